# microformer.viper_elementwise: elementwise kernels: ReLU, leaky ReLU and GELU (exact and tanh
# form), forward and backward (tanh and sigmoid stay portable); dropout's masked scale, and the
# same product unmasked (scale_inplace: a micro-batch's loss gradient); the training step's
# guards: a NaN / inf scan, a bit copy.
import micropython
from array import array
from math import exp, sqrt, tanh
from .actkind import GELU, GELU_TANH, LEAKY_RELU, RELU, erf
from .lazy import sibling as _sibling
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
            mag(x, m, e)
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
            mag(g, m, e)
            v = (m >> 9) * 20972
            if (g >> 31) & 1:
                v = 0 - v
            _store(dinp, i, v, e - 141 - 21)
        else:
            pd[i] = 0


# ---- GELU: x Phi(x), Phi the normal CDF (GELU) or 0.5 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
# (GELU_TANH). Phi and the derivative D(x) = Phi(x) + x Phi'(x) are tables in Q29 on a grid of
# step 1/64 over [0, 6], linearly interpolated (snippet `lookup`); Phi(-x) = 1 - Phi(x) and
# D(-x) = 1 - D(x); beyond 6 both are 1 (1 - Phi(6) < 1e-9, |1 - D(6)| < 4e-8).
# ERROR BOUND (tests/mp/test_viper_range.py): gelu(x) within 1e-5 |x| + 1e-4 |gelu(x)| of the
#   exact value; the gradient within 5e-5 |dout| + 1e-4 |dinp| (the interpolation error of
#   the tables: h^2 / 8 max|f''| with h = 1/64; the products keep 15 and 16 bits). Subnormal
#   inputs count as 0; +inf gives +inf, -inf and NaN give NaN (as 0.5 x (1 + erf(x / sqrt 2)));
#   a non-finite x gives a NaN gradient, as the portable formula does.
_TABLES = {}                # kind -> (Phi, D): array('i') of 385 Q29 values each


def _tables(kind):
    t = _TABLES.get(kind)
    if t is None:
        fw = array("i", [0] * 385)
        bw = array("i", [0] * 385)
        c = sqrt(2.0 / 3.141592653589793)
        for k in range(385):
            x = k / 64.0
            if kind == GELU:
                phi = 0.5 * (1.0 + erf(x / sqrt(2.0)))
                d = phi + x * exp(-0.5 * x * x) / sqrt(2.0 * 3.141592653589793)
            else:
                th = tanh(c * (x + 0.044715 * x * x * x))
                phi = 0.5 * (1.0 + th)
                d = phi + 0.5 * x * (1.0 - th * th) * c * (1.0 + 3.0 * 0.044715 * x * x)
            fw[k] = int(phi * 536870912.0 + 0.5)
            bw[k] = int(d * 536870912.0 + 0.5)
        t = _TABLES[kind] = (fw, bw)
    return t


@micropython.viper
def _gelu(out, inp, n: int, tab, nan, dout, back: int):
    # back 0: out (n,) = inp Phi(inp); back 1: out (n,) = dout D(inp)
    po = ptr32(out)
    pi = ptr32(inp)
    pg = ptr32(dout)
    T = ptr32(tab)
    NANB = ptr32(nan)[0]
    one = 1 << 29
    for i in range(n):
        x = pi[i]
        ex = (x >> 23) & 0xFF
        neg = (x >> 31) & 1
        if ex == 255:
            if back == 0 and neg == 0 and (x & 0x7FFFFF) == 0:
                po[i] = x                       # gelu(+inf) = +inf
            else:
                po[i] = NANB
            continue
        y = x                                   # the factor: x (forward) or dout (backward)
        if back:
            y = pg[i]
        ey = (y >> 23) & 0xFF
        if ey == 255:
            if (y & 0x7FFFFF) != 0:
                po[i] = y | 0x400000            # NaN dout
                continue
            ey = 254                            # inf dout: read as FLT_MAX, saturates below
        if ey == 0:
            po[i] = (y >> 31) << 31             # +-0
            continue
        lookup(x, T, ex, tq, k, f, dl, ph)
        if neg:
            ph = one - ph                       # 1 - Phi(|x|), 1 - D(|x|) (may be < 0)
        sg = (y >> 31) & 1
        if ph < 0:
            ph = 0 - ph
            sg = sg ^ 1
        if ph == 0:
            po[i] = sg << 31
            continue
        pe = 0 - 29                             # ph 2^pe, ph to [2^14, 2^15)
        norm15(ph, pe)
        v = (((y & 0x7FFFFF) | 0x800000) >> 8) * ph                 #!chk v
        e = ey - 142 + pe
        pack(po, i, v, e, sg)


