# microformer.block: the transformer encoder block, and generation through a layer stack.
#   pre-norm (norm_first=True):   x1 = x + Attention(LayerNorm1(x)),  y = x1 + FeedForward(LayerNorm2(x1))
#   post-norm (norm_first=False): x1 = LayerNorm1(x + Attention(x)),  y = LayerNorm2(x1 + FeedForward(x1))
from . import backend
from .attention import Attention
from .dropout import Dropout, check_p
from .feedforward import FeedForward
from .layer import Layer, check_tensor, prefixed, release_buffers, scratch, shape_error, trains
from .norm import LayerNorm
from .tensor import shape_size


class EncoderBlock(Layer):
    """EncoderBlock(E, H, ffn_hidden, causal=False, activation='gelu', max_len=None): [B,S,E] -> [B,S,E].

    Parameters are named ln1.gamma ln1.beta attn.Wq .. attn.bo ln2.gamma ln2.beta ffn.W1 .. ffn.b2.
    forward(x, key_padding_mask=None, lengths=None) passes the mask to the attention.
    With causal=True: prefill(x) then decode_step(x_t [B,1,E]) generate through the KV cache.
    dropout=p (training mode only, as nn.TransformerEncoderLayer(dropout=p)): on the attention
    weights, after the attention (drop1), inside the FFN after the activation, after the FFN (drop2):
      x1 = x + drop1(Attention(LayerNorm1(x))),  y = x1 + drop2(FeedForward(LayerNorm2(x1)))
    kv_tile=T: the attention over key tiles (Attention's kv_tile; needs dropout=0).
    prefill / decode_step never drop.
    norm_first=False: post-norm, nn.TransformerEncoderLayer's default (same parameters):
      x1 = LayerNorm1(x + drop1(Attention(x))),  y = LayerNorm2(x1 + drop2(FeedForward(x1)))
    """

    def __init__(self, embed_dim, num_heads, ffn_hidden, causal=False, activation="gelu",
                 max_len=None, use_bias=True, rng=None, dropout=0.0, kv_tile=None, norm_first=True):
        if not isinstance(embed_dim, int) or embed_dim < 1:
            raise ValueError("EncoderBlock: embed_dim must be a positive int, got %r" % (embed_dim,))
        if norm_first is not True and norm_first is not False:
            raise ValueError("EncoderBlock: norm_first must be True (pre-norm) or False (post-norm), got %r"
                             % (norm_first,))
        self.norm_first = norm_first
        check_p("EncoderBlock", dropout)
        self.embed_dim = embed_dim
        self.ln1 = LayerNorm(embed_dim)
        self.attn = Attention(embed_dim, num_heads, use_bias, causal, rng, max_len, dropout, kv_tile)
        self.ln2 = LayerNorm(embed_dim)
        self.ffn = FeedForward(embed_dim, ffn_hidden, activation, use_bias, rng, dropout)
        self.drop1 = Dropout(dropout)
        self.drop2 = Dropout(dropout)
        self.dropout = self.drop1.p
        self.kv_tile = self.attn.kv_tile
        self.causal = self.attn.causal
        # the attention's and the FFN's outputs are read by this block's residual adds only: in
        # its forward frames they are scratch buffers (layer.Scratch)
        self.attn._out_scratch = True
        self.ffn.fc2._out_scratch = True
        self.drop1._in_place = True               # their dropouts drop over them (Dropout._in_place)
        self.drop2._in_place = True
        self.ffn._in_block = True
        # what the backward computes again instead of keeping (EncoderBlock.recompute)
        self.recompute = True
        for prefix, layer in (("ln1.", self.ln1), ("attn.", self.attn), ("ln2.", self.ln2), ("ffn.", self.ffn)):
            for p, g in layer.params():
                p.name = prefix + p.name
                g.name = prefix + g.name
        self._x = None
        # checkpoint=True: the parts' forward buffers (the attention's Q K V weights, the FFN's
        # hidden, the LayerNorms' statistics, the adapters' x A^T) are placed in the scratch arena
        # (layer.Scratch.every), which the next block's forward overwrites; the backward runs the
        # forward again (the same kernels on the same input: the same values) in its own frame
        # before it reads them. Every block then shares one set of those buffers, for one more
        # block forward per step. Needs pre-norm and dropout=0 (a mask drawn again would differ).
        # Switching it drops the block's buffers (layer.release_buffers): they are made again, in
        # the arena or not, by the next forward.
        self._ckpt = False

    def _get_recompute(self):
        return self._recompute

    def _set_recompute(self, flag):
        if flag is not True and flag is not False:
            raise ValueError("EncoderBlock: recompute must be True or False, got %r" % (flag,))
        self._recompute = flag
        # the FFN's activation output: a scratch buffer of the forward, computed again in backward
        # (FeedForward.recompute; not for tanh and sigmoid, whose backward reads the output)
        self.ffn.recompute = flag and self.ffn.kind != "tanh" and self.ffn.kind != "sigmoid"
        # pre-norm: the LayerNorms' outputs written into buffers the residual sums overwrite, and
        # computed again in backward (_ln_again, FeedForward._norm_again)
        self.ffn._norm = self.ln2 if flag and self.norm_first else None
        # the attention's stored-weights backward item by item above Attention._back_items floats
        # (one item's kernel temporaries), or in one call over the batch
        self.attn._back_items = Attention._back_items if flag else None

    # recompute (a memory choice, not part of the model: specs and checkpoints do not carry it;
    # a Trainer sets it from its memory plan, train.Trainer(recompute=...)):
    #   True (as built): the FFN's activation output and, pre-norm, both LayerNorms' outputs are
    #     computed again in backward (the same kernels on the same inputs: the same values), and
    #     the attention's backward goes item by item over large batches: three [B,S,*] buffers
    #     less per block, for more instructions per training sample;
    #   False: all of them kept, the attention's backward one call: the same results, bit for bit.
    recompute = property(_get_recompute, _set_recompute)

    def sublayers(self):
        return (self.ln1, self.attn, self.drop1, self.ln2, self.ffn, self.drop2)

    def state_parts(self):
        # nn.TransformerEncoderLayer(E, H, hidden, dropout=0, batch_first=True, norm_first=...)
        return (prefixed("self_attn.", self.attn) + self.ffn.state_parts()
                + prefixed("norm1.", self.ln1) + prefixed("norm2.", self.ln2))

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        if len(in_shape) != 3 or in_shape[2] != self.embed_dim:
            raise shape_error("EncoderBlock", "input", "[B,S,%d]" % self.embed_dim, in_shape)

    def cache_floats(self, in_shape):
        n = shape_size(in_shape)
        s = 4 * n      # x1 y dx1 dx
        for l in self.sublayers():
            s += l.cache_floats(in_shape)
        if self.norm_first and self._recompute:
            s -= n     # the LayerNorms' outputs: in x1 and y, and one scratch buffer in backward
        return s

    def _check(self, x, what):
        check_tensor("EncoderBlock", what, x)
        E = self.embed_dim
        if len(x.shape) != 3 or x.shape[2] != E:
            raise shape_error("EncoderBlock", what, "[B,S,%d]" % E, x.shape)

    # The forward paths are split so that each method's frame (arguments + locals + value stack)
    # stays within 11 words: a larger one comes from the GC heap on every call on MicroPython.
    def _run(self, x):
        # the training/eval forward (mode 0), the mask and lengths from forward (_fm, _fl)
        if not self.norm_first:
            mask = self.attn.forward(x, self._fm, None, self._fl)
            return self._post(x, self.drop1.forward(mask), 0)
        # pre-norm: LayerNorm1's output is written into _x1, which the attention reads and the
        # residual sum x1 = x + a overwrites after it (LayerNorm2's likewise into _y, read by the
        # FFN's first linear, overwritten by y = x1 + f): the backward computes both again
        # (_ln_again), so a block keeps no LayerNorm output of its own
        self._buffers("_fwd", x.shape)
        mask = self.attn.forward(self._norm_out(self.ln1, x, self._x1), self._fm, None, self._fl)   # (its output)
        return self._rest(x, self.drop1.forward(mask), 0)

    def _norm_out(self, ln, x, buf):
        # a pre-norm LayerNorm's output in training: into buf (overwritten after its reader, computed
        # again in backward) with recompute, else into the LayerNorm's own buffer (kept)
        return ln.forward_into(x, buf) if self._recompute else ln.forward(x)

    def _rest(self, x, a, mode):
        # pre-norm after the attention a: x1 = x + a, y = x1 + ffn(ln2(x1)) in the mode's buffers
        # (mode 0: training/eval forward, 1: prefill, 2: decode_step; each keeps its own)
        self._buffers(_RUN[mode], x.shape)
        x1 = getattr(self, _X1[mode])
        backend.K.add_forward(x1.data, x.data, a.data, x.size)
        a = self._ffn_of(x1, mode)
        if mode == 0:
            a = self.drop2.forward(a)
        return self._add(_Y[mode], x1, a)

    def _ffn_of(self, x1, mode):
        # ffn(ln2(x1)) (a function of its own: _rest's frame within 11 words)
        return self.ffn.forward(self._norm_out(self.ln2, x1, self._y) if mode == 0 else self.ln2.forward(x1), mode == 0)

    def _add(self, name, p, q):
        # the buffer self.<name> = p + q
        y = getattr(self, name)
        backend.K.add_forward(y.data, p.data, q.data, y.size)
        return y

    def _post(self, x, a, mode):
        # post-norm after the attention a: s1 = x + a, x1 = ln1(s1), s2 = x1 + f, y = ln2(s2); s1
        # and s2 live in the mode's x1 / y buffers (the LayerNorms keep their inputs for backward)
        self._buffers(_RUN[mode], x.shape)
        x1 = self._add(_X1[mode], x, a)
        x1 = self.ln1.forward(x1)
        a = self.ffn.forward(x1, mode == 0)
        if mode == 0:
            a = self.drop2.forward(a)
        x1 = self._add(_Y[mode], x1, a)
        return self.ln2.forward(x1)

    def forward(self, x, key_padding_mask=None, lengths=None):
        # a frame of the scratch arena (layer.Scratch): the attention's and the FFN's outputs
        # are read by the residual adds only, inside this forward (_out_scratch, set in __init__)
        self._check(x, "x")
        self._fm = key_padding_mask               # (as attributes: the frames within 11 words)
        self._fl = lengths
        if self.checkpoint:
            self._check_checkpoint()
        scratch.enter()
        y = self._run_framed(x)
        if not self.checkpoint:           # a checkpointed block's backward runs with them again
            self._fm = self._fl = None
        self.attn._shared = self._ckpt    # its weights in the arena: weights() / stages() refuse
        self.ffn._fresh = False
        self._x = x
        return y

    def _run_framed(self, x):
        try:
            if self.checkpoint:
                return self._run_kept(x)
            return self._run(x)
        finally:
            scratch.leave()

    def _get_checkpoint(self):
        return self._ckpt

    def _set_checkpoint(self, flag):
        if flag is not True and flag is not False:
            raise ValueError("EncoderBlock: checkpoint must be True or False, got %r" % (flag,))
        if flag and not self.norm_first:  # post-norm's output is LayerNorm2's own buffer
            raise ValueError("EncoderBlock: checkpoint needs norm_first=True (pre-norm), got norm_first=False")
        if flag != self._ckpt:            # buffers placed for the other setting: made again
            release_buffers(self)
            self._x = None
        self._ckpt = flag

    checkpoint = property(_get_checkpoint, _set_checkpoint)

    def _check_checkpoint(self):
        if self.dropout > 0.0 and self.training:
            raise ValueError("EncoderBlock: checkpoint needs dropout=0 (its backward runs the forward "
                             "again), got dropout=%r" % (self.dropout,))

    def _run_kept(self, x):
        # checkpoint: this block's own x1 and y first (y is the output: read after the frame),
        # then every part's forward buffers in the arena (Scratch.every)
        self._buffers("_fwd", x.shape)
        scratch.every += 1
        try:
            return self._run(x)
        finally:
            scratch.every -= 1

    def _allocate(self, stage, shape, other, bufs):
        if stage == "_bwd":
            self._dx1 = bufs.scratch("_dx1", shape)     # read inside backward only
            self._dx = bufs.zeros("_dx", shape)         # the input gradient: read after it
        elif stage == "_lnb":                           # pre-norm: LayerNorm1's output again
            self._ln = bufs.scratch("_ln", shape)
        else:                         # one pair per mode: training forward, prefill, decode_step
            mode = _RUN.index(stage)
            for name in (_X1[mode], _Y[mode]):
                setattr(self, name, bufs.zeros(name, shape))

    backward_stops = True

    def _named_sublayers(self):
        return [("self_attn.", self.attn), ("", self.ffn), ("norm1.", self.ln1), ("norm2.", self.ln2)]

    def backward(self, dy, grads=True, need_dx=True):
        # need_dx=False (pre-norm): no input gradient (returns None), and the parts below the
        # lowest trainable one of the block get no backward at all.
        # The backward is a frame of the scratch arena (layer.Scratch): the parts' input gradients
        # and temporaries (and _dx1) are the arena's, shared by every block; only _dx (own) is
        # read after it. What the FFN half placed is given back once _dx1 holds its result.
        self._need_forward(self._x)
        check_tensor("EncoderBlock", "dy", dy)
        if dy.shape != self._x.shape:
            raise shape_error("EncoderBlock", "dy", repr(self._x.shape), dy.shape)
        self._grads = grads and self.trainable    # a part's own flag is its own: nothing is changed here
        self._need = need_dx
        scratch.enter()
        return self._framed(dy)

    def _framed(self, dy):
        # the frame is left however the backward ends (the flags as attributes: a frame within 11 words)
        try:
            return self._backward(dy)
        finally:
            scratch.leave()

    def _backward(self, dy):
        if self.checkpoint:               # the parts' forward buffers again, at the frame's start
            self._run_kept(self._x)
            self._fm = self._fl = None
            self.ffn._fresh = True        # its activation output is there: not computed again
        self._buffers("_bwd", dy.shape)
        scratch.mark(self)
        if not self.norm_first:
            dy = self._backward_post(dy, self._grads)
            return dy if self._need else None
        return self._backward_pre(dy, self._grads, self._need)

    # The backward is split as the forward is: each method's frame within 11 words.
    def _backward_pre(self, dy, train, need_dx):
        # y = x1 + ffn(ln2(x1)): dx1 = dy + ln2'(ffn'(dy))
        if not (need_dx or (train and (trains(self.attn) or trains(self.ln1)))):
            self._ffn_back(dy, train, False)
            return None
        d = self._ffn_back(dy, train, True)
        dy = self._add("_dx1", dy, d)
        scratch.rewind(self)                  # the FFN half's buffers: nothing reads them now
        # x1 = x + attn(ln1(x)): dx = dx1 + ln1'(attn'(dx1))
        if not need_dx:
            self._attn_back(dy, train, False)
            return None
        d = self._attn_back(dy, train, True)
        return self._add("_dx", dy, d)

    def _ffn_back(self, dy, train, need):
        # ln2'(ffn'(drop2'(dy))); need=False: the input gradient is not wanted (only the grads)
        dy = self.drop2.backward(dy)
        if need or (train and trains(self.ln2)):
            return self.ln2.backward(self.ffn.backward(dy, train), train)
        self.ffn.backward(dy, train, False)
        return None

    def _attn_back(self, dy, train, need):
        # ln1'(attn'(drop1'(dy))); need=False: the input gradient is not wanted (only the grads)
        dy = self.drop1.backward(dy)
        if train and trains(self.attn) and self._recompute:
            self.attn._x = self._ln_again(self.ln1)
        if need or (train and trains(self.ln1)):
            return self.ln1.backward(self.attn.backward(dy, train), train)
        self.attn.backward(dy, train, False)
        return None

    def _ln_again(self, ln):
        # a LayerNorm's output computed again (pre-norm: its forward wrote it into a buffer that the
        # residual sum overwrote) into the scratch buffer _ln of this backward's frame, for the
        # attention's weight and adapter grads (the same kernel and input: the same values); only
        # those read it: an attention that does not train gets none. (LayerNorm2's: the FFN's
        # backward, FeedForward._norm)
        self._buffers("_lnb", self._x.shape)
        return ln.output_again(self._ln)

    def _backward_post(self, dy, train):
        # y = ln2(s2), s2 = x1 + ffn(x1): ds2 = ln2'(dy), dx1 = ds2 + ffn'(ds2)
        dy = self.ln2.backward(dy, train)
        d = self.ffn.backward(self.drop2.backward(dy), train)
        d = self._add("_dx1", dy, d)
        scratch.rewind(self)                  # ln2's and the FFN's buffers: nothing reads them now
        # x1 = ln1(s1), s1 = x + attn(x): ds1 = ln1'(dx1), dx = ds1 + attn'(ds1)
        dy = self.ln1.backward(d, train)
        d = self.attn.backward(self.drop1.backward(dy), train)
        return self._add("_dx", dy, d)

    def prefill(self, x, max_len=None):
        """Causal forward over the prompt x [B,S,E], filling the attention's KV cache."""
        self._check(x, "x")
        self.attn._check_decoding("EncoderBlock.prefill")
        self._fmax = max_len
        scratch.enter()                   # a frame, as forward's
        return self._prefill_framed(x)

    def _prefill_framed(self, x):
        try:
            return self._prefill(x, self._fmax)
        finally:
            scratch.leave()

    def _prefill(self, x, max_len):
        if not self.norm_first:
            return self._post(x, self.attn.prefill(x, max_len), 1)
        return self._rest(x, self.attn.prefill(self.ln1.forward(x), max_len), 1)

    def decode_step(self, x):
        """One new token x [B,1,E] -> [B,1,E] through the KV cache."""
        self._check(x, "x")
        self.attn._check_decoding("EncoderBlock.decode_step")
        scratch.enter()                   # a frame, as forward's
        return self._decode_framed(x)

    def _decode_framed(self, x):
        try:
            return self._decode(x)
        finally:
            scratch.leave()

    def _decode(self, x):
        if not self.norm_first:
            return self._post(x, self.attn.decode_step(x), 2)
        return self._rest(x, self.attn.decode_step(self.ln1.forward(x)), 2)

    def kv_bytes_per_token(self):
        return self.attn.kv_bytes_per_token()


