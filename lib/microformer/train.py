# microformer.train: the fit loop, evaluation and prediction for classifiers.
import gc
import time

from . import backend
from .data import Batches
from .loss import CrossEntropyLoss
from .optim import Adam
from .tensor import Rng

def _ms():
    try:
        return time.ticks_ms()
    except AttributeError:
        return int(time.time() * 1000)


def _elapsed(t0):
    try:
        return time.ticks_diff(time.ticks_ms(), t0)
    except AttributeError:
        return _ms() - t0


def argmax(row, base, n):
    """Index i < n of the largest row[base + i] (the first on ties), on the current backend:
    the viper one boxes no float, so picking a class or the next token allocates nothing."""
    return backend.K.argmax(row, base, n)


def train_step(model, loss_fn, optimizer, X, y):
    """One step: forward, loss, backward, update. Returns (loss, correct).

    All or nothing: NonFiniteError (NonFiniteLossError for the loss) leaves every weight and
    optimizer moment as before; a KeyboardInterrupt leaves the weights of the step before, or
    (when it lands while the optimizer writes) of this step, completed, and is raised after it."""
    model.train()
    optimizer.zero_grad()
    logits = model.forward(X)
    loss = loss_fn.forward(logits, y)        # raises NonFiniteLossError before any update
    model.backward(loss_fn.backward())
    # all or nothing: a non-finite gradient or update raises NonFiniteError with the weights as
    # they were; a Ctrl-C during the write is held until the step is complete (optim.py)
    optimizer.step()
    B, C = logits.shape
    correct = 0
    for b in range(B):
        if argmax(logits.data, b * C, C) == y[b]:
            correct += 1
    return loss, correct


def fit(model, loss_fn, optimizer, data, epochs=1, batch_size=16, seed=0, verbose=True, on_epoch=None):
    """Train on a Dataset; one progress line per epoch. Ctrl-C stops after the current step.

    Returns a list of per-epoch dicts: epoch, loss, acc, ms_per_step (and 'interrupted').
    """
    if not isinstance(epochs, int) or epochs < 0:
        raise ValueError("fit: epochs must be a non-negative int, got %r" % (epochs,))
    batches = Batches(data, batch_size, Rng(seed + 1))
    history = []
    steps0 = optimizer.steps
    for epoch in range(1, epochs + 1):
        total = 0.0
        correct = 0
        steps = 0
        seen = 0
        t0 = _ms()
        interrupted = False
        s0 = optimizer.steps
        try:
            for X, y in batches:
                loss, c = train_step(model, loss_fn, optimizer, X, y)
                total += loss * len(y)
                correct += c
                seen += len(y)
        except KeyboardInterrupt:
            # the step in progress either never wrote a weight or was completed (optim.py)
            interrupted = True
        steps = optimizer.steps - s0
        ms = _elapsed(t0)
        seen = seen or 1
        rec = {"epoch": epoch, "loss": total / seen, "acc": correct / seen,
               "ms_per_step": ms / max(1, steps), "steps": steps, "interrupted": interrupted}
        history.append(rec)
        if verbose:
            line = "epoch %d/%d  loss %.4f  acc %.1f%%  %.1f ms/step" % (
                epoch, epochs, rec["loss"], 100 * rec["acc"], rec["ms_per_step"])
            if hasattr(gc, "mem_free"):
                line += "  free %d" % gc.mem_free()
            if interrupted:
                line += ("  (interrupted: stopped after %d full steps; the weights are those of step %d)"
                         % (optimizer.steps - steps0, optimizer.steps))
            print(line)
        if on_epoch:
            on_epoch(rec)
        if interrupted:
            break
    return history


def predict_logits(model, X):
    model.eval()
    out = model.forward(X)
    model.train()
    return out


def evaluate(model, data, batch_size=32):
    """(accuracy, confusion) where confusion[true][predicted] counts samples."""
    C = len(data.classes)
    confusion = [[0] * C for _ in range(C)]
    correct = 0
    for X, y in Batches(data, batch_size):
        logits = predict_logits(model, X)
        K = logits.shape[1]
        if K != C:
            raise ValueError("evaluate: the model gives %d scores per example, the data has %d classes (%s)"
                             % (K, C, ", ".join(str(c) for c in data.classes)))
        for b in range(len(y)):
            p = argmax(logits.data, b * K, K)
            confusion[y[b]][p] += 1
            if p == y[b]:
                correct += 1
    return correct / max(1, len(data)), confusion


def fit_and_evaluate(model, train, test, epochs=100, batch_size=16, lr=1e-3, seed=0, verbose=True):
    """Adam + softmax cross-entropy on `train`, then accuracy on `train` and `test`: a dict."""
    t0 = _ms()
    hist = fit(model, CrossEntropyLoss(), Adam(model, lr=lr), train, epochs=epochs,
               batch_size=batch_size, seed=seed, verbose=verbose)
    seconds = _elapsed(t0) / 1000.0
    train_acc, _ = evaluate(model, train)
    test_acc, confusion = evaluate(model, test)
    return {"backend": backend.name, "epochs": epochs, "n_train": len(train), "n_test": len(test),
            "train_acc": train_acc, "test_acc": test_acc,
            "final_loss": hist[-1]["loss"] if hist else None,
            "s_per_epoch": seconds / max(1, epochs), "history": hist, "confusion": confusion}
