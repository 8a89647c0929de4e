"""One model spec: checkpoints carry it, load_model and finetune.Session rebuild from it, the
Iris layer list is written once (microformer.models), checkpoint.load and the pretrain guard
compare specs, so a Dense(4, 64) model never passes for Dense(4, 32)."""
import json
import os
import re

import pytest

import helpers
import microformer as mf
from microformer.models import IRIS_SPEC

SCRIPT = helpers.script("one_spec_mp.py")


def _check(out):
    assert out["saved_spec"]["layers"] == IRIS_SPEC["layers"]
    assert out["reload_same"]
    # the wide model: shapes differ; the causal one: same tag and shapes, only the spec differs
    assert out["wide_into_iris"] and "out_features: 32 in the checkpoint, 64 in the model" \
        in out["wide_into_iris"], out["wide_into_iris"]
    assert out["iris_into_wide"] and "out_features: 64 in the checkpoint, 32 in the model" \
        in out["iris_into_wide"], out["iris_into_wide"]
    assert out["causal_into_iris"] and "layers[3].causal: False in the checkpoint, True in the model" \
        in out["causal_into_iris"], out["causal_into_iris"]
    assert out["causal_untouched"]
    assert out["own_has_spec"] is False
    assert "holds no model spec" in out["own_load_model"] and "load_checkpoint" in out["own_load_model"]
    assert out["own_load_checkpoint"]
    assert "Twice" in out["own_strict"], out["own_strict"]
    assert "meta['spec'] does not describe the model" in out["wrong_meta_spec"]
    assert out["old_layers"] and out["old_arch"] and out["old_layers_spec"] is False
    assert "holds no model spec" in out["old_none"]


def test_one_spec_cpython(tmp_path):
    _check(json.loads(helpers.run_cpython(SCRIPT, str(tmp_path))))


def test_one_spec_micropython(tmp_path, micropython):
    _check(json.loads(helpers.run_micropython(SCRIPT, str(tmp_path), exe=micropython)))


def test_pretrain_guard_compares_specs(tmp_path, monkeypatch):
    """A pretrain whose model is Dense(4, 64) wide refuses to write a checkpoint named Iris."""
    import pretrain
    from microformer.spec import from_spec

    def wide(seed=1):
        mf.seed(seed)
        spec = json.loads(json.dumps(IRIS_SPEC))
        spec["layers"][0]["out_features"] = 64
        spec["layers"][2]["shape"] = [4, 16]
        spec["layers"][3]["embed_dim"] = 16
        spec["layers"][5]["in_features"] = 16
        return from_spec(spec)
    monkeypatch.setattr(pretrain, "iris_model", wide)
    out = tmp_path / "w.mfck"
    with pytest.raises(RuntimeError, match=r"layers\[0\].out_features: 64 in the trained model, 32 in IRIS_SPEC"):
        pretrain.pretrain(os.path.join(helpers.ROOT, "datasets", "iris.csv"), epochs=1, out=str(out),
                          verbose=False)
    assert not out.exists()


def test_session_builds_from_the_spec(iris_flash, tmp_path):
    """finetune.Session rebuilds from meta['spec']; an old checkpoint (arch only) opens too and
    its save() then carries the spec."""
    import finetune
    from microformer import checkpoint
    import pathlib
    flash = pathlib.Path(iris_flash(tmp_path / "flash"))
    s = finetune.Session(root=str(flash), verbose=False)
    assert mf.to_spec(s.model)["layers"] == IRIS_SPEC["layers"]
    old = checkpoint.read_header(str(flash / "model.mfck"))["meta"]
    del old["spec"]
    checkpoint.save(str(flash / "model.mfck"), s.model, old, spec=False)
    s2 = finetune.Session(root=str(flash), verbose=False)
    assert [bytes(p.data) for _, p in s2.model.named_params()] == \
        [bytes(p.data) for _, p in s.model.named_params()]
    s2.save()
    assert checkpoint.read_header(str(flash / "model.mfck"))["meta"]["spec"]["layers"] == IRIS_SPEC["layers"]
    assert not hasattr(finetune, "build_layers") and not hasattr(finetune, "IRIS_LAYERS")


def test_the_iris_layer_list_is_written_once():
    """Dense(4, 32) (the Iris model's first layer) appears in code only in microformer.models."""
    hits = []
    pat = re.compile(r"Dense\(4, ?32\)|\[\"Dense\", 4, 32\]|\"out_features\": 32")
    for top in ("lib", "board", "host", "tests"):
        for dirpath, _, files in os.walk(os.path.join(helpers.ROOT, top)):
            for f in files:
                if f.endswith(".py") and f not in ("one_spec_mp.py", "test_one_spec.py"):
                    p = os.path.join(dirpath, f)
                    for i, line in enumerate(open(p), 1):
                        if pat.search(line) and not line.lstrip().startswith("#"):
                            hits.append("%s:%d" % (os.path.relpath(p, helpers.ROOT), i))
    assert hits == [os.path.join("lib", "microformer", "models.py") + ":%d" % n
                    for n in _lines_of_models()], hits


def _lines_of_models():
    p = os.path.join(helpers.LIB, "microformer", "models.py")
    return [i for i, line in enumerate(open(p), 1) if '"out_features": 32' in line]
