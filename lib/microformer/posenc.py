# microformer.posenc: fixed sinusoidal positional encoding added to token vectors.
#   pe[p, 2i] = sin(p * div_i), pe[p, 2i+1] = cos(p * div_i), div_i = exp(-2i * ln(10000) / E)
from . import backend
from .dropout import Dropout, check_p
from .layer import Layer, check_tensor, shape_error
from .sinusoid import sinusoid
from .tensor import Tensor, settle


class PositionalEncoding(Layer):
    """PositionalEncoding(max_len, E, dropout=0): x [B,S,E] -> x + pe[start:start+S] (no parameters).

    forward(x, start=0); prefill(x) / decode_step(x_t) keep the position for generation.
    dropout=p: the embedding dropout of the seed's encoder and decoder (applied to x + pe in
    training mode; prefill / decode_step never drop).
    """

    def __init__(self, max_len, embed_dim, dropout=0.0):
        for what, v in (("max_len", max_len), ("embed_dim", embed_dim)):
            if not isinstance(v, int) or v < 1:
                raise ValueError("PositionalEncoding: %s must be a positive int, got %r" % (what, v))
        check_p("PositionalEncoding", dropout)
        self.max_len = max_len
        self.embed_dim = embed_dim
        self.pe = Tensor.zeros((max_len, embed_dim), "pe")      # (L, E), not a parameter
        _table_kernel()(self.pe.data, max_len, embed_dim)
        settle()                                                # the loop's floats: collected now
        self._x = None
        self.pos = 0
        self.drop = Dropout(dropout)
        self.dropout = self.drop.p

    def sublayers(self):
        return (self.drop,)

    def _table(self):
        # (L, E): what forward adds, row `start + s` to token s
        return self.pe

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        if len(in_shape) != 3 or in_shape[2] != self.embed_dim:
            raise shape_error(type(self).__name__, "input", "[B,S,%d]" % self.embed_dim, in_shape)

    def cache_floats(self, in_shape):
        B, S, E = in_shape
        return B * S * E

    def forward(self, x, start=0):
        y = self._add(x, start)
        return self.drop.forward(y)

    def _add(self, x, start):
        # y = x + table[start:start + S] (split so that each frame stays within 11 words)
        self._check_x(x, start)
        self._buffers("_fwd", x.shape)
        self._start = start
        self._run(x)
        self._x = x
        return self._y

    def _run(self, x):
        backend.K.posenc_forward(self._y.data, x.data, self._table().data, x.shape[0], x.shape[1], self.embed_dim,
                                 self._start)

    def _check_x(self, x, start):
        who = type(self).__name__
        check_tensor(who, "x", x)
        if len(x.shape) != 3 or x.shape[2] != self.embed_dim:
            raise shape_error(who, "x", "[B,S,%d]" % self.embed_dim, x.shape)
        if isinstance(start, bool) or not isinstance(start, int) or start < 0 or start + x.shape[1] > self.max_len:
            raise _start_error(who, start, x.shape[1], self.max_len)

    def _allocate(self, stage, shape, other, bufs):
        self._y = bufs.zeros("_y", shape)

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
        who = type(self).__name__
        check_tensor(who, "dy", dy)
        if dy.shape != self._x.shape:
            raise shape_error(who, "dy", repr(self._x.shape), dy.shape)
        return self.drop.backward(dy)  # an added table: dx = dy (through the dropout)

    def prefill(self, x):
        y = self._add(x, 0)
        self.pos = x.shape[1]
        return y

    def decode_step(self, x):
        y = self._add(x, self.pos)
        self.pos += x.shape[1]
        return y


def _table_kernel():
    # the backend's own posenc_table when it has one at hand (numpy's; the portable one once it is
    # loaded), else sinusoid: on a backend that binds its portable kernels on first use (viper,
    # native) asking for posenc_table would load every portable kernel (kernels.py) for one call
    d = getattr(backend.K, "__dict__", None)
    t = d.get("posenc_table") if d is not None else None
    return sinusoid if t is None else t


def _start_error(who, start, S, max_len):
    # the error for a start that is not an int in [0, max_len - S] (its own function: the
    # message's arguments would take the check's frame above 11 words)
    if isinstance(start, bool) or not isinstance(start, int):
        return ValueError("%s: start must be an int (the position of the first token), got %r (%s)"
                          % (who, start, type(start).__name__))
    if start < 0:
        return ValueError("%s: start must be >= 0, got %d" % (who, start))
    return ValueError("%s: positions %d..%d exceed max_len=%d: start + S must be <= %d, got start=%d, "
                      "S=%d (%d)" % (who, start, start + S - 1, max_len, max_len, start, S, start + S))
