# tests/mp/test_optim_fast.py: the whole-step optimizer kernels (adam_step, sgd_step, params_commit)
# that optim.py calls once per step for every tensor, INSIDE each MicroPython interpreter (the
# `micropython` fixture), against float64 NumPy written here from the math, and their portable and
# NumPy twins against the per-tensor kernels under CPython. Bounds (host/viper/optim.py):
#   adam_step  m' within 2^-13 (|m'| + |m| + |d|), v' within 2^-13 (|v'| + |v| + d^2), d = g + wd p
#              (coupled decay) or g; p' within 2^-11 |step| + 2^-22 |p'| (+ 2^-14 lr wd |p| for
#              AdamW's decay) of p - lr/bc1 m' / (sqrt(v'/bc2) + eps), m' and v' as written
#   sgd_step   as sgd_update: p within 2e-4 lr (|g| + wd|p| + mom|buf|) + 2^-23 |p|, buf within
#              2e-4 of the same magnitudes + its rounding
#   flags      the first tensor with a non-finite gradient, weight, buffer or result; the live
#              weights and state are only read (bit for bit unchanged), a size mismatch is refused
# and, on the 64-bit port, the int32 bounds (#!chk lines) hold on the same inputs (instrumented copy).
from array import array

import numpy as np
import pytest

import helpers
from test_viper import _instrumented
from test_viper_range import run_cases as _run_cases



def hx(a):
    return np.asarray(a, dtype=np.float32).tobytes().hex()


def unhx(h):
    return np.frombuffer(bytes.fromhex(h), dtype=np.float32).astype(np.float64)


def wide(rng, n, lo, hi, zeros=0.1):
    # full 24-bit float32 mantissas, magnitudes 2^lo .. 2^hi, both signs, some exact zeros
    x = rng.uniform(-2, 2, n) * 2.0 ** rng.integers(lo, hi, n)
    x[rng.random(n) < zeros] = 0.0
    return np.float32(x).astype(np.float64)


SIZES = (7, 64, 1, 33)


def adam_cases(seed):
    rng = np.random.default_rng(seed)
    cases = []
    for lr, b1, b2, eps, wd, dec, t in ((1e-3, 0.9, 0.999, 1e-8, 0.0, 0, 1), (1e-3, 0.9, 0.999, 1e-8, 0.0, 0, 7),
                                        (1e-2, 0.8, 0.99, 1e-6, 0.1, 0, 3), (1e-2, 0.9, 0.999, 1e-8, 0.1, 1, 2),
                                        (0.5, 0.0, 0.5, 1e-3, 0.0, 0, 1), (1.0, 0.9, 0.999, 1e-8, 0.9, 1, 50),
                                        (3e-4, 0.99, 0.9999, 1e-8, 1e-4, 0, 1000)):
        n = sum(SIZES)
        g = wide(rng, n, -60, 60)
        g[:5] = [2.0 ** 60, -2.0 ** 60, 2.0 ** -60, 1e-30, -3e-38]        # the extremes of the range
        m = np.float32(0.1 * wide(rng, n, -60, 60))
        m[rng.random(n) < 0.3] = 0.0                                      # first steps: m = v = 0
        v = np.float32(np.abs(g) * np.abs(wide(rng, n, -20, 20)))
        v[m == 0] = 0.0
        p = wide(rng, n, -12, 12)
        cases.append({"kind": "adam", "lr": lr, "b1": b1, "b2": b2, "eps": eps, "wd": wd, "dec": dec, "t": t,
                      "p": split(p), "g": split(g), "m": hx(m), "v": hx(v)})
    return cases


def sgd_cases(seed):
    rng = np.random.default_rng(seed)
    cases = []
    for lr, mom, wd in ((0.01, 0.0, 0.0), (0.1, 0.9, 0.0), (1e-3, 0.9, 0.01), (0.5, 0.0, 0.1)):
        n = sum(SIZES)
        cases.append({"kind": "sgd", "lr": lr, "mom": mom, "wd": wd, "p": split(wide(rng, n, -60, 60)),
                      "g": split(wide(rng, n, -60, 60)), "b": hx(wide(rng, n, -60, 60))})
    return cases


def split(x):
    out, o = [], 0
    for n in SIZES:
        out.append(hx(x[o:o + n]))
        o += n
    return out


def joined(hs):
    return np.concatenate([unhx(h) for h in hs])


