# microformer.pool: mean over the sequence axis.
from . import backend
from .layer import Layer, check_tensor, shape_error


class GlobalAvgPool(Layer):
    """x [B,S,E] -> y [B,E], the mean over S."""

    _x = None

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        if len(in_shape) != 3:
            raise shape_error("GlobalAvgPool", "input", "[B,S,E]", in_shape)

    def output_shape(self, in_shape):
        return (in_shape[0], in_shape[2])

    def cache_floats(self, in_shape):
        B, S, E = in_shape
        return B * E + B * S * E

    def forward(self, x):
        check_tensor("GlobalAvgPool", "x", x)
        if len(x.shape) != 3:
            raise shape_error("GlobalAvgPool", "x", "[B,S,E]", x.shape)
        B, S, E = x.shape
        self._buffers("_fwd", x.shape)
        y = self._y
        backend.K.avgpool_forward(y.data, x.data, B, S, E)
        self._x = x
        return y

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
        B, S, E = self._x.shape
        check_tensor("GlobalAvgPool", "dy", dy)
        if dy.shape != self._y.shape:
            raise shape_error("GlobalAvgPool", "dy", "[%d,%d]" % (B, E), dy.shape)
        self._buffers("_bwd", self._x.shape)
        dx = self._dx
        backend.K.avgpool_backward(dx.data, dy.data, B, S, E)
        return dx
