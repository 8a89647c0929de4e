"""host/tools/pretrain.py: the CLI writes a checkpoint the board can rebuild the model from."""
import os
import re

import helpers
import microformer as mf
from microformer.train import evaluate
from iris_seed_mp import SEED_TEST, SEED_TRAIN


def test_cli_checkpoint_loads_with_seed_accuracy(pretrained_iris):
    import iris
    path, stdout = pretrained_iris
    meta = mf.checkpoint.read_header(path)["meta"]
    for key in ("arch", "spec", "classes", "features", "mean", "std", "split_seed", "n_train",
                "epochs", "train_acc", "test_acc"):
        assert key in meta, key
    assert meta["epochs"] == 100                 # the --epochs the fixture passed
    assert meta["classes"] == ["setosa", "versicolor", "virginica"]
    with open(os.path.join(helpers.ROOT, "datasets", "iris.csv")) as f:
        assert meta["features"] == f.readline().strip().split(",")[:-1]
    # the board rebuilds the model from the meta alone and gets the host's accuracy
    mf.seed(99)
    model = mf.load_model(path)
    train, test, mean, std = iris.load_split(os.path.join(helpers.ROOT, "datasets", "iris.csv"),
                                             meta["split_seed"])
    assert meta["mean"] == [float(m) for m in mean] and meta["std"] == [float(s) for s in std]
    acc, _ = evaluate(model, test)
    train_acc, _ = evaluate(model, train)
    assert acc >= SEED_TEST - 1e-9 and train_acc >= SEED_TRAIN - 1e-9, (train_acc, acc)
    assert acc == meta["test_acc"] and train_acc == meta["train_acc"]
    # what the CLI printed is what the reloaded weights score
    assert "epoch 100/100" in stdout, stdout
    m = re.search(r"train accuracy ([\d.]+)% \((\d+)/(\d+)\), test accuracy ([\d.]+)% \((\d+)/(\d+)\)", stdout)
    assert m, stdout
    assert (int(m.group(2)), int(m.group(3))) == (round(train_acc * len(train)), len(train)), m.group(0)
    assert (int(m.group(5)), int(m.group(6))) == (round(acc * len(test)), len(test)), m.group(0)
    assert abs(float(m.group(4)) - 100 * acc) < 0.006 and abs(float(m.group(1)) - 100 * train_acc) < 0.006


def test_pretrain_is_deterministic(tmp_path):
    import pretrain
    data = os.path.join(helpers.ROOT, "datasets", "iris.csv")
    a, b = tmp_path / "a.mfck", tmp_path / "b.mfck"
    pretrain.pretrain(data, epochs=2, out=str(a), verbose=False)
    pretrain.pretrain(data, epochs=2, out=str(b), verbose=False)
    assert a.read_bytes() == b.read_bytes()
