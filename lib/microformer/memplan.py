# microformer.memplan: the memory plan of a training step, before its buffers are allocated
# (train.Trainer.plan): weights, grads, optimizer state, the rollback copy, the activations the
# layers keep for backward at the micro-batch, the batch's rows, and their sum, the peak. Loaded
# on first use: a session that never plans keeps it off the heap.
#
# The activations are measured, not declared: on MicroPython the plan runs the model's forward
# and backward over 1 and PROBE_ROWS rows (after one warm-up pass, with the layers' buffers and
# the viper kernels' scratch released before each) and reads the live heap each leaves
# (gc.mem_alloc). Every buffer a layer makes is about a + b * rows, so two probes give the
# buffers of any micro-batch, whatever the layers keep (the code that makes the buffers is the
# one fact). The probes draw no dropout mask that training
# would see (the dropout generators are put back) and their gradients are cleared by the step's
# zero_grad. Under CPython (no heap to measure) the plan reads the layers' declared
# cache_floats instead and says so ('declared').
import gc

from .layer import Buffered, _epoch, drop_scratch, train_backward
from .tensor import Rng, Tensor, has_grad, shape_size


def _count(who, what, v):
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError("%s: %s must be a positive int, got %r" % (who, what, v))
    return v


def _bytes(p):
    # bytes of a parameter's values (an int8 weight: its bytes and one float32 scale per row)
    if getattr(p, "int8", False) is True:
        return p.size + 4 * p.shape[0]
    return 4 * p.size


def plan(t, batch=None, micro=None, show=False, recompute=None):
    """The plan of a step of trainer `t` over `batch` rows (None: t.batch_size) in micro-batches
    of `micro` rows (None: t.micro_batch, else the whole batch), with the model's EncoderBlocks
    recomputing in backward (recompute True) or keeping their buffers (False; None: as they are
    set now), in bytes: a dict with batch, micro, recompute (None: the model has no such switch),
    checkpoint (True when the model's EncoderBlocks run checkpointed: EncoderBlock.checkpoint),
    weights, grads (the grad buffers that exist or that the optimizer will use),
    optimizer (its state blocks and the step's scratch: optim.state_floats),
    snapshot (the rollback copy of the trainable weights and state, when the trainer has one or
    takes one: t.rollback), activations
    (the layers' output, cache and gradient buffers at the micro-batch: cache_floats),
    batch_rows, and peak (their sum). show: print it (plan_text)."""
    batch = _count("plan", "batch", batch or t.batch_size)
    micro = min(batch, _count("plan", "micro", micro or t.micro_batch or batch))
    shape = t.input_shape if t.input_shape is not None else t._row_shape
    if shape is None:
        raise ValueError("plan: the trainer has no input shape yet (Trainer(input_shape=...), or fit once)")
    weights, grads = _params(t)
    opt = t.optimizer
    if opt is not None:
        n = opt.numel
        slots = len(opt.state_blocks())
        state = 4 * opt.state_floats()
    else:
        from .optim import scratch_stretch
        sizes = [p.size for p, _ in t.params()]
        n = sum(sizes)
        slots = 2                                    # Adam: m and v
        state = 4 * (n * slots + scratch_stretch(sizes) * (1 + slots))   # as optim.state_floats
    acts = activations(t, micro, shape, recompute)
    # the rollback copy: the one there is, or the one a trainer with rollback on will take
    snap = 4 * n * (1 + slots) if (t.rollback or t.has_snapshot()) else 0
    info = {"batch": batch, "micro": micro, "recompute": acts[2], "checkpoint": checkpoint_of(t.model),
            "weights": weights, "grads": grads,
            "optimizer": state,
            "snapshot": snap, "activations": acts[0], "how": acts[1],
            "batch_rows": 4 * _rows(batch, micro, shape) * shape_size(shape)}
    info["peak"] = (weights + grads + state + info["snapshot"] + info["activations"]
                    + info["batch_rows"])
    if show:
        print(plan_text(info))
    return info


