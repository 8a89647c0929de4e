# microformer.graph: what a PyTorch forward does between its modules, as layers and containers.
#   NamedSequential(layers, names)  a Sequential whose layers carry the torch module's own names
#                                   (state_dict 'conv.weight', not '0.weight')
#   Residual(inner)                 y = x + inner(x)           (h = h + self.ff(self.norm(h)))
#   SelectPosition(index)           [B,S,E] -> [B,E], x[:, index] (a CLS position)
#   PrependToken(embed_dim)         [B,S,E] -> [B,S+1,E], a learned [1,1,E] token first
#                                   (torch.cat([self.cls.expand(B, -1, -1), x], dim=1))
#   SeqReduce(kind)                 [B,S,E] -> [B,E], the sum ('sum') or maximum ('max') over S
#   PositionTable(max_len, E)       x + P[:, :S], P a learned [1, max_len, E] table (x + self.pos)
# host/tools/torch_fx.py maps a traced torch module onto them; each has forward and backward, so a
# converted model trains on the board. The copies work a row (E floats) at a time.
from . import backend
from .layer import Layer, check_tensor, shape_error
from .model import Sequential
from .posembed import LearnedPositionalEmbedding
from .tensor import Grad, Tensor, zeros


def _seq(who, x):
    check_tensor(who, "x", x)
    if len(x.shape) != 3:
        raise shape_error(who, "x", "[B,S,E]", x.shape)


class NamedSequential(Sequential):
    """NamedSequential(layers, names): Sequential whose layer i has the name prefix names[i]
    ('conv.' for torch's self.conv; '' for a layer without parameters or a container whose parts
    carry their own; 'cls' for a PrependToken whose parameter is torch's self.cls). state_dict and
    named_params use these names; the names are whole paths (a NamedSequential inside a Residual
    carries 'enc.0.' itself, the Residual adds nothing)."""

    def __init__(self, layers, names):
        Sequential.__init__(self, layers)
        names = list(names)
        if len(names) != len(self.layers) or not all(isinstance(n, str) for n in names):
            raise ValueError("NamedSequential: names must be %d strings (one per layer), got %r"
                             % (len(self.layers), names))
        self.names = names

    def _named_sublayers(self):
        return [(self.names[i], self.layers[i]) for i in range(len(self.layers))]

    def state_parts(self):
        out = []
        for i in range(len(self.layers)):
            for n, parts in self.layers[i].state_parts():
                out.append((self.names[i] + n, parts))
        return out

    def named_params(self):
        out = []
        _named(self, "", out)
        return out


def _named(layer, prefix, out):
    # named_params through NamedSequential / Residual: the names they carry (whole paths), then the
    # leaf's own. (A LoRA adapter's tensors are named relative to the model's top-level part,
    # lora._tensor_names: inside a Residual, whose name is empty, that is the whole path already.)
    if isinstance(layer, NamedSequential):
        for i in range(len(layer.layers)):
            _named(layer.layers[i], layer.names[i], out)
    elif isinstance(layer, Residual):
        _named(layer.inner, prefix, out)
    elif hasattr(layer, "named_params") and not isinstance(layer, Sequential):
        for n, p in layer.named_params():
            out.append((_join(prefix, n), p))
    else:
        for p, _ in layer.params():
            out.append((_join(prefix, p.name), p))


def _join(prefix, name):
    return name if prefix and name.startswith(prefix) else prefix + name


