# microformer.train: the fit loop, evaluation and prediction for classifiers.
import gc
import time
from array import array

from . import backend
from .data import Batches
from .layer import partial
from .loss import CrossEntropyLoss
from .optim import Adam
from .tensor import Rng

def _us():
    # microseconds: ticks_us on MicroPython (ticks_ms is too coarse for a step of ~1 ms)
    try:
        return time.ticks_us()
    except AttributeError:
        return int(time.perf_counter() * 1000000)


def time_since(t0):
    """Microseconds since t0 = _us() (on a board: right up to ~9 minutes, where ticks_us wraps)."""
    try:
        return time.ticks_diff(time.ticks_us(), t0)
    except AttributeError:
        return _us() - t0


def _elapsed(t0):
    """Milliseconds (a float, microsecond resolution) since t0 = _us()."""
    return time_since(t0) / 1000.0


def duration(ms):
    """'850 us', '38.5 ms', '12.3 s': a duration in milliseconds, in readable units."""
    if ms < 1:
        return "%d us" % round(ms * 1000)
    if ms < 1000:
        return "%.1f ms" % ms
    return "%.1f s" % (ms / 1000)


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
    _backward(model, loss_fn)
    # all or nothing: a non-finite gradient or update raises NonFiniteError with the weights as
    # they were; a Ctrl-C during the write is held until the step is complete (optim.py)
    optimizer.step()
    if not getattr(loss_fn, "classifies", True):
        return loss, 0                  # regression: no classes to count
    return loss, _correct(logits, y)


def _backward(model, loss_fn):
    # the model's backward from the loss's gradient; a model whose backward takes need_dx
    # (layer.partial: Sequential and the library's layers) skips the input gradient nobody uses
    # here. A function of its own, so train_step's frame stays within 11 words
    if partial(model):
        model.backward(loss_fn.backward(), True, False)
    else:
        model.backward(loss_fn.backward())


def _correct(logits, y):
    # how many rows of logits [B,C] have their largest value at the label y[b]
    C = logits.shape[1]
    n = 0
    for b in range(logits.shape[0]):
        if argmax(logits.data, b * C, C) == y[b]:
            n += 1
    return n


_CHUNK = 16        # epochs per block of an unbounded history's store
_FIELDS = 6        # per epoch: loss, acc, ms_per_step, steps, ms, interrupted


