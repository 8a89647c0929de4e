"""microformer.spec: a model as JSON-able data and back, in CPython and both MicroPython ports."""
import json

import pytest

import helpers
from microformer.models import IRIS_SPEC

SCRIPT = helpers.script("spec_mp.py")


def _check(out):
    models = out["models"]
    assert len(models) == 3
    for m in models:
        assert m["spec"] == m["again"]                # nothing lost through JSON and back
        assert m["shapes"] == m["shapes2"] and m["shapes"]
    iris = models[0]["spec"]
    assert [l["type"] for l in iris["layers"]] == ["Dense", "ActivationLayer", "Reshape", "Attention",
                                                   "GlobalAvgPool", "Dense"]
    assert iris["layers"] == IRIS_SPEC["layers"]        # to_spec gives back the spec it was built from
    block = models[1]["spec"]["layers"][2]
    assert block["causal"] is True and block["activation"] == "gelu_tanh" and block["max_len"] == 16
    assert models[1]["spec"]["layers"][4]["use_bias"] is False
    assert models[2]["spec"] == {"type": "Attention", "embed_dim": 6, "num_heads": 3, "use_bias": False,
                                 "causal": True, "max_len": 9, "format": "microformer-spec/1"}
    e = out["errors"]
    assert len(e) == 5
    assert "unknown layer type 'Conv9'" in e[0]
    assert "spec.layers[0]" in e[1] and "Dense" in e[1]
    assert "'layers' list" in e[2]
    assert "must be a dict" in e[3]
    assert "out_features" in e[4] or "positive" in e[4]


def test_spec_cpython():
    _check(json.loads(helpers.run_cpython(SCRIPT)))


def test_spec_micropython(micropython):
    _check(json.loads(helpers.run_micropython(SCRIPT, exe=micropython)))


def test_to_spec_names_an_unknown_layer():
    import microformer as mf
    from microformer.spec import to_spec

    class Mine(mf.Dense):
        pass
    with pytest.raises(ValueError, match=r"model\[1\] is a Mine"):
        to_spec(mf.Sequential([mf.Dense(2, 2), Mine(2, 2)]))
