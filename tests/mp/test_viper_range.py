# tests/mp/test_viper_range.py: the viper softmax, attention and cross-entropy kernels over the whole
# float32 range, against the portable kernels and a float64 NumPy computation written here from
# the math. Inputs are built on the host (seeded), passed as exact float32 bits, and run INSIDE
# each MicroPython interpreter (the `micropython` fixture: stock 64-bit and the 32-bit port).
#
# The bounds checked here are the ones stated next to the kernels in kernels_viper.py and in the
# README's "Tolerances" table:
#   softmax weights    |w - w*| <= (2e-4 + 2e-5 (y + 1)) w* + 2^-126, y = (max - s) / sqrt(hs)
#   attention output   |o - o*| <= 1e-3 max_j |v[b, j, col]|   (the value column it averages)
#   attention backward |dv - dv*| <= 1e-3 max_t A[t, j] max_t |dout[t, col]|;  dq, dk: 2e-3 of
#                      the largest |dS| of the row (column) times max |k| (|q|) of the column
#   cross-entropy      |loss - loss*| <= 2^-20 |loss*| + 1e-4;  |dlogits - dlogits*| <= 1e-4 / B
import json

import numpy as np
import pytest

import helpers
from test_viper import _instrumented

# ---- the MicroPython side (range_cases_mp.py): both kernel modules on the same inputs, results
# as float32 bits


def run_cases(cases, micropython, tmp_path, checked_dir=None, driver="range_cases_mp.py"):
    """Results of tests/<driver> on `cases` (one per case; a case that raised fails the test)."""
    src = tmp_path / "cases.json"
    dst = tmp_path / "results.json"
    src.write_text(json.dumps(cases))
    args = [str(src), str(dst)] + ([checked_dir] if checked_dir else [])
    out = helpers.run_micropython(helpers.script(driver), *args, heap="16M", exe=micropython)
    assert "DONE %d" % len(cases) in out, out
    res = json.loads(dst.read_text())
    assert len(res) == len(cases), "%d results for %d cases" % (len(res), len(cases))
    for c, r in zip(cases, res):
        assert "error" not in r, "%s raised %s" % (c["kind"], r["error"])
    return res


def hx(a):
    return np.asarray(a, dtype=np.float32).tobytes().hex()


def unhx(h):
    return np.frombuffer(bytes.fromhex(h), dtype=np.float32).astype(np.float64)


def no_errors(r, what):
    errs = {k: v for k, v in r.items() if k.endswith("_error")}
    assert not errs, "%s raised: %r" % (what, errs)


# ---- input builders -------------------------------------------------------------------------

def mant14(rng, n):
    # signed values with at most 14 significant bits in [1, 2): exact in the viper block format
    return (1.0 + rng.integers(0, 1 << 13, n) / 8192.0) * rng.choice([-1.0, 1.0], n)


def score_rows(rng, cls, n):
    """n scores of one query row, for the class of adversarial inputs `cls` (14-bit mantissas)."""
    if cls == "wide":                    # magnitudes 2^-66 (1e-20) .. 2^99 (6e29), both signs
        return mant14(rng, n) * 2.0 ** rng.integers(-66, 97, n)
    if cls == "span":                    # 1e-20, 1 and 1e20 in every row
        s = mant14(rng, n) * 2.0 ** rng.integers(-3, 4, n)
        picks = rng.permutation(n)[:3]
        for p, e in zip(picks, (-66, 0, 66)):
            s[p] = mant14(rng, 1)[0] * 2.0 ** e
        return s
    if cls == "onehuge":                 # one element of 2^66 or 2^99 among small ones
        s = mant14(rng, n) * 2.0 ** rng.integers(-2, 2, n)
        s[rng.integers(0, n)] = abs(mant14(rng, 1)[0]) * 2.0 ** rng.choice([66, 97])
        return s
    if cls == "hugeneg":                 # everything large and negative: -1e30 .. -1e10
        return -np.abs(mant14(rng, n)) * 2.0 ** rng.integers(33, 97, n)
    if cls == "equal":                   # an all-equal row at a random magnitude and sign
        return np.full(n, mant14(rng, 1)[0] * 2.0 ** rng.integers(-66, 97))
    if cls == "close":                   # scores 2^12 .. 2^13 one unit apart: spread weights
        return (4096.0 + rng.integers(0, 12, n)) * rng.choice([-1.0, 1.0])
    if cls == "moderate":                # |s| < 8: the regime of a trained model
        return mant14(rng, n) * 2.0 ** rng.integers(-6, 3, n)
    raise ValueError(cls)