def run_cases(cases, micropython, tmp_path, checked_dir=None):
    # tests/mp/optim_cases_mp.py on the cases (the viper range tests' runner)
    return _run_cases(cases, micropython, tmp_path, checked_dir, "optim_cases_mp.py")


def f32(x):
    return np.float32(x).astype(np.float64)


def check_adam(c, r):
    """The bounds at the top of this file; returns the worst error / bound per quantity."""
    assert r["flag"] == -1 and r["live_same"], (c["lr"], r["flag"])
    p, g = joined(c["p"]), joined(c["g"])
    m, v = unhx(c["m"]), unhx(c["v"])
    b1, b2, lr, wd, t = f32(c["b1"]), f32(c["b2"]), c["lr"], c["wd"], c["t"]
    d = g + wd * p if (wd and not c["dec"]) else g
    dmag = np.abs(g) + (wd * np.abs(p) if (wd and not c["dec"]) else 0.0)
    gm, gv, gp = unhx(r["m"]), unhx(r["v"]), unhx(r["p"])
    worst = {}

    def check(name, got, want, bound):
        e = np.abs(got - want)
        assert np.all(e <= bound), "%s (lr %g wd %g dec %d t %d): error / bound up to %.3g at %d" % (
            name, lr, wd, c["dec"], t, float((e / bound).max()), int(np.argmax(e / bound)))
        worst[name] = float((e / bound).max())

    want_m = b1 * m + (1 - b1) * d
    check("m", gm, want_m, 2.0 ** -13 * (np.abs(gm) + np.abs(m) + dmag) + 2.0 ** -126)
    want_v = b2 * v + (1 - b2) * d * d
    check("v", gv, want_v, 2.0 ** -13 * (np.abs(gv) + v + dmag * dmag) + 2.0 ** -126)
    bc1, bc2 = 1.0 - c["b1"] ** t, 1.0 - c["b2"] ** t
    pd = p - lr * wd * p if (wd and c["dec"]) else p
    step = lr / bc1 * gm / (np.sqrt(gv / bc2) + c["eps"])
    bound = 2.0 ** -11 * np.abs(step) + 2.0 ** -22 * np.abs(pd - step) + 2.0 ** -126
    if wd and c["dec"]:
        bound = bound + 2.0 ** -14 * lr * wd * np.abs(p)
    check("p", gp, pd - step, bound)
    assert r["committed"] == r["p"]               # params_commit: the new weights, bit for bit
    return worst


def test_adam_step_bounds(micropython, tmp_path):
    cases = adam_cases(31)
    res = run_cases(cases, micropython, tmp_path)
    worst = {}
    for c, r in zip(cases, res, strict=True):
        for k, w in check_adam(c, r).items():
            worst[k] = max(worst.get(k, 0.0), w)
    print("adam_step error / bound:", {k: round(w, 3) for k, w in worst.items()})


def test_sgd_step_bounds(micropython, tmp_path):
    cases = sgd_cases(32)
    res = run_cases(cases, micropython, tmp_path)
    worst = 0.0
    for c, r in zip(cases, res, strict=True):
        assert r["flag"] == -1 and r["live_same"] and r["committed"] == r["p"]
        p, g, b = joined(c["p"]), joined(c["g"]), unhx(c["b"])
        lr, mom, wd = f32(c["lr"]), f32(c["mom"]), f32(c["wd"])
        mag = np.abs(g) + wd * np.abs(p) + (mom * np.abs(b) if c["mom"] else 0)
        d = g + wd * p + (mom * b if c["mom"] else 0)
        want = p - lr * d
        got = unhx(r["p"])
        bound = 2e-4 * lr * mag + 2.0 ** -23 * np.abs(want) + 2.0 ** -126
        worst = max(worst, float((np.abs(got - want) / bound).max()))
        assert np.all(np.abs(got - want) <= bound), (c["lr"], c["mom"], c["wd"])
        if c["mom"]:
            gb = unhx(r["b"])
            assert np.all(np.abs(gb - d) <= 2e-4 * mag + 2.0 ** -24 * np.abs(d) + 2.0 ** -126)
    print("sgd_step error / bound: %.3g" % worst)


