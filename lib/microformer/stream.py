# microformer.stream: a chunked encoder for streams (e.g. a sensor, audio frames): each new chunk
# of tokens attends to itself and to a bounded cache of the `window` tokens before it (per
# attention layer, their keys and values), so memory stays fixed however long the stream runs.
#   chunk at positions p0 .. p0+c-1: query t sees keys max(0, p0 - window) .. p0+c-1
#   (causal attention: .. t); the full forward with that block-banded mask gives the same outputs.
from . import backend
from .activation import ActivationLayer
from .attention import Attention
from .block import EncoderBlock
from .dense import Dense
from .dropout import Dropout
from .embedding import Embedding
from .feedforward import FeedForward
from .layer import Buffered, check_tensor, shape_error
from .norm import LayerNorm
from .posembed import LearnedPositionalEmbedding
from .posenc import PositionalEncoding

_POSITIONWISE = (Dense, LayerNorm, ActivationLayer, FeedForward, Embedding, Dropout)


class _Window(Buffered):
    """One attention layer's stream state: keys and values of the last rows, L = window + chunk.

    The valid rows are right-aligned: a step of c tokens first moves every row up by c (the
    oldest fall out), writes the chunk's K and V into rows L-c .. L-1, and masks rows before
    L-c-h (h = cached history, at most window)."""

    def __init__(self, attn, window, chunk):
        self.attn = attn
        self.window = window
        self.chunk = chunk
        self.h = 0

    def _allocate(self, stage, shape, other, bufs):
        L = self.window + self.chunk
        if stage == "_kv":                       # (B, L, E) keys and values, the key mask
            B, E = shape
            self._kb = bufs.zeros("_kb", (B, L, E))
            self._vb = bufs.zeros("_vb", (B, L, E))
            self._mask = bufs.bytes("_mask", B * L)
        else:                                    # per chunk size c
            B, c, E = shape
            self._q = bufs.zeros("_q", (B, c, E))
            self._k = bufs.zeros("_k", (B, c, E))
            self._v = bufs.zeros("_v", (B, c, E))
            self._ctx = bufs.zeros("_ctx", (B, c, E))
            self._att = bufs.zeros("_att", (B, self.attn.num_heads, c, L))
            self._y = bufs.zeros("_y", (B, c, E))

    def step(self, x):
        a = self.attn
        K = backend.K
        B, c, E = x.shape
        L = self.window + self.chunk
        self._buffers("_kv", (B, E))
        self._buffers("_step", x.shape)
        bias = a.use_bias
        q = self._q
        k = self._k
        v = self._v
        kb = self._kb
        vb = self._vb
        a._project_qkv(q, k, v, x, x)
        K.kv_shift(kb.data, B, L, E, c)
        K.kv_shift(vb.data, B, L, E, c)
        K.kv_store(kb.data, k.data, B, c, L, E, L - c)
        K.kv_store(vb.data, v.data, B, c, L, E, L - c)
        first = L - c - self.h                   # rows before `first` are not visible
        m = self._mask
        for b in range(B):
            for j in range(L):
                m[b * L + j] = 1 if j < first else 0
        K.attention_forward(self._ctx.data, self._att.data, q.data, kb.data, vb.data, m,
                            B, c, L, E, a.num_heads, 1 if a.causal else 0)
        y = self._y
        K.matmul_forward(y.data, self._ctx.data, a.Wo.data, a.bo.data if bias else None, B * c, E, E)
        self.h = min(self.window, self.h + c)
        return y


class _Block(Buffered):
    """An EncoderBlock's stream state: its attention window and the residual sums."""

    def __init__(self, block, window, chunk):
        self.block = block
        self.win = _Window(block.attn, window, chunk)

    def _allocate(self, stage, shape, other, bufs):
        self._x1 = bufs.zeros("_x1", shape)
        self._y = bufs.zeros("_y", shape)

    def step(self, x):
        bl = self.block
        K = backend.K
        a = self.win.step(bl.ln1.forward(x))
        self._buffers("_res", x.shape)
        x1 = self._x1
        K.add_forward(x1.data, x.data, a.data, x.size)
        f = bl.ffn.forward(bl.ln2.forward(x1))
        y = self._y
        K.add_forward(y.data, x1.data, f.data, x.size)
        return y


