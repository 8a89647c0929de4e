"""Train the BasicMotions sensor classifier on the host (CPython, NumPy backend) and write the
checkpoint board/demos/sensor.py fine-tunes: its metadata carries the model spec (mf.load_model rebuilds
it), the class names and the per-channel standardization of the training split.

    python host/tools/train_sensor.py --epochs 60 --out build/sensor.mfck
    python host/tools/train_sensor.py --baselines     # 1-NN Euclidean and 1-NN DTW on the same split, for comparison
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for p in (os.path.join(ROOT, "lib"), os.path.join(ROOT, "board", "demos")):
    if p not in sys.path:
        sys.path.insert(0, p)
import microformer as mf  # noqa: E402
from microformer.meta import check  # noqa: E402
from microformer.train import fit_and_evaluate  # noqa: E402
import sensor  # noqa: E402


# BasicMotions' six dimensions: the watch's accelerometer (x, y, z), then its gyroscope
CHANNEL_NAMES = ("acc_x", "acc_y", "acc_z", "gyro_x", "gyro_y", "gyro_z")


def train(epochs=60, seed=1, lr=3e-3, batch_size=8, filters=16, data_dir=None, verbose=True):
    """(model, meta, result): trained from scratch on the training split, judged on the test split."""
    data_dir = data_dir or os.path.join(ROOT, "datasets")
    tr = sensor.load(sensor.TRAIN, data_dir)
    te = sensor.load(sensor.TEST, data_dir)
    mean, std = sensor.channel_stats(tr)
    sensor.standardize(tr, mean, std)
    sensor.standardize(te, mean, std)
    model = sensor.build_model(seed, filters)
    result = fit_and_evaluate(model, tr, te, epochs, batch_size, lr, seed, verbose)
    # what finetune.Session needs (microformer.meta): a window of STEPS readings of CHANNELS
    # numbers, time-major in a CSV row; the base data is the training file, all of it 'train'
    meta = {"spec": mf.to_spec(model), "task": "classify", "classes": sensor.CLASSES,
            "input_shape": [sensor.STEPS, sensor.CHANNELS], "features": list(CHANNEL_NAMES),
            "mean": mean, "std": std, "data": sensor.TRAIN, "split_seed": 0, "n_train": len(tr),
            "epochs": epochs, "seed": seed, "lr": lr, "batch_size": batch_size,
            "host_train_acc": result["train_acc"], "host_test_acc": result["test_acc"]}
    check(meta, "train_sensor", len(tr))                  # what finetune.Session will check
    return model, meta, result


def _raw(which):
    import numpy as np
    d = sensor.load(which, os.path.join(ROOT, "datasets"))
    return np.asarray(d.X.data, dtype=np.float64).reshape(len(d), sensor.STEPS, sensor.CHANNELS), np.asarray(d.y)


def _dtw(a, b):
    # dependent multivariate DTW, no window: squared Euclidean step cost over all channels
    import numpy as np
    n, m = len(a), len(b)
    cost = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    D = np.full((n + 1, m + 1), np.inf)
    D[0, 0] = 0.0
    for i in range(1, n + 1):
        row, prev, ci = D[i], D[i - 1], cost[i - 1]
        for j in range(1, m + 1):
            row[j] = ci[j - 1] + min(prev[j], row[j - 1], prev[j - 1])
    return D[n, m]


def baselines():
    """Held-out accuracy of 1-NN with Euclidean distance and with DTW (dependent, no window) on the
    raw series: the archive's usual reference classifiers, computed here on the same split."""
    Xtr, ytr = _raw(sensor.TRAIN)
    Xte, yte = _raw(sensor.TEST)
    ed = ((Xte[:, None] - Xtr[None]) ** 2).sum(axis=(2, 3))
    acc_ed = float((ytr[ed.argmin(1)] == yte).mean())
    dtw = [[_dtw(x, t) for t in Xtr] for x in Xte]
    acc_dtw = float((ytr[[int(min(range(len(r)), key=r.__getitem__)) for r in dtw]] == yte).mean())
    return {"1nn_euclidean": acc_ed, "1nn_dtw_d": acc_dtw}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--filters", type=int, default=16)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "sensor.mfck"))
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--baselines", action="store_true", help="print 1-NN Euclidean / DTW held-out accuracy and exit")
    a = ap.parse_args(argv)
    if a.baselines:
        b = baselines()
        print("1-NN Euclidean %.1f%%, 1-NN DTW (dependent, no window) %.1f%% held-out (40 series)"
              % (100 * b["1nn_euclidean"], 100 * b["1nn_dtw_d"]))
        return
    if a.epochs < 1:
        ap.error("--epochs must be >= 1, got %d" % a.epochs)
    model, meta, r = train(a.epochs, a.seed, a.lr, a.batch_size, a.filters, verbose=not a.quiet)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    mf.save_checkpoint(a.out, model, meta)
    print("host (%s backend): %d epochs, train accuracy %.1f%%, held-out accuracy %.1f%% (%d series), "
          "%.2f s/epoch, %d parameters -> %s" % (r["backend"], a.epochs, 100 * r["train_acc"],
                                                  100 * r["test_acc"], r["n_test"], r["s_per_epoch"],
                                                  model.param_count(), a.out))


if __name__ == "__main__":
    main()