def att_case(rng, cls, B, Tq, Tk, hs, NH, causal, masked, vcls="wide"):
    """Attention inputs whose scores q.k / sqrt(hs) are exactly the float32 values score_rows
    gives (one nonzero component per head: q = 2^a, k = score * sqrt(hs) / 2^a with a 14-bit
    mantissa), so both backends see identical scores and the softmax is what is compared."""
    C = hs * NH
    q = np.zeros((B, Tq, C))
    k = np.zeros((B, Tk, C))
    scale = 1.0 / np.sqrt(hs)            # hs in (1, 4, 16): a power of two
    for b in range(B):
        for h in range(NH):
            i0 = h * hs + int(rng.integers(0, hs))
            a = int(rng.integers(-4, 5))
            q[b, :, i0] = 2.0 ** a
            # one score row per query is not possible with a shared k: the key values are the
            # row's scores; queries differ by their power of two (a shift, not a reordering)
            q[b, :, i0] *= 2.0 ** rng.integers(-2, 3, Tq)
            k[b, :, i0] = score_rows(rng, cls, Tk) / scale / 2.0 ** a
    if vcls == "wide":
        v = mant14(rng, B * Tk * C) * 2.0 ** rng.integers(-30, 30, B * Tk * C)
    else:
        v = rng.uniform(-1, 1, B * Tk * C)
    dout = mant14(rng, B * Tq * C) * 2.0 ** rng.integers(-10, 10, B * Tq * C)
    mask = None
    if masked:
        mask = [int(rng.random() < 0.3) for _ in range(B * Tk)]
        mask[:Tk] = [1] * Tk             # batch item 0: every key padded
    return {"kind": "att", "cls": cls, "B": B, "Tq": Tq, "Tk": Tk, "C": C, "NH": NH,
            "causal": int(causal), "mask": mask,
            "q": hx(q.ravel()), "k": hx(k.ravel()), "v": hx(v), "dout": hx(dout)}


CLASSES = ("wide", "span", "onehuge", "hugeneg", "equal", "close", "moderate")


def att_cases(seed):
    rng = np.random.default_rng(seed)
    cases = []
    for cls in CLASSES:
        for hs in (1, 4, 16):
            cases.append(att_case(rng, cls, 2, 5, 7, hs, 2, False, False))
        cases.append(att_case(rng, cls, 3, 6, 6, 4, 2, True, False))
        cases.append(att_case(rng, cls, 3, 4, 9, 1, 3, False, True, vcls="uniform"))
        cases.append(att_case(rng, cls, 2, 3, 12, 16, 1, True, True))
    return cases


# ---- the float64 reference, from the math -------------------------------------------------------

