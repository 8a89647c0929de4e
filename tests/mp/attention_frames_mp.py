"""The MicroPython side of tests/mp/test_attention_frames.py: heap bytes allocated (micropython.
mem_total, which counts every allocation, freed or not) by a batch of calls of each attention
kernel of the viper backend, after a warm-up call. A bytecode function whose frame exceeds 11
words takes it from the heap on every call; the attention entry points must not.

    MICROPYPATH=lib:tests micropython tests/mp/attention_frames_mp.py
"""
import micropython
from array import array

from microformer import kernels_viper as V

B, Tq, Tk, C, NH, L = 2, 4, 5, 8, 2, 7


def z(n):
    return array("f", [0.0] * n)


def ramp(n, a):
    return array("f", [((i * a) % 17 - 8) / 8.0 for i in range(n)])


q, k, v, dout = ramp(B * Tq * C, 3), ramp(B * Tk * C, 5), ramp(B * Tk * C, 7), ramp(B * Tq * C, 11)
out, att = z(B * Tq * C), z(B * NH * Tq * Tk)
dq, dk, dv = z(B * Tq * C), z(B * Tk * C), z(B * Tk * C)
mask = bytearray(B * Tk)
mask[1] = 1
keep = bytearray([1] * (B * NH * Tq * Tk))
keep[3] = 0
q1, kc, vc, o1, a1 = ramp(B * C, 13), ramp(B * L * C, 2), ramp(B * L * C, 9), z(B * C), z(B * NH * L)

# Each kernel is called from module level (a helper function or lambda making a 12-argument call
# would itself need a frame beyond 11 words): a warm-up call (scratch buffers grown, scales
# cached), then 10 calls counted.
_t = [0]


def start():
    _t[0] = micropython.mem_total()


def report(name):
    print("ALLOC %s %d" % (name, micropython.mem_total() - _t[0]))


for i in range(11):
    if i == 1:
        start()
    V.attention_forward(out, att, q, k, v, mask, B, Tq, Tk, C, NH, 1)
report("attention_forward")
for i in range(11):
    if i == 1:
        start()
    V.attention_forward(out, att, q, k, v, None, B, Tq, Tk, C, NH, 0)
report("attention_forward (no mask)")
for i in range(11):
    if i == 1:
        start()
    V.attention_backward(dq, dk, dv, None, dout, att, q, k, v, B, Tq, Tk, C, NH)
report("attention_backward")
for i in range(11):
    if i == 1:
        start()
    V.attention_context(out, att, keep, v, B, Tq, Tk, C, NH, 1.25)
report("attention_context")
for i in range(11):
    if i == 1:
        start()
    V.attention_backward_dropout(dq, dk, dv, None, dout, att, keep, q, k, v, B, Tq, Tk, C, NH, 1.25)
report("attention_backward_dropout")
for i in range(11):
    if i == 1:
        start()
    V.attention_decode(o1, a1, q1, kc, vc, B, 5, L, C, NH)
report("attention_decode")
# one item whose weights exceed the kernel's PIECE: the backward in pieces of query rows
S1 = 46
q2, k2, v2, d2 = ramp(S1 * C, 3), ramp(S1 * C, 5), ramp(S1 * C, 7), ramp(S1 * C, 11)
o2, a2, a3 = z(S1 * C), z(NH * S1 * S1), z(NH * S1 * S1)
dq2, dk2, dv2 = z(S1 * C), z(S1 * C), z(S1 * C)
V.attention_forward(o2, a2, q2, k2, v2, None, 1, S1, S1, C, NH, 0)
for i in range(11):
    if i == 1:
        start()
    V.copy(a3, a2, NH * S1 * S1)         # (the backward writes dS over the weights)
    V.attention_backward(dq2, dk2, dv2, None, d2, a3, q2, k2, v2, 1, S1, S1, C, NH)
report("attention_backward (rows)")
print("DONE")