def _rows(batch, micro, shape):
    # the rows a fit copies at a time: the batch's, or one micro-batch's (data.gathers_batch)
    from .data import gathers_batch
    return batch if gathers_batch(batch, micro, shape_size(shape)) else micro


# rows of the second probe: a little non-linear (kernels that work in chunks of rows), the
# buffers of 1 and 4 rows extrapolate within 2 % to 16 rows where 1 and 2 rows were 12 % over
PROBE_ROWS = 4


def activations(t, rows, shape, recompute=None):
    """(bytes, how, recompute) of the buffers a forward + backward over `rows` rows makes, with
    the model's recompute switch set to `recompute` for the measure (None: as it is; it is put
    back after): measured by two probes on MicroPython ('measured'), the layers' cache_floats under
    CPython ('declared'). The probes are made once per switch setting, shape and model change."""
    was = recompute_of(t.model)
    if recompute is None or was is None:
        recompute = was
    elif recompute != was:
        set_recompute(t.model, recompute)
    try:
        return _activations(t, rows, shape) + (recompute,)
    finally:
        if recompute != was:
            set_recompute(t.model, was)


def _activations(t, rows, shape):
    if not hasattr(gc, "mem_alloc"):
        return 4 * t.model.cache_floats((rows,) + tuple(shape)), "declared"
    pr = t._probed
    if pr is None:
        pr = t._probed = {}
    # measured again after a freeze or a new part (layer.changed), per recompute and checkpoint setting
    sw = (recompute_of(t.model), checkpoints(t.model))
    key = (tuple(shape), _epoch[0], sw)
    got = pr.get(sw)
    if got is None or got[0] != key:
        rngs, states = _generators(t.model)
        try:
            probe(t, 1, shape)                    # warm-up: kernels loaded on first use
            one = probe(t, 1, shape)
            q = PROBE_ROWS
            slope = None
            while slope is None and q > 1:
                try:
                    slope = (probe(t, q, shape) - one) / (q - 1)
                except MemoryError:               # no room for q rows: fewer
                    t.release()
                    q //= 2
            if slope is None:
                slope = one
        finally:
            _put_back(rngs, states)
            t.release()
        got = pr[sw] = (key, one, slope)
    return int(got[1] + got[2] * (rows - 1)), "measured"


# ---- the recompute switch: what the model's EncoderBlocks compute again in backward ---------------

def blocks(model):
    """The EncoderBlocks inside `model` (their `recompute` switch is the trainer's memory choice)."""
    import sys
    m = sys.modules.get("microformer.block")      # not loaded: the model has none
    out = []
    if m is not None:
        _blocks(model, m.EncoderBlock, out, {})
    return out


def _blocks(obj, cls, out, seen):
    if id(obj) in seen:
        return
    seen[id(obj)] = 1
    if isinstance(obj, cls):
        out.append(obj)
        return
    for x in getattr(obj, "layers", None) or ():
        _blocks(x, cls, out, seen)
    sub = getattr(obj, "sublayers", None)
    if sub is not None:
        for x in sub():
            _blocks(x, cls, out, seen)


def recompute_of(model):
    """True when the model's EncoderBlocks recompute in backward, False when they keep, None when
    it has none. ValueError when they differ (a trainer sets them all alike)."""
    got = None
    for b in blocks(model):
        if got is None:
            got = b.recompute
        elif b.recompute != got:
            raise ValueError("memory plan: the model's EncoderBlocks differ in recompute (%r and %r); "
                             "set them alike or let the trainer choose" % (got, b.recompute))
    return got


def set_recompute(model, flag):
    """Every EncoderBlock of `model` to recompute = flag (a memory choice: the results are the same
    bits either way)."""
    for b in blocks(model):
        b.recompute = flag


# ---- the checkpoint switch: EncoderBlock.checkpoint (its backward runs its forward again; every
# block shares one set of forward buffers) switched on by the trainer when a step fits the free
# heap with it and not without it. Only the trainer's own switch is undone (at the fit's end), and
# only blocks that can run checkpointed (pre-norm, no dropout) and are all off are switched.

