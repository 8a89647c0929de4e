# microformer.conv: 1-D convolution over channels-last sequences (torch.nn.Conv1d's weights).
#   x [B, L, C_in] -> y [B, L_out, C_out], L_out = (L + 2 padding - dilation (k - 1) - 1) // stride + 1
#   y[b,t,o] = bias[o] + sum_{c,j} weight[o,c,j] x[b, t stride + j dilation - padding, g C_in/groups + c]
from . import backend
from .layer import WeightBias, check_tensor, shape_error
from .tensor import Grad, Tensor, default_rng, fill_signed, xavier_bound


class Conv1D(WeightBias):
    """Conv1D(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
    use_bias=True): x [B, L, C_in] -> y [B, L_out, C_out] (channels last; torch's Conv1d takes
    [B, C, L]). weight [C_out, C_in/groups, k] and bias [C_out] as nn.Conv1d; zero padding;
    groups = C_in with C_out a multiple of it is a depthwise convolution."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, use_bias=True, rng=None):
        for what, v, lo in (("in_channels", in_channels, 1), ("out_channels", out_channels, 1),
                            ("kernel_size", kernel_size, 1), ("stride", stride, 1),
                            ("padding", padding, 0), ("dilation", dilation, 1), ("groups", groups, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError("Conv1D: %s must be an int >= %d, got %r" % (what, lo, v))
        if in_channels % groups or out_channels % groups:
            raise ValueError("Conv1D: groups=%d must divide in_channels=%d and out_channels=%d"
                             % (groups, in_channels, out_channels))
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.groups = groups
        self.use_bias = use_bias
        cg = in_channels // groups
        # torch's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = C_in/groups * k; the
        # bound as xavier_bound computes it (sqrt(6 / (3f + 3f)) = 1/sqrt(f), rounded down to a float32
        # with integers only) times an exact signed_unit(): the same bits on every port
        bound = xavier_bound(3 * cg * kernel_size, 3 * cg * kernel_size)
        rng = rng or default_rng()
        self.W = fill_signed(Tensor((out_channels, cg, kernel_size), name="W"), bound, rng)
        self.dW = Grad(self.W.shape, "dW")
        self.b = self.db = None
        if use_bias:
            self.b = Tensor((out_channels,), name="b")
            for i in range(out_channels):
                self.b.data[i] = bound * rng.signed_unit()
            self.db = Grad((out_channels,), "db")
        self._x = None

    def out_length(self, L):
        """L_out for an input of length L; ValueError when the dilated kernel does not fit."""
        span = self.dilation * (self.kernel_size - 1) + 1
        if L + 2 * self.padding < span:
            raise ValueError("Conv1D: input length %d with padding %d (%d) is shorter than the kernel "
                             "(kernel_size %d, dilation %d: %d positions)"
                             % (L, self.padding, L + 2 * self.padding, self.kernel_size, self.dilation, span))
        return (L + 2 * self.padding - span) // self.stride + 1

    def output_shape(self, in_shape):
        return (in_shape[0], self.out_length(in_shape[1]), self.out_channels)

    def cache_floats(self, in_shape):
        B, L, C = in_shape
        return B * self.out_length(L) * self.out_channels + B * L * C       # y and dx

    def forward(self, x):
        check_tensor("Conv1D", "x", x)
        C = self.in_channels
        if len(x.shape) != 3 or x.shape[2] != C:
            raise shape_error("Conv1D", "x", "[B,L,%d] (channels last)" % C, x.shape)
        B, L, _ = x.shape
        Lout = self.out_length(L)
        self._buffers("_fwd", x.shape)
        y = self._y
        backend.K.conv1d_forward(y.data, x.data, self.W.data, self.b.data if self.use_bias else None,
                                 B, L, C, Lout, self.out_channels, self.kernel_size, self.stride,
                                 self.padding, self.dilation, self.groups)
        self._x = x
        return y

    backward_stops = True

    def backward(self, dy, grads=True, need_dx=True):
        # need_dx=False (a first layer, train.fit): no input gradient (returns None) and no buffer for it
        self._need_forward(self._x)
        check_tensor("Conv1D", "dy", dy)
        if dy.shape != self._y.shape:
            raise shape_error("Conv1D", "dy", repr(self._y.shape), dy.shape)
        x = self._x
        B, L, C = x.shape
        dx = None
        if need_dx:
            self._buffers("_bwd", x.shape)
            dx = self._dx
        train = grads and self.trainable
        backend.K.conv1d_backward(None if dx is None else dx.data, self.dW.data if train else None,
                                  self.db.data if (train and self.use_bias) else None,
                                  dy.data, x.data, self.W.data, B, L, C, self._y.shape[1],
                                  self.out_channels, self.kernel_size, self.stride, self.padding,
                                  self.dilation, self.groups)
        return dx
