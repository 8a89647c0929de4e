# The trainer's recompute choice (Trainer(recompute=None)): runs under CPython and inside
# MicroPython, directly
#   MICROPYPATH=lib:tests/mp micropython tests/mp/recompute_choice_mp.py [BACKEND]
# bits: two fit steps of a two-EncoderBlock model with recompute True, False and chosen give the
#   same weights, bit for bit, and the blocks are set as asked;
# choice: on MicroPython, a heap with room keeps the buffers (fit(micro_batch='auto') and a fit of
#   the whole batch), and a heap whose free bytes are below the plan with them kept recomputes:
#   prints "CHOICE <kept-free heap choice> <tight heap choice>".
import gc
import sys

import microformer as mf
from microformer.data import Dataset
from microformer.train import Trainer

if len(sys.argv) > 1 and sys.argv[1] != "-":
    mf.set_backend(sys.argv[1])


def model():
    mf.seed(3)
    return mf.Sequential([mf.Reshape((6, 4)), mf.Dense(4, 16), mf.EncoderBlock(16, 2, 32),
                          mf.EncoderBlock(16, 2, 32), mf.GlobalAvgPool(), mf.Dense(16, 3)])


def data(n):
    r = mf.Rng(5)
    X = mf.Tensor((n, 24))
    for i in range(X.size):
        X.data[i] = r.signed_unit()
    return Dataset(X, [i % 3 for i in range(n)], ["a", "b", "c"])


def run(flag, micro=None):
    m = model()
    t = Trainer(m, mf.CrossEntropyLoss(), None, 8, micro, None, 1e-3, recompute=flag)
    t.fit(data(16), epochs=1, verbose=False)
    return [bytes(p.data) for p, _ in m.params()], [b.recompute for b in (m.layers[2], m.layers[3])]


def bits():
    a, fa = run(True)
    b, fb = run(False)
    c, _ = run(None)
    assert fa == [True, True] and fb == [False, False], (fa, fb)
    assert a == b and a == c, "recompute changed the results"
    print("BITS OK")


def choice():
    if not hasattr(gc, "mem_free"):
        print("CHOICE - -")
        return
    m = model()
    t = Trainer(m, mf.CrossEntropyLoss(), None, 8, None, None, 1e-3)
    ds = data(16)
    t.fit(ds, epochs=1, micro_batch="auto", verbose=True)
    roomy = m.layers[2].recompute
    from microformer import memplan
    keep = t.plan(8, 8, False, False)
    again = t.plan(8, 8, False, True)
    assert keep["activations"] > again["activations"], (keep["activations"], again["activations"])
    have = memplan.held(t)
    # free bytes between the two plans' needs: keep does not fit, recompute does
    free = (memplan.fits_need(keep, have) + memplan.fits_need(again, have)) // 2
    tight = memplan.choose_recompute(t, 8, 8, free)
    print("CHOICE %s %s" % ("keep" if roomy is False else "recompute",
                            "keep" if tight is False else "recompute"))


if __name__ == "__main__":
    bits()
    choice()
