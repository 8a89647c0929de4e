# microformer.tensor: flat row-major float32 buffers with a shape, a seeded PRNG, Xavier init.
# Runs unchanged under CPython and MicroPython.
from array import array


def _size(shape):
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
        n = _size(shape)
        if data is None:
            data = array("f", bytes(4 * n))
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
        if _size(shape) != n:
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

    def next_u32(self):
        x = self.state
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        self.state = x
        return x

    def uniform(self, lo=0.0, hi=1.0):
        # top 24 bits -> [0, 1) exactly representable in float32 and float64
        return lo + (hi - lo) * ((self.next_u32() >> 8) * (1.0 / 16777216.0))

    def randint(self, n):
        """An int in [0, n)."""
        return self.next_u32() % n

    def shuffle(self, items):
        """Fisher-Yates in place."""
        for i in range(len(items) - 1, 0, -1):
            j = self.next_u32() % (i + 1)
            items[i], items[j] = items[j], items[i]
        return items


_default_rng = Rng(1)


def default_rng():
    """The generator layers draw their initial weights from when given none."""
    return _default_rng


def seed(n):
    """Reseed the default generator: the same seed builds the same model everywhere."""
    global _default_rng
    _default_rng = Rng(n)


def xavier_uniform(t, fan_in, fan_out, rng):
    """Fill `t` from U(-a, a), a = sqrt(6 / (fan_in + fan_out))."""
    a = (6.0 / (fan_in + fan_out)) ** 0.5
    d = t.data
    for i in range(len(d)):
        d[i] = rng.uniform(-a, a)
    return t