class FitLog:
    """What a fit did, filled in epoch by epoch (so it is right also when fit raises):
    running totals over every epoch (epochs, steps, ms, interrupted) and the figures of the
    last `keep` epochs (None: all of them). records() makes their dicts.

    The figures go into blocks of doubles (exact for every float and count here), and the dicts
    are made only when asked: dicts kept epoch by epoch, between steps that leave only a few
    bytes of garbage, would end up spread over the whole heap, cutting it into pieces too small
    for the next model's buffers. With `keep` set, the store is one block of keep * 48 bytes,
    made before the first step: a fit of any length then holds the same memory."""

    def __init__(self, keep=None):
        if keep is not None and (not isinstance(keep, int) or isinstance(keep, bool) or keep < 1):
            raise ValueError("FitLog: keep must be None or an int >= 1, got %r" % (keep,))
        self.keep = keep
        self.epochs = 0          # epochs run (the last one may be cut short: interrupted)
        self.steps = 0
        self.ms = 0.0
        self.interrupted = False
        self._store = [array("d", bytes(8 * _FIELDS * keep))] if keep else []

    def _slot(self, e):
        # (block, offset) of epoch e's figures (0-based)
        if self.keep:
            return self._store[0], _FIELDS * (e % self.keep)
        return self._store[e // _CHUNK], _FIELDS * (e % _CHUNK)

    def add(self, loss, acc, steps, ms, interrupted):
        """Record the next epoch."""
        e = self.epochs
        if not self.keep and e % _CHUNK == 0:
            self._store.append(array("d", bytes(8 * _FIELDS * _CHUNK)))
        v, o = self._slot(e)
        v[o] = loss
        v[o + 1] = acc
        v[o + 2] = ms / max(1, steps)
        v[o + 3] = steps
        v[o + 4] = ms
        v[o + 5] = 1 if interrupted else 0
        self.epochs = e + 1
        self.steps += steps
        self.ms += ms
        self.interrupted = interrupted

    def first_kept(self):
        """The 0-based index of the oldest epoch whose figures are kept."""
        return self.epochs - min(self.epochs, self.keep) if self.keep else 0

    def record(self, e):
        """Epoch e's record (0-based, one of the kept epochs) as a dict."""
        if not self.first_kept() <= e < self.epochs:
            raise IndexError("FitLog: epoch %d is not kept (kept: %d..%d)"
                             % (e + 1, self.first_kept() + 1, self.epochs))
        v, o = self._slot(e)
        return {"epoch": e + 1, "loss": v[o], "acc": v[o + 1], "ms_per_step": v[o + 2],
                "steps": int(v[o + 3]), "ms": v[o + 4], "interrupted": bool(v[o + 5])}

    def records(self):
        """The kept epochs' records, oldest first (a list of dicts)."""
        first = self.first_kept()
        out = [None] * (self.epochs - first)
        for e in range(first, self.epochs):
            out[e - first] = self.record(e)
        return out


def fit(model, loss_fn, optimizer, data, epochs=1, batch_size=16, seed=0, verbose=True, on_epoch=None,
        progress_s=5, keep=None, log=None):
    """Train on a Dataset; one progress line per epoch, and one at least every `progress_s`
    seconds within a long epoch (verbose). Ctrl-C stops after the current step.

    Returns a list of per-epoch dicts: epoch, loss, acc, ms_per_step, steps, ms (and 'interrupted'),
    for every epoch, or for the last `keep` epochs. With `log` (a FitLog to fill instead of a new
    FitLog(keep)) it returns that log: its running totals (epochs, steps, ms) are right also when
    fit raises, and the caller makes the records (log.records()) when, and if, it wants them.
    """
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 0:
        raise ValueError("fit: epochs must be a non-negative int, got %r" % (epochs,))
    given = log is not None
    if not given:
        log = FitLog(keep)
    batches = Batches(data, batch_size, Rng(seed + 1))
    steps0 = optimizer.steps
    every_us = int(progress_s * 1000000) if verbose and progress_s else 0
    n_batches = (len(data) + batch_size - 1) // batch_size
    for epoch in range(1, epochs + 1):
        total = 0.0
        correct = 0
        seen = 0
        t0 = _us()
        said = t0
        interrupted = False
        s0 = optimizer.steps
        try:
            for X, y in batches:
                loss, c = train_step(model, loss_fn, optimizer, X, y)
                total += loss * len(y)
                correct += c
                seen += len(y)
                if every_us and time_since(said) >= every_us:
                    said = _us()
                    k = optimizer.steps - s0
                    print("  epoch %d/%d: step %d/%d, loss %.4f, %.2f ms/step" % (
                        epoch, epochs, k, n_batches, total / seen, _elapsed(t0) / k))
        except KeyboardInterrupt:
            # the step in progress either never wrote a weight or was completed (optim.py)
            interrupted = True
        steps = optimizer.steps - s0
        ms = _elapsed(t0)
        seen = seen or 1
        log.add(total / seen, correct / seen, steps, ms, interrupted)
        if verbose or on_epoch:
            rec = log.record(log.epochs - 1)
        if verbose:
            line = "epoch %d/%d  loss %.4f  %s%.2f ms/step" % (
                epoch, epochs, rec["loss"],
                "acc %.1f%%  " % (100 * rec["acc"]) if getattr(loss_fn, "classifies", True) else "",
                rec["ms_per_step"])
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
    return log if given else log.records()


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
        n = logits.shape[1]               # scores per example
        if n != C:
            raise ValueError("evaluate: the model gives %d scores per example, the data has %d classes (%s)"
                             % (n, C, ", ".join(str(c) for c in data.classes)))
        for b in range(len(y)):
            p = argmax(logits.data, b * n, n)
            confusion[y[b]][p] += 1
            if p == y[b]:
                correct += 1
    return correct / max(1, len(data)), confusion


def fit_and_evaluate(model, train, test, epochs=100, batch_size=16, lr=1e-3, seed=0, verbose=True):
    """Adam + softmax cross-entropy on `train`, then accuracy on `train` and `test`: a dict."""
    hist = fit(model, CrossEntropyLoss(), Adam(model, lr=lr), train, epochs=epochs,
               batch_size=batch_size, seed=seed, verbose=verbose)
    seconds = sum([h["ms"] for h in hist]) / 1000.0    # per epoch: ticks_us wraps after minutes
    train_acc, _ = evaluate(model, train)
    test_acc, confusion = evaluate(model, test)
    return {"backend": backend.name, "epochs": epochs, "n_train": len(train), "n_test": len(test),
            "train_acc": train_acc, "test_acc": test_acc,
            "final_loss": hist[-1]["loss"] if hist else None,
            "s_per_epoch": seconds / max(1, epochs), "history": hist, "confusion": confusion}
