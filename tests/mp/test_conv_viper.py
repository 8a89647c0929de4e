"""The viper Conv1D kernels on worst-case inputs, inside MicroPython on both interpreters: every
operand at the largest mantissa (it quantizes to 2^14 - 1, the [B1] worst case) with long
multiply-accumulate rows (K up to 4096), against the portable kernels. On the 32-bit port viper's
int wraps mod 2^32 as on the ESP32-S3, so an intermediate past 2^31 would give a wrong result;
on the stock 64-bit port an instrumented copy checks every `#!chk` line (test_viper.py's)."""

import helpers
import test_viper as tv

WORST = r'''
from array import array
from microformer import kernels as P
import KV as V
M = 1.9999998807907104               # mantissa all ones: quantizes to 2^14 - 1 exactly
def full(n, val):
    return array('f', [val] * n)
def z(n):
    return array('f', bytes(4 * n))
def rel(a, b):
    m = max(abs(t) for t in a)
    return max(abs(a[i] - b[i]) for i in range(len(a))) / m
# (B, L, C, OC, k, stride, pad, dil, groups): the forward's K = C/groups * k, dweight's = B * Lout,
# dinput's = k * OC/groups; short rows (K = 1..9: the one- and two-chunk paths) and long ones
CASES = [(2, 5, 1, 1, 1, 1, 0, 1, 1), (1, 6, 3, 2, 1, 1, 0, 1, 1), (2, 6, 1, 2, 5, 1, 2, 1, 1),
         (1, 9, 2, 3, 4, 1, 0, 1, 1), (1, 9, 9, 2, 1, 1, 0, 1, 1), (2, 12, 3, 3, 3, 2, 2, 2, 1),
         (1, 9, 64, 8, 9, 1, 0, 1, 1), (1, 8, 512, 2, 8, 1, 0, 1, 1), (4, 1024, 1, 2, 1, 1, 0, 1, 1),
         (1, 12, 2, 64, 9, 1, 4, 1, 1), (1, 12, 8, 512, 8, 1, 4, 1, 8), (2, 40, 6, 6, 5, 1, 2, 1, 6)]
for (B, L, C, OC, K, st, pad, dil, g) in CASES:
    Lout = (L + 2 * pad - dil * (K - 1) - 1) // st + 1
    Cg = C // g
    for sgn in (1.0, -1.0):
        x = full(B * L * C, M); w = full(OC * Cg * K, sgn * M); b = full(OC, sgn * M * 2.0 ** 20)
        o1 = z(B * Lout * OC); o2 = z(B * Lout * OC)
        P.conv1d_forward(o1, x, w, b, B, L, C, Lout, OC, K, st, pad, dil, g)
        V.conv1d_forward(o2, x, w, b, B, L, C, Lout, OC, K, st, pad, dil, g)
        tag = "B%d L%d C%d OC%d k%d s%d p%d d%d g%d sgn%d" % (B, L, C, OC, K, st, pad, dil, g, sgn)
        print("ERR conv forward %s %.3e" % (tag, rel(o1, o2)))
        dy = full(B * Lout * OC, sgn * M)
        dx1 = z(B * L * C); dx2 = z(B * L * C)
        dw1 = full(OC * Cg * K, M * 1e3); dw2 = array('f', dw1); db1 = full(OC, sgn * M * 1e3); db2 = array('f', db1)
        P.conv1d_backward(dx1, dw1, db1, dy, x, w, B, L, C, Lout, OC, K, st, pad, dil, g)
        V.conv1d_backward(dx2, dw2, db2, dy, x, w, B, L, C, Lout, OC, K, st, pad, dil, g)
        print("ERR conv dinput %s %.3e" % (tag, rel(dx1, dx2)))
        print("ERR conv dweight %s %.3e" % (tag, rel(dw1, dw2)))
        print("ERR conv dbias %s %.3e" % (tag, rel(db1, db2)))
        db1 = full(OC, 0.0); db2 = full(OC, 0.0)
        P.conv1d_backward(None, None, db1, dy, x, w, B, L, C, Lout, OC, K, st, pad, dil, g)
        V.conv1d_backward(None, None, db2, dy, x, w, B, L, C, Lout, OC, K, st, pad, dil, g)
        print("ERR conv dbias alone %s %.3e" % (tag, rel(db1, db2)))
# a scratch smaller than one sample: every sample its own chunk (the accumulate path)
V.CONV_SCRATCH = 1
x = full(3 * 20 * 4, M); w = full(6 * 4 * 3, -M); dy = full(3 * 20 * 6, M)
dw1 = z(72); dw2 = z(72); db1 = z(6); db2 = z(6); dx1 = z(240); dx2 = z(240)
P.conv1d_backward(dx1, dw1, db1, dy, x, w, 3, 20, 4, 20, 6, 3, 1, 1, 1, 1)
V.conv1d_backward(dx2, dw2, db2, dy, x, w, 3, 20, 4, 20, 6, 3, 1, 1, 1, 1)
print("ERR conv chunked dweight %.3e" % rel(dw1, dw2))
print("ERR conv chunked dinput %.3e" % rel(dx1, dx2))
# chunks and two groups: each chunk takes every group's slice of the weights
w = full(6 * 2 * 3, -M); b = full(6, M)
for i in range(18, 36):                 # the second group's weights differ from the first's
    w[i] = M * 0.75
o1 = z(3 * 20 * 6); o2 = z(3 * 20 * 6)
P.conv1d_forward(o1, x, w, b, 3, 20, 4, 20, 6, 3, 1, 1, 1, 2)
V.conv1d_forward(o2, x, w, b, 3, 20, 4, 20, 6, 3, 1, 1, 1, 2)
print("ERR conv chunked grouped forward %.3e" % rel(o1, o2))
dw1 = z(36); dw2 = z(36); db1 = z(6); db2 = z(6); dx1 = z(240); dx2 = z(240)
P.conv1d_backward(dx1, dw1, db1, dy, x, w, 3, 20, 4, 20, 6, 3, 1, 1, 1, 2)
V.conv1d_backward(dx2, dw2, db2, dy, x, w, 3, 20, 4, 20, 6, 3, 1, 1, 1, 2)
print("ERR conv chunked grouped dweight %.3e" % rel(dw1, dw2))
print("ERR conv chunked grouped dbias %.3e" % rel(db1, db2))
print("ERR conv chunked grouped dinput %.3e" % rel(dx1, dx2))
print("DONE")
'''


