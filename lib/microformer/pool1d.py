# microformer.pool1d: max and average pooling along the sequence of channels-last input.
#   x [B, L, C] -> y [B, L_out, C], L_out = (L + 2 padding - kernel_size) // stride + 1
# As torch's MaxPool1d / AvgPool1d (ceil_mode=False; the average counts padding, count_include_pad).

from . import backend
from .layer import Layer, check_tensor, shape_error


class _Pool1D(Layer):

    def __init__(self, kernel_size, stride=None, padding=0):
        who = type(self).__name__
        if stride is None:
            stride = kernel_size
        for what, v, lo in (("kernel_size", kernel_size, 1), ("stride", stride, 1), ("padding", padding, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError("%s: %s must be an int >= %d, got %r" % (who, what, lo, v))
        if padding > kernel_size // 2:
            raise ValueError("%s: padding must be at most kernel_size // 2 = %d, got %d"
                             % (who, kernel_size // 2, padding))
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self._x = None

    def out_length(self, L):
        if L + 2 * self.padding < self.kernel_size:
            raise ValueError("%s: input length %d with padding %d (%d) is shorter than kernel_size %d"
                             % (type(self).__name__, L, self.padding, L + 2 * self.padding, self.kernel_size))
        return (L + 2 * self.padding - self.kernel_size) // self.stride + 1

    def output_shape(self, in_shape):
        return (in_shape[0], self.out_length(in_shape[1]), in_shape[2])

    def cache_floats(self, in_shape):
        B, L, C = in_shape
        return B * self.out_length(L) * C * 2 + B * L * C      # y (and max's positions) and dx

    def _check_x(self, x):
        # the kernels' sizes for x (kept for the backward, which runs on the same shapes)
        who = type(self).__name__
        check_tensor(who, "x", x)
        if len(x.shape) != 3:
            raise shape_error(who, "x", "[B,L,C] (channels last)", x.shape)
        B, L, C = x.shape
        self._pool = (B, L, C, self.out_length(L), self.kernel_size, self.stride, self.padding)
        return self._pool

    def _check_dy(self, dy):
        who = type(self).__name__
        self._need_forward(self._x)
        check_tensor(who, "dy", dy)
        if dy.shape != self._y.shape:
            raise shape_error(who, "dy", repr(self._y.shape), dy.shape)


class MaxPool1D(_Pool1D):
    """MaxPool1D(kernel_size, stride=None, padding=0): x [B,L,C] -> y [B,L_out,C], the maximum of
    each window (stride defaults to kernel_size). backward routes each gradient to its window's
    maximum, the first one on ties, as torch."""

    def forward(self, x):
        pool = self._check_x(x)
        self._buffers("_fwd", x.shape)
        y = self._y
        backend.K.maxpool1d_forward(y.data, self._idx, x.data, pool)
        self._x = x
        return y

    def _allocate(self, stage, shape, other, bufs):
        Layer._allocate(self, stage, shape, other, bufs)
        if stage == "_fwd":
            self._idx = bufs.ints("_idx", self._y.size)          # each output's argmax

    def backward(self, dy, grads=True):
        self._check_dy(dy)
        self._buffers("_bwd", self._x.shape)
        dx = self._dx
        backend.K.maxpool1d_backward(dx.data, dy.data, self._idx, self._pool)
        return dx


class AvgPool1D(_Pool1D):
    """AvgPool1D(kernel_size, stride=None, padding=0): x [B,L,C] -> y [B,L_out,C], the mean of each
    window; padded positions count as zeros in the mean (torch's count_include_pad=True)."""

    def forward(self, x):
        pool = self._check_x(x)
        self._buffers("_fwd", x.shape)
        y = self._y
        backend.K.avgpool1d_forward(y.data, x.data, pool)
        self._x = x
        return y

    def backward(self, dy, grads=True):
        self._check_dy(dy)
        self._buffers("_bwd", self._x.shape)
        dx = self._dx
        backend.K.avgpool1d_backward(dx.data, dy.data, self._pool)
        return dx
