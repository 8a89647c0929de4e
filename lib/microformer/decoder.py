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

    def _run(self, x, mode, memory=None, tmask=None, mmask=None, tlen=None, mlen=None, max_len=None):
        # mode 0: training/eval forward, 1: prefill (each keeps its own buffers; decode_step has its own path)
        K = backend.K
        h = self.ln1.forward(x)
        if mode == 0:
            a = self.drop1.forward(self.self_attn.forward(h, tmask, None, tlen))
        else:                                     # prefill
            if tlen is None and tmask is None:
                a = self.self_attn.prefill(h, max_len)
            else:
                a = self.self_attn.prefill_padded(h, tlen, tmask, max_len)
            self._padded = not (tlen is None and tmask is None)
        self._buffers(_RUN[mode], x.shape)
        x1 = getattr(self, _X1[mode])
        K.add_forward(x1.data, x.data, a.data, x.size)
        h = self.ln2.forward(x1)
        if mode == 0:
            c = self.drop2.forward(self.cross_attn.forward(h, mmask, memory, mlen))
        else:
            c = self.cross_attn.cross_step(h)
        x2 = getattr(self, _X2[mode])
        K.add_forward(x2.data, x1.data, c.data, x.size)
        f = self.ffn.forward(self.ln3.forward(x2), mode == 0)
        if mode == 0:
            f = self.drop3.forward(f)
        y = getattr(self, _Y[mode])
        K.add_forward(y.data, x2.data, f.data, x.size)
        return y

    def forward(self, x, memory, tgt_key_padding_mask=None, memory_key_padding_mask=None,
                tgt_lengths=None, memory_lengths=None):
        self._check(x, "x")
        self._check(memory, "memory")
        if memory.shape[0] != x.shape[0]:
            raise shape_error("DecoderBlock", "memory", "[%d,Sk,%d]" % (x.shape[0], self.embed_dim),
                              memory.shape)
        y = self._run(x, 0, memory, tgt_key_padding_mask, memory_key_padding_mask, tgt_lengths,
                      memory_lengths)
        self._x = x
        return y

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
        x = self._x
        if dy.shape != x.shape:
            raise shape_error("DecoderBlock", "dy", repr(x.shape), dy.shape)
        K = backend.K
        n = x.size
        train = grads and self.trainable
        self._buffers("_bwd", x.shape)
        # y = x2 + ffn(ln3(x2)): dx2 = dy + ln3'(ffn'(dy))
        d = self.ln3.backward(self.ffn.backward(self.drop3.backward(dy), train), train)
        dx2 = self._dx2
        K.add_forward(dx2.data, dy.data, d.data, n)
        # x2 = x1 + cross(ln2(x1), memory): dx1 = dx2 + ln2'(dh), dmemory from the cross-attention
        dh = self.cross_attn.backward(self.drop2.backward(dx2), train)
        self.dmemory = self.cross_attn.dcontext
        d = self.ln2.backward(dh, train)
        dx1 = self._dx1
        K.add_forward(dx1.data, dx2.data, d.data, n)
        # x1 = x + self(ln1(x)): dx = dx1 + ln1'(self'(dx1))
        if not need_dx:
            if train and trains(self.ln1):
                self.ln1.backward(self.self_attn.backward(self.drop1.backward(dx1), train), train)
            elif train and trains(self.self_attn):
                self.self_attn.backward(self.drop1.backward(dx1), train, False)
            return None
        d = self.ln1.backward(self.self_attn.backward(self.drop1.backward(dx1), train), train)
        dx = self._dx
        K.add_forward(dx.data, dx1.data, d.data, n)
        return dx

    def cache_memory(self, memory, memory_key_padding_mask=None, memory_lengths=None):
        """Generation: the cross-attention's K and V of memory [B,Sk,E], computed once."""
        self._check(memory, "memory")
        self.cross_attn.cache_context(memory, memory_key_padding_mask, memory_lengths)

    def prefill(self, x, max_len=None, tgt_lengths=None, tgt_key_padding_mask=None):
        """The decoder prompt x [B,S,E] (padded at the tail: tgt_lengths) after cache_memory()."""
        self._check(x, "x")
        return self._run(x, 1, tmask=tgt_key_padding_mask, tlen=tgt_lengths, max_len=max_len)

    def decode_step(self, x):
        """One new token x [B,1,E] -> [B,1,E] through the self-attention and cross-attention caches."""
        self._check(x, "x")
        if not hasattr(self, "_padded"):
            raise RuntimeError("DecoderBlock: decode_step() called before prefill()")
        # _run(x, 2) in parts whose frames stay within the 11 words MicroPython keeps off the GC
        # heap (host/frames.py): x1 = x + self(ln1(x)), x2 = x1 + cross(ln2(x1)), y = x2 + ffn(ln3(x2))
        a = self.ln1.forward(x)
        a = self.self_attn.decode_step_padded(a) if self._padded else self.self_attn.decode_step(a)
        self._buffers(_RUN[2], x.shape)
        a = self._sum(_X1[2], x, a)
        a = self._sum(_X2[2], a, self._cross_step(a))
        return self._sum(_Y[2], a, self._ffn_step(a))

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