def test_conv_worst_case_both_interpreters(tmp_path, micropython):
    if helpers.traits(micropython)["bits"] == 32:
        out = tv.run_mp(micropython, "@micropython.viper\ndef f(a: int, b: int) -> int:\n    return a * b\n"
                        "print(f(100000, 100000))\n", tmp_path)
        assert out.split() == ["1410065408"], "viper int does not wrap mod 2^32 here: %r" % out
    out = tv.run_mp(micropython, tv._script(WORST), tmp_path, heap="32M")
    assert "DONE" in out
    errs = tv._errors(out)
    assert len(errs) == 12 * 2 * 5 + 2 + 4, sorted(errs)
    tv._check(errs)


def test_conv_instrumented_on_64bit(tmp_path):
    """The same worst cases through the copy of kernels_viper.py that asserts |v| < 2^31 after every
    line marked `#!chk` (the conv section's index lines among them)."""
    exe = helpers.interpreter_path("stock")
    assert helpers.traits(exe)["bits"] == 64
    d = tv._instrumented(tmp_path)
    src = open(d + "/kv_checked/viper_conv.py").read()
    assert "_chk(di)" in src and "_chk(u)" in src          # the conv section's markers were expanded
    out = tv.run_mp(exe, tv._script(WORST, module="kv_checked"), tmp_path, path=("lib", d), heap="32M")
    assert "DONE" in out
    tv._check(tv._errors(out))
