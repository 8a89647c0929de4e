# tests/mp/test_viper_decode_range.py: the viper kernels of the decode path (residual add, positional
# encoding add, embedding lookup and gradient, KV store, attention_decode, LayerNorm forward, GELU
# in both forms, argmax) over the float32 range, INSIDE each MicroPython interpreter (the
# `micropython` fixture: stock 64-bit and the 32-bit port), against float64 NumPy written here from
# the math. The bounds are the ones stated next to the kernels (host/viper/*.py, kernels_viper.py):
#   add / posenc add / embedding grad  the float32 sum bit for bit (ties to even); subnormal
#                                      operands count as 0, sums below 2^-126 flush to 0
#   embedding lookup, KV store         bit copies; a bad id is reported at the portable index
#   attention_decode                   weights as attention_forward's softmax; out within
#                                      1e-3 max_j |v[b, j, col]|
#   layernorm forward                  mean 2^-23 max|x|; rstd 2e-4 rstd*; y within
#                                      4e-4 |xhat* w| + 2^(1-P) max|x| rstd* |w| + 2^-23 |y*|
#                                      + 2^-126, P = min(24, 29 - clog2 C)
#   layernorm backward                 dinp within 1e-3 rstd max_c |dout_c w_c| (per row);
#                                      dweight within 2e-4 sum_n |dout xhat| + its roundings;
#                                      dbias the float32 sums; a non-finite row gives NaN
#   gelu, gelu_tanh                    y within 1e-5 |x| + 1e-4 |y*|; dinp within
#                                      5e-5 |dout| + 1e-4 |dinp*|
#   dropout_apply, scale_inplace       the float32 product bit for bit (a subnormal factor as 0,
#                                      products below 2^-126 flushed); dropped outputs +0
# and the int32 bounds (#!chk lines) of those kernels hold on the same inputs (instrumented copy).
import math

import numpy as np
import pytest

from test_viper import _instrumented
from test_viper_range import run_cases as _run_cases


def run_cases(cases, micropython, tmp_path, checked_dir=None):
    # the decoding kernels' driver: tests/mp/decode_cases_mp.py
    return _run_cases(cases, micropython, tmp_path, checked_dir, "decode_cases_mp.py")


def hx(a):
    return np.asarray(a, dtype=np.float32).tobytes().hex()


def unhx(h, dtype=np.float32):
    return np.frombuffer(bytes.fromhex(h), dtype=dtype)


def wide(rng, n, lo=-126, hi=127):
    # full 24-bit mantissas, magnitudes 2^lo .. 2^hi, both signs, some exact zeros
    x = rng.uniform(-2, 2, n) * 2.0 ** rng.integers(lo, hi, n)
    x[rng.random(n) < 0.05] = 0.0
    return np.float32(np.clip(x, -3.4e38, 3.4e38))


# ---- 1. float32 adds: bit for bit -------------------------------------------------------------