def test_int32_bounds_instrumented(micropython, tmp_path):
    """Every `#!chk` intermediate of the step kernels stays below 2^31 on the same inputs (the
    instrumented copy raises OverflowError otherwise); meaningful on the 64-bit port, where ints do
    not wrap: on the 32-bit port a wrap would already break the bounds above."""
    cases = adam_cases(33) + sgd_cases(34)
    res = run_cases(cases, micropython, tmp_path, _instrumented(tmp_path))
    for c, r in zip(cases, res, strict=True):
        assert r["flag"] == -1 and r["live_same"]
        if c["kind"] == "adam":
            check_adam(c, r)


def flag_cases():
    rng = np.random.default_rng(35)
    out = []
    n = sum(SIZES)
    base = {"lr": 1e-3, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "wd": 0.0, "dec": 0, "t": 3}
    for what, k, where, val in (("g", 1, 5, np.nan), ("g", 2, 0, np.inf), ("g", 3, 32, -np.inf),
                                ("p", 1, 63, np.inf), ("g", 2, 0, 1e21), ("p", 3, 1, np.nan)):
        p = wide(rng, n, -3, 3)
        g = wide(rng, n, -10, 0)
        x = {"p": p, "g": g}[what]
        off = sum(SIZES[:k])
        x[off + where] = val                  # 1e21: its square overflows v
        out.append(dict(base, kind="adam", p=split(p), g=split(g), m=hx(np.zeros(n)), v=hx(np.zeros(n)), want=k))
        out.append({"kind": "sgd", "lr": 0.1, "mom": 0.9, "wd": 0.0, "p": split(p), "g": split(g),
                    "b": hx(np.zeros(n)), "want": k if val != 1e21 else -1})
    p = wide(rng, n, -3, 3)
    p[3] = 3e38                               # SGD: p - lr g overflows float32
    g = wide(rng, n, -3, 3)
    g[3] = -1e38
    out.append({"kind": "sgd", "lr": 10.0, "mom": 0.0, "wd": 0.0, "p": split(p), "g": split(g), "b": "", "want": 0})
    return out


def test_non_finite_is_flagged_and_nothing_is_written(micropython, tmp_path):
    cases = flag_cases()
    res = run_cases(cases, micropython, tmp_path)
    for c, r in zip(cases, res, strict=True):
        assert r["flag"] == c["want"], (c["kind"], c["want"], r["flag"])
        assert r["live_same"], c["kind"]


MISMATCH = r'''
from array import array
import microformer as mf
from microformer import kernels_viper as V
a = mf.Tensor((3,)); b = mf.Tensor((3,))
b.data = array('f', [0.0] * 2)               # a gradient replaced by a shorter buffer
H = [1e-3, 0.9, 0.999, 1e-8, 0.0, 0, 1]
for f in (lambda: V.adam_step(array('f', [0.0] * 3), [array('f', [0.0] * 3), array('f', [0.0] * 3)], [(a, b)],
                              [array('f', [0.0] * 3), array('f', [0.0] * 3)], H),
          lambda: V.sgd_step(array('f', [0.0] * 3), [], [(a, b)], [], [0.1, 0.0, 0.0]),
          lambda: V.adam_step(array('f', [0.0] * 2), [array('f', [0.0] * 3), array('f', [0.0] * 3)], [(a, a)],
                              [array('f', [0.0] * 3), array('f', [0.0] * 3)], H),
          lambda: V.params_commit([(a, a)], array('f', [0.0] * 2), 1)):
    try:
        f()
        print("NO ERROR")
    except ValueError as e:
        print("ValueError", e)
'''


def test_size_mismatch_is_refused(micropython, tmp_path):
    s = tmp_path / "mm.py"
    s.write_text(MISMATCH)
    out = helpers.run_micropython(s, exe=micropython).split("\n")
    lines = [x for x in out if x]
    assert len(lines) == 4 and all(x.startswith("ValueError ") for x in lines), out
    assert "adam_step: a parameter or gradient does not match" in lines[0]
    assert "sgd_step: a parameter or gradient does not match" in lines[1]