def ref_attention(c):
    B, Tq, Tk, C, NH = c["B"], c["Tq"], c["Tk"], c["C"], c["NH"]
    hs = C // NH
    q = unhx(c["q"]).reshape(B, Tq, C)
    k = unhx(c["k"]).reshape(B, Tk, C)
    mask = None if c["mask"] is None else np.array(c["mask"]).reshape(B, Tk)
    s = np.zeros((B, NH, Tq, Tk))
    vis = np.ones((B, NH, Tq, Tk), dtype=bool)
    for b in range(B):
        for h in range(NH):
            sl = slice(h * hs, (h + 1) * hs)
            s[b, h] = q[b, :, sl] @ k[b, :, sl].T / np.sqrt(hs)
            for t in range(Tq):
                for j in range(Tk):
                    if (c["causal"] and j > t + Tk - Tq) or (mask is not None and mask[b, j]):
                        vis[b, h, t, j] = False
    w = np.zeros_like(s)
    y = np.full_like(s, np.inf)          # (max - s) * scale: the distance from the row max
    for idx in np.ndindex(B, NH, Tq):
        row = vis[idx]
        if row.any():
            m = s[idx][row].max()
            e = np.where(row, np.exp(s[idx] - m), 0.0)
            w[idx] = e / e.sum()
            y[idx] = np.where(row, m - s[idx], np.inf)
    return s, w, y, vis


def softmax_bound(w_ref, y):
    return (2e-4 + 2e-5 * (np.minimum(y, 1e30) + 1.0)) * w_ref + 2.0 ** -126


# ---- 1. what the issue saw ------------------------------------------------------------------------

def test_issue_cases_fixed(micropython, tmp_path):
    cases = [{"kind": "layer", "tokens": [100.0, 60.0]},
             {"kind": "layer", "tokens": [1e-20, 1.0, 1100.0]},
             {"kind": "xent", "B": 1, "V": 3, "logits": hx([2000.0, 0.0, 1.0]), "labels": [1]},
             {"kind": "xent", "B": 1, "V": 3, "logits": hx([1e20, 0.0, 1.0]), "labels": [1]}]
    r = run_cases(cases, micropython, tmp_path)
    # tokens 100 and 60: scores 10000, 6000, 3600: query 0 looks at token 0 only, output 100
    for backend in ("python", "viper"):
        w = unhx(r[0][backend + "_w"])
        y = unhx(r[0][backend + "_y"])
        np.testing.assert_allclose(w, [1.0, 0.0, 1.0, 0.0], atol=1e-6, err_msg=backend)
        np.testing.assert_allclose(y, [100.0, 100.0], rtol=1e-3, err_msg=backend)
    # tokens 1e-20, 1, 1100: every token's output within 1e-3 of the portable one
    yp = unhx(r[1]["python_y"])
    yv = unhx(r[1]["viper_y"])
    assert np.all(np.abs(yv - yp) <= 1e-3 * np.abs(yp)), (yp, yv)
    # cross-entropy on huge logits: the loss is max - s_y + ln(sum exp(s - max)) ~ 2000 and 1e20
    for i, want in ((2, 2000.0 + np.log(1 + np.exp(-1999.0) + np.exp(-2000.0))), (3, float(np.float32(1e20)))):
        for tag in ("p", "v"):
            got = float(r[i][tag + "_loss"])
            assert abs(got - want) <= 1e-6 * want, (i, tag, got, want)


# ---- 2. softmax weights and the attention forward over the range ---------------------------------

PSCALE = 1.25        # dropout p = 0.2 on the weights: kept weights times 1.25 (exact in float32)


def _att_results(micropython, tmp_path, seed, checked_dir=None):
    cases = att_cases(seed)
    rng = np.random.default_rng(100 + seed)
    for c in cases:          # and the dropout variants from the same weights: a keep mask each
        c["keep"] = [int(u) for u in rng.random(c["B"] * c["NH"] * c["Tq"] * c["Tk"]) >= 0.2]
        c["pscale"] = PSCALE
    return cases, run_cases(cases, micropython, tmp_path, checked_dir)