def _ids(ids, who, what):
    if isinstance(ids, (list, tuple)):
        ids = Tensor.from_list(ids)
    if not isinstance(ids, Tensor) or len(ids.shape) != 2:
        raise ValueError("Transformer: %s %s must be token ids [B,S] (a Tensor or nested lists of ints), got %r"
                         % (who, what, getattr(ids, "shape", type(ids).__name__)))
    return ids


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
            raise ValueError("Transformer: %s must be a list of B=%d ints in [1, %d], got %r" % (what, B, S, lengths))
        for b in range(B):
            n = lengths[b]
            if not isinstance(n, int) or n < 1 or n > S:
                raise ValueError("Transformer: %s[%d] must be an int in [1, %d], got %r" % (what, b, S, n))

    def encode(self, src, src_lengths=None):
        """memory [B,Ss,E] of the source ids (the encoder stack and its final LayerNorm)."""
        src = _ids(src, "src", "ids")
        B, S = src.shape
        self._check_lengths(src_lengths, B, S, "src_lengths")
        h = self.src_pos.forward(self.src_embed.forward(src))
        for blk in self.encoder:
            h = blk.forward(h, None, src_lengths)
        return self.enc_norm.forward(h)

    def forward(self, src, tgt, src_lengths=None, tgt_lengths=None):
        src = _ids(src, "src", "ids")
        tgt = _ids(tgt, "tgt", "ids")
        if tgt.shape[0] != src.shape[0]:
            raise ValueError("Transformer: tgt must have the batch size of src (%d), got %r"
                             % (src.shape[0], tgt.shape))
        self._check_lengths(tgt_lengths, tgt.shape[0], tgt.shape[1], "tgt_lengths")
        memory = self.encode(src, src_lengths)
        h = self.tgt_pos.forward(self.tgt_embed.forward(tgt))
        for blk in self.decoder:
            h = blk.forward(h, memory, None, None, tgt_lengths, src_lengths)
        y = self.generator.forward(self.dec_norm.forward(h))
        self._src = src
        self._memory = memory
        return y

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
        K = backend.K
        train = grads and self.trainable
        if not train:
            return None                     # nothing trains: no backward at all
        dec_low, enc_low, need_mem, tgt, src = self._plan()
        if dec_low < 0:                     # only the generator (or nothing) trains
            self.generator.backward(dy, train, False)
            return None
        mem = self._memory
        self._buffers("_bwd", mem.shape)
        dmem = self._dmem
        K.zero(dmem.data, mem.size)
        d = self.generator.backward(dy, train, True)
        d = self.dec_norm.backward(d, train)
        for i in range(len(self.decoder) - 1, dec_low - 1, -1):
            d = self.decoder[i].backward(d, train, i > dec_low or tgt)
            if need_mem:
                K.add_forward(dmem.data, dmem.data, self.decoder[i].dmemory.data, mem.size)
        if tgt:
            self.tgt_embed.backward(self.tgt_pos.backward(d), train)
        if not need_mem:
            return None
        d = self.enc_norm.backward(dmem, train)
        for i in range(len(self.encoder) - 1, enc_low - 1, -1):
            d = self.encoder[i].backward(d, train, i > enc_low or src)
        if src:
            self.src_embed.backward(self.src_pos.backward(d), train)
        return None

    def _plan(self):
        # where backward stops, kept until a flag or a grad buffer changes:
        # (lowest decoder to run, -1: none below the generator; lowest encoder to run;
        #  does the memory gradient matter; do the target / source embeddings train)
        e = _epoch[0]
        p = getattr(self, "_plan_at", None)
        if p is not None and p[0] == e:
            return p[1]
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

    def _logits_argmax(self, h, out, done, eos):
        logits = self.generator.forward(self.dec_norm.forward(h))
        B = logits.shape[0]
        S = logits.shape[1]
        V = self.tgt_vocab
        d = logits.data
        nxt = self._next.data
        for b in range(B):
            best = backend.K.argmax(d, ((b + 1) * S - 1) * V, V)
            nxt[b] = best
            if not done[b]:
                out[b].append(best)
                if eos is not None and best == eos:
                    done[b] = 1

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
        out = [[] for _ in range(B)]
        done = bytearray(B)
        h = self.tgt_pos.prefill(self.tgt_embed.forward(nxt))
        for blk in self.decoder:
            h = blk.prefill(h, max_new)
        self._logits_argmax(h, out, done, eos)
        for _ in range(max_new - 1):
            if eos is not None and all(done):
                break
            h = self.tgt_pos.decode_step(self.tgt_embed.forward(nxt))
            for blk in self.decoder:
                h = blk.decode_step(h)
            self._logits_argmax(h, out, done, eos)
        return out

    def kv_bytes_per_token(self):
        n = 0
        for blk in self.decoder:
            n += blk.kv_bytes_per_token()
        return n
