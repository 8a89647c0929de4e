# microformer.embedding: token ids -> learned vectors (a lookup table, trained by row).
from . import backend
from .layer import Layer, shape_error
from .tensor import Grad, Tensor, default_rng, shape_size, xavier_uniform


class Embedding(Layer):
    """Embedding(vocab, E): ids [B,S] -> y [B,S,E], y[b,s] = W[ids[b,s]].

    ids: a Tensor of token ids held as floats (exact up to 2**24), e.g.
    Tensor.from_list([[3, 1, 4]]); nested lists of ints are converted. backward(dy)
    adds dy's rows into dW at the ids' rows and returns None (ids have no gradient).
    """

    def __init__(self, vocab, embed_dim, rng=None):
        for what, v in (("vocab", vocab), ("embed_dim", embed_dim)):
            if not isinstance(v, int) or v < 1:
                raise ValueError("Embedding: %s must be a positive int, got %r" % (what, v))
        self.vocab = vocab
        self.embed_dim = embed_dim
        self.W = xavier_uniform(Tensor((vocab, embed_dim), name="W"), vocab, embed_dim,
                                rng or default_rng())                  # (V, E)
        self.dW = Grad((vocab, embed_dim), "dW")
        self._ids = None

    def params(self):
        return ((self.W, self.dW),)

    def state_parts(self):
        # nn.Embedding: weight [vocab, E]
        return [("weight", [self.W])]

    def output_shape(self, in_shape):
        return tuple(in_shape) + (self.embed_dim,)

    def cache_floats(self, in_shape):
        n = shape_size(in_shape)
        return n * self.embed_dim

    def forward(self, ids):
        if not isinstance(ids, Tensor):          # (a Tensor first: the tuple below is built per call)
            if not isinstance(ids, (list, tuple)):
                raise ValueError("Embedding: ids must be a Tensor of token ids [B,S] (or nested lists of ints), "
                                 "got %s" % type(ids).__name__)
            ids = Tensor.from_list(ids)
        if len(ids.shape) < 1:
            raise shape_error("Embedding", "ids", "[B,S]", ids.shape)
        self._buffers("_fwd", ids.shape)
        bad = backend.K.embedding_forward(self._y.data, ids.data, self.W.data, ids.size, self.embed_dim, self.vocab)
        if bad >= 0:
            raise ValueError("Embedding: token ids must be ints in [0, %d), got %r at flat index %d"
                             % (self.vocab, ids.data[bad], bad))
        self._ids = ids
        return self._y

    def _allocate(self, stage, shape, other, bufs):
        self._y = bufs.zeros("_y", self.output_shape(shape))

    def backward(self, dy, grads=True):
        self._need_forward(self._ids)
        if not isinstance(dy, Tensor) or dy.shape != self._y.shape:
            raise shape_error("Embedding", "dy", repr(self._y.shape), getattr(dy, "shape", ()))
        if grads and self.trainable:
            backend.K.embedding_backward(self.dW.data, dy.data, self._ids.data, self._ids.size, self.embed_dim)
        return None
