# microformer.viper_common: what every viper kernel module shares: the module scratch, the 15-bit
# mantissa of a Python float, the float32 encoder _store, the debug guard _chk, zero.
# The number format and the overflow analysis are described in kernels_viper.py.
import micropython
from array import array
from math import frexp as _frexp

# ---- module scratch (grown on demand, so steady-state calls allocate nothing) ---------------
_S = [array("i", [0] * 64)]    # int scratch: quantized blocks
_F = [array("f", [0.0] * 64)]  # float scratch: dA / dS rows of the attention backward
_G = [array("f", [0.0] * 64)]  # float scratch: the dropped attention weights (A keep / (1 - p))
_ONES = [array("f", [1.0] * 16)]
# _BL[j] = the bit length of j (0 .. 8) for j < 256: the normalizing shift of a packed value in one
# load (snippet norm24_bl) in place of a cascade of compares
_BL = bytes([0] + [len(bin(j)) - 2 for j in range(1, 256)])


def _grow(box, n, typecode, fill):
    # box[0], replaced by a larger array of `fill` when it holds fewer than n items
    a = box[0]
    if len(a) < n:
        box[0] = None                   # the old one can go before the new one is made
        a = box[0] = _filled(typecode, n + n // 4 + 16, fill)
    return a


def _filled(typecode, n, fill):
    # array(typecode) of n copies of fill, made without a transient of n items: from a list
    # or bytes the heap would hold the items twice; range fills it lazily, then _fill32
    a = array(typecode, range(n))
    _fill32(a, array(typecode, [fill]), n)
    return a


@micropython.viper
def _fill32(buf, one, n: int):
    # buf[0:n] = the 32-bit item one[0], bit for bit
    p = ptr32(buf)
    v = ptr32(one)[0]
    for i in range(n):
        p[i] = v


def _iscratch(n):
    return _grow(_S, n, "i", 0)


def _fscratch(n):
    return _grow(_F, n, "f", 0.0)


def _gscratch(n):
    return _grow(_G, n, "f", 0.0)


def _ones(n):
    return _grow(_ONES, n, "f", 1.0)


def _mant15(x):
    # float x >= 0 -> (m, e) with x ~= m * 2^e and 2^14 <= m < 2^15 (m = 0 for x == 0)
    if x <= 0.0:
        return 0, 0
    f, e = _frexp(x)
    m = int(f * 32768.0 + 0.5)
    if m >= 32768:
        m >>= 1
        e += 1
    return m, e - 15


# ---- element helpers (cold paths; hot loops inline the same snippets) -----------------------
@micropython.viper
def _chk(x: int):
    # debug guard used by the instrumented copy in tests: |x| must fit a 32-bit signed int
    b = 30                              # a variable: the compiler would fold 1 << 30 into a bigint
    lim = (1 << b) + ((1 << b) - 1)
    if x > lim or x < 0 - lim - 1:
        raise OverflowError("viper int32 bound exceeded")


@micropython.viper
def _store(buf, i: int, v: int, e: int):
    # buf[i] = v * 2^e as float32 bits; |v| < 2^31. Round to nearest, flush underflow, inf on overflow.
    p = ptr32(buf)
    store(p, i, v, e)


@micropython.viper
def _zero(buf, n: int):
    p = ptr32(buf)
    for i in range(n):
        p[i] = 0


def zero(buf, n):
    _zero(buf, n)
