# microformer.dropout: inverted dropout, as torch.nn.Dropout.
#   training: y = x * keep / (1 - p), keep ~ Bernoulli(1 - p) per element; eval: y = x
from . import backend
from .layer import Layer, check_tensor, shape_error
from .tensor import Rng, dropout_seed, shape_size


def check_p(who, p):
    """p as a float in [0, 1], or a ValueError naming `who`."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0.0 <= p <= 1.0):
        raise ValueError("%s: dropout must be a number in [0, 1], got %r" % (who, p))
    return float(p)


class Dropout(Layer):
    """Dropout(p=0.5, seed=None): any shape -> same shape.

    In training mode (layer.train(), the default) each element is zeroed with probability p and
    the others are scaled by 1/(1-p) (p = 1 zeroes everything), as torch.nn.Dropout; in eval mode
    (layer.eval()) forward returns x itself. backward reuses the mask of the last forward.
    The mask comes from the layer's own xorshift generator (tensor.Rng: the same masks on CPython
    and every MicroPython port), seeded with `seed` or, by default, from the dropout stream that
    mf.seed(n) resets (not the weights' generator: a model's initial weights do not depend on p).
    """

    def __init__(self, p=0.5, seed=None):
        self.p = check_p("Dropout", p)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError("Dropout: seed must be an int or None, got %r" % (seed,))
        self.rng = None
        if self.p > 0.0:
            self.rng = Rng(dropout_seed() if seed is None else seed)
        # drop when the top 24 bits of a draw are below round(p * 2^24); keep the rest, times 1/(1-p)
        self._threshold = int(self.p * 16777216 + 0.5)
        self.scale = 0.0 if self.p >= 1.0 else 1.0 / (1.0 - self.p)
        self._x = None
        self._applied = False

    def output_shape(self, in_shape):
        return in_shape

    def cache_floats(self, in_shape):
        n = shape_size(in_shape)
        return 2 * n + (n + 3) // 4          # y, dx and the byte mask

    def active(self):
        """True when forward drops elements (training mode and p > 0)."""
        return self.training and self.p > 0.0

    def forward(self, x):
        check_tensor("Dropout", "x", x)
        self._x = x
        self._applied = self.active()
        if not self._applied:
            return x
        self._buffers("_fwd", x.shape)
        n = x.size
        self.rng.keep_mask(self._keep, n, self._threshold, backend.K)
        y = x if self._in_place else self._y
        backend.K.dropout_apply(y.data, x.data, self._keep, n, self.scale)
        return y

    # True (an EncoderBlock's own two dropouts): forward drops in place, over x, which is then its
    # output: x is the attention's or the FFN's output, read by this dropout only (the block's
    # residual add reads the result), so the dropout keeps no output buffer of its own
    _in_place = False

    def identity(self, x):
        """forward without dropping, whatever the mode (generation): backward then passes dy on."""
        check_tensor("Dropout", "x", x)
        self._x = x
        self._applied = False
        return x

    def _allocate(self, stage, shape, other, bufs):
        # the input gradient is read by the part below only: inside an EncoderBlock's backward a
        # buffer of its arena (layer.Scratch), outside every frame an array of its own
        if stage == "_fwd":
            self._y = bufs.none("_y") if self._in_place else bufs.zeros("_y", shape)
            self._keep = bufs.bytes("_keep", shape_size(shape))      # 1 = kept
        else:
            self._dx = bufs.scratch("_dx", shape)

    def mask(self):
        """The last training forward's keep mask (bytes, 1 = kept), or None if it dropped nothing."""
        return bytes(self._keep[:self._x.size]) if (self._x is not None and self._applied) else None

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
        check_tensor("Dropout", "dy", dy)
        if dy.shape != self._x.shape:
            raise shape_error("Dropout", "dy", repr(self._x.shape), dy.shape)
        if not self._applied:
            return dy
        self._buffers("_bwd", dy.shape)
        dx = self._dx
        # in the forward pass this was y = x * keep * scale: dx = dy * keep * scale, the same mask
        backend.K.dropout_apply(dx.data, dy.data, self._keep, dy.size, self.scale)
        return dx