def add_case(rng, n=4000):
    a = wide(rng, n)
    b = np.empty(n, np.float32)
    # partners at every exponent gap 0..40 of a, both signs (cancellation, ties, overflow)
    gap = rng.integers(-40, 41, n)
    b[:] = np.float32(np.clip(rng.uniform(-2, 2, n) * np.abs(a.astype(np.float64)) * 2.0 ** gap,
                              -3.4e38, 3.4e38))
    b[::7] = -a[::7]                                   # exact cancellation
    b[1::7] = np.float32(-a[1::7] * (1 + 2.0 ** -23))  # cancellation to one ulp
    b[2::7] = np.float32(a[2::7])                      # doubling (ties of the last bit)
    specials = np.array([np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 0.0, -0.0, 1e-40, -1e-40, 1.0],
                        np.float32)
    a[:100] = np.repeat(specials, 10)
    b[:100] = np.tile(specials, 10)
    B, S, C = 2, 5, 8                     # posenc: n = B S C rows of a, pe = b's first rows
    ids = rng.integers(0, n // C, 40).astype(np.float32)
    return {"kind": "add", "a": hx(a), "b": hx(b), "B": B, "S": S, "C": C, "start": 3,
            "ids": hx(ids), "N": 40, "EC": C}


def f32_sum(a, b):
    """IEEE float32 sum, then the viper rules: subnormal operands as 0, subnormal sums flushed."""
    a = np.where(np.abs(a) < 2.0 ** -126, np.copysign(np.float32(0), a), a).astype(np.float32)
    b = np.where(np.abs(b) < 2.0 ** -126, np.copysign(np.float32(0), b), b).astype(np.float32)
    with np.errstate(all="ignore"):
        s = (a + b).astype(np.float32)
    tiny = (np.abs(s) < 2.0 ** -126) & (s != 0)
    s[tiny] = 0.0
    return s


def same_bits(got, want, what):
    g = got.view(np.uint32)
    w = want.view(np.uint32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), "%s: NaN positions differ" % what
    ok = (g == w) | nan
    bad = np.nonzero(~ok)[0]
    assert bad.size == 0, "%s: %d sums differ, first at %d: %r vs %r" % (
        what, bad.size, bad[0], got[bad[0]], want[bad[0]])


@pytest.mark.parametrize("seed", [1, 2])
def test_adds_are_float32_sums_bit_for_bit(micropython, tmp_path, seed):
    rng = np.random.default_rng(seed)
    c = add_case(rng)
    r = run_cases([c], micropython, tmp_path)[0]
    a = unhx(c["a"]).copy()
    b = unhx(c["b"]).copy()
    same_bits(unhx(r["add"]), f32_sum(a, b), "add_forward")
    B, S, C = c["B"], c["S"], c["C"]
    pe = b[c["start"] * C:(c["start"] + S) * C]
    want = f32_sum(a[:B * S * C], np.tile(pe, B))
    same_bits(unhx(r["pos"])[:B * S * C], want, "posenc_forward")
    # embedding_backward: the table a, rows at ids += rows of b, in order (repeated ids twice)
    t = a.copy().reshape(-1, C)
    ids = unhx(c["ids"]).astype(int)
    for n, i in enumerate(ids):
        t[i] = f32_sum(t[i], b[n * C:(n + 1) * C])
    same_bits(unhx(r["emb"]), t.ravel(), "embedding_backward")
    # posembed_backward: the table b, rows start.. += the rows of dout (a[400:]) per batch item
    t = b.copy()
    st = c["start"] * C
    d = a[400:400 + B * S * C]
    for i in range(B):
        t[st:st + S * C] = f32_sum(t[st:st + S * C], d[i * S * C:(i + 1) * S * C])
    same_bits(unhx(r["posb"]), t, "posembed_backward")


# ---- 2. bit copies: embedding lookup (bad ids) and the KV store --------------------------------

def test_embedding_lookup_and_kv_store(micropython, tmp_path):
    rng = np.random.default_rng(3)
    V, C = 50, 6
    table = wide(rng, V * C)
    cases = []
    # good ids (0 and -0.0 included), then one bad id at position 4 of each kind
    for bad in (None, -1.0, 0.5, 50.0, 49.5, 1e30, np.inf, np.nan, 1e-40, 2.0 ** 24, -0.0):
        ids = np.float32([3, 0, 49, 17, 8, 1])
        if bad is not None:
            ids[4] = bad
        B, S, L, Ck, pos = 2, 3, 7, 5, 4
        cases.append({"kind": "embed", "ids": hx(ids), "table": hx(table), "C": C, "V": V,
                      "src": hx(wide(rng, B * S * Ck)), "cache": hx(wide(rng, B * L * Ck)),
                      "B": B, "S": S, "L": L, "KC": Ck, "pos": pos})
    res = run_cases(cases, micropython, tmp_path)
    for c, r in zip(cases, res):
        assert r["v_bad"] == r["p_bad"], (unhx(c["ids"]), r)
        ids = unhx(c["ids"])
        want_bad = next((n for n, i in enumerate(ids) if not (0 <= i < V and i == int(i))), -1)
        assert r["v_bad"] == want_bad
        got = unhx(r["v_out"]).reshape(-1, C)
        for n in range(len(ids) if want_bad < 0 else want_bad):
            assert got[n].tobytes() == table.reshape(V, C)[int(ids[n])].tobytes()
        assert r["v_kv"] == r["p_kv"]
        cache = unhx(c["cache"]).reshape(c["B"], c["L"], 5).copy()
        cache[:, c["pos"]:c["pos"] + c["S"]] = unhx(c["src"]).reshape(c["B"], c["S"], 5)
        assert unhx(r["v_kv"]).tobytes() == cache.tobytes()


# ---- 3. attention_decode ----------------------------------------------------------------------

def test_attention_decode_bounds(micropython, tmp_path):
    rng = np.random.default_rng(4)
    cases = []
    for B, T, L, C, NH, sq, sv in ((1, 1, 4, 8, 2, 1.0, 1.0), (2, 9, 12, 32, 2, 3.0, 1e-20),
                                   (3, 30, 30, 12, 3, 1e15, 1e30), (1, 64, 64, 32, 2, 0.3, 5.0),
                                   (2, 17, 40, 16, 1, 1e-18, 1e-30)):
        att0 = np.full(B * NH * L, 7.0, np.float32)     # columns >= T must stay as they are
        cases.append({"kind": "dec", "B": B, "T": T, "L": L, "C": C, "NH": NH,
                      "q": hx(sq * rng.uniform(-1, 1, B * C)), "kc": hx(sq * rng.uniform(-1, 1, B * L * C)),
                      "vc": hx(sv * rng.uniform(-1, 1, B * L * C)), "att0": hx(att0)})
    res = run_cases(cases, micropython, tmp_path)
    for c, r in zip(cases, res):
        B, T, L, C, NH = c["B"], c["T"], c["L"], c["C"], c["NH"]
        hs = C // NH
        q = unhx(c["q"]).astype(np.float64).reshape(B, NH, hs)
        kc = unhx(c["kc"]).astype(np.float64).reshape(B, L, NH, hs)
        vc = unhx(c["vc"]).astype(np.float64).reshape(B, L, NH, hs)
        att = unhx(r["att"]).reshape(B, NH, L)
        out = unhx(r["out"]).reshape(B, NH, hs)
        assert np.all(att[:, :, T:] == 7.0), "attention_decode wrote beyond the T cached keys"
        # the bound of attention_forward holds because the numbers are attention_forward's
        assert r["out"] == r["fout"], "attention_decode differs from attention_forward"
        assert att[:, :, :T].tobytes() == unhx(r["fatt"]).tobytes()
        for b in range(B):
            for h in range(NH):
                s = kc[b, :T, h] @ q[b, h] / math.sqrt(hs)
                w = np.exp(s - s.max())
                w /= w.sum()
                # scores within ds (the GEMM bound): weights within a factor e^(2 ds) and the softmax's
                ds = 2.0 ** -11 * hs * np.abs(q[b, h]).max() * np.abs(kc[b, :T, h]).max() / math.sqrt(hs)
                if ds < 0.01:
                    tol = w * (np.expm1(2 * ds) + 2e-4 + 2e-5 * ((s.max() - s) + 1)) + 2.0 ** -126
                    assert np.all(np.abs(att[b, h, :T] - w) <= tol), (c["T"], att[b, h, :T], w)
                o = att[b, h, :T].astype(np.float64) @ vc[b, :T, h]
                col = np.abs(vc[b, :T, h]).max(axis=0)
                assert np.all(np.abs(out[b, h] - o) <= 1e-3 * col + 2.0 ** -126), (out[b, h], o)


# ---- 4. LayerNorm forward ---------------------------------------------------------------------

def ln_cases(seed):
    rng = np.random.default_rng(seed)
    cases = []
    for N, C, lo, hi in ((4, 32, -3, 3), (3, 1, -2, 2), (5, 7, -126, 127), (2, 64, 60, 100),
                         (3, 300, -20, 20), (2, 1000, -5, 5), (4, 16, -126, -100)):
        x = wide(rng, N * C, lo, hi).reshape(N, C)
        x[0] = np.float32(1.5)                            # a constant row: var 0, rstd 1/sqrt(eps)
        if N > 2:
            x[1] = np.float32(2.0 ** hi) * np.float32(rng.uniform(0.99, 1.01, C))   # nearly constant
        cases.append({"kind": "ln", "N": N, "C": C, "x": hx(x.ravel()), "w": hx(wide(rng, C, -3, 3)),
                      "b": hx(wide(rng, C, -3, 3)), "eps": 1e-5})
    x = np.float32(rng.uniform(-1, 1, (4, 8)))
    x[1, 3] = np.inf
    x[2, 0] = np.nan
    x[3, 5] = -np.inf
    cases.append({"kind": "ln", "N": 4, "C": 8, "x": hx(x.ravel()), "w": hx(np.ones(8)),
                  "b": hx(np.zeros(8)), "eps": 1e-5, "nonfinite": [1, 2, 3]})
    cases.append({"kind": "ln", "N": 2, "C": 5, "x": hx(rng.uniform(-1e-3, 1e-3, 10)), "w": hx(np.ones(5)),
                  "b": hx(np.zeros(5)), "eps": 0.5})     # eps dominating the variance
    return cases


def test_layernorm_forward_bounds(micropython, tmp_path):
    cases = ln_cases(5)
    res = run_cases(cases, micropython, tmp_path)
    worst = 0.0
    for c, r in zip(cases, res):
        N, C = c["N"], c["C"]
        x = unhx(c["x"]).astype(np.float64).reshape(N, C)
        w = unhx(c["w"]).astype(np.float64)
        b = unhx(c["b"]).astype(np.float64)
        y = unhx(r["y"]).astype(np.float64).reshape(N, C)
        mean = unhx(r["mean"]).astype(np.float64)
        rstd = unhx(r["rstd"]).astype(np.float64)
        for n in range(N):
            if n in c.get("nonfinite", ()):
                assert np.all(np.isnan(y[n])) and np.isnan(mean[n]) and np.isnan(rstd[n]), (n, y[n])
                continue
            xs = np.where(np.abs(x[n]) < 2.0 ** -126, 0.0, x[n])
            m = xs.mean()
            rs = 1.0 / math.sqrt(((xs - m) ** 2).mean() + np.float32(c["eps"]))
            xh = (xs - m) * rs
            want = xh * w + b
            assert abs(mean[n] - m) <= 2.0 ** -23 * np.abs(xs).max() + 2.0 ** -126, (c["C"], mean[n], m)
            assert abs(rstd[n] - rs) <= 2e-4 * rs, (c["C"], rstd[n], rs)
            P = min(24, 29 - int(math.ceil(math.log2(C))))   # bits each x keeps of the row's max|x|
            bound = (4e-4 * np.abs(xh * w) + 2.0 ** (1 - P) * np.abs(xs).max() * rs * np.abs(w)
                     + 2.0 ** -23 * np.abs(want) + 2.0 ** -126)
            worst = max(worst, float((np.abs(y[n] - want) / bound).max()))
            assert np.all(np.abs(y[n] - want) <= bound), (c["C"], n, np.abs(y[n] - want).max())
    print("layernorm error / bound: %.3g" % worst)


def lnb_cases(seed):
    rng = np.random.default_rng(seed)
    cases = []
    for N, C, lo, hi, glo, ghi in ((4, 32, -3, 3, -3, 3), (3, 1, -2, 2, -2, 2), (5, 7, -60, 60, -60, 60),
                                   (2, 64, 60, 100, -20, 20), (3, 300, -20, 20, -3, 3), (4, 16, -120, -100, 80, 100),
                                   (2, 1000, -5, 5, -5, 5)):
        x = wide(rng, N * C, lo, hi).reshape(N, C).astype(np.float64)
        x[0] = 1.5 + rng.uniform(-1e-3, 1e-3, C)          # nearly constant: large rstd
        m = x.mean(axis=1)
        rs = 1.0 / np.sqrt(((x - m[:, None]) ** 2).mean(axis=1) + 1e-5)
        cases.append({"kind": "lnb", "N": N, "C": C, "x": hx(x.ravel()), "w": hx(wide(rng, C, -3, 3)),
                      "g": hx(wide(rng, N * C, glo, ghi)), "mean": hx(m), "rstd": hx(rs),
                      "dw0": hx(wide(rng, C, glo, ghi)), "db0": hx(wide(rng, C, glo, ghi))})
    x = np.float32(rng.uniform(-1, 1, (3, 6)))
    g = np.float32(rng.uniform(-1, 1, (3, 6)))
    g[1, 2] = np.nan
    x[2, 4] = np.inf
    cases.append({"kind": "lnb", "N": 3, "C": 6, "x": hx(x.ravel()), "w": hx(np.ones(6)), "g": hx(g.ravel()),
                  "mean": hx(x.mean(axis=1)), "rstd": hx(np.ones(3)), "dw0": hx(np.zeros(6)),
                  "db0": hx(np.zeros(6)), "nonfinite": [1, 2]})
    return cases


def test_layernorm_backward_bounds(micropython, tmp_path):
    cases = lnb_cases(13)
    res = run_cases(cases, micropython, tmp_path)
    worst = [0.0, 0.0]
    for c, r in zip(cases, res):
        N, C = c["N"], c["C"]
        x = unhx(c["x"]).astype(np.float64).reshape(N, C)
        w = unhx(c["w"]).astype(np.float64)
        g = unhx(c["g"]).astype(np.float64).reshape(N, C)
        mean = unhx(c["mean"]).astype(np.float64)
        rstd = unhx(c["rstd"]).astype(np.float64)
        dx = unhx(r["dx"]).astype(np.float64).reshape(N, C)
        assert r["dx2"] == r["dx"], "dinp depends on whether dweight / dbias are given"
        dw = unhx(r["dw"]).astype(np.float64)
        db = unhx(r["db"])
        bad = c.get("nonfinite", ())
        if bad:
            for n in bad:
                assert np.all(np.isnan(dx[n])), dx[n]
            assert np.all(np.isnan(dw)), "a non-finite row must reach the weight gradient"
            assert np.all(np.isfinite(dx[0]))
            continue
        xs = np.where(np.abs(x) < 2.0 ** -126, 0.0, x)
        gs = np.where(np.abs(g) < 2.0 ** -126, 0.0, g)
        xh = (xs - mean[:, None]) * rstd[:, None]
        dn = gs * w
        want = rstd[:, None] * (dn - dn.mean(axis=1, keepdims=True) - xh * (dn * xh).mean(axis=1, keepdims=True))
        bound = 1e-3 * rstd[:, None] * np.abs(dn).max(axis=1, keepdims=True) + 2.0 ** -126
        worst[0] = max(worst[0], float((np.abs(dx - want) / bound).max()))
        assert np.all(np.abs(dx - want) <= bound), (C, np.abs(dx - want).max(), bound.min())
        dw0 = unhx(c["dw0"]).astype(np.float64)
        want_w = dw0 + (gs * xh).sum(axis=0)
        bw = 2e-4 * np.abs(gs * xh).sum(axis=0) + N * 2.0 ** -23 * (np.abs(dw0) + np.abs(gs * xh).sum(axis=0)) + 2.0 ** -126
        worst[1] = max(worst[1], float((np.abs(dw - want_w) / bw).max()))
        assert np.all(np.abs(dw - want_w) <= bw), (C, np.abs(dw - want_w).max())
        want_b = unhx(c["db0"]).copy()
        for n in range(N):
            want_b = f32_sum(want_b, np.float32(g[n]))
        same_bits(db, want_b, "layernorm dbias")
    print("layernorm backward error / bound: dinp %.3g, dweight %.3g" % tuple(worst))


def sgd_cases(seed):
    rng = np.random.default_rng(seed)
    cases = []
    for lr, mom, wd in ((0.01, 0.0, 0.0), (0.1, 0.9, 0.0), (1e-3, 0.9, 0.01), (0.5, 0.0, 0.1), (3e-5, 0.99, 1e-4)):
        n = 600
        cases.append({"kind": "sgd", "n": n, "lr": lr, "mom": mom, "wd": wd, "p": hx(wide(rng, n, -60, 60)),
                      "g": hx(wide(rng, n, -60, 60)), "b": hx(wide(rng, n, -60, 60))})
    return cases


def test_sgd_step_bounds(micropython, tmp_path):
    cases = sgd_cases(14)
    res = run_cases(cases, micropython, tmp_path)
    worst = 0.0
    for c, r in zip(cases, res):
        p = unhx(c["p"]).astype(np.float64)
        g = unhx(c["g"]).astype(np.float64)
        b = unhx(c["b"]).astype(np.float64)
        lr, mom, wd = np.float32(c["lr"]), np.float32(c["mom"]), np.float32(c["wd"])
        mag = np.abs(g) + wd * np.abs(p) + (mom * np.abs(b) if c["mom"] else 0)
        d = g + wd * p + (mom * b if c["mom"] else 0)
        want = p - lr * d
        got = unhx(r["p"]).astype(np.float64)
        bound = 2e-4 * lr * mag + 2.0 ** -23 * np.abs(want) + 2.0 ** -126
        worst = max(worst, float((np.abs(got - want) / bound).max()))
        assert np.all(np.abs(got - want) <= bound), (c["lr"], c["mom"], c["wd"], np.abs(got - want).max())
        if c["mom"]:
            gb = unhx(r["b"]).astype(np.float64)
            assert np.all(np.abs(gb - d) <= 2e-4 * mag + 2.0 ** -24 * np.abs(d) + 2.0 ** -126)
    print("sgd error / bound: %.3g" % worst)


# ---- 5. GELU, both forms, forward and backward -------------------------------------------------

def gelu_ref(x, tanh_form):
    x = np.where(np.abs(x) < 2.0 ** -126, 0.0, x)
    if tanh_form:
        c = math.sqrt(2 / math.pi)
        u = c * (x + 0.044715 * x ** 3)
        th = np.tanh(u)
        phi = 0.5 * (1 + th)
        d = phi + 0.5 * x * (1 - th * th) * c * (1 + 3 * 0.044715 * x * x)
    else:
        erf = np.vectorize(math.erf)
        phi = 0.5 * (1 + erf(x / math.sqrt(2)))
        d = phi + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return x * phi, d


@pytest.mark.parametrize("kind,code", [("gelu", 2), ("gelu_tanh", 5)])
def test_gelu_bounds(micropython, tmp_path, kind, code):
    rng = np.random.default_rng(6 + code)
    x = np.concatenate([np.float32(rng.uniform(-9, 9, 3000)), np.float32(np.arange(-640, 641) / 64.0),
                        np.float32(np.arange(-640, 640) / 64.0 + 1 / 128.0),    # grid points and midpoints
                        wide(rng, 400, -126, 127)])
    g = np.concatenate([wide(rng, len(x) - 400, -10, 10), wide(rng, 400, -126, 127)])
    specials = np.float32([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-40])
    x = np.concatenate([x, specials])
    g = np.concatenate([g, np.float32([1, 1, 1, 1, 1, 1])])
    c = {"kind": "gelu", "x": hx(x), "g": hx(g), "code": code}
    r = run_cases([c], micropython, tmp_path)[0]
    y = unhx(r["y"]).astype(np.float64)
    d = unhx(r["d"]).astype(np.float64)
    n = len(x) - len(specials)
    with np.errstate(all="ignore"):
        yr, dr = gelu_ref(x[:n].astype(np.float64), code == 5)
    dr = dr * g[:n]
    fin = np.isfinite(yr) & np.isfinite(dr) & (np.abs(yr) < 3e38) & (np.abs(dr) < 3e38)
    by = 1e-5 * np.abs(x[:n]) + 1e-4 * np.abs(yr) + 2.0 ** -126
    bd = 5e-5 * np.abs(g[:n]) + 1e-4 * np.abs(dr) + 2.0 ** -126
    ey = np.abs(y[:n] - yr) / by
    ed = np.abs(d[:n] - dr) / bd
    assert np.all(ey[fin] <= 1), "gelu: worst x %r: %r vs %r" % (x[:n][fin][ey[fin].argmax()], y[:n][fin][ey[fin].argmax()],
                                                              yr[fin][ey[fin].argmax()])
    assert np.all(ed[fin] <= 1), "gelu grad: worst x %r" % x[:n][fin][ed[fin].argmax()]
    print("%s error / bound: forward %.3g, backward %.3g" % (kind, ey[fin].max(), ed[fin].max()))
    ys, ds = y[n:], d[n:]
    assert ys[0] == np.inf and np.isnan(ys[1]) and np.isnan(ys[2])
    assert ys[3] == 0 and ys[4] == 0 and np.signbit(ys[4]) and ys[5] == 0
    assert np.all(np.isnan(ds[:3])) and np.all(ds[3:] == 0.5)


# ---- 6. argmax --------------------------------------------------------------------------------

def test_argmax_as_float_comparisons(micropython, tmp_path):
    rng = np.random.default_rng(8)
    x = np.concatenate([wide(rng, 200), np.float32([np.nan, 1, 2, 2, -np.inf, np.inf, 3e38, -0.0, 0.0,
                                                    -1, -2, np.nan, 5, -3e38, -1e-40, -2e-40])])
    rows = [[0, 200], [200, 4], [201, 3], [204, 3], [207, 2], [209, 2], [210, 6], [0, 1], [206, 10]]
    for o in range(0, 190, 7):
        rows.append([o, 10])
    r = run_cases([{"kind": "argmax", "x": hx(x), "rows": rows}], micropython, tmp_path)[0]
    assert r["v"] == r["p"]
    want = []
    for o, n in rows:
        best = 0
        for i in range(1, n):
            if x[o + i] > x[o + best]:
                best = i
        want.append(best)
    assert r["v"] == want


# ---- 7. one-token GEMMs keep the quantized weight, and follow any change of it ------------------

def test_kept_weight_follows_every_change(micropython, tmp_path):
    rng = np.random.default_rng(12)
    cases = []
    # (the kept rows come in parts of a few weight rows: (1, 32, 128) and (4, 128, 32) have several,
    # and the edits reach the first and the last; made: kept before the first call, so a call of
    # more rows (a prompt) uses them too)
    for N, C, OC, made, bias in ((1, 32, 128, False, True), (2, 7, 5, False, True), (4, 128, 32, False, True),
                                 (5, 16, 16, False, True), (16, 128, 32, True, True), (16, 32, 128, True, False),
                                 (1, 130, 3, True, False), (3, 5, 200, True, True)):
        w = wide(rng, OC * C, -20, 20)
        one_bit = np.float32(w[3]).view(np.uint32) ^ np.uint32(1)
        edits = [[0, 1e12], [OC * C - 1, -1e13], [3, float(one_bit.view(np.float32))], [3, float(w[3])]]
        cases.append({"kind": "kept", "N": N, "C": C, "OC": OC, "x": hx(wide(rng, N * C, -20, 20)),
                      "w": hx(w), "b": hx(wide(rng, OC, -20, 20)) if bias else None, "edits": edits,
                      "made": made})
    res = run_cases(cases, micropython, tmp_path)
    for c, r in zip(cases, res):
        outs = r["outs"]
        assert len(outs) == len(c["edits"]) + 1
        for j, (kept, fresh) in enumerate(outs):
            assert kept == fresh, "N=%d: the kept weight gave another result after edit %d" % (c["N"], j)
        assert outs[1][0] != outs[0][0] and outs[2][0] != outs[1][0]


# ---- 8. dropout's masked scale: the float32 product, bit for bit -----------------------------------

DROP_SCALES = ([1.0 / (1.0 - p) for p in (0.1, 0.25, 0.3, 0.5, 0.9, 1e-3)] + [1.0, 0.0, 3.0e38, 1e-30]
               + [2.0 - 2.0 ** -22])     # times 1 + 2^-23: 2 - 2^-44 rounds up to 2 (a mantissa carry)


def drop_case(rng, n=3000):
    x = wide(rng, n)
    specials = np.array([np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 0.0, -0.0, 1e-40, -1e-40, 1.0,
                         1.1754944e-38, -1.1754944e-38, 1 + 2.0 ** -23, -(1 + 2.0 ** -23)], np.float32)
    x[:len(specials)] = specials
    x[len(specials):len(specials) + 400] = np.float32(rng.uniform(-2, 2, 400))   # the usual range
    keep = (rng.random(n) < 0.8).astype(np.uint8)
    keep[:len(specials)] = 1
    return {"kind": "drop", "x": hx(x), "keep": [int(v) for v in keep], "scales": hx(DROP_SCALES)}


def f32_product(x, s):
    """IEEE float32 product, then the viper rules: a subnormal factor as 0, products below 2^-126
    flushed to 0."""
    s = np.float32(s)
    x = np.where(np.abs(x) < 2.0 ** -126, np.copysign(np.float32(0), x), x).astype(np.float32)
    if abs(float(s)) < 2.0 ** -126:
        s = np.float32(0)
    with np.errstate(all="ignore"):
        y = (x * s).astype(np.float32)
    tiny = (np.abs(y) < 2.0 ** -126) & (y != 0)
    y[tiny] = np.copysign(np.float32(0), y[tiny])
    return y


def test_dropout_is_the_float32_product(micropython, tmp_path):
    rng = np.random.default_rng(12)
    c = drop_case(rng)
    r = run_cases([c], micropython, tmp_path)[0]
    x = unhx(c["x"]).copy()
    keep = np.array(c["keep"], bool)
    assert len(r["v"]) == len(DROP_SCALES)
    for j, sc in enumerate(DROP_SCALES):
        want = f32_product(x, sc)                      # the scale as float32, as the board holds it
        want[~keep] = 0.0                              # a dropped output is +0
        same_bits(unhx(r["v"][j]), want, "viper dropout_apply scale %r" % sc)
    # scale_inplace (a micro-batch's loss gradient) is the same product with every element kept,
    # in place: no element is zeroed
    assert len(r["s"]) == len(DROP_SCALES)
    for j, sc in enumerate(DROP_SCALES):
        same_bits(unhx(r["s"][j]), f32_product(x, sc), "viper scale_inplace scale %r" % sc)


# ---- 9. the int32 bounds of these kernels hold on the same inputs (every #!chk line) -------------

def test_decode_kernels_keep_int32_bounds(micropython, tmp_path):
    d = _instrumented(tmp_path)
    rng = np.random.default_rng(9)
    cases = [add_case(rng, 600)] + ln_cases(10) + lnb_cases(11) + sgd_cases(15)
    x = np.concatenate([np.float32(rng.uniform(-9, 9, 500)), wide(rng, 200)])
    cases.append({"kind": "gelu", "x": hx(x), "g": hx(wide(rng, 700)), "code": 2})
    cases.append({"kind": "gelu", "x": hx(x), "g": hx(wide(rng, 700)), "code": 5})
    cases.append(drop_case(rng, 800))
    run_cases(cases, micropython, tmp_path, checked_dir=d)