RECORD = r'''
from array import array
import microformer as mf
mf.set_backend("viper")
for kind in ("adam", "sgd"):
    for which in (0, 1):                 # the weight's buffer, then the gradient's
        a = mf.Tensor((4,)); b = mf.Tensor((4,))
        for i in range(4):
            a.data[i] = 0.5 + i
            b.data[i] = 0.25 - 0.125 * i
        opt = mf.Adam([(a, b)], lr=1e-2) if kind == "adam" else mf.SGD([(a, b)], lr=1e-2, momentum=0.9)
        opt.step()                       # the step records the buffers whose sizes it checked
        opt.step()
        t = (a, b)[which]
        old = bytes(t.data)
        t.data = array("f", [0.5] * 4)   # a new buffer of the same size: read, and recorded
        before = bytes(a.data)
        opt.step()
        print("SAME", kind, which, opt.steps, bytes(a.data) != before)
        t.data = array("f", [0.5] * 3)   # a shorter one: refused, nothing written
        before = bytes(a.data)
        try:
            opt.step()
            print("NO ERROR", kind, which)
        except ValueError as e:
            print("SHORT", kind, which, opt.steps, bytes(a.data) == before, str(e).split(":")[0])
from microformer import viper_optim
print("KEPT", [x for x in viper_optim._REC if x != ()])     # no buffer held between steps
'''


def test_replaced_buffers_are_checked_again(micropython, tmp_path):
    """The step keeps a record of the buffers whose sizes it checked and skips their len() calls
    the next time: a weight or gradient whose buffer was replaced is checked again (a shorter one
    is refused with nothing written, not read or written past its end). The kernel module holds
    no buffer between steps, refused ones included."""
    s = tmp_path / "record.py"
    s.write_text(RECORD)
    out = helpers.run_micropython(s, exe=micropython)
    rows = [line.split() for line in out.splitlines() if line.strip()]
    assert len(rows) == 9 and rows.pop() == ["KEPT", "[]"], out
    for i, kind in enumerate(["adam", "adam", "sgd", "sgd"]):
        same, short = rows[2 * i], rows[2 * i + 1]
        which = str(i % 2)
        assert same == ["SAME", kind, which, "3", "True"], out
        assert short == ["SHORT", kind, which, "3", "True", kind + "_step"], out


FROZEN = r'''
import microformer as mf
from microformer.models import iris_model
mf.set_backend(BACKEND)
for kind in ("adam", "sgd", "adam clipped"):
    model = iris_model(1)
    x = mf.Tensor((16, 4))
    for i in range(64):
        x.data[i] = (i % 7) / 7.0 - 0.5
    if kind == "sgd":
        opt = mf.SGD(model, lr=1e-2, momentum=0.9)
    else:
        opt = mf.Adam(model, lr=1e-2, max_grad_norm=1.0 if kind == "adam clipped" else None)
    lf = mf.CrossEntropyLoss()
    for _ in range(2):                   # steps that record the buffers they checked
        opt.zero_grad()
        lf.forward(model.forward(x), [i % 3 for i in range(16)])
        model.backward(lf.backward())
        opt.step()
    model.layers[-1].trainable = False   # frozen after the optimizer was made
    st = opt.buffers if kind == "sgd" else opt.m + opt.v
    before = [bytes(p.data) for _, p in model.named_params()] + [bytes(t.data) for t in st]
    try:
        opt.step()
        print("NO ERROR", kind)
    except ValueError as e:
        st = opt.buffers if kind == "sgd" else opt.m + opt.v
        after = [bytes(p.data) for _, p in model.named_params()] + [bytes(t.data) for t in st]
        print("REFUSED", kind.replace(" ", "_"), opt.steps, after == before, str(e))
'''


@pytest.mark.parametrize("backend", ["viper", "python"])
def test_frozen_after_the_optimizer_is_refused(micropython, tmp_path, backend):
    """The whole-step kernels answer STEP_FROZEN for a pair without a grad buffer (the step no
    longer walks the pairs in Python first): the step names the parameter, nothing changes."""
    s = tmp_path / "frozen.py"
    s.write_text("BACKEND = %r\n" % backend + FROZEN)
    out = helpers.run_micropython(s, exe=micropython)
    rows = [line.split(" ", 4) for line in out.splitlines() if line.strip()]
    assert [r[:4] for r in rows] == [["REFUSED", k, "2", "True"] for k in ("adam", "sgd", "adam_clipped")], out
    for r in rows:
        assert "was frozen after the optimizer was made" in r[4] and r[4].split(":")[0] in ("Adam", "SGD"), out