def checkpoints(model):
    """The model's EncoderBlocks' checkpoint switches, a tuple (empty: it has none)."""
    return tuple(b.checkpoint for b in blocks(model))


def checkpoint_of(model):
    """True when every EncoderBlock of the model runs checkpointed, False when none does, None when
    it has none or they differ."""
    c = checkpoints(model)
    if not c:
        return None
    if all(c):
        return True
    return False if not any(c) else None


def can_checkpoint(model):
    """The EncoderBlocks the plan may switch checkpoint on in: every one of the model's, when each is
    pre-norm, has no dropout and is off now; else []."""
    bs = blocks(model)
    for b in bs:
        if b.checkpoint or not b.norm_first or b.dropout > 0.0:
            return []
    return bs


def set_checkpoint(t, flag):
    """Trainer t's checkpoint switch: True switches on every block can_checkpoint() gives (t._ckpt
    holds them; True when it did), False switches the ones t switched back off."""
    if flag:
        bs = can_checkpoint(t.model)
        for b in bs:
            b.checkpoint = True
        t._ckpt = bs
        return bool(bs)
    for b in t._ckpt:
        b.checkpoint = False
    t._ckpt = []
    return False


def fits_now(t, B, m, free):
    """Does the plan of B rows in micro-batches of m fit `free` bytes (fits(), the headroom counted)
    with the switches as they are? False when there is no room to probe."""
    try:
        return fits(plan(t, B, m), held(t), free)
    except MemoryError:
        t.release()
        return False


def checkpoint_if_needed(t, B, m, free):
    """A fit of B rows at micro-batch m whose plan does not fit `free` bytes: EncoderBlock.checkpoint
    switched on when the plan then fits (True), else left off (False). Only with
    Trainer(checkpoint=None) and blocks that can (can_checkpoint)."""
    if t.checkpoint is not None or not can_checkpoint(t.model) or fits_now(t, B, m, free):
        return False
    set_checkpoint(t, True)
    if fits_now(t, B, m, free):
        return True
    return set_checkpoint(t, False)


def choose_recompute(t, B, micro, free):
    """The recompute setting a step of B rows in micro-batches of `micro` runs with, and set it:
    t.recompute when the user set it (True / False); else keep (False) when the plan with every
    buffer kept fits `free` bytes (fits(); free None: no heap to measure, under CPython), and
    recompute (True) when it does not. None when the model has no switch."""
    if recompute_of(t.model) is None:
        return None
    flag = t.recompute
    if flag is None and free is None:
        flag = False
    elif flag is None:
        try:
            flag = not fits(plan(t, B, micro, False, False), held(t), free)
        except MemoryError:                       # no room to probe the kept buffers: recompute
            t.release()
            flag = True
    set_recompute(t.model, flag)
    return flag


def probe(t, rows, shape):
    """Live heap bytes (MicroPython) that a training forward + backward over `rows` zero rows
    leaves: the layers' and the loss's buffers and what they refer to."""
    x = Tensor((rows,) + tuple(shape))
    y = t.probe_labels(rows)
    t.release()
    drop_scratch()
    gc.collect()
    a = gc.mem_alloc()
    t.model.train()
    logits = t.model.forward(x)
    t.loss_fn.forward(logits, y)
    train_backward(t.model, t.loss_fn.backward())
    logits = None
    gc.collect()
    return gc.mem_alloc() - a


def _generators(model):
    # the model's dropout generators and their states: a probe draws no mask training would see
    rngs = []
    _rngs(model, rngs, {})
    return rngs, [r.state for r in rngs]


def _put_back(rngs, states):
    for i in range(len(rngs)):
        rngs[i].state = states[i]


