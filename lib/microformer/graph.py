# microformer.graph: what a PyTorch forward does between its modules, as layers and containers.
#   NamedSequential(layers, names)  a Sequential whose layers carry the torch module's own names
#                                   (state_dict 'conv.weight', not '0.weight')
#   Residual(inner)                 y = x + inner(x)           (h = h + self.ff(self.norm(h)))
#   SelectPosition(index)           [B,S,E] -> [B,E], x[:, index] (a CLS position)
#   PrependToken(embed_dim)         [B,S,E] -> [B,S+1,E], a learned [1,1,E] token first
#                                   (torch.cat([self.cls.expand(B, -1, -1), x], dim=1))
#   SeqReduce(kind)                 [B,S,E] -> [B,E], the sum ('sum') or maximum ('max') over S
# host/torch_fx.py maps a traced torch module onto them; each has forward and backward, so a
# converted model trains on the board. The copies work a row (E floats) at a time.
from . import backend
from .layer import Layer, check_tensor, shape_error
from .model import Sequential
from .tensor import Tensor


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
    # named_params through NamedSequential / Residual: the names they carry, then the leaf's own
    if isinstance(layer, NamedSequential):
        for i in range(len(layer.layers)):
            _named(layer.layers[i], prefix + layer.names[i], out)
    elif isinstance(layer, Residual):
        _named(layer.inner, prefix, out)
    elif hasattr(layer, "named_params") and not isinstance(layer, Sequential):
        for n, p in layer.named_params():
            out.append((prefix + n, p))
    else:
        for p, _ in layer.params():
            out.append((prefix + p.name, p))


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

    def forward(self, x):
        _seq("SelectPosition", x)
        B, S, E = x.shape
        i = self._pos(S)
        self._buffers("_fwd", x.shape)
        y = memoryview(self._y.data)
        src = memoryview(x.data)
        for b in range(B):
            o = (b * S + i) * E
            y[b * E:(b + 1) * E] = src[o:o + E]
        self._x = x
        return self._y

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
        check_tensor("SelectPosition", "dy", dy)
        if dy.shape != self._y.shape:
            raise shape_error("SelectPosition", "dy", repr(self._y.shape), dy.shape)
        B, S, E = self._x.shape
        i = self._pos(S)
        self._buffers("_bwd", self._x.shape)     # zeros: only position i gets a gradient
        dx = memoryview(self._dx.data)
        g = memoryview(dy.data)
        for b in range(B):
            o = (b * S + i) * E
            dx[o:o + E] = g[b * E:(b + 1) * E]
        return self._dx


class PrependToken(Layer):
    """PrependToken(embed_dim): x [B,S,E] -> [B,S+1,E], a learned token W [1,1,E] at position 0.
    Its state_dict entry has the empty name: in a NamedSequential it is the torch parameter's name."""

    def __init__(self, embed_dim):
        if not isinstance(embed_dim, int) or isinstance(embed_dim, bool) or embed_dim < 1:
            raise ValueError("PrependToken: embed_dim must be a positive int, got %r" % (embed_dim,))
        self.embed_dim = embed_dim
        self.W = Tensor((1, 1, embed_dim), name="")     # zeros, as torch's usual nn.Parameter(torch.zeros(1, 1, E))
        self.dW = Tensor.zeros((1, 1, embed_dim), "d")
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
        return B * (S + 1) * E + B * S * E

    def forward(self, x):
        _seq("PrependToken", x)
        B, S, E = x.shape
        if E != self.embed_dim:
            raise shape_error("PrependToken", "x", "[B,S,%d]" % self.embed_dim, x.shape)
        self._buffers("_fwd", x.shape)
        y = memoryview(self._y.data)
        src = memoryview(x.data)
        tok = memoryview(self.W.data)
        n = S * E
        for b in range(B):
            o = b * (n + E)
            y[o:o + E] = tok
            y[o + E:o + E + n] = src[b * n:(b + 1) * n]
        self._x = x
        return self._y

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
        check_tensor("PrependToken", "dy", dy)
        if dy.shape != self._y.shape:
            raise shape_error("PrependToken", "dy", repr(self._y.shape), dy.shape)
        B, S, E = self._x.shape
        n = S * E
        self._buffers("_bwd", self._x.shape)
        dx = memoryview(self._dx.data)
        g = memoryview(dy.data)
        for b in range(B):
            o = b * (n + E)
            dx[b * n:(b + 1) * n] = g[o + E:o + E + n]
        if grads and self.trainable and self.dW.data is not None:
            self._grad(dy)
        return self._dx

    def _grad(self, dy):
        # dW += the token rows' gradient, summed over the batch
        d = self.dW.data
        g = dy.data
        E = self.embed_dim
        step = (self._x.shape[1] + 1) * E
        for b in range(self._x.shape[0]):
            o = b * step
            for e in range(E):
                d[e] += g[o + e]


class SeqReduce(Layer):
    """SeqReduce('sum' | 'max'): x [B,S,E] -> y [B,E], the sum or the maximum over S (torch's
    x.sum(dim=1), x.amax(dim=1): the maximum's gradient goes to the first position holding it)."""

    def __init__(self, kind="sum"):
        if kind not in ("sum", "max"):
            raise ValueError("SeqReduce: kind must be 'sum' or 'max', got %r" % (kind,))
        self.kind = kind
        self._x = None

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        if len(in_shape) != 3:
            raise shape_error("SeqReduce", "input", "[B,S,E]", in_shape)

    def output_shape(self, in_shape):
        return (in_shape[0], in_shape[2])

    def cache_floats(self, in_shape):
        B, S, E = in_shape
        return B * E + B * S * E + (B * E if self.kind == "max" else 0)

    def _allocate(self, stage, shape, other, bufs):
        B, S, E = shape
        if stage == "_fwd":
            self._y = bufs.zeros("_y", (B, E))
            if self.kind == "max":
                self._arg = bufs.ints("_arg", B * E)
        else:
            self._dx = bufs.zeros("_dx", shape)

    def forward(self, x):
        _seq("SeqReduce", x)
        self._buffers("_fwd", x.shape)
        if self.kind == "sum":
            self._sum(x)
        else:
            self._max(x)
        self._x = x
        return self._y

    def _sum(self, x):
        B, S, E = x.shape
        y = self._y.data
        backend.K.zero(y, B * E)
        src = x.data
        for b in range(B):
            for s in range(S):
                o = (b * S + s) * E
                for e in range(E):
                    y[b * E + e] += src[o + e]

    def _max(self, x):
        B, S, E = x.shape
        y = self._y.data
        arg = self._arg
        src = x.data
        for b in range(B):
            for e in range(E):
                best = src[b * S * E + e]
                k = 0
                for s in range(1, S):
                    v = src[(b * S + s) * E + e]
                    if v > best:
                        best = v
                        k = s
                y[b * E + e] = best
                arg[b * E + e] = k

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
        check_tensor("SeqReduce", "dy", dy)
        if dy.shape != self._y.shape:
            raise shape_error("SeqReduce", "dy", repr(self._y.shape), dy.shape)
        self._buffers("_bwd", self._x.shape)
        B, S, E = self._x.shape
        dx = self._dx.data
        g = dy.data
        if self.kind == "sum":
            for b in range(B):
                for s in range(S):
                    o = (b * S + s) * E
                    for e in range(E):
                        dx[o + e] = g[b * E + e]
        else:
            arg = self._arg
            backend.K.zero(dx, B * S * E)      # the maxima move between steps
            for b in range(B):
                for e in range(E):
                    dx[(b * S + arg[b * E + e]) * E + e] = g[b * E + e]
        return self._dx