@pytest.mark.parametrize("seed", [1, 2])
def test_softmax_weights_whole_range(micropython, tmp_path, seed):
    cases, res = _att_results(micropython, tmp_path, seed)
    worst = {}
    for c, r in zip(cases, res):
        no_errors(r, c["cls"])
        s, w_ref, y, vis = ref_attention(c)
        wp = unhx(r["p_att"]).reshape(w_ref.shape)
        wv = unhx(r["v_att"]).reshape(w_ref.shape)
        # hidden keys weigh exactly 0, a row without visible keys is all 0
        assert np.all(wv[~vis] == 0.0), c["cls"]
        bound = softmax_bound(w_ref, y)
        ev = np.abs(wv - w_ref)
        # the portable kernel against the same math (float32 on the 32-bit port)
        ep = np.abs(wp - w_ref)
        assert np.all(ep <= bound), "portable beyond the bound: %s" % c["cls"]
        assert np.all(ev <= bound), "%s (hs=%d): max excess %.3g, worst rel %.3g" % (
            c["cls"], c["C"] // c["NH"], float((ev - bound).max()),
            float((ev / np.maximum(w_ref, 1e-300)).max()))
        assert np.all(np.abs(wv - wp) <= 2 * bound), c["cls"]
        rows = vis.any(axis=-1)
        assert np.all(np.abs(wv.sum(axis=-1)[rows] - 1.0) <= 4e-4), c["cls"]
        worst[c["cls"]] = max(worst.get(c["cls"], 0.0), float((ev / bound).max()))
    print("softmax weight error / bound per class:", worst)


@pytest.mark.parametrize("seed", [3])
def test_attention_output_and_backward_whole_range(micropython, tmp_path, seed):
    cases, res = _att_results(micropython, tmp_path, seed)
    worst = {}
    for c, r in zip(cases, res):
        no_errors(r, c["cls"])
        for drop in (False, True):
            _attention_errors(c, r, drop, worst)
    assert set(worst) == {"out", "dv", "dq", "dk", "drop out", "drop dv", "drop dq", "drop dk"}, worst
    print("attention errors (relative to their block scales):", worst)