def _rngs(obj, out, seen):
    # the random generators inside a model (dropout masks), each once
    if id(obj) in seen:
        return
    seen[id(obj)] = 1
    d = getattr(obj, "__dict__", None)
    if not d:
        return
    for name in d:
        v = d[name]
        if isinstance(v, Rng):
            out.append(v)
        elif isinstance(v, Buffered):
            _rngs(v, out, seen)
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, Buffered):
                    _rngs(x, out, seen)


def _params(t):
    # (bytes of the model's weights, bytes of the grad buffers they hold now)
    weights = 0
    grads = 0
    for p, g in t.model.params():
        weights += _bytes(p)
        if has_grad(g):                         # held, or made by the first backward
            grads += 4 * g.size
    return weights, grads


def held(t):
    """Bytes of what a plan counts that exists already: weights, grads, the optimizer and its
    rollback copy. Grad buffers count once made (the first backward makes them)."""
    from .layer import grad_floats
    h = _params(t)[0] + 4 * grad_floats(t.model)
    opt = t.optimizer
    if opt is not None:
        h += 4 * opt.state_floats()
        if t.has_snapshot():
            h += 4 * opt.numel * (1 + len(opt.state_blocks()))
    return h


# A plan fits when what it adds to the heap is free, its activations and batch rows counted
# HEADROOM times: the heap is never one free block, and the largest arrays of a step (a layer's
# output at the micro-batch) need room in one piece (on the 32-bit port, Iris at 120 rows in
# micro-batches of 60 failed with 12 % and with 25 % to spare after a failed fit). The optimizer's
# state blocks and the grads are made before the micro-batch is picked (choose_micro), so they
# are held, not planned, when it is.
HEADROOM = 1.5


def fits(info, have, free, headroom=HEADROOM):
    """Does plan `info` fit `free` bytes when `have` bytes of it are held already: what it adds,
    its activations and batch rows counted `headroom` times?"""
    return fits_need(info, have, headroom) <= free


def fits_need(info, have, headroom=HEADROOM):
    """The free bytes plan `info` needs to fit (fits()) when `have` bytes of it are held."""
    big = info["activations"] + info["batch_rows"]
    return info["peak"] - have - big + big * headroom


def pick_micro(t, batch, free):
    """The largest micro-batch (rows <= batch: batch, batch/2, ... 1) whose plan fits in `free`
    bytes (fits()); else 1 when one row's plan fits without the headroom (a heap that has the
    bytes may well have the room: the step tells, and a failed step gives its memory back);
    None when not even that."""
    have = held(t)
    m = batch
    while m >= 1:
        info = plan(t, batch, m)
        if fits(info, have, free):
            return m
        m //= 2
    return 1 if fits(info, have, free, 1.0) else None


def tried_micro(t, batch, free):
    """The largest micro-batch whose plan fits `free` bytes (pick_micro) and whose forward +
    backward then runs in the heap as it is (a probe over that many zero rows, halved on a
    MemoryError: a plan that fits the free bytes may find no room for one of its arrays in a
    fragmented heap); None when none does. For a message that names a micro-batch to retry with:
    the probe leaves the weights and the dropout generators as they were, and its buffers and
    gradients go (the next step zeroes the gradients)."""
    m = pick_micro(t, batch, free)
    shape = t.input_shape if t.input_shape is not None else t._row_shape
    rngs, states = _generators(t.model)
    try:
        while m:
            try:
                probe(t, m, shape)
                return m
            except MemoryError:
                t.release()
                m //= 2
        return None
    finally:
        _put_back(rngs, states)
        t.release()


def _free():
    gc.collect()
    return gc.mem_free()


