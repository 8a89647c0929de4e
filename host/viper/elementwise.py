# microformer.viper_elementwise: elementwise kernels: ReLU and leaky ReLU, forward and backward (the
# smooth activations stay portable); the training step's guards: a NaN / inf scan, a bit copy.
import micropython
from . import kernels as _pk
from .kernels import LEAKY_RELU, RELU
from .viper_common import _store


@micropython.viper
def _relu(out, inp, n: int, leaky: int):
    # out (n,) = relu(inp): x > 0 iff the sign bit is clear and the bits are not 0 (subnormals
    # count); NaN -> NaN. leaky: 0.01 x (15-bit mantissa product, via _store), -inf -> -inf
    po = ptr32(out)
    pi = ptr32(inp)
    for i in range(n):
        x = pi[i]
        e = (x >> 23) & 0xFF
        if e == 255 and (x & 0x7FFFFF) != 0:
            po[i] = x                   # NaN stays NaN (as torch.relu)
        elif ((x >> 31) & 1) == 0 and x != 0:
            po[i] = x
        elif leaky and e == 255:
            po[i] = x                   # 0.01 * -inf = -inf
        elif leaky and e != 0:
            #@ mag(x, m, e)
            _store(out, i, 0 - (m >> 9) * 20972, e - 141 - 21)   # 0.01 ~ 20972 * 2^-21
        else:
            po[i] = 0


@micropython.viper
def _relu_back(dinp, dout, inp, n: int, leaky: int):
    # dinp (n,) = dout where inp > 0, else 0 (or 0.01 dout), as torch: relu passes dout where
    # not inp <= 0 (a NaN inp included), leaky_relu where inp > 0; a NaN dout stays NaN there
    pd = ptr32(dinp)
    pg = ptr32(dout)
    pi = ptr32(inp)
    for i in range(n):
        x = pi[i]
        g = pg[i]
        e = (g >> 23) & 0xFF
        xnan = ((x >> 23) & 0xFF) == 255 and (x & 0x7FFFFF) != 0
        if (((x >> 31) & 1) == 0 and x != 0 and not xnan) or (xnan and not leaky):
            pd[i] = g
        elif leaky and e == 255:
            pd[i] = g                   # 0.01 * (NaN or +-inf)
        elif leaky and e != 0:
            #@ mag(g, m, e)
            v = (m >> 9) * 20972
            if (g >> 31) & 1:
                v = 0 - v
            _store(dinp, i, v, e - 141 - 21)
        else:
            pd[i] = 0


def act_forward(out, inp, N, kind):
    # out (N,) = f(inp (N,)); RELU and LEAKY_RELU in viper, the smooth ones portable
    if kind == RELU or kind == LEAKY_RELU:
        _relu(out, inp, N, kind)
    else:
        _pk.act_forward(out, inp, N, kind)


def act_backward(dinp, dout, inp, out, N, kind):
    # in the forward pass this was out = f(inp); dinp (N,) = f'(inp) * dout (written)
    if kind == RELU or kind == LEAKY_RELU:
        _relu_back(dinp, dout, inp, N, kind)
    else:
        _pk.act_backward(dinp, dout, inp, out, N, kind)


# ---- guards of the training step: a scan for NaN / inf and a bit copy (finite.py, optim.py) ----
@micropython.viper
def _first_nonfinite(buf, n: int) -> int:
    # index of the first element whose exponent bits are all ones (NaN or +-inf), or -1
    p = ptr32(buf)
    for i in range(n):
        if ((p[i] >> 23) & 0xFF) == 255:
            return i
    return -1


@micropython.viper
def _copy(dst, src, n: int):
    # dst (n,) = src (n,) as raw 32-bit words
    d = ptr32(dst)
    s = ptr32(src)
    for i in range(n):
        d[i] = s[i]


first_nonfinite = _first_nonfinite
copy = _copy
