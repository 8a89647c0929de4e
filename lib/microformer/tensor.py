# microformer.tensor: flat row-major float32 buffers with a shape, a seeded PRNG, Xavier init.
# Runs unchanged under CPython and MicroPython.
import sys
from array import array

_MICROPYTHON = sys.implementation.name == "micropython"


def zeros(n, typecode="f"):
    """array(typecode) of n zeros ('f' float32, 'i' int32). On MicroPython it is made in one
    allocation of its own size: array('f', bytes(4 n)) would also allocate a same-size temporary
    beside it, which the heap gets back only at the next collection, so every buffer made that way
    would leave a hole of its size behind (a heap that has the room but not in one piece). range
    has a length, so the array is made at its size from it, then cleared. CPython frees the
    temporary at once: there it is made from bytes."""
    if not _MICROPYTHON:
        return array(typecode, bytes(4 * n))
    a = array(typecode, range(n))
    if typecode == "f":
        from . import backend
        backend.K.zero(a, n)
    else:
        for i in range(n):
            a[i] = 0
    return a


def shape_size(shape):
    """The number of values a tensor of `shape` holds (the product of its dimensions)."""
    n = 1
    for d in shape:
        n *= d
    return n


def _check_shape(shape, who):
    if not isinstance(shape, tuple):
        shape = tuple(shape)
    for d in shape:
        if not isinstance(d, int) or d < 1:
            raise ValueError("%s: shape dimensions must be positive ints, got %r" % (who, shape))
    return shape


class Tensor:
    """A float32 `array('f')` in `.data` (row-major) viewed with `.shape` (a tuple)."""

    def __init__(self, shape, data=None, name=""):
        shape = _check_shape(shape, "Tensor")
        n = shape_size(shape)
        if data is None:
            data = zeros(n)
        elif len(data) != n:
            raise ValueError("Tensor: data has %d values, shape %r needs %d" % (len(data), shape, n))
        self.data = data
        self.shape = shape
        self.name = name

    @staticmethod
    def zeros(shape, name=""):
        return Tensor(shape, None, name)

    @staticmethod
    def from_list(values, shape=None):
        """Nested lists (or a flat list plus `shape`) to a Tensor.

        A Tensor holds any float32, NaN and inf included (as torch.tensor does): readings are
        checked where they enter a model instead: Sequential.forward, Dataset, read_csv and the
        board session refuse NaN / inf naming the example and the feature (finite.py)."""
        flat = []
        inferred = _flatten(values, flat, 0, [])
        if shape is None:
            shape = tuple(inferred) if inferred else (len(flat),)
        return Tensor(shape, array("f", flat))

    @property
    def size(self):
        return len(self.data)

    def reshape(self, *shape):
        """A view with another shape on the same buffer; one dimension may be -1."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        n = len(self.data)
        if -1 in shape:
            known = 1
            for d in shape:
                if d != -1:
                    known *= d
            if known == 0 or n % known:
                raise ValueError("reshape: cannot view %r as %r" % (self.shape, shape))
            shape = tuple(n // known if d == -1 else d for d in shape)
        shape = _check_shape(shape, "reshape")
        if shape_size(shape) != n:
            raise ValueError("reshape: cannot view %r (%d values) as %r" % (self.shape, n, shape))
        return Tensor(shape, self.data, self.name)

    def fill(self, value):
        d = self.data
        v = float(value)
        for i in range(len(d)):
            d[i] = v
        return self

    def copy_from(self, other):
        if len(other.data) != len(self.data):
            raise ValueError("copy_from: shape %r into %r" % (other.shape, self.shape))
        self.data[:] = other.data
        return self

    def clone(self):
        return Tensor(self.shape, array("f", self.data), self.name)

    def tolist(self):
        return _nest(self.data, self.shape, 0, 0)[0]

    def __repr__(self):
        return "Tensor(shape=%r%s)" % (self.shape, ", name=%r" % self.name if self.name else "")


def _flatten(v, out, depth, dims):
    if isinstance(v, (list, tuple)):
        if len(dims) == depth:
            dims.append(len(v))
        elif dims[depth] != len(v):
            raise ValueError("from_list: ragged nested list at depth %d" % depth)
        for e in v:
            _flatten(e, out, depth + 1, dims)
    else:
        out.append(float(v))
    return dims


def _nest(data, shape, dim, start):
    # returns (nested list, next flat index)
    if dim == len(shape) - 1:
        n = shape[dim]
        return [data[start + i] for i in range(n)], start + n
    out = []
    for _ in range(shape[dim]):
        sub, start = _nest(data, shape, dim + 1, start)
        out.append(sub)
    return out, start


class Rng:
    """xorshift32: the same sequence on CPython and on every MicroPython port."""

    def __init__(self, seed=1):
        if not isinstance(seed, int):
            raise ValueError("Rng: seed must be an int, got %r" % (seed,))
        self.state = (seed & 0xFFFFFFFF) or 0x9E3779B9
        self._halves = None             # keep_mask's state in 16-bit halves (made on first use)

    def next_u32(self):
        x = self.state
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        self.state = x
        return x

    def uniform(self, lo=0.0, hi=1.0):
        """A float in [lo, hi): lo + (hi - lo) * k / 2^24 with k the top 24 bits of next_u32().
        k / 2^24 is exact on every port; the scaling rounds in the interpreter's float width (double
        on CPython, single on an ESP32), so for lo, hi other than 0, 1 the last bit can differ."""
        return lo + (hi - lo) * ((self.next_u32() >> 8) / 16777216)

    def signed_unit(self):
        """(k - 2^23) / 2^23 with k the top 24 bits of next_u32(): a float in [-1, 1) that is exact
        in float32 and float64 alike (a 24-bit integer times a power of two)."""
        return ((self.next_u32() >> 8) - 8388608) / 8388608

    def keep_mask(self, keep, n, threshold, kernels=None):
        """keep[i] = 1 if the top 24 bits of the next draw are >= threshold, else 0, for i < n:
        dropout's keep mask (threshold = round(p * 2^24) drops a fraction p); the draws are
        next_u32()'s. `kernels`: the kernel module that draws them (dropout_mask; the layers pass
        the backend's), the portable one by default."""
        h = self._halves
        if h is None:
            h = self._halves = array("i", [0, 0])
        x = self.state
        h[0] = x >> 16
        h[1] = x & 0xFFFF
        if kernels is None:
            from . import kernels           # the portable kernels: loaded here, on first use
        kernels.dropout_mask(keep, h, n, threshold)
        self.state = (h[0] << 16) | h[1]
        return keep

    def randint(self, n):
        """An int in [0, n)."""
        return self.next_u32() % n

    def shuffle(self, items):
        """Fisher-Yates in place, j = next_u32() % (i + 1) at each i. The state is kept in 16-bit
        halves meanwhile (the same xorshift32 steps), so no int beyond 2^30 is made: on a 32-bit
        port (the ESP32) shuffling an epoch's order allocates nothing (for up to 16384 items)."""
        x = self.state
        hi = x >> 16
        lo = x & 0xFFFF
        for i in range(len(items) - 1, 0, -1):
            hi ^= ((hi << 13) | (lo >> 3)) & 0xFFFF         # x ^= x << 13 (mod 2^32)
            lo ^= (lo << 13) & 0xFFFF
            lo ^= hi >> 1                                   # x ^= x >> 17
            hi ^= ((hi << 5) | (lo >> 11)) & 0xFFFF         # x ^= x << 5
            lo ^= (lo << 5) & 0xFFFF
            m = i + 1
            j = ((hi % m) * 65536 + lo) % m                 # x % m from the halves
            items[i], items[j] = items[j], items[i]
        self.state = (hi << 16) | lo
        return items