class Residual(Layer):
    """Residual(inner): y = x + inner(x), inner a layer keeping x's shape (a Sequential of them)."""

    backward_stops = False

    def __init__(self, inner):
        if not (hasattr(inner, "forward") and hasattr(inner, "backward") and hasattr(inner, "collect_params")):
            raise ValueError("Residual: inner must be a layer (forward/backward/collect_params), got %r" % (inner,))
        self.inner = inner
        self._x = None

    def sublayers(self):
        return (self.inner,)

    def _named_sublayers(self):
        return [("", self.inner)]

    def state_parts(self):
        return self.inner.state_parts()

    def output_shape(self, in_shape):
        return in_shape

    def cache_floats(self, in_shape):
        from .tensor import shape_size
        return 2 * shape_size(in_shape) + self.inner.cache_floats(in_shape)

    def forward(self, x):
        check_tensor("Residual", "x", x)
        h = self.inner.forward(x)
        if h.shape != x.shape:
            raise shape_error("Residual", "inner output", "x's shape %r" % (x.shape,), h.shape)
        self._buffers("_fwd", x.shape)
        backend.K.add_forward(self._y.data, x.data, h.data, x.size)
        self._x = x
        return self._y

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
        check_tensor("Residual", "dy", dy)
        if dy.shape != self._x.shape:
            raise shape_error("Residual", "dy", repr(self._x.shape), dy.shape)
        self._buffers("_bwd", dy.shape)
        self._dx.data[:] = dy.data            # dy may be a buffer the inner layers overwrite
        return self._add_inner(self._dx, grads and self.trainable)

    def _add_inner(self, dx, grads):
        inner = self.inner
        if getattr(inner, "backward_stops", False):
            g = inner.backward(dx, grads, True)
        else:
            g = inner.backward(dx, grads)
        backend.K.add_forward(dx.data, dx.data, g.data, dx.size)
        return dx


def _rows(layer, key, fill):
    # an array('f') of row numbers for the embedding kernels (a gather: out row n = table row
    # ids[n]; a scatter-add: table row ids[n] += rows n), made once per shape and kept
    c = layer.__dict__.get("_rowcache")
    if c is None:
        c = layer._rowcache = {}
    a = c.get(key)
    if a is None:
        if len(c) >= 4:
            c.clear()
        a = c[key] = fill(key)
    return a


def _fill(values):
    a = zeros(len(values))
    for k in range(len(values)):
        a[k] = values[k]
    return a


