# microformer.decoder: the pre-norm transformer decoder block and the encoder-decoder Transformer.
#   x1 = x + SelfAttn_causal(LN1(x)),  x2 = x1 + CrossAttn(LN2(x1), memory),  y = x2 + FFN(LN3(x2))
# Transformer: memory = LN_enc(EncoderBlocks(PE(Emb_src(src))))  (src padding from src_lengths)
#              logits = Dense(LN_dec(DecoderBlocks(PE(Emb_tgt(tgt)), memory)))
# (decoder self-attention causal, + tgt padding from tgt_lengths; cross-attention hides padded memory)
from . import backend
from .attention import Attention
from .block import EncoderBlock
from .dense import Dense
from .dropout import Dropout, check_p
from .embedding import Embedding
from .feedforward import FeedForward
from .layer import Layer, _epoch, check_tensor, prefixed, shape_error, trains
from .norm import LayerNorm
from .posenc import PositionalEncoding
from .tensor import Tensor, shape_size


class DecoderBlock(Layer):
    """DecoderBlock(E, H, ffn_hidden, activation='gelu', max_len=None): x [B,S,E], memory [B,Sk,E] -> [B,S,E].

    forward(x, memory, tgt_key_padding_mask=None, memory_key_padding_mask=None, tgt_lengths=None,
    memory_lengths=None); backward(dy) returns (dx, dmemory). state_dict names as
    nn.TransformerDecoderLayer(norm_first=True, batch_first=True): self_attn.* multihead_attn.*
    linear1/2.* norm1/2/3.*.
    Generation: cache_memory(memory, memory_lengths) once, then prefill(x) and decode_step(x_t).
    dropout=p (training mode only, as nn.TransformerDecoderLayer(dropout=p)): on the weights of
    both attentions, after the self-attention (drop1), after the cross-attention (drop2), inside
    the FFN after the activation, after the FFN (drop3):
      x1 = x + drop1(SelfAttn(LN1(x))),  x2 = x1 + drop2(CrossAttn(LN2(x1), memory)),
      y = x2 + drop3(FFN(LN3(x2)))
    cache_memory / prefill / decode_step never drop.
    """

    def __init__(self, embed_dim, num_heads, ffn_hidden, activation="gelu", max_len=None,
                 use_bias=True, rng=None, dropout=0.0):
        if not isinstance(embed_dim, int) or embed_dim < 1:
            raise ValueError("DecoderBlock: embed_dim must be a positive int, got %r" % (embed_dim,))
        check_p("DecoderBlock", dropout)
        self.embed_dim = embed_dim
        self.ln1 = LayerNorm(embed_dim)
        self.self_attn = Attention(embed_dim, num_heads, use_bias, True, rng, max_len, dropout)
        self.ln2 = LayerNorm(embed_dim)
        self.cross_attn = Attention(embed_dim, num_heads, use_bias, False, rng, None, dropout)
        self.ln3 = LayerNorm(embed_dim)
        self.ffn = FeedForward(embed_dim, ffn_hidden, activation, use_bias, rng, dropout)
        self.drop1 = Dropout(dropout)
        self.drop2 = Dropout(dropout)
        self.drop3 = Dropout(dropout)
        self.dropout = self.drop1.p
        for prefix, layer in (("ln1.", self.ln1), ("self_attn.", self.self_attn), ("ln2.", self.ln2),
                              ("cross_attn.", self.cross_attn), ("ln3.", self.ln3), ("ffn.", self.ffn)):
            for p, g in layer.params():
                p.name = prefix + p.name
                g.name = prefix + g.name
        self._x = None

    def sublayers(self):
        return (self.ln1, self.self_attn, self.drop1, self.ln2, self.cross_attn, self.drop2, self.ln3,
                self.ffn, self.drop3)

    def _named_sublayers(self):
        return [("self_attn.", self.self_attn), ("multihead_attn.", self.cross_attn), ("", self.ffn),
                ("norm1.", self.ln1), ("norm2.", self.ln2), ("norm3.", self.ln3)]

    def state_parts(self):
        # nn.TransformerDecoderLayer(E, H, hidden, dropout=p, batch_first=True, norm_first=True)
        return (prefixed("self_attn.", self.self_attn) + prefixed("multihead_attn.", self.cross_attn)
                + self.ffn.state_parts() + prefixed("norm1.", self.ln1) + prefixed("norm2.", self.ln2)
                + prefixed("norm3.", self.ln3))

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        if len(in_shape) != 3 or in_shape[2] != self.embed_dim:
            raise shape_error("DecoderBlock", "input", "[B,S,%d]" % self.embed_dim, in_shape)

    def cache_floats(self, in_shape):
        n = shape_size(in_shape)
        s = 6 * n      # x1 x2 y dx2 dx1 dx
        for l in self.sublayers():
            s += l.cache_floats(in_shape)
        return s

    def _check(self, x, what):
        check_tensor("DecoderBlock", what, x)
        E = self.embed_dim
        if len(x.shape) != 3 or x.shape[2] != E:
            raise shape_error("DecoderBlock", what, "[B,S,%d]" % E, x.shape)

    # The forward, backward and generation paths are split so that each method's frame (arguments
    # + locals + value stack) stays within 11 words: a larger one comes from the GC heap on every
    # call on MicroPython. The training forward keeps its memory and masks on the block (_mem,
    # _tmask, _mmask, _tlen, _mlen) for its parts.
    def forward(self, x, memory, tgt_key_padding_mask=None, memory_key_padding_mask=None,
                tgt_lengths=None, memory_lengths=None):
        self._check_pair(x, memory)
        self._tmask = tgt_key_padding_mask
        self._mmask = memory_key_padding_mask
        self._tlen = tgt_lengths
        self._mlen = memory_lengths
        self._mem = memory
        return self._run(x)

    def _check_pair(self, x, memory):
        self._check(x, "x")
        self._check(memory, "memory")
        if memory.shape[0] != x.shape[0]:
            raise shape_error("DecoderBlock", "memory", "[%d,Sk,%d]" % (x.shape[0], self.embed_dim),
                              memory.shape)

    def _run(self, x):
        # the training/eval forward (mode 0): x1 = x + drop1(self(ln1(x))), x2 = x1 +
        # drop2(cross(ln2(x1), memory)), y = x2 + drop3(ffn(ln3(x2)))
        a = self._self_fwd(x)
        self._buffers(_RUN[0], x.shape)
        a = self._sum(_X1[0], x, a)
        a = self._sum(_X2[0], a, self._cross_fwd(a))
        a = self._sum(_Y[0], a, self._ffn_fwd(a))
        self._x = x
        return a

    def _self_fwd(self, x):
        return self.drop1.forward(self.self_attn.forward(self.ln1.forward(x), self._tmask, None, self._tlen))

    def _cross_fwd(self, x1):
        return self.drop2.forward(self.cross_attn.forward(self.ln2.forward(x1), self._mmask, self._mem, self._mlen))

    def _ffn_fwd(self, x2):
        return self.drop3.forward(self.ffn.forward(self.ln3.forward(x2), True))

    def _allocate(self, stage, shape, other, bufs):
        if stage == "_bwd":
            self._dx2 = bufs.zeros("_dx2", shape)
            self._dx1 = bufs.zeros("_dx1", shape)
            self._dx = bufs.zeros("_dx", shape)
        else:                         # one set per mode: training forward, prefill, decode_step
            mode = _RUN.index(stage)
            for name in (_X1[mode], _X2[mode], _Y[mode]):
                setattr(self, name, bufs.zeros(name, shape))

    backward_stops = True

    def backward(self, dy, grads=True, need_dx=True):
        """dy [B,S,E] -> dx [B,S,E]; the memory's gradient [B,Sk,E] is then self.dmemory.
        need_dx=False: dx is None, and the self-attention branch gets no backward unless it trains."""
        self._need_forward(self._x)
        check_tensor("DecoderBlock", "dy", dy)
        if dy.shape != self._x.shape:
            raise shape_error("DecoderBlock", "dy", repr(self._x.shape), dy.shape)
        grads = grads and self.trainable      # a part's own flag is its own: nothing is changed here
        self._buffers("_bwd", dy.shape)
        return self._back(dy, grads, need_dx)

    def _back(self, dy, train, need_dx):
        d = self._ffn_back(dy, train)                 # y = x2 + ffn(ln3(x2)): dx2 = dy + ln3'(ffn'(dy))
        dy = self._sum("_dx2", dy, d)
        d = self._cross_back(dy, train)               # x2 = x1 + cross(ln2(x1), memory): dx1 = dx2 + ln2'(dh)
        dy = self._sum("_dx1", dy, d)
        d = self._self_back(dy, train, need_dx)       # x1 = x + self(ln1(x)): dx = dx1 + ln1'(self'(dx1))
        if d is None:
            return None
        return self._sum("_dx", dy, d)

    def _ffn_back(self, dy, train):
        return self.ln3.backward(self.ffn.backward(self.drop3.backward(dy), train), train)

    def _cross_back(self, dx2, train):
        # ln2'(cross'(dx2)); the memory's gradient from the cross-attention
        dx2 = self.cross_attn.backward(self.drop2.backward(dx2), train)
        self.dmemory = self.cross_attn.dcontext
        return self.ln2.backward(dx2, train)

    def _self_back(self, dx1, train, need_dx):
        # ln1'(self'(drop1'(dx1))); need_dx=False: the grads only (None), and no backward at all
        # unless the self-attention branch trains
        if need_dx:
            return self.ln1.backward(self.self_attn.backward(self.drop1.backward(dx1), train), train)
        if train and trains(self.ln1):
            self.ln1.backward(self.self_attn.backward(self.drop1.backward(dx1), train), train)
        elif train and trains(self.self_attn):
            self.self_attn.backward(self.drop1.backward(dx1), train, False)
        return None

    def cache_memory(self, memory, memory_key_padding_mask=None, memory_lengths=None):
        """Generation: the cross-attention's K and V of memory [B,Sk,E], computed once."""
        self._check(memory, "memory")
        self.cross_attn.cache_context(memory, memory_key_padding_mask, memory_lengths)

    def prefill(self, x, max_len=None, tgt_lengths=None, tgt_key_padding_mask=None):
        """The decoder prompt x [B,S,E] (padded at the tail: tgt_lengths) after cache_memory()."""
        self._check(x, "x")
        self._tlen = tgt_lengths                     # (for _self_prefill)
        self._tmask = tgt_key_padding_mask
        a = self._self_prefill(x, max_len)
        self._padded = not (tgt_lengths is None and tgt_key_padding_mask is None)
        return self._rest(x, a, 1)

    def _self_prefill(self, x, max_len):
        if self._tlen is None and self._tmask is None:
            return self.self_attn.prefill(self.ln1.forward(x), max_len)
        return self.self_attn.prefill_padded(self.ln1.forward(x), self._tlen, self._tmask, max_len)

    def decode_step(self, x):
        """One new token x [B,1,E] -> [B,1,E] through the self-attention and cross-attention caches."""
        self._check(x, "x")
        if not hasattr(self, "_padded"):
            raise RuntimeError("DecoderBlock: decode_step() called before prefill()")
        a = self.ln1.forward(x)
        a = self.self_attn.decode_step_padded(a) if self._padded else self.self_attn.decode_step(a)
        return self._rest(x, a, 2)

    def _rest(self, x, a, mode):
        # after the self-attention a, in the mode's buffers (1: prefill, 2: decode_step):
        # x1 = x + a, x2 = x1 + cross(ln2(x1)) (the cached memory), y = x2 + ffn(ln3(x2))
        self._buffers(_RUN[mode], x.shape)
        a = self._sum(_X1[mode], x, a)
        a = self._sum(_X2[mode], a, self._cross_step(a))
        return self._sum(_Y[mode], a, self._ffn_step(a))

    def _cross_step(self, x1):
        return self.cross_attn.cross_step(self.ln2.forward(x1))

    def _ffn_step(self, x2):
        return self.ffn.forward(self.ln3.forward(x2), False)

    def _sum(self, name, p, q):
        # the buffer self.<name> = p + q
        y = getattr(self, name)
        backend.K.add_forward(y.data, p.data, q.data, y.size)
        return y

    def kv_bytes_per_token(self):
        return self.self_attn.kv_bytes_per_token()