HYPER = r'''
import microformer as mf
from microformer.models import iris_model
mf.set_backend("viper")
# entries 1, 2, 4, 5, 6, 7 each differ from the one before in one hyperparameter: weight_decay,
# decoupled, beta1, beta2, eps, lr; an entry is (lr, beta1, beta2, eps, weight_decay, decoupled)
# (the step compares objects: every entry takes its numbers from these names)
L1, L2, A1, A2, C1, C2, E1, E2, W0, W1 = 1e-2, 3e-3, 0.9, 0.8, 0.999, 0.99, 1e-8, 1e-3, 0.0, 0.1
KW = [(L1, A1, C1, E1, W0, False), (L1, A1, C1, E1, W1, False), (L1, A1, C1, E1, W1, True),
      (L2, A1, C1, E1, W0, False), (L2, A2, C1, E1, W0, False), (L2, A2, C2, E1, W0, False),
      (L2, A2, C2, E2, W0, False), (L1, A2, C2, E2, W0, False)]


def run(order):
    # one model and Adam per KW entry, stepped in the given order of entries; their weights
    models, opts = [], []
    for kw in KW:
        m = iris_model(1)
        x = mf.Tensor((16, 4))
        for i in range(64):
            x.data[i] = (i % 7) / 7.0 - 0.5
        lf = mf.CrossEntropyLoss()
        lf.forward(m.forward(x), [i % 3 for i in range(16)])
        m.backward(lf.backward())
        models.append(m)
        opts.append(mf.Adam(m, lr=kw[0], betas=(kw[1], kw[2]), eps=kw[3], weight_decay=kw[4], decoupled=kw[5]))
    for k in order:
        opts[k].step()
        if k == 0 and opts[0].steps == 2:
            opts[0].lr = 2e-2            # a schedule: the same optimizer, another lr
    return [b"".join(bytes(p.data) for _, p in m.named_params()) for m in models]


n = len(KW)
apart = run([k for k in range(n) for _ in range(3)])
mixed = run([k for _ in range(3) for k in range(n)])
print("SAME", [a == b for a, b in zip(apart, mixed)])
print("DIFFER", len(set(apart)) == n)
'''


def test_hyperparameters_are_taken_at_every_step(micropython, tmp_path):
    """The step keeps its hyperparameters in fixed point and makes them again only when one of
    them changed: optimizers that differ in one hyperparameter each (and a schedule that sets
    lr), stepped in turn, give the same weights as each stepped on its own."""
    s = tmp_path / "hyper.py"
    s.write_text(HYPER)
    out = helpers.run_micropython(s, exe=micropython)
    assert "SAME [True, True, True, True, True, True, True, True]" in out and "DIFFER True" in out, out


# ---- the portable and NumPy twins are the per-tensor kernels, bit for bit (CPython) ----------

def _twin_case(seed, kind):
    rng = np.random.default_rng(seed)
    from microformer.tensor import Tensor
    ps = []
    for n in SIZES:
        ps.append((Tensor((n,), array("f", np.float32(rng.normal(size=n)).tolist())),
                   Tensor((n,), array("f", np.float32(rng.normal(size=n) * 0.1).tolist()))))
    N = sum(SIZES)
    st = [array("f", np.float32(rng.normal(size=N) * 0.01).tolist()),
          array("f", np.float32(np.abs(rng.normal(size=N)) * 1e-3).tolist())]
    return ps, st, N


@pytest.mark.parametrize("mod", ["kernels", "kernels_numpy"])
@pytest.mark.parametrize("kind,hyper", [("adam", (1e-3, 0.9, 0.999, 1e-8, 0.0, 0)), ("adam", (1e-2, 0.8, 0.99, 1e-6, 0.1, 0)),
                                        ("adam", (1e-2, 0.9, 0.999, 1e-8, 0.1, 1)), ("sgd", (0.05, 0.9, 0.01)),
                                        ("sgd", (0.1, 0.0, 0.0))])
