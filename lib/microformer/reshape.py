# microformer.reshape: a view with another shape; the batch axis stays first.
from .layer import Layer, check_tensor, shape_error
from .tensor import shape_size


class Reshape(Layer):
    """Reshape((4, 8)): x [B, 32] -> view [B, 4, 8]; no copy."""

    def __init__(self, shape):
        if not isinstance(shape, (tuple, list)):
            raise ValueError("Reshape: shape must be a tuple of positive ints (the per-sample shape, "
                             "e.g. (4, 8)), got %r" % (shape,))
        shape = tuple(shape)
        for d in shape:
            if not isinstance(d, int) or d < 1:
                raise ValueError("Reshape: shape must hold positive ints, got %r" % (shape,))
        self.shape = shape
        self._n = shape_size(shape)
        self._x = None

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        n = shape_size(in_shape[1:])
        if n != self._n:
            raise shape_error("Reshape", "input", "[B, %d values per sample] for %r" % (self._n, self.shape),
                              in_shape)

    def output_shape(self, in_shape):
        return (in_shape[0],) + self.shape

    def forward(self, x):
        check_tensor("Reshape", "x", x)
        if x.size != x.shape[0] * self._n:
            raise shape_error("Reshape", "x", "[B, %d values per sample] for %r"
                              % (self._n, self.shape), x.shape)
        # the views are Tensor headers kept per input shape (the layer's buffers), pointed at
        # each step's data: nothing is copied or allocated
        self._x = x
        self._buffers("_fwd", x.shape)
        v = self._view
        v.data = x.data
        return v

    def _allocate(self, stage, shape, other, bufs):
        if stage == "_fwd":
            self._view = bufs.view("_view", self._x.reshape((shape[0],) + self.shape))
        else:
            self._dview = bufs.view("_dview", self._dy.reshape(shape))

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
        check_tensor("Reshape", "dy", dy)
        if dy.shape != self._view.shape:
            raise shape_error("Reshape", "dy", repr(self._view.shape), dy.shape)
        self._dy = dy
        self._buffers("_bwd", self._x.shape)
        v = self._dview
        v.data = dy.data
        return v