def _attention_errors(c, r, drop, worst):
    # the viper output and gradients against the portable ones, relative to the block scales;
    # drop: the dropout variants (attention_context, attention_backward_dropout) with c's mask:
    # A' = A keep pscale in place of A, and dA = keep pscale (dout . v)
    tag = "drop " if drop else ""
    key = ("_dout_ctx", "_ddv", "_ddq", "_ddk") if drop else ("_out", "_dv", "_dq", "_dk")
    B, Tq, Tk, C, NH = c["B"], c["Tq"], c["Tk"], c["C"], c["NH"]
    hs = C // NH
    v = unhx(c["v"]).reshape(B, Tk, C)
    q = unhx(c["q"]).reshape(B, Tq, C)
    k = unhx(c["k"]).reshape(B, Tk, C)
    dout = unhx(c["dout"]).reshape(B, Tq, C)
    A0 = A = unhx(r["att_used"]).reshape(B, NH, Tq, Tk)     # A0: softmax's A, before any dropout
    ps = 1.0
    if drop:
        ps = c["pscale"]
        A = A * np.array(c["keep"], np.float64).reshape(A.shape) * ps
    # output: relative to the largest |v| of the column it averages (masked keys included:
    # they share the block exponent), times the largest weight sum (pscale with dropout)
    op = unhx(r["p" + key[0]]).reshape(B, Tq, C)
    ov = unhx(r["v" + key[0]]).reshape(B, Tq, C)
    vmax = np.abs(v).max(axis=1, keepdims=True) * ps
    e_out = float((np.abs(ov - op) / vmax).max())
    assert e_out <= 1e-3, (tag, c["cls"], e_out)
    # backward from the same weights A
    dvp = unhx(r["p" + key[1]]).reshape(B, Tk, C)
    dvv = unhx(r["v" + key[1]]).reshape(B, Tk, C)
    e_dv = 0.0
    for h in range(NH):
        sl = slice(h * hs, (h + 1) * hs)
        # dv[b, j, col] = sum_t A[b,h,t,j] dout[b,t,col]: block maxes over t
        scale_dv = A[:, h].max(axis=1)[:, :, None] * np.abs(dout[:, :, sl]).max(axis=1)[:, None, :]
        d = np.abs(dvv[:, :, sl] - dvp[:, :, sl])
        e_dv = max(e_dv, float(np.where(scale_dv > 0, d / np.where(scale_dv > 0, scale_dv, 1), d * 1e300).max()))
    assert e_dv <= 1e-3, (tag, c["cls"], e_dv)
    # dS = A (dA - sum_j A dA) / sqrt(hs) cancels (a one-hot row has dS = 0 exactly), so
    # dq and dk are judged against the product of the block maxima of their operands:
    # G = max A * hs max|dout| max|v| / sqrt(hs) (the scale of dS; per query row for dq,
    # per batch item and head for dk) times max |k| (|q|) of the column
    for name, other, rows, kk in (("dq", k, Tq, key[2]), ("dk", q, Tk, key[3])):
        gp = unhx(r["p" + kk]).reshape(B, rows, C)
        gv = unhx(r["v" + kk]).reshape(B, rows, C)
        e = 0.0
        for h in range(NH):
            sl = slice(h * hs, (h + 1) * hs)
            vmx = np.abs(v[:, :, sl]).max(axis=(1, 2))                       # (B,)
            G = (A0[:, h].max(axis=2) * np.abs(dout[:, :, sl]).max(axis=2) * ps
                 * vmx[:, None] * hs / np.sqrt(hs))                          # (B, Tq)
            if name == "dk":
                G = np.repeat(G.max(axis=1, keepdims=True), Tk, axis=1)      # (B, Tk)
            sc = G[:, :, None] * np.abs(other[:, :, sl]).max(axis=1)[:, None, :]
            d = np.abs(gv[:, :, sl] - gp[:, :, sl])
            ok = sc > 0
            assert np.all(d[~ok] == 0.0), (c["cls"], name)
            if ok.any():
                e = max(e, float((d[ok] / sc[ok]).max()))
        assert e <= 2e-3, (tag, c["cls"], name, e)
        worst[tag + name] = max(worst.get(tag + name, 0.0), e)
    worst[tag + "out"] = max(worst.get(tag + "out", 0.0), e_out)
    worst[tag + "dv"] = max(worst.get(tag + "dv", 0.0), e_dv)


# ---- 3. cross-entropy: the loss value against float64 math, the gradient against both -------------

def xent_rows(rng, cls, V):
    if cls in ("wide", "span", "onehuge", "hugeneg", "equal", "close", "moderate"):
        return score_rows(rng, cls, V)
    if cls == "full":                    # full 24-bit mantissas over the range up to 1e30
        return np.float32(rng.uniform(-1, 1, V) * 10.0 ** rng.uniform(-20, 30, V)).astype(np.float64)
    if cls == "huge2":                   # logits up to +-1e30 and their negatives together
        return np.float32(rng.choice([-1, 1], V) * 10.0 ** rng.uniform(28, 30, V)).astype(np.float64)
    raise ValueError(cls)


def xent_cases(seed):
    rng = np.random.default_rng(seed)
    cases = []
    for cls in CLASSES + ("full", "huge2"):
        for B, V in ((1, 2), (1, 3), (4, 3), (16, 5), (7, 10), (3, 40)):
            lg = np.concatenate([xent_rows(rng, cls, V) for _ in range(B)])
            labels = [int(x) for x in rng.integers(0, V, B)]
            cases.append({"kind": "xent", "cls": cls, "B": B, "V": V, "logits": hx(lg), "labels": labels})
    # the issue's examples and their neighbours, with the label at the max and away from it
    for lg in ([2000.0, 0.0, 1.0], [1e20, 0.0, 1.0], [1e30, -1e30, 0.0], [-1e30, -1e30, -1e30],
               [1e-20, 1.0, 1e20], [3.0, 3.0, 3.0]):
        for y in (0, 1, 2):
            cases.append({"kind": "xent", "cls": "fixed", "B": 1, "V": 3, "logits": hx(lg), "labels": [y]})
    return cases