def _dropping(layer):
    # True when a forward of `layer` would drop (training mode with dropout > 0), anywhere inside
    if isinstance(layer, Dropout):
        return layer.active()
    if isinstance(layer, Attention) and layer.training and layer.dropout > 0.0:
        return True
    for l in layer.sublayers():
        if _dropping(l):
            return True
    return False


class StreamingEncoder:
    """StreamingEncoder(model, window, chunk): run an encoder stack over a stream, chunk by chunk.

    model: a Sequential (or one layer) of EncoderBlock / Attention (self-attention) layers and
    position-wise ones (Dense, LayerNorm, ActivationLayer, FeedForward, Embedding, Dropout), with
    PositionalEncoding / LearnedPositionalEmbedding at the stream's absolute positions.
    step(x) takes the next chunk x [B, c, ...] (1 <= c <= chunk tokens) and returns its outputs
    [B, c, ...] (a buffer the next step overwrites): each token attends to its chunk (up to itself
    when the attention is causal) and to the `window` tokens before the chunk, whose keys and values
    every attention layer keeps: memory O(B (window + chunk) E) per layer, however long the stream.
    Inference only (no backward); the model must be in eval() mode if it has dropout.
    reset() starts a new stream; pos is the number of tokens seen.
    """

    def __init__(self, model, window, chunk):
        for what, v, lo in (("window", window, 0), ("chunk", chunk, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError("StreamingEncoder: %s must be an int >= %d, got %r" % (what, lo, v))
        self.model = model
        self.window = window
        self.chunk = chunk
        layers = model.layers if hasattr(model, "layers") else [model]
        self._steps = []
        for i in range(len(layers)):
            l = layers[i]
            if isinstance(l, EncoderBlock):
                if not l.norm_first:
                    raise ValueError("StreamingEncoder: layer %d is a post-norm EncoderBlock (norm_first="
                                     "False); streaming supports pre-norm blocks" % i)
                self._steps.append((0, _Block(l, window, chunk)))
            elif isinstance(l, Attention):
                self._steps.append((0, _Window(l, window, chunk)))
            elif isinstance(l, (PositionalEncoding, LearnedPositionalEmbedding)):
                self._steps.append((1, l))
            elif isinstance(l, _POSITIONWISE):
                self._steps.append((2, l))
            else:
                raise ValueError("StreamingEncoder: layer %d is a %s, which mixes or reshapes positions "
                                 "(supported: EncoderBlock, Attention, PositionalEncoding, "
                                 "LearnedPositionalEmbedding, Dense, LayerNorm, ActivationLayer, "
                                 "FeedForward, Embedding, Dropout)" % (i, type(l).__name__))
        self.pos = 0
        self._batch = None

    def reset(self):
        """Forget the cached history: the next step starts a new stream at position 0."""
        self.pos = 0
        self._batch = None
        for kind, s in self._steps:
            if kind == 0:
                (s.win if isinstance(s, _Block) else s).h = 0

    def step(self, x):
        """The next chunk x [B, c, ...] -> its outputs [B, c, ...]."""
        check_tensor("StreamingEncoder", "x", x)
        if len(x.shape) < 2 or not (1 <= x.shape[1] <= self.chunk):
            raise shape_error("StreamingEncoder", "x", "[B, c, ...] with 1 <= c <= chunk=%d" % self.chunk,
                              x.shape)
        if self._batch is not None and x.shape[0] != self._batch:
            raise ValueError("StreamingEncoder: this stream has batch %d, got a chunk of batch %d "
                             "(reset() starts a new stream)" % (self._batch, x.shape[0]))
        if _dropping(self.model):
            raise ValueError("StreamingEncoder: the model has dropout in training mode; call model.eval() "
                             "first (streaming is inference)")
        for kind, s in self._steps:
            if kind == 1:
                x = s.forward(x, self.pos)
            else:
                x = s.step(x) if kind == 0 else s.forward(x)
        self._batch = x.shape[0]
        self.pos += x.shape[1]
        return x
