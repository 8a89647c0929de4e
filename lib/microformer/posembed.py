# microformer.posembed: learned positional embedding added to token vectors.
#   y[b,s] = x[b,s] + weight[start + s], weight [max_len, E] trained (PositionalEncoding is the
#   fixed sinusoidal table)
from . import backend
from .dropout import Dropout
from .posenc import PositionalEncoding
from .tensor import Grad, Tensor, default_rng, fill_signed


class LearnedPositionalEmbedding(PositionalEncoding):
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
        self.W = fill_signed(Tensor((max_len, embed_dim), name="W"), self.INIT, rng)
        self.dW = Grad((max_len, embed_dim), "dW")
        self.drop = Dropout(0.0)          # (no dropout here: the seed has it on the sinusoidal table)
        self.dropout = 0.0
        self._x = None
        self._start = 0
        self.pos = 0

    def sublayers(self):
        return ()                         # a plain layer: its own W, not a composite

    def params(self):
        return ((self.W, self.dW),)

    def state_parts(self):
        return [("weight", [self.W])]

    def _table(self):
        return self.W

    def backward(self, dy, grads=True):
        dy = PositionalEncoding.backward(self, dy, grads)     # dx
        if grads and self.trainable:
            self._grad(dy)
        return dy

    def _grad(self, dx):
        # dW rows start.. += dx summed over the batch (a method of its own: frames within 11 words)
        backend.K.posembed_backward(self.dW.data, dx.data, self._x.shape[0], self._x.shape[1], self.embed_dim,
                                    self._start)