_NAN = array("f", [float("nan")])


# act_forward / act_backward are viper functions: as bytecode their frames (12 and 14 words)
# came from the GC heap on every call (see viper_gemm._mm); so is _tables' (18 words), which
# they call only to build a table the first time.
_NONE = None                # viper compares objects with a global, not the literal


@micropython.viper
def _table(kind: int, back: int):
    # the GELU table of kind (forward: Phi, back: D), built on first use
    t = _TABLES.get(kind)
    if t is _NONE:
        t = _tables(kind)
    return t[back]


@micropython.viper
def act_forward(out, inp, N: int, kind: int):
    # out (N,) = f(inp (N,)); RELU, LEAKY_RELU, GELU, GELU_TANH in viper, TANH and SIGMOID portable
    if kind == int(RELU) or kind == int(LEAKY_RELU):
        _relu(out, inp, N, kind)
    elif kind == int(GELU) or kind == int(GELU_TANH):
        _gelu(out, inp, N, _table(kind, 0), _NAN, inp, 0)
    else:
        _sibling("kernels").act_forward(out, inp, N, kind)


@micropython.viper
def act_backward(dinp, dout, inp, out, N: int, kind: int):
    # in the forward pass this was out = f(inp); dinp (N,) = f'(inp) * dout (written)
    if kind == int(RELU) or kind == int(LEAKY_RELU):
        _relu_back(dinp, dout, inp, N, kind)
    elif kind == int(GELU) or kind == int(GELU_TANH):
        _gelu(dinp, inp, N, _table(kind, 1), _NAN, dout, 1)
    else:
        _sibling("kernels").act_backward(dinp, dout, inp, out, N, kind)


