# microformer.memplan: the memory plan of a training step, before anything is allocated
# (train.Trainer.plan): weights, grads, optimizer state, the rollback copy, the activations the
# layers keep for backward at the micro-batch, the batch's rows, and their sum, the peak. Loaded
# on first use: a session that never plans keeps it off the heap.
import gc

from .tensor import shape_size


def _count(who, what, v):
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError("%s: %s must be a positive int, got %r" % (who, what, v))
    return v


def _bytes(p):
    # bytes of a parameter's values (an int8 weight: its bytes and one float32 scale per row)
    if getattr(p, "int8", False) is True:
        return p.size + 4 * p.shape[0]
    return 4 * p.size


def plan(t, batch=None, micro=None, show=False):
    """The plan of a step of trainer `t` over `batch` rows (None: t.batch_size) in micro-batches
    of `micro` rows (None: t.micro_batch, else the whole batch), in bytes: a dict with batch,
    micro, weights, grads (the grad buffers that exist or that the optimizer will use),
    optimizer (its state, the step's shadow state and new weights: optim.state_floats),
    snapshot (the rollback copy: weights and state of the trainable parameters), activations
    (the layers' output, cache and gradient buffers at the micro-batch: cache_floats),
    batch_rows, and peak (their sum). show: print it (plan_text)."""
    batch = _count("plan", "batch", batch or t.batch_size)
    micro = min(batch, _count("plan", "micro", micro or t.micro_batch or batch))
    shape = t.input_shape if t.input_shape is not None else t._row_shape
    if shape is None:
        raise ValueError("plan: the trainer has no input shape yet (Trainer(input_shape=...), or fit once)")
    weights = 0
    grads = 0
    for p, g in t.model.params():
        weights += _bytes(p)
        if g.data is not None:
            grads += 4 * g.size
    opt = t.optimizer
    if opt is not None:
        n = opt.numel
        slots = len(opt.state_blocks())
        state = 4 * opt.state_floats()
    else:
        n = 0
        for p, _ in t.params():
            n += p.size
        slots = 2                                    # Adam: m and v
        state = 4 * n * (1 + 2 * slots)
    info = {"batch": batch, "micro": micro, "weights": weights, "grads": grads, "optimizer": state,
            "snapshot": 4 * n * (1 + slots),
            "activations": 4 * t.model.cache_floats((micro,) + tuple(shape)),
            "batch_rows": 4 * batch * shape_size(shape)}
    info["peak"] = (weights + grads + state + info["snapshot"] + info["activations"]
                    + info["batch_rows"])
    if show:
        print(plan_text(info))
    return info


def held(t):
    """Bytes of what a plan counts that exists already: weights, grads, the optimizer and its
    rollback copy."""
    h = 0
    for p, g in t.model.params():
        h += _bytes(p)
        if g.data is not None:
            h += 4 * g.size
    opt = t.optimizer
    if opt is not None:
        h += 4 * opt.state_floats()
        if t.has_snapshot():
            h += 4 * opt.numel * (1 + len(opt.state_blocks()))
    return h


def pick_micro(t, batch, free):
    """The largest micro-batch (rows <= batch: batch, batch/2, ... 1) whose plan, less what
    exists already, fits in `free` bytes; None when not even one row does."""
    have = held(t)
    m = batch
    while m >= 1:
        if plan(t, batch, m)["peak"] - have <= free:
            return m
        m //= 2
    return None


def _free():
    gc.collect()
    return gc.mem_free()


def choose_micro(t, B, verbose):
    # fit(micro_batch='auto') on MicroPython: the largest micro-batch that fits the free heap
    # (once the layers' buffers of an earlier pass are given back, when needed)
    free = _free()
    m = pick_micro(t, B, free)
    if m is None:
        t.release()
        free = _free()
        m = pick_micro(t, B, free)
    if m is None:
        raise MemoryError(refusal(plan(t, B, 1), free))
    if verbose and m < B:
        print("fit: batch %d in micro-batches of %d (the plan of a whole batch needs %d bytes more, "
              "%d are free)" % (B, m, plan(t, B, B)["peak"] - held(t), free))
    return m


def plan_text(info):
    """The memory plan (plan()) as one line: each part, then the peak."""
    return ("memory plan, batch %d in micro-batches of %d: weights %d, grads %d, optimizer %d, "
            "rollback copy %d, activations %d, batch %d; peak %d bytes"
            % (info["batch"], info["micro"], info["weights"], info["grads"], info["optimizer"],
               info["snapshot"], info["activations"], info["batch_rows"], info["peak"]))


def refusal(info, free):
    return ("fit refused before its first step: even micro-batches of 1 row need more than the "
            "free heap (%s; free %d bytes). Freeze more, use LoRA, or free memory"
            % (plan_text(info), free))