class SelectPosition(Layer):
    """SelectPosition(index): x [B,S,E] -> y [B,E] = x[:, index] (negative: from the end)."""

    def __init__(self, index=0):
        if not isinstance(index, int) or isinstance(index, bool):
            raise ValueError("SelectPosition: index must be an int, got %r" % (index,))
        self.index = index
        self._x = None

    def _pos(self, S):
        i = self.index if self.index >= 0 else S + self.index
        if not 0 <= i < S:
            raise ValueError("SelectPosition: index %d is outside a sequence of %d positions" % (self.index, S))
        return i

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        if len(in_shape) != 3:
            raise shape_error("SelectPosition", "input", "[B,S,E]", in_shape)
        self._pos(in_shape[1])

    def output_shape(self, in_shape):
        return (in_shape[0], in_shape[2])

    def cache_floats(self, in_shape):
        B, S, E = in_shape
        return B * E + B * S * E

    def _ids(self):
        # the rows b S + index of x viewed as [B S, E]
        sh = self._x.shape
        return _rows(self, (sh[0], sh[1], self._pos(sh[1])),
                     lambda k: _fill([b * k[1] + k[2] for b in range(k[0])]))

    def forward(self, x):
        _seq("SelectPosition", x)
        self._pos(x.shape[1])
        self._buffers("_fwd", x.shape)
        self._x = x
        self._gather()
        return self._y

    def _gather(self):
        backend.K.embedding_forward(self._y.data, self._ids(), self._x.data, self._y.shape[0], self._y.shape[1],
                                    self._x.size // self._x.shape[2])

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
        check_tensor("SelectPosition", "dy", dy)
        if dy.shape != self._y.shape:
            raise shape_error("SelectPosition", "dy", repr(self._y.shape), dy.shape)
        self._buffers("_bwd", self._x.shape)
        self._scatter(dy)
        return self._dx

    def _scatter(self, dy):
        # dx = 0 but for row index of each example, which is dy's row
        backend.K.zero(self._dx.data, self._dx.size)
        backend.K.embedding_backward(self._dx.data, dy.data, self._ids(), dy.shape[0], dy.shape[1])


class PrependToken(Layer):
    """PrependToken(embed_dim): x [B,S,E] -> [B,S+1,E], a learned token W [1,1,E] at position 0.
    Its state_dict entry has the empty name: in a NamedSequential it is the torch parameter's name."""

    def __init__(self, embed_dim):
        if not isinstance(embed_dim, int) or isinstance(embed_dim, bool) or embed_dim < 1:
            raise ValueError("PrependToken: embed_dim must be a positive int, got %r" % (embed_dim,))
        self.embed_dim = embed_dim
        self.W = Tensor((1, 1, embed_dim), name="")     # zeros, as torch's usual nn.Parameter(torch.zeros(1, 1, E))
        self.dW = Grad((1, 1, embed_dim), "d")
        self._x = None

    def params(self):
        return ((self.W, self.dW),)

    def state_parts(self):
        return [("", [self.W])]

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        if len(in_shape) != 3 or in_shape[2] != self.embed_dim:
            raise shape_error("PrependToken", "input", "[B,S,%d]" % self.embed_dim, in_shape)

    def output_shape(self, in_shape):
        return (in_shape[0], in_shape[1] + 1, in_shape[2])

    def cache_floats(self, in_shape):
        B, S, E = in_shape
        return B * (S + 1) * E + B * S * E + 2 * B * E

    def _allocate(self, stage, shape, other, bufs):
        Layer._allocate(self, stage, shape, other, bufs)
        self._tok = bufs.zeros("_tok", (shape[0], shape[2]))     # the token's B rows (or their gradient)

    def _seq_ids(self):
        # row b (S+1) + 1 + s of y for row b S + s of x
        sh = self._x.shape
        return _rows(self, ("x", sh[0], sh[1]),
                     lambda k: _fill([b * (k[2] + 1) + 1 + s for b in range(k[1]) for s in range(k[2])]))

    def _tok_ids(self):
        # row b (S+1) of y, the token's place in example b
        sh = self._x.shape
        return _rows(self, ("t", sh[0], sh[1]), lambda k: _fill([b * (k[2] + 1) for b in range(k[1])]))

    def _zero_ids(self):
        return _rows(self, ("0", self._x.shape[0]), lambda k: zeros(k[1]))

    def forward(self, x):
        _seq("PrependToken", x)
        if x.shape[2] != self.embed_dim:
            raise shape_error("PrependToken", "x", "[B,S,%d]" % self.embed_dim, x.shape)
        self._buffers("_fwd", x.shape)
        self._x = x
        self._place()
        return self._y

    def _place(self):
        # y = 0; y rows of the sequence += x rows; the token's B rows (a gather of row 0 of W) added
        # at their places: the embedding kernels' gather and scatter-add, no copy per value in Python
        K = backend.K
        K.zero(self._y.data, self._y.size)
        K.embedding_backward(self._y.data, self._x.data, self._seq_ids(), self._x.shape[0] * self._x.shape[1],
                             self.embed_dim)
        K.embedding_forward(self._tok.data, self._zero_ids(), self.W.data, self._x.shape[0], self.embed_dim, 1)
        K.embedding_backward(self._y.data, self._tok.data, self._tok_ids(), self._x.shape[0], self.embed_dim)

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
        check_tensor("PrependToken", "dy", dy)
        if dy.shape != self._y.shape:
            raise shape_error("PrependToken", "dy", repr(self._y.shape), dy.shape)
        self._buffers("_bwd", self._x.shape)
        self._dy = dy
        self._take()
        if grads and self.trainable and self.dW.data is not None:
            self._grad()
        return self._dx

    def _take(self):
        # dx = the rows of dy at the sequence's places (a gather)
        backend.K.embedding_forward(self._dx.data, self._seq_ids(), self._dy.data,
                                    self._x.shape[0] * self._x.shape[1], self.embed_dim, self._dy.shape[0] *
                                    self._dy.shape[1])

    def _grad(self):
        # dW += the token rows of dy, summed over the batch (gathered, then added into row 0)
        self._gather_tok()
        backend.K.embedding_backward(self.dW.data, self._tok.data, self._zero_ids(), self._x.shape[0],
                                     self.embed_dim)

    def _gather_tok(self):
        backend.K.embedding_forward(self._tok.data, self._tok_ids(), self._dy.data, self._tok.shape[0], self.embed_dim,
                                    self._dy.size // self.embed_dim)


class SeqReduce(Layer):
    """SeqReduce('sum' | 'max'): x [B,S,E] -> y [B,E], the sum or the maximum over S (torch's
    x.sum(dim=1), x.amax(dim=1)). The sum is the mean kernel's times S; the maximum is a max
    pooling over the whole sequence, its gradient going to the first position holding it (torch's
    amax splits it between equal maxima)."""

    def __init__(self, kind="sum"):
        if kind not in ("sum", "max"):
            raise ValueError("SeqReduce: kind must be 'sum' or 'max', got %r" % (kind,))
        self.kind = kind
        self._max = kind == "max"
        self._x = None

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        if len(in_shape) != 3:
            raise shape_error("SeqReduce", "input", "[B,S,E]", in_shape)

    def output_shape(self, in_shape):
        return (in_shape[0], in_shape[2])

    def cache_floats(self, in_shape):
        B, S, E = in_shape
        return B * E + B * S * E + (B * E if self._max else 0)

    def _allocate(self, stage, shape, other, bufs):
        Layer._allocate(self, stage, shape, other, bufs)
        if stage == "_fwd" and self._max:
            self._arg = bufs.ints("_arg", shape[0] * shape[2])     # each maximum's position

    def forward(self, x):
        _seq("SeqReduce", x)
        self._buffers("_fwd", x.shape)
        self._x = x
        if self._max:
            self._fmax()
        else:
            self._fsum()
        return self._y

    def _fsum(self):
        sh = self._x.shape
        backend.K.avgpool_forward(self._y.data, self._x.data, sh[0], sh[1], sh[2])
        backend.K.scale_inplace(self._y.data, self._y.size, float(sh[1]))

    def _fmax(self):
        # one window over the whole sequence: a max pooling of kernel and stride S into one position
        sh = self._x.shape
        self._pool = (sh[0], sh[1], sh[2], 1, sh[1], sh[1], 0)
        backend.K.maxpool1d_forward(self._y.data, self._arg, self._x.data, self._pool)

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
        check_tensor("SeqReduce", "dy", dy)
        if dy.shape != self._y.shape:
            raise shape_error("SeqReduce", "dy", repr(self._y.shape), dy.shape)
        self._buffers("_bwd", self._x.shape)
        self._dy = dy
        if self._max:
            self._bmax()
        else:
            self._bsum()
        return self._dx

    def _bsum(self):
        sh = self._x.shape
        backend.K.avgpool_backward(self._dx.data, self._dy.data, sh[0], sh[1], sh[2])
        backend.K.scale_inplace(self._dx.data, self._dx.size, float(sh[1]))

    def _bmax(self):
        backend.K.maxpool1d_backward(self._dx.data, self._dy.data, self._arg, self._pool)



class PositionTable(LearnedPositionalEmbedding):
    """PositionTable(max_len, E): x [B,S,E] -> x + P[:, :S], P a learned [1, max_len, E] table
    (torch's x + self.pos with self.pos = nn.Parameter(torch.zeros(1, S, E)), or x + self.pos[:, :S]):
    a LearnedPositionalEmbedding whose table has torch's shape and the empty state_dict name (in a
    NamedSequential, the torch parameter's name)."""

    def __init__(self, max_len, embed_dim):
        LearnedPositionalEmbedding.__init__(self, max_len, embed_dim)
        self.W = Tensor((1, max_len, embed_dim), self.W.data, "")
        self.dW = Grad((1, max_len, embed_dim), "d")

    def params(self):
        return ((self.W, self.dW),)

    def state_parts(self):
        return [("", [self.W])]
