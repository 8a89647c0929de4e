# microformer.activation: elementwise nonlinearities.
from . import actkind, backend
from .layer import Layer, check_tensor, shape_error
from .tensor import shape_size

KINDS = {
    "relu": actkind.RELU,
    "leaky_relu": actkind.LEAKY_RELU,
    "gelu": actkind.GELU,             # exact: 0.5 x (1 + erf(x / sqrt 2)), like torch.nn.GELU()
    "gelu_tanh": actkind.GELU_TANH,   # the tanh approximation, like torch.nn.GELU('tanh')
    "tanh": actkind.TANH,
    "sigmoid": actkind.SIGMOID,
}


class ActivationLayer(Layer):
    """ActivationLayer('relu' | 'leaky_relu' | 'gelu' | 'gelu_tanh' | 'tanh' | 'sigmoid'); any shape."""

    def __init__(self, kind="relu"):
        if kind not in KINDS:
            raise ValueError("ActivationLayer: kind must be one of %s, got %r"
                             % (", ".join(sorted(KINDS)), kind))
        if kind == "gelu" and actkind.erf is None:
            raise ValueError("ActivationLayer: 'gelu' needs math.erf, which this MicroPython build lacks; "
                             "use 'gelu_tanh' (the tanh approximation)")
        self.kind = kind
        self._code = KINDS[kind]
        self._x = None

    def cache_floats(self, in_shape):
        n = shape_size(in_shape)
        return 2 * n

    def forward(self, x):
        check_tensor("ActivationLayer", "x", x)
        self._buffers("_fwd", x.shape)
        y = self._y
        backend.K.act_forward(y.data, x.data, x.size, self._code)
        self._x = x
        return y

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
        check_tensor("ActivationLayer", "dy", dy)
        if dy.shape != self._y.shape:
            raise shape_error("ActivationLayer", "dy", repr(self._y.shape), dy.shape)
        self._buffers("_bwd", dy.shape)
        backend.K.act_backward(self._dx.data, dy.data, self._x.data, self._y.data, dy.size, self._code)
        return self._dx
