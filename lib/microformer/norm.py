# microformer.norm: layer normalisation over the last axis.
#   y = (x - mean) / sqrt(var + eps) * gamma + beta   (biased variance, as torch.nn.LayerNorm)
from . import backend
from .finite import hyper
from .layer import Layer, check_tensor, shape_error
from .tensor import Tensor, shape_size


class LayerNorm(Layer):
    """LayerNorm(E, eps=1e-5): x [..., E] -> y [..., E]; parameters gamma (ones), beta (zeros)."""

    def __init__(self, dim, eps=1e-5):
        if not isinstance(dim, int) or dim < 1:
            raise ValueError("LayerNorm: dim must be a positive int, got %r" % (dim,))
        self.dim = dim
        self.eps = hyper("LayerNorm", "eps", eps, 0.0, None, True)
        self.gamma = Tensor.zeros((dim,), "gamma").fill(1.0)   # (E,)
        self.beta = Tensor.zeros((dim,), "beta")               # (E,)
        self.dgamma = Tensor.zeros((dim,), "dgamma")
        self.dbeta = Tensor.zeros((dim,), "dbeta")
        self._x = None

    def params(self):
        return ((self.gamma, self.dgamma), (self.beta, self.dbeta))

    def state_parts(self):
        # nn.LayerNorm: weight (gamma), bias (beta)
        return [("weight", [self.gamma]), ("bias", [self.beta])]

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        if len(in_shape) < 2 or in_shape[-1] != self.dim:
            raise shape_error("LayerNorm", "input", "[..., %d]" % self.dim, in_shape)

    def cache_floats(self, in_shape):
        n = shape_size(in_shape)
        return 2 * n + 2 * (n // self.dim)     # y, dx, mean, rstd

    def forward(self, x):
        check_tensor("LayerNorm", "x", x)
        E = self.dim
        if len(x.shape) < 2 or x.shape[-1] != E:
            raise shape_error("LayerNorm", "x", "[..., %d]" % E, x.shape)
        N = x.size // E
        self._buffers("_fwd", x.shape)
        backend.K.layernorm_forward(self._y.data, self._mean.data, self._rstd.data, x.data, self.gamma.data,
                                    self.beta.data, N, E, self.eps)
        self._x = x
        return self._y

    def _allocate(self, stage, shape, other, bufs):
        if stage == "_fwd":
            n = shape_size(shape[:-1])
            self._y = bufs.zeros("_y", shape)
            self._mean = bufs.zeros("_mean", (n,))
            self._rstd = bufs.zeros("_rstd", (n,))
        else:
            self._dx = bufs.zeros("_dx", shape)

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
        check_tensor("LayerNorm", "dy", dy)
        x = self._x
        if dy.shape != x.shape:
            raise shape_error("LayerNorm", "dy", repr(x.shape), dy.shape)
        E = self.dim
        self._buffers("_bwd", x.shape)
        dx = self._dx
        train = grads and self.trainable
        backend.K.layernorm_backward(dx.data, self.dgamma.data if train else None,
                                     self.dbeta.data if train else None, dy.data, x.data,
                                     self.gamma.data, self._mean.data, self._rstd.data, x.size // E, E)
        return dx
