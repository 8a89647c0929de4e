# microformer.reshape: a view with another shape; the batch axis stays first.
from .layer import Layer, check_tensor, shape_error


class Reshape(Layer):
    """Reshape((4, 8)): x [B, 32] -> view [B, 4, 8]; no copy."""

    def __init__(self, shape):
        if not isinstance(shape, (tuple, list)):
            raise ValueError("Reshape: shape must be a tuple of positive ints (the per-sample shape, "
                             "e.g. (4, 8)), got %r" % (shape,))
        shape = tuple(shape)
        n = 1
        for d in shape:
            if not isinstance(d, int) or d < 1:
                raise ValueError("Reshape: shape must hold positive ints, got %r" % (shape,))
            n *= d
        self.shape = shape
        self._n = n
        self._in_data = self._dy_data = None

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        n = 1
        for d in in_shape[1:]:
            n *= d
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
        # the same input buffer as last step: hand out the same view (nothing allocated)
        if x.data is not self._in_data or x.shape != self._xshape:
            self._view = x.reshape((x.shape[0],) + self.shape)
            self._in_data = x.data
        self._xshape = x.shape
        return self._view

    def backward(self, dy):
        self._need_forward(getattr(self, "_xshape", None))
        check_tensor("Reshape", "dy", dy)
        if dy.shape != self._view.shape:
            raise shape_error("Reshape", "dy", repr((self._xshape[0],) + self.shape), dy.shape)
        if dy.data is not self._dy_data:
            self._dview = dy.reshape(self._xshape)
            self._dy_data = dy.data
        return self._dview
