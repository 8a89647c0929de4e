# microformer.train: the trainer (batches and micro-batches, the memory plan, rollback, history,
# the optimizer), the fit loop, evaluation and prediction for classifiers.
import gc
import time
from array import array

from . import backend
from .data import Batches, gathers_batch
from .layer import drop_scratch, partial, release_buffers, train_backward as _down
from .loss import CrossEntropyLoss
from .optim import Adam
from .tensor import SETTLE_GC_BYTES, Rng, Tensor, zeros


# The first training step makes the model's buffers (activations, grads, the kernels' scratch),
# each float32 array copied from a zeroed bytes object of its size that is garbage right after.
# Without a collection in between, the arrays end up spaced by holes of their own size, and a
# larger block later finds no room: a 318K heap on the 32-bit port had 66 KB free, none of it
# 3.4 KB in one piece. So a fit (the memory plan's probes, the optimizer and rollback copy
# included) has the GC collect after every SETTLE_GC_BYTES of allocation (gc.threshold;
# Trainer.settle) until its first step is done, then puts the threshold back (the value and why:
# tensor.py, next to settle_gc).

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
        progress_s=5, keep=None, log=None, micro_batch=None, recompute=None, checkpoint=None):
    """Train on a Dataset; one progress line per epoch, and one at least every `progress_s`
    seconds within a long epoch (verbose). Ctrl-C stops after the current step.

    Returns a list of per-epoch dicts: epoch, loss, acc, ms_per_step, steps, ms (and 'interrupted'),
    for every epoch, or for the last `keep` epochs. With `log` (a FitLog to fill instead of a new
    FitLog(keep)) it returns that log: its running totals (epochs, steps, ms) are right also when
    fit raises, and the caller makes the records (log.records()) when, and if, it wants them.
    micro_batch: rows per forward/backward (the gradients of a batch's micro-batches add up to
    the batch's: Trainer); None: the whole batch. on_epoch(record) returning True stops the fit.
    recompute: what the model's EncoderBlocks compute again in backward (Trainer); None: chosen
    from the memory plan. checkpoint: their EncoderBlock.checkpoint (Trainer); None: switched on
    by the memory plan only when the step fits with it and not without.
    """
    t = Trainer(model, loss_fn, optimizer, batch_size=batch_size, micro_batch=micro_batch,
                recompute=recompute, checkpoint=checkpoint)
    return t.fit(data, epochs=epochs, seed=seed, verbose=verbose, on_epoch=on_epoch,
                 progress_s=progress_s, keep=keep, log=log)


def _check_count(who, what, v, none_ok=False):
    if v is None and none_ok:
        return v
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError("%s: %s must be a positive int%s, got %r"
                         % (who, what, " or None" if none_ok else "", v))
    return v