_RUN = ("_fwd", "_pre", "_dec")
_X1 = ("_x1", "_x1_p", "_x1_d")
_Y = ("_y", "_y_p", "_y_d")


def _layers(model):
    return model.layers if hasattr(model, "layers") else [model]


def _keep_weights(layer):
    # the kept weight copies decoding uses (Dense.keep_weights), made for every layer inside
    for l in layer.sublayers() if hasattr(layer, "sublayers") else ():
        _keep_weights(l)
    if hasattr(layer, "keep_weights"):
        layer.keep_weights()


def prefill(model, x, max_len=None):
    """Run a prompt through a Sequential (or one layer): layers with a KV cache or a position
    (Attention, EncoderBlock, PositionalEncoding) remember it; the others just run forward.
    The caches (KV cache, a decoding step's buffers, the backend's scratch for a step over the
    full cache) are made first, then the backend's kept weight copies for decode_step
    (Dense.keep_weights): the largest long-lived arrays before the smaller ones."""
    for l in _layers(model):
        a = l.attn if isinstance(l, EncoderBlock) else l
        if isinstance(a, Attention) and a.causal and len(getattr(x, "shape", ())) >= 2:
            a.reserve_cache(x.shape[0], x.shape[1], max_len)
    for l in _layers(model):
        _keep_weights(l)
    for l in _layers(model):
        if hasattr(l, "prefill"):
            x = l.prefill(x, max_len) if isinstance(l, (Attention, EncoderBlock)) else l.prefill(x)
        else:
            x = l.forward(x)
    return x


def decode_step(model, x):
    """The next token (ids [B,1], or x [B,1,E]) through the stack after prefill(); returns its output."""
    for l in _layers(model):
        x = l.decode_step(x) if hasattr(l, "decode_step") else l.forward(x)
    return x


def kv_bytes_per_token(model):
    """KV-cache bytes per generated token per sequence, over every layer of the stack."""
    n = 0
    for l in _layers(model):
        if hasattr(l, "kv_bytes_per_token"):
            n += l.kv_bytes_per_token()
    return n
