# The memory plan's checkpoint switch (Trainer(checkpoint=None), memplan.checkpoint_if_needed):
# runs under CPython and inside MicroPython, directly
#   MICROPYPATH=lib:tests/mp micropython tests/mp/checkpoint_choice_mp.py [BACKEND]
# bits: two fit steps of a two-EncoderBlock model with checkpoint True, False and chosen give the
#   same weights, bit for bit; as asked the blocks stay so, chosen they are off after the fit;
# choice (MicroPython: a heap to measure): free bytes between the plan with checkpointed blocks
#   and the plan without switch them on, more or fewer leave them off, Trainer(checkpoint=False)
#   and a model with dropout never; a fit whose free heap (memplan._free) fits only the
#   checkpointed plan runs checkpointed, says so, the same bits, and ends with the blocks off (also
#   when one row fits either plan only without its headroom): prints "CKPT CHOICE OK" and
#   "CKPT FIT OK <micro-batch>" for each; a fit whose plan without checkpoint cannot be probed
#   (a MemoryError) runs checkpointed: "CKPT NOPROBE OK <micro-batch>".
import gc
import sys

import microformer as mf
from microformer import memplan
from microformer.data import Dataset
from microformer.train import Trainer

if len(sys.argv) > 1 and sys.argv[1] != "-":
    mf.set_backend(sys.argv[1])


def model(dropout=0.0):
    mf.seed(3)
    return mf.Sequential([mf.Reshape((6, 4)), mf.Dense(4, 16), mf.EncoderBlock(16, 2, 32, dropout=dropout),
                          mf.EncoderBlock(16, 2, 32, dropout=dropout), mf.GlobalAvgPool(), mf.Dense(16, 3)])


def data(n):
    r = mf.Rng(5)
    X = mf.Tensor((n, 24))
    for i in range(X.size):
        X.data[i] = r.signed_unit()
    return Dataset(X, [i % 3 for i in range(n)], ["a", "b", "c"])


def flags(m):
    return [b.checkpoint for b in (m.layers[2], m.layers[3])]


def weights(m):
    return [bytes(p.data) for p, _ in m.params()]


def run(flag, micro=None):
    m = model()
    t = Trainer(m, mf.CrossEntropyLoss(), None, 8, micro, None, 1e-3, checkpoint=flag)
    t.fit(data(16), epochs=1, verbose=False)
    return weights(m), flags(m)


def bits():
    a, fa = run(True)
    b, fb = run(False)
    c, fc = run(None)
    assert fa == [True, True] and fb == [False, False] and fc == [False, False], (fa, fb, fc)
    assert a == b and a == c, "checkpoint changed the results"
    print("CKPT BITS OK")
    return a


def needs(t, B, m):
    # the free bytes the plan needs with the blocks off and on (set by hand, then back off)
    have = memplan.held(t)
    off = memplan.fits_need(t.plan(B, m), have)
    for b in memplan.blocks(t.model):
        b.checkpoint = True
    on = memplan.fits_need(t.plan(B, m), have)
    for b in memplan.blocks(t.model):
        b.checkpoint = False
    return int(off), int(on)


def choice():
    m = model()
    t = Trainer(m, mf.CrossEntropyLoss(), None, 8, None, None, 1e-3)
    t.fit(data(16), epochs=1, verbose=False)
    off, on = needs(t, 8, 8)
    assert on < off, "checkpointed blocks plan no less: %d >= %d" % (on, off)
    assert memplan.checkpoint_if_needed(t, 8, 8, (on + off) // 2) is True
    assert flags(m) == [True, True], flags(m)
    assert "EncoderBlock.checkpoint on" in memplan.plan_text(t.plan(8, 8))
    memplan.set_checkpoint(t, False)
    assert flags(m) == [False, False]
    assert memplan.checkpoint_if_needed(t, 8, 8, off) is False and flags(m) == [False, False]
    assert memplan.checkpoint_if_needed(t, 8, 8, on - 1) is False and flags(m) == [False, False]
    t.checkpoint = False
    assert memplan.checkpoint_if_needed(t, 8, 8, (on + off) // 2) is False and flags(m) == [False, False]
    d = model(0.1)
    td = Trainer(d, mf.CrossEntropyLoss(), None, 8, None, None, 1e-3)
    td.fit(data(16), epochs=1, verbose=False)
    assert memplan.can_checkpoint(d) == []
    assert memplan.checkpoint_if_needed(td, 8, 8, 1) is False and flags(d) == [False, False]
    print("CKPT CHOICE OK")


def fit_tight(micro, loose=False):
    # a fit whose free heap (as memplan reads it) fits the checkpointed plan and not the other;
    # loose: micro_batch='auto' with free bytes for one row of either plan only without the
    # headroom (fits(..., 1.0)): the checkpointed one, the smaller, is chosen
    m = model()
    t = Trainer(m, mf.CrossEntropyLoss(), None, 8, None, None, 1e-3)
    t.use_data(data(16))
    t.make_optimizer().zero_grad()
    memplan.set_recompute(m, True)
    off, on = needs(t, 8, 1 if micro == "auto" else micro)
    free = (on + off) // 2
    if loose:
        free = t.plan(8, 1)["peak"] - memplan.held(t)     # one row, blocks off, no headroom
        assert free < on, "the checkpointed row fits with its headroom: %d >= %d" % (free, on)
    real = memplan._free
    memplan._free = lambda: free
    seen = []
    try:
        # a caller that chose the micro-batch and then did not fit (the board session refusing
        # the fit after the plan) puts the blocks back with unset_checkpoint
        t.choose_micro(8, micro)
        chosen = flags(m)
        t.unset_checkpoint()
        assert chosen == [True, True] and flags(m) == [False, False], (chosen, flags(m))
        t.fit(data(16), epochs=1, verbose=True, micro_batch=micro, on_epoch=lambda r: seen.append(flags(m)))
    finally:
        memplan._free = real
    assert t.last_checkpoint is True and seen == [[True, True]], (t.last_checkpoint, seen)
    assert flags(m) == [False, False], flags(m)
    want, _ = run(False, t.last_rows)                    # the same micro-batches, not checkpointed
    assert weights(m) == want, "a checkpointed fit changed the results"
    print("CKPT FIT OK %s" % (t.last_rows,))


def fit_no_room_to_probe():
    # micro_batch='auto' where the blocks' buffers without checkpoint cannot even be probed (a
    # MemoryError, made here): the checkpointed plan is probed and the fit runs with it
    m = model()
    t = Trainer(m, mf.CrossEntropyLoss(), None, 8, None, None, 1e-3)
    real = memplan.probe

    def probe(t, rows, shape):
        if not any(memplan.checkpoints(t.model)):
            raise MemoryError("no room to probe (made by the test)")
        return real(t, rows, shape)
    memplan.probe = probe
    try:
        t.fit(data(16), epochs=1, verbose=True, micro_batch="auto")
    finally:
        memplan.probe = real
    assert t.last_checkpoint is True and flags(m) == [False, False], (t.last_checkpoint, flags(m))
    print("CKPT NOPROBE OK %s" % (t.last_rows,))


if __name__ == "__main__":
    bits()
    if hasattr(gc, "mem_free"):
        choice()
        fit_tight(8)
        fit_tight("auto")
        fit_tight("auto", True)
        fit_no_room_to_probe()
