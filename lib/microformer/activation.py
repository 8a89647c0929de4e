# microformer.activation: elementwise nonlinearities.
from . import backend, kernels
from .layer import Layer, check_tensor, shape_error

KINDS = {
    "relu": kernels.RELU,
    "leaky_relu": kernels.LEAKY_RELU,
    "gelu": kernels.GELU,         # tanh approximation
    "tanh": kernels.TANH,
    "sigmoid": kernels.SIGMOID,
}


class ActivationLayer(Layer):
    """ActivationLayer('relu' | 'leaky_relu' | 'gelu' | 'tanh' | 'sigmoid'); any shape."""

    def __init__(self, kind="relu"):
        if kind not in KINDS:
            raise ValueError("ActivationLayer: kind must be one of %s, got %r"
                             % (", ".join(sorted(KINDS)), kind))
        self.kind = kind
        self._code = KINDS[kind]
        self._x = None

    def cache_floats(self, in_shape):
        n = 1
        for d in in_shape:
            n *= d
        return 2 * n

    def forward(self, x):
        check_tensor("ActivationLayer", "x", x)
        y = self._buffer("_y", x.shape)
        backend.K.act_forward(y.data, x.data, x.size, self._code)
        self._x = x
        return y

    def backward(self, dy):
        self._need_forward(self._x)
        check_tensor("ActivationLayer", "dy", dy)
        if dy.shape != self._y.shape:
            raise shape_error("ActivationLayer", "dy", repr(self._y.shape), dy.shape)
        dx = self._buffer("_dx", dy.shape)
        backend.K.act_backward(dx.data, dy.data, self._x.data, self._y.data, dy.size, self._code)
        return dx
