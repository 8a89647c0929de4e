# One or more viper kernels from each generated module (lib/microformer/viper_*.py) on fixed
# inputs, run by `make xtensa-test` on the emulated Xtensa core and on the 32-bit unix port: each
# line is `KERNEL name hex-of-outputs`, and the two ports' lines must be equal. The kernels work
# on float32 bit patterns with integer instructions, so equal means bit for bit.
import sys
from array import array
from binascii import hexlify

from microformer import kernels_viper as V
from microformer import viper_common, viper_conv, viper_elementwise, viper_gemm  # noqa: F401
from microformer import viper_norm, viper_optim, viper_q8, viper_rows, viper_sequence, viper_softmax  # noqa: F401

_state = [12345]


def rnd(n, scale=1.0):
    # a fixed pseudo-random float32 array (an LCG: the same on every port)
    a = array('f', range(n))
    s = _state[0]
    for i in range(n):
        s = (s * 1103515245 + 12345) & 0x7fffffff
        a[i] = ((s >> 8) / 8388608.0 - 0.5) * 2.0 * scale
    _state[0] = s
    return a


def z(n):
    a = array('f', range(n))
    V.zero(a, n)
    return a


def hx(*bufs):
    return " ".join(hexlify(bytes(b)).decode() for b in bufs)


def case(name, fn):
    try:
        print("KERNEL", name, fn())
    except Exception as e:  # one line per failure; the other kernels still run
        print("KERNEL", name, "ERROR", repr(e))


def gemm():
    N, C, OC = 5, 12, 7
    x, w, b = rnd(N * C), rnd(OC * C), rnd(OC)
    out = z(N * OC)
    V.matmul_forward(out, x, w, b, N, C, OC)
    dx, dw, db = z(N * C), z(OC * C), z(OC)
    V.matmul_backward(dx, dw, db, rnd(N * OC), x, w, N, C, OC)
    return hx(out, dx, dw, db)


def softmax():
    B, T, C, NH = 2, 6, 8, 2
    q, k, v = rnd(B * T * C), rnd(B * T * C), rnd(B * T * C)
    out, att = z(B * T * C), z(B * NH * T * T)
    V.attention_forward(out, att, q, k, v, None, B, T, T, C, NH, 1)
    logits = rnd(4 * 5, 3.0)
    dl = z(4 * 5)
    loss = V.crossentropy_softmax(dl, logits, array('i', [0, 3, 4, 1]), 4, 5)
    return hx(out, att, dl, array('f', [loss]))


def elementwise():
    n = 33
    x = rnd(n, 4.0)
    r = []
    for kind in (V.RELU, V.LEAKY_RELU, V.GELU):
        y = z(n)
        V.act_forward(y, x, n, kind)
        r.append(y)
    return hx(*r)


def libm():
    # TANH and SIGMOID are portable kernels (math.tanh, math.exp): the C library's libm, which
    # differs between ports (glibc on the 32-bit unix port, MicroPython's lib/libm here, newlib's on
    # an ESP32-S3 firmware); compared within 2 units in the last place, not bit for bit
    n = 33
    x = rnd(n, 4.0)
    r = []
    for kind in (V.TANH, V.SIGMOID):
        y = z(n)
        V.act_forward(y, x, n, kind)
        r.append(y)
    return hx(*r)


def gelu_tanh():
    # viper, but its Q29 table is computed on first use from math.tanh (libm, as above): a table
    # entry one unit apart moves an output by about 1e-7; compared within 1e-6
    n = 33
    x = rnd(n, 4.0)
    y = z(n)
    V.act_forward(y, x, n, V.GELU_TANH)
    return hx(y)


def norm():
    N, C = 3, 10
    x = rnd(N * C, 2.0)
    ln = [rnd(C), rnd(C), z(N), z(N)]
    out = z(N * C)
    V.layernorm_forward(out, x, ln, N, C, 1e-5)
    return hx(out, ln[2], ln[3])


def optim():
    n = 17
    p, g, m, v = rnd(n), rnd(n), z(n), z(n)
    for t in (1, 2, 3):
        V.adam_update(p, g, m, v, n, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1 - 0.9 ** t, 1 - 0.999 ** t, 0)
    return hx(p, m, v)


def conv():
    B, L, C, OC, KS = 2, 9, 3, 4, 3
    Lout = L - KS + 1
    x, w, b = rnd(B * L * C), rnd(OC * C * KS), rnd(OC)
    out = z(B * Lout * OC)
    V.conv1d_forward(out, x, w, b, B, L, C, Lout, OC, KS, 1, 0, 1, 1)
    return hx(out)


def q8():
    N, C, OC = 3, 8, 5
    x = rnd(N * C)
    q = array('b', [((i * 37) % 255) - 127 for i in range(OC * C)])
    scale, bias = rnd(OC, 0.01), rnd(OC)
    out = z(N * OC)
    V.q8_matmul_forward(out, x, q, scale, bias, N, C, OC)
    return hx(out)


def rows():
    x = rnd(19)
    dst = z(2 * 4)
    src = rnd(5 * 4)
    V.gather_rows(dst, src, array('i', [3, 1]), 0, 2, 4)
    return "%d %s" % (V.argmax(x, 2, 15), hx(dst))


def sequence():
    n = 13
    a, b = rnd(n), rnd(n)
    out = z(n)
    V.add_forward(out, a, b, n)
    N, C, Vv = 4, 6, 5
    table = rnd(Vv * C)
    emb = z(N * C)
    bad = V.embedding_forward(emb, array('f', [4, 0, 2, 2]), table, N, C, Vv)
    return "%d %s" % (bad, hx(out, emb))


for name, fn in (("viper_gemm", gemm), ("viper_softmax", softmax), ("viper_elementwise", elementwise),
                 ("libm_tanh_sigmoid", libm), ("libm_gelu_tanh_table", gelu_tanh),
                 ("viper_norm", norm), ("viper_optim", optim), ("viper_conv", conv), ("viper_q8", q8),
                 ("viper_rows", rows), ("viper_sequence", sequence)):
    case(name, fn)
print("KERNELS DONE", sys.implementation._machine if hasattr(sys.implementation, "_machine") else "")