_DROPOUT_SALT = 0x6D617363          # the dropout stream's seed differs from the weights' one
_default_rng = Rng(1)
_dropout_rng = Rng(1 ^ _DROPOUT_SALT)


def default_rng():
    """The generator layers draw their initial weights from when given none."""
    return _default_rng


def dropout_seed():
    """The seed of the next dropout generator (Dropout, Attention(dropout=p)): a stream of its own,
    so that adding dropout to a model changes none of its initial weights. The draw is hashed
    (a generator seeded with a raw draw would replay the stream one step later: every layer would
    get its neighbour's mask, shifted by one element)."""
    x = _dropout_rng.next_u32()
    for _ in range(2):                   # the 32-bit integer hash of `lowbias32` (two rounds)
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def seed(n):
    """Reseed the default generators (weights and dropout masks): the same seed builds the same
    model, and draws the same dropout masks, everywhere."""
    global _default_rng, _dropout_rng
    _default_rng = Rng(n)
    _dropout_rng = Rng(n ^ _DROPOUT_SALT)


def _isqrt(n):
    """floor(sqrt(n)) of an int n >= 0, by Newton's method on ints."""
    if n < 2:
        return n
    x = n
    y = (x + 1) // 2
    while y < x:
        x = y
        y = (x + n // x) // 2
    return x


def xavier_bound(fan_in, fan_out):
    """The Xavier bound a = sqrt(6 / (fan_in + fan_out)) rounded down to 24 significant bits: a
    float32 value computed with integers only, so it is the same number on every port."""
    for v, what in ((fan_in, "fan_in"), (fan_out, "fan_out")):
        if not isinstance(v, int) or v < 1:
            raise ValueError("xavier_uniform: %s must be an int >= 1, got %r" % (what, v))
    n = fan_in + fan_out
    s = 23                                   # a <= sqrt(3) < 2, so floor(a * 2^23) < 2^24
    m = _isqrt((6 << (2 * s)) // n)          # floor(a * 2^s) (floor of floor: still floor(sqrt))
    while m < 8388608:                       # normalize to 24 significant bits
        s += 1
        m = _isqrt((6 << (2 * s)) // n)
    a = m / 8388608                          # exact: m < 2^24, a power-of-two divisor
    s -= 23
    while s > 0:                             # exact halvings by small powers of two
        k = s if s < 20 else 20
        a = a / (1 << k)
        s -= k
    return a


def xavier_uniform(t, fan_in, fan_out, rng):
    """Fill `t` from U(-a, a), a = sqrt(6 / (fan_in + fan_out)) (see xavier_bound).

    Each weight is a * u with u = rng.signed_unit(): a and u are exact float32 values, so the one
    product is a single correctly rounded float32 operation (in float64 it is exact, then rounded
    once when stored in the float32 buffer). The same seed gives the same bits on CPython, the 64-bit
    unix port and a 32-bit single-precision board."""
    return fill_signed(t, xavier_bound(fan_in, fan_out), rng)


# MicroPython: a tensor of at least this many values filled from the Rng is followed by a
# collection (fill_signed)
SETTLE_FLOATS = 1024


def fill_signed(t, a, rng):
    """t.data[i] = a * rng.signed_unit() for every i, in order; returns t. On MicroPython a
    large tensor is then followed by gc.collect(): the draws leave boxed floats and ints beyond
    30 bits behind (on a 32-bit port about 16 bytes per value), and collected before the next
    tensor is made, a model's arrays land next to each other instead of each after its
    predecessor's garbage (the 100k-parameter encoder of the memory goals left its largest free
    block at 593 KB of 2.4 MB free without it, on the 32-bit port)."""
    d = t.data
    for i in range(len(d)):
        d[i] = a * rng.signed_unit()
    if len(d) >= SETTLE_FLOATS:
        settle()
    return t


# MicroPython: while a model is made or changed in many small steps (adapters added), the GC
# collects every SETTLE_GC_BYTES of allocation (gc.threshold; settle_gc / unsettle_gc), and a
# fit until its first step is done (train.Trainer.settle): garbage left to pile up pushes what
# is made next above it, and once collected leaves holes between long-lived arrays. 8 KB: the
# add_lora of the memory goals' encoder left its largest free block at 355 KB of 671 KB free
# without it, 568 KB with it (32-bit port); for the Iris session thresholds of 2, 4, 8 and 16 KB
# all ran from the same heap (275 KB). Not for a whole fit: a 4 KB threshold costs an Iris step
# 50 % more time on the 32-bit port.
SETTLE_GC_BYTES = 8192


def settle_gc(nbytes=SETTLE_GC_BYTES):
    """MicroPython: have the GC collect every `nbytes` of allocation; returns the threshold it
    replaces, for unsettle_gc (None: nothing changed, as on CPython)."""
    if not _MICROPYTHON:
        return None
    import gc
    old = gc.threshold()
    gc.threshold(nbytes)
    return old


def unsettle_gc(old):
    """Put back the GC threshold settle_gc returned (None: nothing to put back)."""
    if old is not None:
        import gc
        gc.threshold(old)


def settle():
    """On MicroPython, collect the garbage a fill loop leaves (a float and an int per value drawn
    or computed) before anything long-lived is made: what the model makes next then takes the
    lowest free blocks, next to what it made before, instead of landing among that garbage and
    staying there as islands that cut the free heap into pieces once it is collected (a layer's
    arrays and the KV cache need blocks in one piece). Nothing on CPython."""
    if _MICROPYTHON:
        import gc
        gc.collect()


class Grad(Tensor):
    """A parameter's gradient: its buffer (zeros) is made on the first use of `.data` (the first
    backward that trains the parameter, or an optimizer step), none before, so a model used only
    for inference holds no gradient buffers. `.data = None` drops it (the parameter is frozen;
    layer.release_grad) and `wake()` lets the next use make it again (layer.ensure_grad)."""

    def __init__(self, shape, name=""):
        self.shape = _check_shape(shape, "Grad")
        self.name = name
        self._d = None
        self.lazy = True                 # no buffer yet; one is made on first use

    def _get(self):
        d = self._d
        if d is None and self.lazy:
            d = self._d = zeros(shape_size(self.shape))
            self.lazy = False
        return d

    def _set(self, v):
        self._d = v
        self.lazy = False

    data = property(_get, _set)

    @property
    def size(self):
        return shape_size(self.shape)

    def wake(self):
        """A frozen gradient (no buffer) gets one again on its next use."""
        if self._d is None:
            self.lazy = True


def has_grad(g):
    """Does gradient g train: a buffer held, or one made on first use (Grad)? Reads no `.data`
    of a Grad that has none, so asking allocates nothing."""
    if getattr(g, "lazy", False):
        return True
    return g.data is not None