def test_twins_equal_the_per_tensor_kernels(mod, kind, hyper):
    import importlib
    K = importlib.import_module("microformer." + mod)
    ps, st, N = _twin_case(7, kind)
    newp = array("f", [0.0] * N)
    news = [array("f", [0.0] * N), array("f", [0.0] * N)]
    if kind == "adam":
        lr, b1, b2, eps, wd, dec = hyper
        bc1, bc2 = 1 - b1 ** 3, 1 - b2 ** 3
        assert K.adam_step(newp, news, ps, st, [lr, b1, b2, eps, wd, dec, 3]) == -1
    else:
        lr, mom, wd = hyper
        assert K.sgd_step(newp, news[:1] if mom else [], ps, st[:1] if mom else [], [lr, mom, wd]) == -1
    o = 0
    for p, g in ps:
        n = p.size
        pc, m, v = array("f", p.data), array("f", st[0][o:o + n]), array("f", st[1][o:o + n])
        if kind == "adam":
            K.adam_update(pc, g.data, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, dec)
            assert bytes(m) == bytes(news[0][o:o + n]) and bytes(v) == bytes(news[1][o:o + n])
        else:
            K.sgd_update(pc, g.data, m if mom else None, n, lr, mom, wd)
            if mom:
                assert bytes(m) == bytes(news[0][o:o + n])
        assert bytes(pc) == bytes(newp[o:o + n])
        o += n
    before = [bytes(p.data) for p, _ in ps]
    K.params_commit(ps, newp, len(ps))
    assert b"".join(bytes(p.data) for p, _ in ps) == bytes(newp) and before != [bytes(p.data) for p, _ in ps]


COPIES = r'''
from array import array
import microformer as mf
from microformer import kernels_viper as V
bad = []
for n in (0, 1, 2, 3, 4, 5, 7, 8, 9, 33, 64):
    src = array('f', [i * 1.5 - 3.0 for i in range(n)] + [7.0])
    dst = array('f', [9.0] * (n + 1))
    V.copy(dst, src, n)
    if list(dst[:n]) != list(src[:n]) or dst[n] != 9.0:
        bad.append(("copy", n))
    sizes = (n + 1, 3, n + 2)
    ps = [(mf.Tensor((k,)), mf.Tensor((k,))) for k in sizes]
    new = array('f', [i + 0.25 for i in range(sum(sizes))] + [5.0])
    V.params_commit(ps, new, len(ps))
    if b''.join(bytes(p.data) for p, _ in ps) != bytes(new[:sum(sizes)]):
        bad.append(("params_commit", n))
print("BAD", bad)
'''


def test_copies_of_every_length(micropython, tmp_path):
    """copy and params_commit move four words per turn: every length (the tails included) is
    copied bit for bit, and nothing past it is written."""
    s = tmp_path / "cp.py"
    s.write_text(COPIES)
    assert helpers.run_micropython(s, exe=micropython).split("\n")[0] == "BAD []"


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("where", ["grad", "weight", "result"])
def test_twins_flag_the_first_non_finite_tensor(kind, where):
    """The NumPy twins update every tensor at once: they still flag the first pair that holds a
    non-finite gradient, weight or result, as the portable kernels do, for each pair in turn."""
    from microformer import kernels, kernels_numpy
    for k in range(len(SIZES)):
        flags = []
        for K in (kernels, kernels_numpy):
            ps, st, N = _twin_case(11, kind)
            lr = 1e-3
            if where == "grad":
                ps[k][1].data[SIZES[k] - 1] = float("nan")
            elif where == "weight":
                ps[k][0].data[0] = float("-inf")
            else:                                  # a finite weight the step takes past float32's range
                ps[k][0].data[0] = -3.4e38
                ps[k][1].data[0] = 1.0
                lr = 1e38
            if k + 1 < len(SIZES):                 # a later pair's bad gradient does not hide it
                ps[k + 1][1].data[0] = float("inf")
            newp = array("f", [0.0] * N)
            news = [array("f", [0.0] * N), array("f", [0.0] * N)]
            with np.errstate(over="ignore", invalid="ignore"):     # the overflow is the point
                if kind == "adam":
                    flags.append(K.adam_step(newp, news, ps, st, [lr, 0.9, 0.999, 1e-8, 0.0, 0, 1]))
                else:
                    flags.append(K.sgd_step(newp, news[:1], ps, st[:1], [lr, 0.9, 0.0]))
        assert flags == [k, k], (where, k, flags)


@pytest.mark.parametrize("mod", ["kernels", "kernels_numpy"])
def test_twins_step_no_pairs(mod):
    """An optimizer over no parameters (a model whose every layer is frozen) steps: nothing to
    update, nothing flagged."""
    import importlib
    K = importlib.import_module("microformer." + mod)
    e = array("f")
    assert K.adam_step(e, [e, e], [], [e, e], [1e-3, 0.9, 0.999, 1e-8, 0.0, 0, 1]) == -1
    assert K.sgd_step(e, [e], [], [e], [0.1, 0.9, 0.0]) == -1
    assert K.sgd_step(e, [], [], [], [0.1, 0.0, 0.0]) == -1