class Trainer:
    """What training is, over a model: batches and micro-batches, the memory plan, the optimizer
    and its state, the rollback copy, the history of a fit.

    Trainer(model, loss_fn, optimizer=None, batch_size=16, micro_batch=None, input_shape=None,
            lr=1e-3, exclude=None, names=None)

    optimizer: an optimizer over the parameters to train, or None: Adam(lr) over the model's
      trainable parameters, made on the first step (`exclude`: {id(param): 1} of parameters to
      leave out of it; `names`: [(name, param)] for its messages).
    micro_batch: rows per forward/backward; a batch of batch_size rows then runs as micro-batches
      whose parameter gradients add up to the batch's (each micro-batch's loss gradient is scaled
      by rows/batch) before one optimizer step: the step of the whole batch, up to float
      summation order. None: the whole batch, unless fit(micro_batch='auto') picks one.
    input_shape: the model's input per example (a tuple); batches of flat rows [B, n] are viewed
      as [B, *input_shape] (no copy). None: as the data gives them.
    recompute: a memory choice for the model's EncoderBlocks (EncoderBlock.recompute; the same
      results, bit for bit): True computes the FFN's activation output and the pre-norm
      LayerNorms' outputs again in backward (and runs a large attention backward item by item),
      False keeps them (fewer instructions per sample, more activation memory). None: the fit
      chooses from the memory plan: keep when the micro-batch's plan with everything kept fits
      the free heap (always under CPython, where there is no heap to measure), else recompute;
      with micro_batch='auto' the micro-batch is picked with the recomputes on and the buffers
      are kept when the whole batch then fits with them. The fit's verbose line says which.
    checkpoint: the model's EncoderBlock.checkpoint for each fit (the same results, bit for bit;
      one more block forward per step): True / False as asked; None: the blocks as they are,
      and when they can run checkpointed (pre-norm, no dropout) and are off, the memory plan
      switches them on for a fit whose step does not fit the free heap without it and does with
      it (micro_batch='auto': when not even one row fits with its headroom otherwise), says so in
      the fit's verbose line, and switches them back off when the fit ends (last_checkpoint: True
      when the last fit ran so).

    fit(data, epochs, ...) trains; plan(batch) says what a step needs (bytes) before it runs;
    snapshot() / restore() copy the trainable state (weights, optimizer state, step count, lr)
    aside and back; logits(X) and evaluate(data) run the model in eval mode."""

    def __init__(self, model, loss_fn, optimizer=None, batch_size=16, micro_batch=None,
                 input_shape=None, lr=1e-3, exclude=None, names=None, recompute=None, checkpoint=None):
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.batch_size = _check_count("Trainer", "batch_size", batch_size)
        self.micro_batch = _check_count("Trainer", "micro_batch", micro_batch, True)
        if recompute is not None and recompute is not True and recompute is not False:
            raise ValueError("Trainer: recompute must be None, True or False, got %r" % (recompute,))
        self.recompute = recompute       # None: chosen from the memory plan by each fit
        if checkpoint is not None and checkpoint is not True and checkpoint is not False:
            raise ValueError("Trainer: checkpoint must be None, True or False, got %r" % (checkpoint,))
        self.checkpoint = checkpoint     # None: the blocks' own, or switched on by the plan (memplan)
        self._ckpt = []                  # the EncoderBlocks this trainer's plan switched checkpoint on in
        self.last_checkpoint = False     # the last fit ran with them switched on by the plan
        self._chose = None               # (batch, micro) of choose_micro('auto'), for the fit after it
        self.input_shape = None if input_shape is None else tuple(input_shape)
        self.lr = lr
        self.exclude = exclude or {}
        self.names = names
        self.settle_gc_bytes = SETTLE_GC_BYTES   # MicroPython: collect every so many bytes until the first step is done (None: never)
        self.rollback = False            # the caller takes a snapshot() before each fit (the plan counts it)
        self._views = {}
        self._snap = None
        self._settle = None
        self._loss = 0.0
        self._correct = 0
        self._X = self._Y = self._xv = self._yv = None
        self._micro = None
        self._auto = False
        self._verbose = False
        self._row_shape = None
        self._probed = None              # memplan: the activations measured at 1 and 4 rows, per recompute
        self.last_rows = None            # rows per forward of the last fit (its buffers' size)
        self._labels = None              # a data set's labels for those probes

    # ---- the optimizer and its parameters -----------------------------------------------

    def params(self):
        """The (param, grad) pairs this trainer trains: the model's trainable ones, less `exclude`."""
        out = []
        for pair in self.model.collect_params([]):
            if id(pair[0]) not in self.exclude:
                out.append(pair)
        return out

    def collect_params(self, groups):
        """Appends params() to `groups` (the layer contract's collect_params, for code that takes
        a model, such as microformer.guard)."""
        groups.extend(self.params())
        return groups

    def make_optimizer(self):
        """The optimizer (made now when there is none yet: Adam over params()). ValueError when
        nothing trains."""
        if self.optimizer is None:
            params = self.params()
            if not params:
                raise ValueError("Trainer: every parameter is frozen; unfreeze something first")
            self.optimizer = Adam(params, lr=self.lr, names=self.names)
        return self.optimizer

    # ---- rollback: the trainable state, copied aside and back ---------------------------

    def snapshot(self):
        """Copy the trainable state aside: the weights the optimizer updates, its state (Adam's
        m and v), its step count and lr. One block of `numel` floats for the weights and one per
        state slot (blocks of the optimizer's own size: a fragmented heap finds room for them
        where it has room for the optimizer), made on the first snapshot of an optimizer and
        reused."""
        opt = self.make_optimizer()
        K = backend.K
        blocks = opt.state_blocks()
        n = opt.numel
        snap = self._snap
        if snap is None or snap[0] is not opt:
            self._snap = None
            snap = [opt, [zeros(n) for _ in range(1 + len(blocks))], 0, 0.0]
        mv = memoryview(snap[1][0])
        o = 0
        for p, _ in opt.params:
            K.copy(mv[o:o + p.size], p.data, p.size)
            o += p.size
        for j in range(len(blocks)):
            K.copy(snap[1][j + 1], blocks[j], n)
        snap[2] = opt.steps
        snap[3] = opt.lr
        self._snap = snap

    def restore(self):
        """Put the state of the last snapshot() back (weights, optimizer state, steps, lr). A
        Ctrl-C during the copy is held until the copy is complete, then raised."""
        if self._snap is None:
            raise ValueError("Trainer.restore: no snapshot taken (snapshot() first)")
        held = None
        while True:
            try:
                self._put()
                break
            except KeyboardInterrupt as e:
                held = e
        if held is not None:
            raise held

    def _put(self):
        opt, saved, steps, lr = self._snap
        K = backend.K
        mv = memoryview(saved[0])
        o = 0
        for p, _ in opt.params:
            # a view of the weights: the portable copy assigns a slice, which an array takes
            # only from an array
            K.copy(memoryview(p.data), mv[o:o + p.size], p.size)
            o += p.size
        blocks = opt.state_blocks()
        for j in range(len(blocks)):
            K.copy(blocks[j], saved[j + 1], opt.numel)
        opt.steps = steps
        opt.lr = lr

    def has_snapshot(self):
        """Is there a rollback copy of the current optimizer's state?"""
        return self._snap is not None and self._snap[0] is self.optimizer

    def drop_snapshot(self):
        """Free the rollback copy."""
        self._snap = None

    # ---- memory: the plan (memplan.py, loaded on first use) -----------------------------

    def plan(self, batch=None, micro=None, show=False, recompute=None):
        """What a training step of `batch` rows in micro-batches of `micro` rows needs, in bytes,
        before anything is allocated (memplan.plan): a dict of the parts and the peak. recompute:
        with the model's EncoderBlocks recomputing (True) or keeping (False); None: as set now."""
        from .memplan import plan
        return plan(self, batch, micro, show, recompute)

    def probe_labels(self, rows):
        """Labels (or targets) for `rows` probe rows of the plan: the data's first ones (repeated
        when it has fewer), else class 0."""
        y = self._labels
        if y:
            return [y[i % len(y)] for i in range(rows)]     # fewer examples than rows: again
        return [0] * rows

    def use_data(self, data):
        """The data set the next fit and plan read (its row shape and labels)."""
        if self.input_shape is None and hasattr(data, "X"):
            self._row_shape = tuple(data.X.shape[1:])
        self._labels = getattr(data, "y", None)

    def pick_micro(self, batch, free):
        """The largest micro-batch (rows, <= batch) whose plan fits in `free` bytes, or None."""
        from .memplan import pick_micro
        return pick_micro(self, batch, free)

    def tried_micro(self, batch, free):
        """pick_micro, then checked by a forward + backward of that many rows in the heap as it
        is (memplan.tried_micro): a micro-batch to name in an out-of-memory message."""
        from .memplan import tried_micro
        return tried_micro(self, batch, free)

    def release(self):
        """Drop the layers' and the loss's buffers and the batch views (made again on the next
        pass): what a failed fit gives back."""
        release_buffers(self.model)
        release_buffers(self.loss_fn)
        self._views = {}
        self._X = self._Y = self._xv = self._yv = None
        drop_scratch()

    # ---- steps --------------------------------------------------------------------------

    def step(self, X, y):
        """One optimizer step over a batch (X [B, ...], y B labels or targets) in micro-batches;
        returns (mean loss, correct). All or nothing as optimizer.step() (optim.py)."""
        opt = self.make_optimizer()
        self.model.train()
        opt.zero_grad()
        self._X = X
        self._Y = y
        self._accumulate(len(y))
        self._X = self._Y = self._xv = self._yv = None
        opt.step()
        if self._settle is not None:
            self.unsettle()
        return self._loss, self._correct

    # The per-step methods keep their frames within MicroPython's 11 words (host/tools/frames.py): the
    # batch, its micro-batch views and the totals travel on self.
    def _accumulate(self, B):
        # the batch's gradients; with micro_batch='auto', a MemoryError (the heap is never one
        # free block: a plan that fits the free bytes may find no room for a large array) halves
        # the micro-batch and runs the batch again: nothing was written but grads, zeroed again
        while True:
            try:
                self._batch(B)
                return
            except MemoryError:
                if not self._smaller(B):
                    raise
                self.optimizer.zero_grad()

    def _smaller(self, B):
        m = self._micro or B
        if not self._auto or m <= 1:
            return False
        X, Y = self._X, self._Y
        self.release()
        self._X, self._Y = X, Y
        self._micro = self.last_rows = m // 2
        if self._verbose:
            print("fit: out of memory in micro-batches of %d rows: micro-batches of %d from here on "
                  "(the memory plan fitted the free heap, which was too fragmented)" % (m, m // 2))
        return True

    def _batch(self, B):
        self._loss = 0.0
        self._correct = 0
        m = self._micro or self.micro_batch or B
        s = 0
        while s < B:
            k = m if m < B - s else B - s
            self._part(s, k, B)
            s += k
        self._loss /= B

    def _part(self, s, k, B):
        # the micro-batch of rows s..s+k of the batch: forward, loss, backward (grads add up)
        self._view(s, k, B)
        logits = self.model.forward(self._xv)
        self._loss += self.loss_fn.forward(logits, self._yv) * k   # NonFiniteLossError: no update
        self._back(k, B)
        if getattr(self.loss_fn, "classifies", True):
            self._correct += _correct(logits, self._yv)

    def _back(self, k, B):
        # the loss's gradient is the mean over k rows: scaled by k / B, the micro-batches' grads
        # add up to the mean over the batch's B rows
        dy = self.loss_fn.backward()
        if k != B:
            backend.K.scale_inplace(dy.data, dy.size, k / B)
        _down(self.model, dy)

    def _view(self, s, k, B):
        # X rows s..s+k as the model's input shape, and their labels: views made once per
        # (batch, rows) and source buffer (an int key: no tuple per step); a batch whose rows are
        # not copied (data.BatchRows: micro-batches) copies these k rows into a buffer of k rows
        if self._X.data is None:
            self._gathered(s, k)
            return
        if s == 0 and k == B and self.input_shape is None:
            self._xv = self._X
            self._yv = self._Y
            return
        v = self._views.get((B << 20) | (s << 10) | k)
        if v is None or v[0] is not self._X.data:
            v = self._new_view(self._X, s, k, B)
        self._xv = v[1]
        self._yv = self._Y if k == B else self._labels_of(v[2], s, k)

    def _gathered(self, s, k):
        v = self._views.get(-k)               # the buffer of k rows (a negative key: no view's)
        if v is None:
            X = self._X
            v = [None, Tensor((k,) + (self.input_shape if self.input_shape is not None else X.shape[1:])), [0] * k]
            self._views[-k] = v
        self._X.gather(v[1].data, s, k)
        self._xv = v[1]
        self._yv = self._labels_of(v[2], s, k)

    def _labels_of(self, yv, s, k):
        y = self._Y
        for i in range(k):
            yv[i] = y[s + i]
        return yv

    def _new_view(self, X, s, k, B):
        F = X.size // B
        data = X.data if k == B else memoryview(X.data)[s * F:(s + k) * F]
        shape = (k,) + (self.input_shape if self.input_shape is not None else X.shape[1:])
        v = [X.data, Tensor(shape, data), [0] * k]
        if B < 1024 and k < 1024:
            self._views[(B << 20) | (s << 10) | k] = v
        return v

    def settle(self):
        """MicroPython: have the GC collect every settle_gc_bytes until the first step is done
        (the step's new buffers then land in order instead of among the garbage of their
        zeroed sources)."""
        th = getattr(gc, "threshold", None)
        if th is not None and self.settle_gc_bytes and self._settle is None:
            self._settle = th()
            th(self.settle_gc_bytes)

    def unsettle(self):
        """The GC threshold from before settle()."""
        if self._settle is not None:
            gc.threshold(self._settle)
            self._settle = None

    # ---- fit ----------------------------------------------------------------------------

    def fit(self, data, epochs=1, batch_size=None, micro_batch=None, seed=0, verbose=True,
            on_epoch=None, progress_s=5, keep=None, log=None, shrink=False):
        """Train on a Dataset (X [N, n], y) for `epochs`; see train.fit for the arguments and
        what it returns. batch_size / micro_batch: this fit's (None: the trainer's); micro_batch
        'auto' picks the largest micro-batch whose plan fits the free heap (MicroPython; under
        CPython the whole batch) and says so; when none fits, MemoryError names the numbers.
        A MemoryError inside a step of an 'auto' fit (or of any fit with shrink=True: a caller
        that chose the micro-batch with choose_micro itself) halves the micro-batch and runs the
        batch again.
        on_epoch(record) is called after each epoch; returning True stops the fit there.
        A fit that fails (any exception) drops the buffers it made, so the heap is as before."""
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 0:
            raise ValueError("fit: epochs must be a non-negative int, got %r" % (epochs,))
        B = _check_count("fit", "batch_size", batch_size or self.batch_size)
        if micro_batch is not None and micro_batch != "auto":
            _check_count("fit", "micro_batch", micro_batch)
        self.use_data(data)
        B = min(B, len(data)) if len(data) else B
        self._set_checkpoint()
        self.settle()                    # the plan's probes and the optimizer too (SETTLE_GC_BYTES)
        try:
            self._micro = self.choose_micro(B, micro_batch, verbose)
        except BaseException:            # refused: the threshold as it was
            self.unsettle()
            self._labels = None
            self.unset_checkpoint()
            raise
        self.last_checkpoint = bool(self._ckpt)
        self.last_rows = self._micro or B
        self._auto = micro_batch == "auto" or bool(shrink)
        self._verbose = verbose
        try:
            return self._fit(data, epochs, B, seed, verbose, on_epoch, progress_s, keep, log)
        except BaseException:
            self.unsettle()
            self.release()
            raise
        finally:
            self.unsettle()
            self._micro = None
            self._auto = False
            self._labels = None
            self.unset_checkpoint()

    def _set_checkpoint(self):
        # Trainer(checkpoint=True / False): every EncoderBlock's switch as asked, for each fit
        import sys
        if self.checkpoint is not None and "microformer.block" in sys.modules:
            from .memplan import blocks
            for b in blocks(self.model):
                b.checkpoint = self.checkpoint

    def unset_checkpoint(self):
        """The EncoderBlocks the memory plan switched checkpoint on in (choose_micro), back off:
        a fit does it when it ends; a caller that chose the micro-batch and then did not fit too."""
        if self._ckpt:
            from .memplan import set_checkpoint
            set_checkpoint(self, False)

    def choose_micro(self, B, micro, verbose=False):
        """The micro-batch a fit of batch B runs: `micro` itself unless it is 'auto'; then the
        largest whose plan fits the free heap (None under CPython: the whole batch). MemoryError
        with the plan when not even one row fits."""
        chose, self._chose = self._chose, None
        if micro != "auto":
            if chose != (B, micro):               # not the micro-batch 'auto' chose just now
                self._keep_or_recompute(B, micro or B, verbose)
            return micro
        if not hasattr(gc, "mem_free"):
            self._keep_or_recompute(B, B, verbose)
            return None
        from .memplan import choose_micro
        m = choose_micro(self, B, verbose)
        self._chose = (B, m)
        return m

    def _keep_or_recompute(self, B, m, verbose):
        # a fit at micro-batch m (given, or the whole batch): the model's EncoderBlocks keep their
        # buffers or recompute (recompute: the user's; None: from the memory plan, memplan)
        import sys
        if "microformer.block" not in sys.modules:     # no EncoderBlock anywhere: nothing to choose
            return
        from . import memplan
        free = memplan._free() if hasattr(gc, "mem_free") else None
        flag = memplan.choose_recompute(self, B, m, free)
        if free is not None:
            memplan.checkpoint_if_needed(self, B, m, free)
        if verbose and flag is not None and free is not None:
            print("fit: batch %d in %s%s" % (B, "one pass" if m >= B else "micro-batches of %d" % m,
                                             memplan._said(flag, self)))

    def _fit(self, data, epochs, B, seed, verbose, on_epoch, progress_s, keep, log):
        given = log is not None
        if not given:
            log = FitLog(keep)
        opt = self.make_optimizer()
        batches = Batches(data, B, Rng(seed + 1),
                          gathers_batch(B, self._micro or self.micro_batch, data.X.shape[1]))
        n_batches = (len(data) + B - 1) // B
        every_us = int(progress_s * 1000000) if verbose and progress_s else 0
        for epoch in range(1, epochs + 1):
            interrupted = self._epoch(batches, log, epoch, epochs, n_batches, every_us)
            rec = log.record(log.epochs - 1) if (verbose or on_epoch) else None
            if verbose:
                _epoch_line(self.loss_fn, rec, epoch, epochs, interrupted, opt, log)
            stop = on_epoch(rec) if on_epoch else None
            if interrupted or stop is True:
                break
        return log if given else log.records()

    def _epoch(self, batches, log, epoch, epochs, n_batches, every_us):
        opt = self.optimizer
        total = 0.0
        correct = 0
        seen = 0
        t0 = _us()
        said = t0
        interrupted = False
        s0 = opt.steps
        try:
            for X, y in batches:
                loss, c = self.step(X, y)
                total += loss * len(y)
                correct += c
                seen += len(y)
                if every_us and time_since(said) >= every_us:
                    said = _us()
                    k = opt.steps - s0
                    print("  epoch %d/%d: step %d/%d, loss %.4f, %.2f ms/step" % (
                        epoch, epochs, k, n_batches, total / seen, _elapsed(t0) / k))
        except KeyboardInterrupt:
            # the step in progress either never wrote a weight or was completed (optim.py)
            interrupted = True
        seen = seen or 1
        log.add(total / seen, correct / seen, opt.steps - s0, _elapsed(t0), interrupted)
        return interrupted

    # ---- evaluation ---------------------------------------------------------------------

    def logits(self, X):
        """The model's outputs for X [B, n] (viewed as the input shape) in eval mode."""
        B = X.shape[0]
        if self.input_shape is not None and X.shape[1:] != self.input_shape:
            X = Tensor((B,) + self.input_shape, X.data)
        return predict_logits(self.model, X)

    def evaluate(self, data, batch_size=32):
        """(accuracy, confusion) on a classification Dataset (see evaluate())."""
        return evaluate(self, data, batch_size)

    # evaluate() reads these
    def forward(self, X):
        return self.model.forward(X if self.input_shape is None or X.shape[1:] == self.input_shape
                                  else Tensor((X.shape[0],) + self.input_shape, X.data))

    def train(self, mode=True):
        self.model.train(mode)
        return self

    def eval(self):
        return self.train(False)


def _epoch_line(loss_fn, rec, epoch, epochs, interrupted, opt, log):
    line = "epoch %d/%d  loss %.4f  %s%.2f ms/step" % (
        epoch, epochs, rec["loss"],
        "acc %.1f%%  " % (100 * rec["acc"]) if getattr(loss_fn, "classifies", True) else "",
        rec["ms_per_step"])
    if hasattr(gc, "mem_free"):
        line += "  free %d" % gc.mem_free()
    if interrupted:
        line += ("  (interrupted: stopped after %d full steps; the weights are those of step %d)"
                 % (log.steps, opt.steps))
    print(line)


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