_RUN = ("_fwd", "_pre", "_dec")
_X1 = ("_x1", "_x1_p", "_x1_d")
_X2 = ("_x2", "_x2_p", "_x2_d")
_Y = ("_y", "_y_p", "_y_d")


def _modes(layer, out):
    out.append((layer, layer.training))
    for l in layer.sublayers():
        _modes(l, out)
    return out


def _lengths_list_error(what, B, S, lengths):
    return ValueError("Transformer: %s must be a list of B=%d ints in [1, %d], got %r" % (what, B, S, lengths))


def _lengths_item_error(what, lengths, b, S):
    return ValueError("Transformer: %s[%d] must be an int in [1, %d], got %r" % (what, b, S, lengths[b]))


def _ids(ids, who, what):
    if isinstance(ids, (list, tuple)):
        ids = Tensor.from_list(ids)
    if not isinstance(ids, Tensor) or len(ids.shape) != 2:
        raise _ids_error(ids, who, what)
    return ids


def _ids_error(ids, who, what):
    return ValueError("Transformer: %s %s must be token ids [B,S] (a Tensor or nested lists of ints), got %r"
                      % (who, what, getattr(ids, "shape", type(ids).__name__)))


class Transformer(Layer):
    """Transformer(src_vocab, tgt_vocab, embed_dim, num_heads, ffn_hidden, num_encoder_layers=1,
    num_decoder_layers=1, max_len=64, activation='gelu'): the seed's encoder-decoder.

    forward(src [B,Ss] ids, tgt [B,St] ids, src_lengths=None, tgt_lengths=None) -> logits [B,St,V];
    masks come from the per-sample lengths (tail padding): encoder self-attention and
    cross-attention hide src positions >= src_lengths[b]; decoder self-attention is causal and hides
    tgt positions >= tgt_lengths[b]. backward(dlogits) fills every grad.
    generate(src, src_lengths, bos, max_new, eos=None): greedy decoding through the caches.
    dropout=p (training mode only): the seed's dropout, after both positional encodings and inside
    every EncoderBlock(dropout=p) and DecoderBlock(dropout=p); generate() never drops.
    """

    def __init__(self, src_vocab, tgt_vocab, embed_dim, num_heads, ffn_hidden, num_encoder_layers=1,
                 num_decoder_layers=1, max_len=64, activation="gelu", use_bias=True, rng=None, dropout=0.0):
        for what, v in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab), ("max_len", max_len),
                        ("num_encoder_layers", num_encoder_layers), ("num_decoder_layers", num_decoder_layers)):
            if not isinstance(v, int) or v < 1:
                raise ValueError("Transformer: %s must be a positive int, got %r" % (what, v))
        self.dropout = check_p("Transformer", dropout)
        self.src_vocab = src_vocab
        self.tgt_vocab = tgt_vocab
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.ffn_hidden = ffn_hidden
        self.max_len = max_len
        self.activation = activation
        self.use_bias = use_bias
        self.src_embed = Embedding(src_vocab, embed_dim, rng)
        self.tgt_embed = Embedding(tgt_vocab, embed_dim, rng)
        self.src_pos = PositionalEncoding(max_len, embed_dim, dropout)
        self.tgt_pos = PositionalEncoding(max_len, embed_dim, dropout)
        self.encoder = [EncoderBlock(embed_dim, num_heads, ffn_hidden, False, activation, None, use_bias, rng,
                                     dropout) for _ in range(num_encoder_layers)]
        self.enc_norm = LayerNorm(embed_dim)
        self.decoder = [DecoderBlock(embed_dim, num_heads, ffn_hidden, activation, max_len, use_bias, rng,
                                     dropout) for _ in range(num_decoder_layers)]
        self.dec_norm = LayerNorm(embed_dim)
        self.generator = Dense(embed_dim, tgt_vocab, use_bias, rng)
        self._src = None

    def _parts(self):
        out = [("src_embed.", self.src_embed)]
        for i in range(len(self.encoder)):
            out.append(("encoder.layers.%d." % i, self.encoder[i]))
        out.append(("encoder.norm.", self.enc_norm))
        out.append(("tgt_embed.", self.tgt_embed))
        for i in range(len(self.decoder)):
            out.append(("decoder.layers.%d." % i, self.decoder[i]))
        out.append(("decoder.norm.", self.dec_norm))
        out.append(("generator.", self.generator))
        return out

    def _named_sublayers(self):
        return self._parts()

    def sublayers(self):
        # the positional encodings have no parameters but a dropout: train()/eval() reach them
        return [l for _, l in self._parts()] + [self.src_pos, self.tgt_pos]

    def state_parts(self):
        out = []
        for prefix, l in self._parts():
            out.extend(prefixed(prefix, l))
        return out

    def named_params(self):
        """[(name, param)], e.g. 'decoder.layers.0.self_attn.Wq'."""
        out = []
        for prefix, l in self._parts():
            for p, _ in l.params():
                out.append((prefix + p.name, p))
        return out

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        if len(in_shape) != 2:
            raise shape_error("Transformer", "input", "[B,S] token ids", in_shape)

    def output_shape(self, in_shape):
        return tuple(in_shape) + (self.tgt_vocab,)

    def _check_lengths(self, lengths, B, S, what):
        if lengths is None:
            return
        if not isinstance(lengths, (list, tuple)) or len(lengths) != B:
            raise _lengths_list_error(what, B, S, lengths)
        b = 0
        while b < B:
            if not isinstance(lengths[b], int) or lengths[b] < 1 or lengths[b] > S:
                raise _lengths_item_error(what, lengths, b, S)
            b += 1

    # forward, backward and generation are split so that each method's frame (arguments + locals
    # + value stack) stays within 11 words: a larger one comes from the GC heap on every call on
    # MicroPython. The forward keeps its lengths (_tlen, _slen) and memory (_fmem) on the model
    # for its parts.
    def encode(self, src, src_lengths=None):
        """memory [B,Ss,E] of the source ids (the encoder stack and its final LayerNorm)."""
        src = _ids(src, "src", "ids")
        self._check_lengths(src_lengths, src.shape[0], src.shape[1], "src_lengths")
        src = self.src_pos.forward(self.src_embed.forward(src))
        i = 0
        while i < len(self.encoder):
            src = self.encoder[i].forward(src, None, src_lengths)
            i += 1
        return self.enc_norm.forward(src)

    def forward(self, src, tgt, src_lengths=None, tgt_lengths=None):
        src = _ids(src, "src", "ids")
        tgt = _ids(tgt, "tgt", "ids")
        self._check_tgt(src, tgt, tgt_lengths)
        self._slen = src_lengths
        self._tlen = tgt_lengths
        return self._forward(src, tgt)

    def _check_tgt(self, src, tgt, tgt_lengths):
        if tgt.shape[0] != src.shape[0]:
            raise ValueError("Transformer: tgt must have the batch size of src (%d), got %r"
                             % (src.shape[0], tgt.shape))
        self._check_lengths(tgt_lengths, tgt.shape[0], tgt.shape[1], "tgt_lengths")

    def _forward(self, src, tgt):
        self._fmem = self.encode(src, self._slen)
        tgt = self.tgt_pos.forward(self.tgt_embed.forward(tgt))
        i = 0
        while i < len(self.decoder):
            tgt = self._decoder_forward(self.decoder[i], tgt)
            i += 1
        tgt = self.generator.forward(self.dec_norm.forward(tgt))
        self._src = src
        self._memory = self._fmem
        return tgt

    def _decoder_forward(self, blk, h):
        return blk.forward(h, self._fmem, None, None, self._tlen, self._slen)

    def _allocate(self, stage, shape, other, bufs):
        if stage == "_bwd":                               # memory's gradient, summed over layers
            self._dmem = bufs.zeros("_dmem", shape)
        else:                                             # "_gen": next ids (B, 1)
            self._next = bufs.zeros("_next", shape)

    def backward(self, dy, grads=True):
        """dlogits [B,St,V] of the last forward (not after a generate()); fills the grads (token ids
        have none): returns None."""
        self._need_forward(self._src)
        check_tensor("Transformer", "dy", dy)
        if dy.shape != self.generator._y.shape:
            raise shape_error("Transformer", "dy", repr(self.generator._y.shape), dy.shape)
        if not (grads and self.trainable):
            return None                     # nothing trains: no backward at all
        plan = self._plan()                 # (dec_low, enc_low, need_mem, tgt, src): see _make_plan
        if plan[0] < 0:                     # only the generator (or nothing) trains
            self.generator.backward(dy, True, False)
            return None
        self._decoder_back(dy, plan)
        if plan[2]:
            self._encoder_back(plan)
        return None

    def _decoder_back(self, dy, plan):
        # the generator, the final LayerNorm and the decoder blocks down to plan[0]; the memory's
        # gradient summed over them (when it matters: plan[2]); the target embedding (plan[3])
        self._buffers("_bwd", self._memory.shape)
        backend.K.zero(self._dmem.data, self._memory.size)
        dy = self.dec_norm.backward(self.generator.backward(dy, True, True), True)
        i = len(self.decoder) - 1
        while i >= plan[0]:
            dy = self.decoder[i].backward(dy, True, i > plan[0] or plan[3])
            if plan[2]:
                backend.K.add_forward(self._dmem.data, self._dmem.data, self.decoder[i].dmemory.data,
                                      self._memory.size)
            i -= 1
        if plan[3]:
            self.tgt_embed.backward(self.tgt_pos.backward(dy), True)

    def _encoder_back(self, plan):
        # the memory's gradient through the final LayerNorm and the encoder blocks down to plan[1];
        # the source embedding (plan[4])
        dy = self.enc_norm.backward(self._dmem, True)
        i = len(self.encoder) - 1
        while i >= plan[1]:
            dy = self.encoder[i].backward(dy, True, i > plan[1] or plan[4])
            i -= 1
        if plan[4]:
            self.src_embed.backward(self.src_pos.backward(dy), True)

    def _plan(self):
        # where backward stops, kept until a flag or a grad buffer changes
        p = getattr(self, "_plan_at", None)
        if p is not None and p[0] == _epoch[0]:
            return p[1]
        return self._make_plan()

    def _make_plan(self):
        # (lowest decoder to run, -1: none below the generator; lowest encoder to run;
        #  does the memory gradient matter; do the target / source embeddings train)
        e = _epoch[0]
        src = trains(self.src_embed)
        enc_low = len(self.encoder)
        for i in range(len(self.encoder)):
            if trains(self.encoder[i]):
                enc_low = i
                break
        if src:
            enc_low = 0
        need_mem = src or enc_low < len(self.encoder) or trains(self.enc_norm)
        tgt = trains(self.tgt_embed)
        dec_low = -1
        if need_mem or tgt:
            dec_low = 0
        else:
            for i in range(len(self.decoder)):
                if trains(self.decoder[i]):
                    dec_low = i
                    break
            if dec_low < 0 and trains(self.dec_norm):
                dec_low = len(self.decoder)
        plan = (dec_low, enc_low, need_mem, tgt, src)
        self._plan_at = (e, plan)
        return plan

    def _logits_argmax(self, h):
        # every sequence's next token: the largest logit of its last position (generate's state:
        # _next, _out, _done, _eos)
        h = self.generator.forward(self.dec_norm.forward(h))
        b = 0
        while b < h.shape[0]:
            self._pick(h, b)
            b += 1

    def _pick(self, logits, b):
        best = backend.K.argmax(logits.data, ((b + 1) * logits.shape[1] - 1) * self.tgt_vocab, self.tgt_vocab)
        self._next.data[b] = best
        if not self._done[b]:
            self._out[b].append(best)
            if self._eos is not None and best == self._eos:
                self._done[b] = 1

    def generate(self, src, src_lengths=None, bos=0, max_new=16, eos=None):
        """Greedy decoding: encode once, cache every cross-attention's K/V once, then one token at
        a time through the self-attention KV caches. Returns B lists of token ids (each ending at
        its first eos, which is included, or after max_new tokens)."""
        src = _ids(src, "src", "ids")
        B = src.shape[0]
        if not isinstance(max_new, int) or max_new < 1 or max_new > self.max_len:
            raise ValueError("Transformer: max_new must be an int in [1, %d] (max_len), got %r"
                             % (self.max_len, max_new))
        for what, v in (("bos", bos), ("eos", eos)):
            if v is not None and (not isinstance(v, int) or v < 0 or v >= self.tgt_vocab):
                raise ValueError("Transformer: %s must be a token id in [0, %d), got %r" % (what, self.tgt_vocab, v))
        self._src = None        # the layers' inputs are now generation's: backward needs a new forward
        modes = _modes(self, [])
        self.train(False)       # the encoder runs its forward: never dropped in generation
        try:
            memory = self.encode(src, src_lengths)
        finally:
            for l, m in modes:
                l.training = m
        for blk in self.decoder:
            blk.cache_memory(memory, None, src_lengths)
        self._buffers("_gen", (B, 1))
        nxt = self._next
        for b in range(B):
            nxt.data[b] = bos
        out = self._out = [[] for _ in range(B)]
        done = self._done = bytearray(B)
        self._eos = eos
        h = self.tgt_pos.prefill(self.tgt_embed.forward(nxt))
        for blk in self.decoder:
            h = blk.prefill(h, max_new)
        self._logits_argmax(h)
        for _ in range(max_new - 1):
            if eos is not None and all(done):
                break
            h = self.tgt_pos.decode_step(self.tgt_embed.forward(nxt))
            for blk in self.decoder:
                h = blk.decode_step(h)
            self._logits_argmax(h)
        return out

    def kv_bytes_per_token(self):
        n = 0
        for blk in self.decoder:
            n += blk.kv_bytes_per_token()
        return n