def ref_xent(c):
    B, V = c["B"], c["V"]
    lg = unhx(c["logits"]).reshape(B, V)
    loss = 0.0
    d = np.zeros((B, V))
    for b in range(B):
        m = lg[b].max()
        e = np.exp(lg[b] - m)
        z = e.sum()
        y = c["labels"][b]
        loss += (m - lg[b, y]) + np.log(z)
        d[b] = e / z / B
        d[b, y] -= 1.0 / B
    return loss / B, d


@pytest.mark.parametrize("seed", [5, 6])
def test_crossentropy_whole_range(micropython, tmp_path, seed):
    cases = xent_cases(seed)
    res = run_cases(cases, micropython, tmp_path)
    worst_l = worst_d = 0.0
    for c, r in zip(cases, res):
        no_errors(r, c["cls"])
        want, dref = ref_xent(c)
        lv = float(r["v_loss"])
        tol = 2.0 ** -20 * abs(want) + 1e-4
        assert abs(lv - want) <= tol, (c["cls"], c["B"], c["V"], lv, want)
        # (the portable kernel computes m + log(z) - s_y, which loses log(z) when m is huge;
        # its loss is not the judge here)
        dv = unhx(r["v_d"]).reshape(dref.shape)
        dp = unhx(r["p_d"]).reshape(dref.shape)
        B = c["B"]
        assert float(np.abs(dv - dref).max()) * B <= 1e-4, (c["cls"], float(np.abs(dv - dref).max()) * B)
        assert float(np.abs(dv - dp).max()) * B <= 1e-4, (c["cls"], "vs portable")
        worst_l = max(worst_l, abs(lv - want) / tol)
        worst_d = max(worst_d, float(np.abs(dv - dref).max()) * B / 1e-4)
    print("cross-entropy error / bound: loss %.3g, dlogits %.3g" % (worst_l, worst_d))


# ---- 4. the int32 bounds hold on these inputs too (instrumented copy, every #!chk line) ----------

def test_range_inputs_keep_int32_bounds(micropython, tmp_path):
    d = _instrumented(tmp_path)
    cases = att_cases(11)[::3] + xent_cases(12)[::4]
    res = run_cases(cases, micropython, tmp_path, checked_dir=d)
    for c, r in zip(cases, res):
        no_errors(r, c.get("cls", c["kind"]))


# ---- 5. the block-float GEMM family (Dense, pooling), Adam over the range ------------------------
# GEMM bound (kernels_viper.py, [B1]): an output that sums K products of a block (row) of A and a
# block of B is within 2^-11 K max|a| max|b| (+ 2^-11 of an addend: bias, old gradient) of the
# exact sum: every operand is rounded to 14 bits of its block maximum.

def wide(rng, n, lo=-66, hi=66):
    # full 24-bit float32 mantissas, magnitudes 2^lo .. 2^hi, both signs, some exact zeros
    x = rng.uniform(-2, 2, n) * 2.0 ** rng.integers(lo, hi, n)
    x[rng.random(n) < 0.1] = 0.0
    return np.float32(x).astype(np.float64)


