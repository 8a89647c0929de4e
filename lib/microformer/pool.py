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
        self._buffers("_fwd", x.shape)
        backend.K.avgpool_forward(self._y.data, x.data, x.shape[0], x.shape[1], x.shape[2])
        self._x = x
        return self._y

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
        check_tensor("GlobalAvgPool", "dy", dy)
        if dy.shape != self._y.shape:
            raise shape_error("GlobalAvgPool", "dy", "[%d,%d]" % self._y.shape, dy.shape)
        self._buffers("_bwd", self._x.shape)
        # (no locals: a frame within 11 words stays off the GC heap, host/tools/frames.py)
        backend.K.avgpool_backward(self._dx.data, dy.data, self._x.shape[0], self._x.shape[1], self._x.shape[2])
        return self._dx