def choose_micro(t, B, verbose):
    # fit(micro_batch='auto') on MicroPython: the optimizer's blocks and the grads first (every
    # micro-batch needs them; made now they are contiguous before the step's buffers come), then
    # the largest micro-batch that fits the free heap (once the layers' buffers of an earlier
    # pass are given back, when needed). Refused: the optimizer made here is dropped again.
    # With a recompute switch the trainer chooses (t.recompute None), the micro-batch is picked
    # with the recomputes on (the smaller plan), then the buffers are kept when the whole batch
    # fits with them kept (fewer instructions per sample, the same results).
    made = t.optimizer is None
    was = recompute_of(t.model)
    try:
        t.make_optimizer().zero_grad()
        if was is not None:
            set_recompute(t.model, True if t.recompute is None else t.recompute)
        free = _free()
        ck = t.checkpoint is None and can_checkpoint(t.model)
        try:
            m = pick_micro(t, B, free)
            if m is None:
                t.release()
                free = _free()
                m = pick_micro(t, B, free)
        except MemoryError:                       # no room to probe one row: checkpointed, if it can
            if not ck:
                raise
            t.release()
            free = _free()
            m = None
        if ck and (m is None or not fits_now(t, B, m, free)):
            # not even one row fits with its headroom: checkpointed blocks (a smaller plan), when a
            # micro-batch then fits (pick_micro: one row without the headroom at least)
            set_checkpoint(t, True)
            c = pick_micro(t, B, free)
            if c is not None:
                m = c
            else:
                set_checkpoint(t, False)
        flag = None
        if m is not None and was is not None:
            if m == B:                            # keep, when the whole batch fits with it
                flag = choose_recompute(t, B, m, free)
            else:
                flag = t.recompute is not False
    except MemoryError:
        m = None
    if m is None:
        set_checkpoint(t, False)
        if made:
            t.optimizer = None
        t.release()
        why = refusal(t, B)                       # (the plan with the switch as the pick had it)
        if was is not None:
            set_recompute(t.model, was)
        raise MemoryError(why)
    if flag is not None:
        set_recompute(t.model, flag)
    if verbose and m < B:
        print("fit: batch %d in micro-batches of %d%s (the plan of a whole batch needs %d bytes more, "
              "%d are free)" % (B, m, _said(flag, t), plan(t, B, B)["peak"] - held(t), free))
    elif verbose and flag is not None:
        print("fit: batch %d in one pass%s (%s)" % (B, _said(flag, t), _why(t, B, flag, free)))
    return m


def _why(t, B, flag, free):
    # why a whole batch recomputes or keeps (a fit's line)
    if t.recompute is not None:
        return "as asked: recompute=%r" % (t.recompute,)
    if not flag:
        return "the plan with every buffer kept fits the free heap"
    return ("the plan with every buffer kept needs %d bytes more, %d are free"
            % (plan(t, B, B, False, False)["peak"] - held(t), free))


def _said(flag, t=None):
    # the recompute choice in a fit's line (None: the model has no switch), and the checkpoint
    # switch when the plan turned it on
    if flag is None:
        return ""
    return ((", activations recomputed in backward" if flag else ", activations kept (no recompute)")
            + (", EncoderBlock.checkpoint on (the plan without it does not fit)" if t is not None and t._ckpt else ""))


def plan_text(info):
    """The memory plan (plan()) as one line: each part, then the peak."""
    r = info.get("recompute")
    return ("memory plan, batch %d in micro-batches of %d: weights %d, grads %d, optimizer %d, "
            "rollback copy %d, activations %d (%s%s%s), batch %d; peak %d bytes"
            % (info["batch"], info["micro"], info["weights"], info["grads"], info["optimizer"],
               info["snapshot"], info["activations"], info["how"],
               "" if r is None else "; recomputed in backward" if r else "; kept, no recompute",
               "; EncoderBlock.checkpoint on" if info.get("checkpoint") else "",
               info["batch_rows"], info["peak"]))


def refusal(t, B):
    """The message of a fit refused before its first step: the plan at micro-batches of 1 row
    (or why there is none) and the free heap."""
    free = _free()
    try:
        text = plan_text(plan(t, B, 1))
    except MemoryError:
        t.release()
        free = _free()
        text = "no room left to make the memory plan"
    return ("fit refused before its first step: even micro-batches of 1 row need more than the "
            "free heap (%s; free %d bytes). Freeze more, use LoRA, or free memory" % (text, free))
