# microformer.posembed: learned positional embedding added to token vectors.
#   y[b,s] = x[b,s] + weight[start + s], weight [max_len, E] trained (PositionalEncoding is the
#   fixed sinusoidal table)
from . import backend
from .layer import Layer, check_tensor, shape_error
from .tensor import Tensor, default_rng


class LearnedPositionalEmbedding(Layer):
    """LearnedPositionalEmbedding(max_len, E): x [B,S,E] -> x + weight[start:start+S].

    weight [max_len, E] (state_dict 'weight') starts as U(-1/32, 1/32); forward(x, start=0);
    prefill(x) / decode_step(x_t) keep the position for generation as PositionalEncoding does.
    """

    INIT = 0.03125            # 1/32: a power of two, so INIT * signed_unit() is exact on every port

    def __init__(self, max_len, embed_dim, rng=None):
        for what, v in (("max_len", max_len), ("embed_dim", embed_dim)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError("LearnedPositionalEmbedding: %s must be a positive int, got %r" % (what, v))
        self.max_len = max_len
        self.embed_dim = embed_dim
        rng = rng or default_rng()
        self.W = Tensor((max_len, embed_dim), name="W")
        d = self.W.data
        for i in range(len(d)):
            d[i] = self.INIT * rng.signed_unit()
        self.dW = Tensor.zeros((max_len, embed_dim), "dW")
        self._shape = None
        self._start = 0
        self.pos = 0

    def params(self):
        return ((self.W, self.dW),)

    def _state(self):
        return [("weight", [self.W])]

    def cache_floats(self, in_shape):
        B, S, E = in_shape
        return B * S * E

    def forward(self, x, start=0):
        check_tensor("LearnedPositionalEmbedding", "x", x)
        E = self.embed_dim
        if len(x.shape) != 3 or x.shape[2] != E:
            raise shape_error("LearnedPositionalEmbedding", "x", "[B,S,%d]" % E, x.shape)
        B, S, _ = x.shape
        if not isinstance(start, int) or start < 0 or start + S > self.max_len:
            raise ValueError("LearnedPositionalEmbedding: positions %r..%r exceed max_len=%d"
                             % (start, start + S - 1, self.max_len))
        y = self._buffer("_y", x.shape)
        backend.K.posenc_forward(y.data, x.data, self.W.data, B, S, E, start)
        self._shape = x.shape
        self._start = start
        return y

    def backward(self, dy):
        self._need_forward(self._shape)
        check_tensor("LearnedPositionalEmbedding", "dy", dy)
        if dy.shape != self._shape:
            raise shape_error("LearnedPositionalEmbedding", "dy", repr(self._shape), dy.shape)
        if self.trainable:
            B, S, E = self._shape
            backend.K.posembed_backward(self.dW.data, dy.data, B, S, E, self._start)
        return dy

    def prefill(self, x):
        y = self.forward(x, 0)
        self.pos = x.shape[1]
        return y

    def decode_step(self, x):
        y = self.forward(x, self.pos)
        self.pos += x.shape[1]
        return y
