# bench_guard.py: what a default fine-tune leaves behind, on a model and data of its own (not
# Iris). Runs on a board, the unix ports and CPython:
#   micropython bench_guard.py FOLDER SEED
# FOLDER: an empty folder used as the flash (model.mfck and data/ are written there). SEED draws
# the data, the split and the initial weights. It pretrains a small attention classifier on a
# generated 3-class task (windows of 4 readings x 3 channels; 160 train rows, 40 test rows, the
# split given in the checkpoint), then, in finetune.Session as a user runs it:
#   default  add 5 examples of class 'walk' read by a shifted sensor, s.fit(): base test
#            accuracy before and after, and how many of the 5 are then predicted right
#   nocare   the same fit without rehearsal and keeping what it gives (rehearse=0, on_worse='keep')
#   plain    a fit on the 5 examples given as a list (data=pairs): no rehearsal, no validation,
#            the last epoch stays (what s.fit() did before the guard)
#   lr50     s.fit(lr=50): what the guard did and the accuracy after
# and prints one line `GUARD {json}`. host/bench/bench_quality.py runs it over seeds and writes
# host/results/QUALITY.md.
import json
import os
import sys

import microformer as mf
from microformer.tensor import Rng, Tensor

L, C = 4, 3
CLASSES = ["rest", "walk", "run"]
CENTRE = [[0.0, 0.0, 0.0], [2.0, 1.0, 0.0], [4.0, 0.0, 1.0]]   # per class, per channel (raw units)
SLOPE = [0.0, 0.3, 0.6]                                         # per class: drift over the window
NOISE = 0.7
SHIFT = [1.6, -0.8, 0.8]          # the user's sensor: class 'walk' read with this offset per channel
N_ROWS, N_TRAIN, N_USER = 200, 160, 5
EPOCHS, LR, BATCH = 40, 0.005, 16


def _gauss(rng):
    # about N(0, 1): the sum of 4 uniforms on [-sqrt(3), sqrt(3)) over 2 (variance 1)
    s = 0.0
    for _ in range(4):
        s += rng.uniform(-1.7320508, 1.7320508)
    return s / 2


def window(rng, k, shift=None):
    row = []
    for t in range(L):
        for c in range(C):
            v = CENTRE[k][c] + SLOPE[k] * t + NOISE * _gauss(rng)
            if shift:
                v += shift[c]
            row.append(round(v, 4))
    return row


def model(seed):
    mf.seed(seed)
    return mf.Sequential([mf.Reshape((L, C)), mf.Dense(C, 8), mf.ActivationLayer("relu"), mf.Attention(8, 2),
                          mf.GlobalAvgPool(), mf.Dense(8, len(CLASSES))])


def _mkdir(p):
    try:
        os.mkdir(p)
    except OSError:
        pass


def make_flash(root, seed):
    """Write data/shift.csv and model.mfck (pretrained here) into root; returns the user's
    N_USER shifted examples as (features, label) pairs."""
    from microformer.data import Dataset
    from microformer.train import fit, evaluate
    rng = Rng(1000 + seed)
    rows = [window(rng, i % 3) + [CLASSES[i % 3]] for i in range(N_ROWS)]
    _mkdir(root + "/data")
    with open(root + "/data/shift.csv", "w") as f:
        f.write(",".join("t%d_%s" % (t, c) for t in range(L) for c in ("ax", "ay", "az")) + ",label\n")
        for r in rows:
            f.write(",".join(str(v) for v in r) + "\n")
    # the split is the model's: rows are train or test by a seeded shuffle the checkpoint records
    idx = Rng(seed).shuffle(list(range(N_ROWS)))
    train = idx[:N_TRAIN]
    mean = [0.0] * C
    sq = [0.0] * C
    for i in train:
        for j in range(L * C):
            v = rows[i][j]
            mean[j % C] += v
            sq[j % C] += v * v
    n = len(train) * L
    mean = [m / n for m in mean]
    std = [(sq[c] / n - mean[c] ** 2) ** 0.5 for c in range(C)]
    X = Tensor((len(train), L * C))
    for a in range(len(train)):
        for j in range(L * C):
            X.data[a * L * C + j] = (rows[train[a]][j] - mean[j % C]) / std[j % C]
    y = [CLASSES.index(rows[i][-1]) for i in train]
    m = model(seed)
    ds = Dataset(X, y, CLASSES)
    fit(m, mf.CrossEntropyLoss(), mf.Adam(m, lr=LR), ds, epochs=EPOCHS, batch_size=BATCH, seed=seed,
        verbose=False)
    meta = {"task": "classify", "classes": CLASSES, "input_shape": [L, C], "features": ["ax", "ay", "az"],
            "mean": mean, "std": std, "data": "shift.csv", "split_seed": seed, "n_train": N_TRAIN,
            "train_acc": evaluate(m, ds)[0]}
    mf.save_checkpoint(root + "/model.mfck", m, meta)
    urng = Rng(2000 + seed)
    return [(window(urng, 1, SHIFT), "walk") for _ in range(N_USER)]


def _right(s, pairs):
    return sum(1 for x, label in pairs if s.predict(x, False).label == label)


def run(root, seed):
    import finetune
    pairs = make_flash(root, seed)
    out = {"seed": seed, "n_test": N_ROWS - N_TRAIN, "n_user": N_USER}
    s = finetune.Session(root=root, verbose=False)
    out["backend"] = mf.get_backend()
    out["test_before"] = s.evaluate(verbose=False)["correct"]
    out["user_before"] = _right(s, pairs)
    s.add_examples(pairs)
    for case, kw in (("default", {}), ("nocare", {"rehearse": 0, "on_worse": "keep"}),
                     ("plain", {"data": pairs}), ("lr50", {"lr": 50})):
        t = finetune.Session(root=root, verbose=False)
        before = t.evaluate(verbose=False)["correct"]
        h = t.fit(verbose=False, **kw)
        out[case] = {"test": t.evaluate(verbose=False)["correct"], "user": _right(t, pairs),
                     "guard": h.get("guard"), "test_before": before, "steps": h["steps"]}
        del t
    return out


if __name__ == "__main__":
    print("GUARD " + json.dumps(run(sys.argv[1], int(sys.argv[2]))))
