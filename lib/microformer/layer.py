# microformer.layer: the base class every layer derives from (the layer contract).
from .tensor import Tensor


class Layer:
    """y = forward(x); dx = backward(dy) (adds into parameter grads); collect_params(groups)."""

    trainable = True
    training = True

    def collect_params(self, groups):
        """Append (param, grad) Tensor pairs of a trainable layer to `groups`; return it."""
        if self.trainable:
            for pair in self.params():
                groups.append(pair)
        return groups

    def params(self):
        """Every (param, grad) pair, frozen or not (what a checkpoint saves)."""
        return ()

    def train(self, mode=True):
        self.training = mode
        return self

    def eval(self):
        return self.train(False)

    def param_count(self):
        n = 0
        for p, _ in self.params():
            n += p.size
        return n

    def output_shape(self, in_shape):
        return in_shape

    def check_input_shape(self, in_shape):
        """ValueError naming the layer and the expected vs given shape (summary() calls it)."""
        if not isinstance(in_shape, tuple) or not in_shape:
            raise ValueError("%s: input shape must be a non-empty tuple like (B, F), got %r"
                             % (type(self).__name__, in_shape))

    def cache_floats(self, in_shape):
        """Floats of output and cache buffers a forward + backward at `in_shape` holds."""
        return 0

    def _buffer(self, attr, shape):
        # Reuse the buffer while the shape stays the same: steady-state steps allocate nothing.
        t = getattr(self, attr, None)
        if t is None or t.shape != shape:
            t = Tensor.zeros(shape)
            setattr(self, attr, t)
        return t

    def _need_forward(self, cached):
        if cached is None:
            raise RuntimeError("%s: backward() called before forward()" % type(self).__name__)


def shape_error(layer, what, expected, got):
    return ValueError("%s: %s must be %s, got %r" % (layer, what, expected, tuple(got)))


def check_tensor(layer, what, x):
    if not isinstance(x, Tensor):
        raise ValueError("%s: %s must be a Tensor, got %s" % (layer, what, type(x).__name__))