def gemm_cases(seed):
    rng = np.random.default_rng(seed)
    cases = []
    for N, C, OC, lo, hi in ((4, 3, 5, -55, 55), (8, 16, 4, -20, 20), (3, 40, 7, -50, 50),
                             (16, 4, 32, -2, 2), (5, 9, 3, 45, 55), (6, 8, 2, -66, -50)):
        # cancelling rows: every second row is the negation of the first with one element perturbed
        x = wide(rng, N * C, lo, hi).reshape(N, C)
        x[1::2] = -x[0:N // 2 * 2:2][:len(x[1::2])]
        x[1::2, 0] *= 1.5
        cases.append({"kind": "mm", "N": N, "C": C, "OC": OC, "x": hx(x.ravel()),
                      "w": hx(wide(rng, OC * C, lo, hi)), "b": hx(wide(rng, OC, lo, hi)),
                      "dout": hx(wide(rng, N * OC, lo, hi)), "dw0": hx(wide(rng, OC * C, lo, hi)),
                      "db0": hx(wide(rng, OC, lo, hi))})
    for B, T, C in ((2, 5, 3), (3, 33, 4), (1, 1, 6)):
        cases.append({"kind": "pool", "B": B, "T": T, "C": C, "x": hx(wide(rng, B * T * C)),
                      "dout": hx(wide(rng, B * C))})
    cases.append({"kind": "act", "x": hx(wide(rng, 300, -126, 127)), "g": hx(wide(rng, 300, -126, 127))})
    for dec, wd in ((0, 0.0), (0, 0.01), (1, 0.01)):
        n = 200
        g = wide(rng, n, -60, 60)
        cases.append({"kind": "adam", "n": n, "p": hx(wide(rng, n, -10, 10)), "g": hx(g),
                      "m": hx(0.1 * g), "v": hx(np.abs(g) * np.abs(wide(rng, n, -10, 10))),
                      "lr": 1e-3, "wd": wd, "dec": dec, "steps": 3})
    return cases


def _blockbound(a, b, addend=None):
    # 2^-11 * K * max|a_row| * max|b_row| for out = a . b^T (a (M,K), b (N,K)), plus 2^-11 |addend|
    K = a.shape[1]
    bound = 2.0 ** -11 * K * np.abs(a).max(axis=1)[:, None] * np.abs(b).max(axis=1)[None, :]
    if addend is not None:
        bound = bound + 2.0 ** -11 * np.abs(addend)
    return bound + 2.0 ** -126


def test_gemm_pool_adam_whole_range(micropython, tmp_path):
    cases = gemm_cases(21)
    res = run_cases(cases, micropython, tmp_path)
    worst = {}

    def check(name, got, want, bound):
        e = np.abs(got - want)
        assert np.all(e <= bound), "%s: error / bound up to %.3g" % (name, float((e / bound).max()))
        worst[name] = max(worst.get(name, 0.0), float((e / bound).max()))

    for c, r in zip(cases, res):
        if c["kind"] == "mm":
            N, C, OC = c["N"], c["C"], c["OC"]
            x = unhx(c["x"]).reshape(N, C); w = unhx(c["w"]).reshape(OC, C); b = unhx(c["b"])
            dout = unhx(c["dout"]).reshape(N, OC)
            dw0 = unhx(c["dw0"]).reshape(OC, C); db0 = unhx(c["db0"])
            for tag in ("v", "p"):
                check(tag + " matmul_forward", unhx(r[tag + "_out"]).reshape(N, OC), x @ w.T + b,
                      _blockbound(x, w, b[None, :]))
                check(tag + " matmul_backward dinp", unhx(r[tag + "_dinp"]).reshape(N, C), dout @ w,
                      _blockbound(dout, w.T))
                check(tag + " matmul_backward dweight", unhx(r[tag + "_dw"]).reshape(OC, C),
                      dw0 + dout.T @ x, _blockbound(dout.T, x.T, dw0))
                check(tag + " matmul_backward dbias", unhx(r[tag + "_db"]), db0 + dout.sum(axis=0),
                      _blockbound(dout.T, np.ones((1, N)), db0[:, None])[:, 0])
        elif c["kind"] == "pool":
            B, T, C = c["B"], c["T"], c["C"]
            x = unhx(c["x"]).reshape(B, T, C); dout = unhx(c["dout"]).reshape(B, C)
            for tag in ("v", "p"):
                # forward: a GEMM with the constant 1/T (K = T, max|b| = 1/T)
                check(tag + " avgpool_forward", unhx(r[tag + "_out"]).reshape(B, C), x.mean(axis=1),
                      2.0 ** -11 * np.abs(x).max(axis=1) + 2.0 ** -126)
                # backward: dout / T per element, 15-bit 1/T: relative to the element
                want = np.repeat((dout / T)[:, None, :], T, axis=1)
                check(tag + " avgpool_backward", unhx(r[tag + "_dinp"]).reshape(B, T, C), want,
                      2.0 ** -13 * np.abs(want) + 2.0 ** -126)
        elif c["kind"] == "act":
            x = unhx(c["x"]); g = unhx(c["g"])
            for tag in ("v", "p"):
                for kind, slope, tol in ((0, 0.0, 0.0), (1, 0.01, 1e-4)):
                    want = np.where(x > 0, x, slope * x)
                    check("%s act %d forward" % (tag, kind), unhx(r["%s_%d_out" % (tag, kind)]), want,
                          tol * np.abs(want) + (2.0 ** -126 if kind else 0.0))
                    want = np.where(x > 0, g, slope * g)
                    check("%s act %d backward" % (tag, kind), unhx(r["%s_%d_d" % (tag, kind)]), want,
                          tol * np.abs(want) + (2.0 ** -126 if kind else 0.0))
        elif c["kind"] == "adam":
            # against the portable kernel: the parameter change relative to lr, the moments
            # relative to themselves (15-bit soft float)
            pp, pv = unhx(r["p_p"]), unhx(r["v_p"])
            check("adam p (per lr, plus 2^-22 |p|)", pv, pp, 2e-3 * c["lr"] * c["steps"] + 2.0 ** -22 * np.abs(pp))
            # the moments: relative to the magnitudes that enter them (the new and old moment,
            # the gradient with its weight decay), as cancellation can make the result small
            g = np.abs(unhx(c["g"])) + c["wd"] * np.abs(unhx(c["p"]))
            for mom, gin in (("m", g), ("v", g * g)):
                want = unhx(r["p_" + mom])
                sc = np.abs(want) + np.abs(unhx(c[mom])) + gin
                check("adam " + mom, unhx(r["v_" + mom]), want, 2e-3 * sc + 2.0 ** -126)
    print("error / bound:", {k: round(v, 3) for k, v in sorted(worst.items())})


# ---- 6. sizes beyond the int32 analysis are refused, not computed wrong ----------------------------

LIMITS = r'''
from array import array
from microformer import kernels_viper as V
def z(n):
    return array('f', bytes(4 * n))
def attempt(tag, f):
    try:
        f()
        print(tag, "OK")
    except ValueError as e:
        print(tag, "ValueError", e)
attempt("V16384", lambda: V.crossentropy_softmax(z(16384), z(16384), [3], 1, 16384))
attempt("V16385", lambda: V.crossentropy_softmax(z(16385), z(16385), [3], 1, 16385))
attempt("B12000", lambda: V.crossentropy_softmax(z(12000 * 10), z(12000 * 10), [1] * 12000, 12000, 10))
attempt("Tk65535", lambda: V.attention_forward(z(1), z(65535), z(1), z(65535), z(65535), None, 1, 1, 65535, 1, 1, 0))
attempt("Tk65536", lambda: V.attention_forward(z(1), z(65536), z(1), z(65536), z(65536), None, 1, 1, 65536, 1, 1, 0))
'''


def test_sizes_beyond_the_bounds_are_refused(micropython, tmp_path):
    f = tmp_path / "limits.py"
    f.write_text(LIMITS)
    out = helpers.run_micropython(str(f), heap="16M", exe=micropython)
    lines = dict(line.split(" ", 1) for line in out.splitlines() if line.strip())
    assert lines["V16384"] == "OK" and lines["Tk65535"] == "OK", out
    assert "at most 16384 classes, got V=16385" in lines["V16385"], out
    assert "B * log2(V) must be < 45000, got B=12000 V=10" in lines["B12000"], out
    assert "Tk must be < 65536 keys, got 65536" in lines["Tk65536"], out
