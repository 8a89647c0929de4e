"""host/pretrain.py: the CLI writes a checkpoint the board can rebuild the model from."""
import os
import subprocess
import sys
import tempfile

import helpers

BOARD = os.path.join(helpers.ROOT, "board")
if BOARD not in sys.path:
    sys.path.insert(0, BOARD)

import microformer as mf        # noqa: E402
from microformer.train import evaluate  # noqa: E402

_cache = {}


def pretrained_checkpoint():
    """Run the CLI once per test session (~15 s); (path, stdout). test_finetune.py shares it."""
    if "path" not in _cache:
        out = os.path.join(tempfile.mkdtemp(prefix="mf_pretrain_"), "build", "iris.mfck")
        proc = subprocess.run([sys.executable, os.path.join(helpers.ROOT, "host", "pretrain.py"),
                               "--data", os.path.join(helpers.ROOT, "datasets", "iris.csv"),
                               "--epochs", "100", "--out", out],
                              capture_output=True, text=True, timeout=300, cwd=helpers.ROOT)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        _cache["path"], _cache["stdout"] = out, proc.stdout
    return _cache["path"], _cache["stdout"]


def test_cli_checkpoint_loads_with_seed_accuracy():
    import finetune
    import iris
    path, stdout = pretrained_checkpoint()
    assert "epoch 100/100" in stdout and "test accuracy 93.33%" in stdout, stdout
    meta = mf.checkpoint.read_header(path)["meta"]
    for key in ("arch", "layers", "classes", "features", "mean", "std", "split_seed", "n_train",
                "epochs", "train_acc", "test_acc"):
        assert key in meta, key
    assert meta["arch"] == "iris-attention-v1" and meta["epochs"] == 100
    assert meta["classes"] == ["setosa", "versicolor", "virginica"]
    assert meta["features"] == ["sepal_length", "sepal_width", "petal_length", "petal_width"]
    # the board rebuilds the model from the meta alone and gets the host's accuracy
    model = finetune.build_layers(meta["layers"], seed=99)
    mf.load_checkpoint(path, model)
    train, test, mean, std = iris.load_split(os.path.join(helpers.ROOT, "datasets", "iris.csv"),
                                             meta["split_seed"])
    assert meta["mean"] == [float(m) for m in mean] and meta["std"] == [float(s) for s in std]
    acc, _ = evaluate(model, test)
    assert acc >= 0.93 and abs(acc - meta["test_acc"]) < 1e-9
    assert meta["train_acc"] >= 0.99


def test_pretrain_is_deterministic(tmp_path):
    sys.path.insert(0, os.path.join(helpers.ROOT, "host"))
    import pretrain
    data = os.path.join(helpers.ROOT, "datasets", "iris.csv")
    a, b = tmp_path / "a.mfck", tmp_path / "b.mfck"
    pretrain.pretrain(data, epochs=2, out=str(a), verbose=False)
    pretrain.pretrain(data, epochs=2, out=str(b), verbose=False)
    assert a.read_bytes() == b.read_bytes()
