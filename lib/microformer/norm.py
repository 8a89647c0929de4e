# microformer.norm: layer normalisation over the last axis.
#   y = (x - mean) / sqrt(var + eps) * gamma + beta   (biased variance, as torch.nn.LayerNorm)
from . import backend
from .finite import hyper
from .layer import Layer, check_tensor, shape_error
from .tensor import Grad, Tensor, shape_size


class LayerNorm(Layer):
    """LayerNorm(E, eps=1e-5): x [..., E] -> y [..., E]; parameters gamma (ones), beta (zeros)."""

    def __init__(self, dim, eps=1e-5):
        if not isinstance(dim, int) or dim < 1:
            raise ValueError("LayerNorm: dim must be a positive int, got %r" % (dim,))
        self.dim = dim
        self.eps = hyper("LayerNorm", "eps", eps, 0.0, None, True)
        self.gamma = Tensor.zeros((dim,), "gamma").fill(1.0)   # (E,)
        self.beta = Tensor.zeros((dim,), "beta")               # (E,)
        self.dgamma = Grad((dim,), "dgamma")
        self.dbeta = Grad((dim,), "dbeta")
        self._x = None
        # the arrays the kernels take as one argument (few arguments keep forward's and
        # backward's frames off the heap): [gamma, beta, mean, rstd, dgamma, dbeta], set for a
        # call and cleared after it (so that no array is kept alive by this list)
        self._ln = [None] * 6

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
        self._buffers("_fwd", x.shape)
        self._buffers("_out", x.shape)
        backend.K.layernorm_forward(self._y.data, x.data, self._arrays(False), x.size // E, E, self.eps)
        self._clear()
        self._x = x
        return self._y

    def forward_into(self, x, out):
        """forward(x) written into `out` (a Tensor of x's shape that the caller owns) instead of a
        buffer of this layer's: a pre-norm EncoderBlock passes buffers of its own that nothing reads
        until the norm's reader is done (the residual sums written after it), and computes the
        output again for backward (output_again)."""
        check_tensor("LayerNorm", "x", x)
        if len(x.shape) < 2 or x.shape[-1] != self.dim:
            raise shape_error("LayerNorm", "x", "[..., %d]" % self.dim, x.shape)
        check_tensor("LayerNorm", "out", out)
        if out.shape != x.shape:
            raise shape_error("LayerNorm", "out", repr(x.shape), out.shape)
        self._buffers("_fwd", x.shape)
        self._x = x
        return self.output_again(out)

    def output_again(self, out):
        """The last forward's output computed again from its kept input into `out` (x's shape):
        the same kernel on the same input, so the same values (the row mean and 1/std are written
        again, the same)."""
        self._need_forward(self._x)
        backend.K.layernorm_forward(out.data, self._x.data, self._arrays(False), self._x.size // self.dim,
                                    self.dim, self.eps)
        self._clear()
        return out

    def _arrays(self, train):
        # self._ln for one kernel call; the gradients only when `train` (else None: not written)
        a = self._ln
        a[0] = self.gamma.data
        a[1] = self.beta.data
        a[2] = self._mean.data
        a[3] = self._rstd.data
        if train:
            a[4] = self.dgamma.data
            a[5] = self.dbeta.data
        return a

    def _clear(self):
        a = self._ln
        for i in range(6):
            a[i] = None

    def _allocate(self, stage, shape, other, bufs):
        if stage == "_fwd":                # the row statistics backward reads
            n = shape_size(shape[:-1])
            self._mean = bufs.zeros("_mean", (n,))
            self._rstd = bufs.zeros("_rstd", (n,))
        elif stage == "_out":              # the output (forward_into writes the caller's instead)
            self._y = bufs.zeros("_y", shape)
        else:
            self._dx = bufs.scratch("_dx", shape)

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
        check_tensor("LayerNorm", "dy", dy)
        if dy.shape != self._x.shape:
            raise shape_error("LayerNorm", "dy", repr(self._x.shape), dy.shape)
        self._buffers("_bwd", dy.shape)
        backend.K.layernorm_backward(self._dx.data, dy.data, self._x.data, self._arrays(grads and self.trainable),
                                     dy.size // self.dim, self.dim)
        self._clear()
        return self._dx
