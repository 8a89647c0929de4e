# microformer.guard on a tiny classifier, under CPython and inside MicroPython:
#   MICROPYPATH=lib:board:board/demos:board/benchmarks:tests/mp micropython tests/mp/guard_mp.py
# Prints GUARD OK or raises AssertionError (tests/mp/test_guard.py runs it on every interpreter).
import microformer as mf
from microformer import guard
from microformer.data import Dataset
from microformer.tensor import Rng, Tensor
from microformer.train import evaluate, fit


def blobs(n, seed, flip=False):
    # two classes in 2 features: class k around (2k - 1, 0); flip swaps the labels
    rng = Rng(seed)
    X = Tensor((n, 2))
    y = []
    for i in range(n):
        k = i % 2
        X.data[2 * i] = 2 * k - 1 + rng.uniform(-0.5, 0.5)
        X.data[2 * i + 1] = rng.uniform(-0.5, 0.5)
        y.append(1 - k if flip else k)
    return Dataset(X, y, ["a", "b"])


def net(seed=1):
    mf.seed(seed)
    return mf.Sequential([mf.Dense(2, 6), mf.ActivationLayer("relu"), mf.Dense(6, 2)])


def weights(model):
    return [bytes(p.data) for p, _ in model.collect_params([])]


def trained(epochs=30):
    m = net()
    fit(m, mf.CrossEntropyLoss(), mf.Adam(m, lr=0.05), blobs(40, 1), epochs=epochs, batch_size=8,
        verbose=False)
    return m


def run():
    r = {}
    # rehearsal: round(ratio * n) distinct rows of the base, sorted, seeded, capped at the base
    a = guard.rehearsal(100, 5, 4, 7)
    r["rehearsal"] = (len(a), len(set(a)), a == sorted(a), min(a) >= 0 and max(a) < 100,
                      guard.rehearsal(100, 5, 4, 7) == a, len(guard.rehearsal(10, 5, 4, 7)),
                      guard.rehearsal(100, 5, 0, 7))
    t, v = guard.holdout(20, 0.2, 3)
    r["holdout"] = (len(t), len(v), sorted(t + v) == list(range(20)), guard.holdout(5, 0.2, 3))

    # a fit on flipped labels: every epoch leaves validation worse -> rolled back, bit for bit
    m = trained()
    before = weights(m)
    val = blobs(20, 2)
    acc0 = evaluate(m, val)[0]
    g = guard.Guard(m, mf.CrossEntropyLoss(), val, 0.025, "rollback", 8)
    bad = blobs(40, 3, flip=True)
    g.start(bad)
    worse = []

    def on_epoch(rec):
        g.on_epoch(rec)
        worse.append(g.last.acc < acc0 - 0.025)

    fit(m, mf.CrossEntropyLoss(), mf.Adam(m, lr=0.3), bad, epochs=3, batch_size=8, verbose=False,
        on_epoch=on_epoch)
    moved = weights(m) != before
    what, text = g.finish()
    r["worse"] = (moved and worse == [True] * 3, what, weights(m) == before, evaluate(m, val)[0] == acc0,
                  text)

    # the same with on_worse='keep': the best epoch stays, and the text says it is worse
    m = trained()
    before = weights(m)
    g = guard.Guard(m, mf.CrossEntropyLoss(), val, 0.025, "keep", 8)
    g.start(bad)
    fit(m, mf.CrossEntropyLoss(), mf.Adam(m, lr=0.3), bad, epochs=3, batch_size=8, verbose=False,
        on_epoch=g.on_epoch)
    what, text = g.finish()
    r["keep"] = (what, weights(m) != before, text)

    # the best epoch: the weights put back are those of the epoch validation liked best
    m = net(2)
    seen = {}
    g = guard.Guard(m, mf.CrossEntropyLoss(), val, 0.025, "rollback", 8)
    g.start(blobs(40, 1))

    def on_epoch(rec):
        g.on_epoch(rec)
        seen[rec["epoch"]] = (weights(m), evaluate(m, val)[0])

    fit(m, mf.CrossEntropyLoss(), mf.Adam(m, lr=0.05), blobs(40, 1), epochs=6, batch_size=8,
        verbose=False, on_epoch=on_epoch)
    what, text = g.finish()
    top = max(acc for _, acc in seen.values())
    last_top = max(e for e in seen if seen[e][1] == top)     # ties: the later epoch
    r["best"] = (what, g.best_epoch == last_top, weights(m) == seen[last_top][0], text)

    # divergence: an epoch whose training loss is over DIVERGE x the start stops the fit (the
    # weights are moved by hand, as a run-away step would), and finish() puts back the weights
    m = trained()
    before = weights(m)
    g = guard.Guard(m, mf.CrossEntropyLoss(), val, 0.025, "rollback", 8)
    g.start(blobs(40, 1))
    limit = g.limit()
    for p, _ in m.collect_params([]):
        for i in range(p.size):
            p.data[i] = p.data[i] * -3.0
    try:
        g.on_epoch({"epoch": 1, "loss": 1.01 * limit, "steps": 5})
        stopped = None
    except guard.Diverged as e:
        stopped = str(e)
    calm = guard.Guard(m, mf.CrossEntropyLoss(), val, 0.025, "rollback", 8)
    calm.start(blobs(40, 1))
    calm.on_epoch({"epoch": 1, "loss": 0.99 * calm.limit(), "steps": 5})    # under the limit: no stop
    what, text = g.finish()
    r["diverged"] = (stopped, limit >= guard.DIVERGE * guard.LOSS_FLOOR, what, weights(m) == before, text)

    # the copy: one block of the trainable parameters (4 bytes each)
    m = net()
    n = 2 * 6 + 6 + 6 * 2 + 2
    r["nbytes"] = (guard.Guard(m, mf.CrossEntropyLoss(), val).nbytes(), 4 * n)

    # bad arguments name themselves
    errs = []
    for kw in ({"on_worse": "maybe"}, {"tol": -1}, {"tol": "x"}):
        try:
            guard.Guard(m, mf.CrossEntropyLoss(), val, **kw)
            errs.append("no error")
        except ValueError as e:
            errs.append(str(e))
    r["errors"] = errs
    return r


def check(r):
    reh = r["rehearsal"]
    assert reh[:5] == (20, 20, True, True, True) and reh[5] == 10 and reh[6] == [], r["rehearsal"]
    h = r["holdout"]
    assert h[:3] == (16, 4, True) and h[3] == ([0, 1, 2, 3, 4], []), h
    moved, what, same, acc_same, text = r["worse"]
    assert moved and what == "rollback" and same and acc_same, r["worse"]
    assert "worse than before" in text and "2.5 points" in text, text
    what, moved, text = r["keep"]
    assert what == "best" and moved and "on_worse='keep'" in text, r["keep"]
    what, best_ok, weights_ok, text = r["best"]
    assert what == "best" and best_ok and weights_ok and "kept epoch" in text, r["best"]
    stopped, floor, what, same, text = r["diverged"]
    assert stopped is not None and floor and what == "rollback" and same, r["diverged"]
    assert "diverged at epoch 1" in text, text
    got, want = r["nbytes"]
    assert got == want, r["nbytes"]
    e = r["errors"]
    assert "on_worse must be one of 'rollback', 'keep', got 'maybe'" in e[0], e
    assert "tol must be a number in [0, 1], got -1" in e[1] and "got 'x'" in e[2], e


if __name__ == "__main__":
    check(run())
    print("GUARD OK")