# ---- dropout: out = inp * scale where kept, else 0 ---------------------------------------------
# ERROR BOUND (tests/mp/test_viper_decode_range.py): each kept output is the float32 product inp *
#   scale rounded to nearest, ties to even, bit for bit, except that a subnormal inp (or scale)
#   counts as 0 and a product below 2^-126 is flushed to 0 (an absolute error below 2^-126);
#   +-inf and NaN as IEEE (inf * 0 = NaN); past float32's largest: +-inf. A dropped output is +0.
# How: the 24-bit mantissas as 12-bit halves, P = hh 2^24 + mid 2^12 + ll with hh, ll < 2^24 and
#   mid < 2^25 [B8]; low = ll + (mid mod 2^12) 2^12 < 2^25, high = hh + mid / 2^12 + low / 2^24
#   < 2^24 + 2^13 + 2: the 48-bit product as high 2^24 + low (mod 2^24), then rounded once.
@micropython.viper
def _drop(out, inp, keep, sc, n: int):
    # out (n,) = inp * sc[0] where keep[i] (bytes, 1 = kept), else 0
    po = ptr32(out)
    pi = ptr32(inp)
    pk = ptr8(keep)
    s = ptr32(sc)[0]
    es = (s >> 23) & 0xFF
    ms = (s & 0x7FFFFF) | 0x800000
    sh = ms >> 12
    sl = ms & 0xFFF
    b22 = 22                            # (a literal 0x7F800000 would be folded into a bigint)
    INF = 0x1FE << b22                  # +inf's bits
    QNAN = 0x1FF << b22                 # a quiet NaN's
    for i in range(n):
        if pk[i] == 0:
            po[i] = 0
            continue
        x = pi[i]
        ex = (x >> 23) & 0xFF
        sg = ((x ^ s) >> 31) & 1
        if ex == 255 or es == 255:
            if (ex == 255 and (x & 0x7FFFFF) != 0) or (es == 255 and (s & 0x7FFFFF) != 0):
                po[i] = QNAN                            # NaN in: NaN out
            elif ex == 0 or es == 0:
                po[i] = QNAN                            # inf * 0
            else:
                po[i] = (sg << 31) | INF
            continue
        if ex == 0 or es == 0:
            po[i] = sg << 31                            # a zero (or flushed subnormal) factor
            continue
        mx = (x & 0x7FFFFF) | 0x800000
        xh = mx >> 12
        xl = mx & 0xFFF
        mid = xh * sl + xl * sh                                     #!chk mid
        low = xl * sl + ((mid & 0xFFF) << 12)                       #!chk low
        high = xh * sh + (mid >> 12) + (low >> 24)                  #!chk high
        low = low & 0xFFFFFF
        e = ex + es - 127
        if high >= 0x800000:
            e += 1
            m = high
            rest = low
            half = 0x800000
        else:
            m = (high << 1) | (low >> 23)
            rest = low & 0x7FFFFF
            half = 0x400000
        if rest > half or (rest == half and (m & 1)):
            m += 1
            if m == 0x1000000:
                m = 0x800000
                e += 1
        if e >= 255:
            po[i] = (sg << 31) | INF
        elif e <= 0:
            po[i] = sg << 31
        else:
            po[i] = (sg << 31) | (e << 23) | (m & 0x7FFFFF)


# ---- dropout's keep mask: xorshift32 in 16-bit halves (exactly kernels.dropout_mask's draws) ----
@micropython.viper
def _dmask(keep, state, n: int, threshold: int):
    # keep (n,) bytes: 1 where the top 24 bits of the next draw are >= threshold; state: the
    # halves [hi, lo] (array('i')), advanced by n draws. Every value stays below 2^29.
    pk = ptr8(keep)
    st = ptr32(state)
    hi = st[0]
    lo = st[1]
    for i in range(n):
        hi ^= ((hi << 13) | (lo >> 3)) & 0xFFFF
        lo ^= (lo << 13) & 0xFFFF
        lo ^= hi >> 1
        hi ^= ((hi << 5) | (lo >> 11)) & 0xFFFF
        lo ^= (lo << 5) & 0xFFFF
        pk[i] = 1 if ((hi << 8) | (lo >> 8)) >= threshold else 0
    st[0] = hi
    st[1] = lo


dropout_mask = _dmask
_SCALE = array("f", [0.0])


def dropout_apply(out, inp, keep, n, scale):
    # out (n,) = inp * scale where keep[i], else 0: dropout's forward (inp = x) and its backward
    # (inp = dy: the same mask and scale)
    _SCALE[0] = scale
    _drop(out, inp, keep, _SCALE, n)


_KEEP = [b"\x01" * 64]     # a mask that keeps every element (bytes), grown on demand


def scale_inplace(g, n, factor):
    # g (n,) *= factor, each element the float32 product of g[i] and float32(factor) (_drop with
    # every element kept, in place: element i is read before it is written); a micro-batch's
    # loss gradient (train.py) on the viper kernels, without loading the portable module
    keep = _KEEP[0]
    if len(keep) < n:
        _KEEP[0] = None                 # the old one can go before the new one is made
        keep = _KEEP[0] = b"\x01" * (n + n // 4 + 16)
    _SCALE[0] = factor
    _drop(g, g, keep, _SCALE, n)


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
    # dst (n,) = src (n,) as raw 32-bit words: four words per turn through a moving address
    # (constant offsets index it: a quarter of the indexed loop's instructions)
    a = int(ptr32(src))
    off = int(ptr32(dst)) - a
    copy4(a, off, end, n)


first_nonfinite = _first_nonfinite
copy = _copy
