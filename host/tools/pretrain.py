"""Pretrain the seed's Iris attention model on the host and write a checkpoint for the board.

    python host/tools/pretrain.py --data datasets/iris.csv --epochs 100 --out build/iris.mfck

CPython only (a host tool), but it trains with lib/microformer itself, so the weights are the
ones the board would compute. The model and the 120/30 split come from microformer.models.
Deterministic: the same arguments write a byte-identical file.

The checkpoint's metadata is everything board/finetune.py needs to rebuild and use the model
(microformer.meta checks it):
  arch        "iris-attention-v1" (a name), spec: the model (microformer.spec; load_model rebuilds it)
  task        "classify"; input_shape [4] (four flat features)
  classes     label names, index order of the logits
  features    the CSV header's feature names
  mean, std   per-feature standardization of the training rows (raw units -> model input)
  data        the base data's file name ('iris.csv': the session reads data/iris.csv)
  split_seed, n_train, init_seed, epochs, lr, batch_size, train_acc, test_acc, history
"""
import argparse
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LIB = os.path.join(_ROOT, "lib")
if _LIB not in sys.path:
    sys.path.insert(0, _LIB)

import microformer as mf                      # noqa: E402
from microformer.train import evaluate, fit   # noqa: E402
from microformer.models import IRIS_ARCH, IRIS_SPEC, IRIS_SPLIT_SEED, iris_model, iris_split  # noqa: E402
from microformer.spec import difference, to_spec  # noqa: E402
from microformer.meta import check as check_meta  # noqa: E402


def feature_names(path):
    with open(path) as f:
        head = f.readline().strip().split(",")
    return [h.strip() for h in head[:-1]]


def pretrain(data, epochs=100, out=None, seed=1, split_seed=IRIS_SPLIT_SEED, lr=1e-3,
             batch_size=16, verbose=True):
    """Train, evaluate, write `out` (if given); return the metadata dict."""
    mf.set_backend("python")
    train, test, mean, std = iris_split(data, split_seed)
    model = iris_model(seed)
    if verbose:
        model.summary((batch_size, 4))
    opt = mf.Adam(model, lr=lr)
    t0 = time.time()
    every = max(1, epochs // 10)

    def progress(rec):
        if verbose and (rec["epoch"] % every == 0 or rec["epoch"] == epochs):
            print("epoch %3d/%d  loss %.4f  train acc %.1f%%" % (rec["epoch"], epochs, rec["loss"],
                                                                100 * rec["acc"]))

    hist = fit(model, mf.CrossEntropyLoss(), opt, train, epochs=epochs, batch_size=batch_size,
               seed=seed, verbose=False, on_epoch=progress)
    seconds = time.time() - t0
    train_acc, _ = evaluate(model, train)
    test_acc, confusion = evaluate(model, test)
    meta = {
        "arch": IRIS_ARCH, "spec": to_spec(model), "task": "classify", "input_shape": [4],
        "classes": list(train.classes), "features": feature_names(data),
        "mean": [float(m) for m in mean], "std": [float(s) for s in std],
        "split_seed": split_seed, "n_train": len(train), "init_seed": seed,
        "epochs": epochs, "lr": lr, "batch_size": batch_size,
        "train_acc": train_acc, "test_acc": test_acc,
        "data": os.path.basename(data), "trained_on": "host",
        "final_loss": hist[-1]["loss"] if hist else None,
        "history": [],          # board/finetune.py appends one record per on-board fit
    }
    check_meta(meta, "pretrain", len(train) + len(test))     # what finetune.Session will check
    d = difference(meta["spec"], IRIS_SPEC, ("the trained model", "IRIS_SPEC"))
    if d:       # the checkpoint must say exactly what was trained
        raise RuntimeError("pretrain: the model does not match microformer.models.IRIS_SPEC (%s)" % d)
    if verbose:
        print("train accuracy %.2f%% (%d/%d), test accuracy %.2f%% (%d/%d), %.1f s"
              % (100 * train_acc, round(train_acc * len(train)), len(train),
                 100 * test_acc, round(test_acc * len(test)), len(test), seconds))
        print("test confusion (rows true, columns predicted; %s): %s" % (", ".join(train.classes),
                                                                         confusion))
    if out:
        d = os.path.dirname(out)
        if d:
            os.makedirs(d, exist_ok=True)
        n = mf.save_checkpoint(out, model, meta)
        if verbose:
            print("wrote %s (%d bytes)" % (out, n))
    return meta


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(_ROOT, "datasets", "iris.csv"))
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--out", default=os.path.join("build", "iris.mfck"))
    ap.add_argument("--seed", type=int, default=1, help="weight init and batch order seed")
    ap.add_argument("--split-seed", type=int, default=IRIS_SPLIT_SEED)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    pretrain(a.data, a.epochs, a.out, a.seed, a.split_seed, a.lr, a.batch_size, not a.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
