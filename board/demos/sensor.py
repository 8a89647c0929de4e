# sensor.py: activity recognition from a smartwatch's accelerometer and gyroscope (BasicMotions:
# 6 channels x 100 steps at 10 Hz; standing, running, walking, badminton) with a 1-D convolution
# front end and an attention block (board REPL, MicroPython or CPython).
#   >>> import sensor; sensor.main("sensor.mfck")   # a host-trained checkpoint: evaluate on the
#                                                   # held-out set, fine-tune a few epochs, evaluate
# [B,600] -> [B,100,6] -> Conv1D(6,F,5,stride 2,padding 2) -> ReLU -> MaxPool1D(2) -> [B,25,F]
# -> LearnedPositionalEmbedding(25,F) -> EncoderBlock(F,2,2F,relu) -> GlobalAvgPool -> Dense(F,4)
# The data: datasets/basicmotions_{train,test}.csv (on a board: /data/), time-major rows.
import gc

import microformer as mf
from microformer.data import Batches, find_file, read_csv
from microformer.loss import CrossEntropyLoss
from microformer.optim import Adam
from microformer.train import argmax, evaluate, fit, predict_logits

CLASSES = ["Standing", "Running", "Walking", "Badminton"]
STEPS = 100
CHANNELS = 6
TRAIN = "basicmotions_train.csv"
TEST = "basicmotions_test.csv"


def build_model(seed=1, filters=16, num_heads=2):
    mf.seed(seed)
    F = filters
    return mf.Sequential([
        mf.Reshape((STEPS, CHANNELS)),                   # 100 steps of 6 readings
        mf.Conv1D(CHANNELS, F, 5, stride=2, padding=2),  # [B,50,F]: local motion features
        mf.ActivationLayer("relu"),
        mf.MaxPool1D(2),                                 # [B,25,F]
        mf.LearnedPositionalEmbedding(25, F),            # which part of the window
        mf.EncoderBlock(F, num_heads, 2 * F, activation="relu"),  # windows attend to windows
        mf.GlobalAvgPool(),                              # [B,F]
        mf.Dense(F, len(CLASSES)),                       # logits
    ])


def load(which, data_dir=None):
    """A split (TRAIN or TEST) as a Dataset [N, 600] with the classes in CLASSES order, from
    data_dir or else the places find_file looks (data/, /data/, datasets/, ../datasets/)."""
    data = read_csv(find_file(which, data_dir + "/" + which if data_dir else None), CLASSES)
    if data.num_features != STEPS * CHANNELS:
        raise ValueError("sensor: %s has %d values per row, expected %d (%d steps x %d channels)"
                         % (which, data.num_features, STEPS * CHANNELS, STEPS, CHANNELS))
    return data


def channel_stats(data):
    """Per-channel mean and standard deviation over every row and step (lists of CHANNELS)."""
    d = data.X.data
    n = len(d) // CHANNELS
    mean = [0.0] * CHANNELS
    var = [0.0] * CHANNELS
    for i in range(len(d)):
        mean[i % CHANNELS] += d[i]
    mean = [m / n for m in mean]
    for i in range(len(d)):
        e = d[i] - mean[i % CHANNELS]
        var[i % CHANNELS] += e * e
    return mean, [(v / n) ** 0.5 or 1.0 for v in var]


def standardize(data, mean, std):
    """In place: each channel to (x - mean) / std (the training split's statistics)."""
    if len(mean) != CHANNELS or len(std) != CHANNELS:
        raise ValueError("sensor.standardize: mean and std need %d values, got %d and %d"
                         % (CHANNELS, len(mean), len(std)))
    d = data.X.data
    inv = [1.0 / s for s in std]
    for i in range(len(d)):
        c = i % CHANNELS
        d[i] = (d[i] - mean[c]) * inv[c]
    return data


def predictions(model, data, batch_size=20):
    """The predicted class index of every row, in order."""
    out = []
    for X, y in Batches(data, batch_size):
        logits = predict_logits(model, X)
        n = logits.shape[1]
        for b in range(len(y)):
            out.append(argmax(logits.data, b * n, n))
    return out


def step_heap(model, data, batch_size=8):
    """(bytes held after a collection, bytes one forward + loss + backward allocates), with the
    model, the data and the training buffers resident (a first pass makes the steady-state
    buffers). No weight changes: the optimizer's zero_grad clears the gradients it leaves."""
    loss_fn = CrossEntropyLoss()
    X, y = next(iter(Batches(data, batch_size)))
    model.train()
    loss_fn.forward(model.forward(X), y)
    model.backward(loss_fn.backward())
    gc.collect()
    if not hasattr(gc, "mem_alloc"):
        return None, None
    a0 = gc.mem_alloc()
    gc.disable()
    try:
        loss_fn.forward(model.forward(X), y)
        model.backward(loss_fn.backward())
        a1 = gc.mem_alloc()
    except MemoryError:                  # the pass allocates more than the free heap
        a1 = None
    finally:
        gc.enable()
    gc.collect()
    return a0, (a1 - a0 if a1 is not None else None)


def main(checkpoint="sensor.mfck", epochs=3, lr=5e-4, batch_size=8, backend=None, data_dir=None, verbose=True):
    """Load a host-trained checkpoint, report held-out accuracy, fine-tune `epochs` epochs on the
    training split, report again. Returns a dict of the figures."""
    if backend:
        mf.set_backend(backend)
    model, meta = mf.load_model(checkpoint, with_meta=True)
    if meta.get("classes") != CLASSES:
        raise ValueError("sensor: checkpoint %r is for classes %r, expected %r" % (checkpoint, meta.get("classes"), CLASSES))
    train = standardize(load(TRAIN, data_dir), meta["mean"], meta["std"])
    test = standardize(load(TEST, data_dir), meta["mean"], meta["std"])
    gc.collect()
    acc0, _ = evaluate(model, test, batch_size)          # one batch shape: the buffers are reused
    if verbose:
        print("backend %s: checkpoint %s: held-out accuracy %.1f%% (%d series)"
              % (mf.get_backend(), checkpoint, 100 * acc0, len(test)))
    held, per_step = step_heap(model, train, batch_size)
    hist = fit(model, CrossEntropyLoss(), Adam(model, lr=lr), train, epochs=epochs, batch_size=batch_size,
               seed=1, verbose=verbose)
    s_per_epoch = sum(h["ms_per_step"] * h["steps"] for h in hist) / 1000.0 / max(1, len(hist))
    acc1, confusion = evaluate(model, test, batch_size)
    train_acc, _ = evaluate(model, train, batch_size)
    if verbose:
        print("after %d fine-tuning epochs: train accuracy %.1f%%, held-out accuracy %.1f%%, %.2f s/epoch"
              % (len(hist), 100 * train_acc, 100 * acc1, s_per_epoch))
        if held is not None:
            print("heap: %d bytes held (model, data, buffers), %s bytes allocated per forward + backward"
                  % (held, per_step if per_step is not None else "more than the free heap's"))
        print("confusion (rows true, columns predicted; %s): %s" % (", ".join(CLASSES), confusion))
    return {"backend": mf.get_backend(), "test_acc_before": acc0, "test_acc": acc1, "train_acc": train_acc,
            "s_per_epoch": s_per_epoch, "heap_held": held, "heap_per_step": per_step, "history": hist,
            "confusion": confusion, "model": model}
