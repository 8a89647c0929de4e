# microformer.attndecode: what an Attention layer runs to generate and to be looked at, loaded on
# first use (a program that only trains never needs it, and a board's heap is small): the KV cache
# (prefill, decode_step, reserve_cache, the backend's kept weight copies), cached cross-attention
# (cache_context, cross_step), padded decoding (prefill_padded, decode_step_padded), the stored
# weights (weights, stages) and the buffers of those stages (allocate). Each function takes the
# layer as its first argument; attention.py binds the public ones to Attention on first use
# (Attention.prefill and the rest are these functions then).
#
# Cached cross-attention: cache_context(memory) projects K and V of the context once;
# cross_step(x) then attends from new queries to them (with the context's padding mask).
# Padded self-attention generation: prefill_padded(x, lengths) is prefill() with a key padding
# mask (a batch of prompts of different lengths, padded at the tail); decode_step_padded(x_t)
# keeps the padded slots hidden for every later token. The attention itself does not know
# positions: a caller adding positional encodings gives sample b's new token position
# lengths[b] + t, not S + t.
from . import backend
from .layer import check_tensor, shape_error
from .tensor import Tensor

PUBLIC = ("weights", "stages", "keep_weights", "prefill", "reserve_cache", "decode_step", "cache_context",
          "cross_step", "prefill_padded", "decode_step_padded")


def _no_weights(self, what):
    if self._shared:
        raise ValueError("Attention: %s: the last forward's weights were in the scratch arena of a "
                         "checkpointed EncoderBlock, which the next block's forward writes over: set "
                         "blk.checkpoint = False and run the forward again" % what)
    if self._spent:
        raise ValueError("Attention: %s shows the last forward's weights, and a backward has run since "
                         "(it may write their gradient over them): run a forward again" % what)
    A = getattr(self, "_A", None)
    if A is not None and A.shape[0] != self._Q.shape[0]:
        raise ValueError("Attention: %s needs the stored attention weights, which recompute=True keeps "
                         "for one batch item only (set attn.recompute = False and run the forward again)"
                         % what)
    if self.kv_tile is not None:
        raise ValueError("Attention: %s needs the stored attention weights, which kv_tile=%d never "
                         "keeps (build it with kv_tile=None to look at them)" % (what, self.kv_tile))


def weights(self, b=0, h=0):
    """The last forward's attention weights of batch item b, head h: [S][Sk] lists."""
    _no_weights(self, "weights()")
    if self._x is None:
        raise RuntimeError("Attention: no attention weights yet: run a forward first "
                           "(model.forward(x)), then weights() / mf.show()")
    B, H, S, Sk = self._A.shape
    if not (0 <= b < B) or not (0 <= h < H):
        raise ValueError("Attention: weights(b, h) needs 0 <= b < %d and 0 <= h < %d, got (%r, %r)"
                         % (B, H, b, h))
    base = (b * H + h) * S * Sk
    d = self._A.data
    return [[d[base + i * Sk + j] for j in range(Sk)] for i in range(S)]


def keep_weights(self):
    """The backend's kept copies of Wq Wk Wv Wo for decode_step, made now (as Dense.keep_weights;
    none while LoRA adapters are attached: decoding refuses them)."""
    make = getattr(backend.K, "keep_weight", None)
    if make is None or self._adapted():
        return
    E = self.embed_dim
    for i, W, b in ((0, self.Wq, self.bq), (1, self.Wk, self.bk), (2, self.Wv, self.bv), (3, self.Wo, self.bo)):
        if W.__class__ is Tensor and self._wkeep[i][0] is None:
            make(self._wkeep[i], W.data, b.data if self.use_bias else None, E, E)


def prefill(self, x, max_len=None):
    """Causal forward over the prompt x [B,S,E]; keeps its K and V in a cache of max_len tokens."""
    self._check_decoding("prefill")
    self._check_x(x, "x")
    shape = _cache_shape(self, x, max_len)
    _reserve(self, shape)
    y = _eval_forward(self, x, None, None)
    _store_prompt(self, x)
    self._pos = x.shape[1]
    self._padded = False
    self._prompted = True
    return y


def reserve_cache(self, B, S, max_len=None):
    """Make the KV cache of B sequences (capacity max_len, or the layer's) and what a decoding
    step keeps, now, for a prompt of S tokens (mf.prefill does, before the kept weight copies);
    prefill() then finds them. Sizes prefill would refuse make nothing (prefill says why);
    decode_step is refused from here until a prefill completes."""
    cap = max_len if max_len is not None else self.max_len
    if (isinstance(B, int) and B >= 1 and isinstance(S, int) and isinstance(cap, int) and 1 <= S <= cap):
        _reserve(self, (B, cap, self.embed_dim))


def _reserve(self, shape):
    # what decoding keeps, made before the prompt's buffers (the long-lived arrays low in the
    # heap, the prompt's above them): the cache (B, L, E), a decoding step's buffers and the
    # backend's scratch for a step over the full cache (at its largest from the start: grown
    # token by token it would leave a hole in the heap at each growth)
    B, L, E = shape
    self._prompted = False              # until a prompt is in the cache: no decode_step
    self._buffers("_kv", shape)
    self._buffers("_dec", (B, 1, E), L)
    make = getattr(backend.K, "reserve_decode", None)
    if make is not None:
        make(B, L, E, self.num_heads)


def _cache_shape(self, x, max_len):
    B, S, E = x.shape
    cap = max_len if max_len is not None else self.max_len
    if cap is None:
        raise ValueError("Attention: prefill needs a cache capacity: Attention(..., max_len=N) "
                         "or prefill(x, max_len=N)")
    if not isinstance(cap, int) or cap < S:
        raise ValueError("Attention: max_len must be an int >= prompt length %d, got %r" % (S, cap))
    return (B, cap, E)


def _eval_forward(self, x, key_padding_mask, lengths):
    # forward() as in eval(): generation never drops
    if self.training and self.dropout > 0.0:
        return _undropped(self, x, key_padding_mask, lengths)
    return self.forward(x, key_padding_mask, None, lengths)


def _undropped(self, x, key_padding_mask, lengths):
    drop = self.training
    self.training = False
    try:
        return self.forward(x, key_padding_mask, None, lengths)
    finally:
        self.training = drop


def _store_prompt(self, x):
    # the prompt's K and V into the cache's first S slots
    backend.K.kv_store(self._kc.data, self._Kt.data, x.shape[0], x.shape[1], self._kc.shape[1], self.embed_dim, 0)
    backend.K.kv_store(self._vc.data, self._V.data, x.shape[0], x.shape[1], self._kc.shape[1], self.embed_dim, 0)


def _check_token(self, x, who):
    # one new token per cached sequence, and room for it in the cache (B, L, E); no tuple is
    # built (this runs per token)
    check_tensor("Attention", "x", x)
    s = x.shape
    c = self._kc.shape
    if len(s) != 3 or s[0] != c[0] or s[1] != 1 or s[2] != c[2] or self._pos >= c[1]:
        raise _token_error(self, x, who)


def _token_error(self, x, who):
    B, L, E = self._kc.shape
    if x.shape != (B, 1, E):
        return shape_error("Attention", "x", "[%d,1,%d] (one token per cached sequence)" % (B, E), x.shape)
    return ValueError("Attention: KV cache is full: max_len=%d tokens, %s would write position %d"
                      % (L, who, self._pos))


def _decode_qkv(self, x):
    # a decoding step's first half: q, k, v of the new token; k and v into the cache at _pos
    self._no_lora("decoding")
    self._buffers("_dec", x.shape, self._kc.shape[1])
    self._pq.forward_kept(self._dq1, x)
    self._pk.forward_kept(self._dk1, x)
    self._pv.forward_kept(self._dv1, x)
    backend.K.kv_store(self._kc.data, self._dk1.data, self._kc.shape[0], 1, self._kc.shape[1], self.embed_dim,
                       self._pos)
    backend.K.kv_store(self._vc.data, self._dv1.data, self._kc.shape[0], 1, self._kc.shape[1], self.embed_dim,
                       self._pos)


def decode_step(self, x):
    """One new token per sequence, x [B,1,E] -> y [B,1,E], attending to every cached token."""
    self._check_decoding("decode_step")
    if self._kc is None or not self._prompted:
        raise RuntimeError("Attention: decode_step() called before prefill()")
    _check_token(self, x, "decode_step")
    _decode_qkv(self, x)
    self._pos += 1
    _decode_attend(self)
    self._po.forward_kept(self._dy1, self._dctx1)       # y = ctx . Wo^T + bo
    return self._dy1


def _decode_attend(self):
    # the new token's query against the first _pos cached keys (a kernel of 10 arguments: this
    # frame comes from the heap, one per step)
    backend.K.attention_decode(self._dctx1.data, self._datt.data, self._dq1.data, self._kc.data, self._vc.data,
                               self._kc.shape[0], self._pos, self._kc.shape[1], self.embed_dim, self.num_heads)


def stages(self):
    """The last forward's intermediates as Tensors [B,H,S,Sk]: scores before scaling, after
    scaling, after masking (-inf where hidden), softmax weights; plus Q K V ctx [B,*,E]."""
    _no_weights(self, "stages()")
    self._need_forward(self._x)
    B, H, S, Sk = self._A.shape
    E = self.embed_dim
    K = backend.K
    out = {}
    scale = 1.0 / (self.head_dim ** 0.5)
    for name, sc, masked in (("scores_raw", 1.0, 0), ("scores_scaled", scale, 0),
                             ("scores_masked", scale, 1)):
        t = Tensor.zeros((B, H, S, Sk), name)
        K.attention_scores(t.data, self._Q.data, self._Kt.data, self._mask if masked else None,
                           B, S, Sk, E, H, sc, 1 if (masked and self.causal) else 0, -_INF)
        out[name] = t
    out["weights"] = self._A
    out["Q"], out["K"], out["V"], out["ctx"] = self._Q, self._Kt, self._V, self._ctx
    return out


def cache_context(self, context, key_padding_mask=None, lengths=None):
    """K and V of context [B,Sk,E] computed once for cross_step(); its padding (mask or lengths)."""
    self._check_x(context, "context")
    self._buffers("_xkv", context.shape)
    self._xm = self._masks(key_padding_mask, lengths, context, self._xmask)   # None, _xmask or the caller's
    self._no_lora("cache_context")
    self._pk.forward(self._xk, context)
    self._pv.forward(self._xv, context)
    return self._xk


def cross_step(self, x):
    """Queries x [B,T,E] -> y [B,T,E] attending to the context cached by cache_context()."""
    _check_cross(self, x)
    self._no_lora("cross_step")
    self._buffers("_xdec", x.shape, self._xkv.shape[1])
    self._pq.forward(self._xq, x)
    _cross_attend(self)
    self._po.forward(self._xy, self._xctx)
    return self._xy


def _check_cross(self, x):
    have = getattr(self, "_xkv", None)
    if have is None:
        raise RuntimeError("Attention: cross_step() called before cache_context()")
    check_tensor("Attention", "x", x)
    if len(x.shape) != 3 or x.shape[0] != have.shape[0] or x.shape[2] != have.shape[2]:
        raise shape_error("Attention", "x", "[%d,T,%d] (the cached context's batch)" % (have.shape[0],
                          have.shape[2]), x.shape)


def _cross_attend(self):
    # the queries against the cached context (a kernel of 12 arguments: a heap frame per step)
    backend.K.attention_forward(self._xctx.data, self._xatt.data, self._xq.data, self._xk.data, self._xv.data,
                                self._xm, self._xq.shape[0], self._xq.shape[1], self._xk.shape[1],
                                self.embed_dim, self.num_heads, 0)


def prefill_padded(self, x, lengths=None, key_padding_mask=None, max_len=None):
    """prefill() for prompts of different lengths: x [B,S,E] padded, lengths B ints (or a
    key_padding_mask [B,S]); padded slots stay hidden from every later token."""
    self._check_decoding("prefill_padded")
    if lengths is None and key_padding_mask is None:
        raise ValueError("Attention: prefill_padded needs lengths or key_padding_mask (else use prefill)")
    prefill(self, x, max_len)                        # K and V in the cache (no padding yet) ...
    _eval_forward(self, x, key_padding_mask, lengths)    # ... and the output with the padding
    self._buffers("_kvm", self._kc.shape)
    _hide_padding(self, x.shape[1])
    self._padded = True
    return self._y


def _hide_padding(self, S):
    # the cache's hidden slots: the prompt's padded ones and every one not written yet
    for b in range(self._kc.shape[0]):
        _hide_row(self, b, S)


def _hide_row(self, b, S):
    L = self._kc.shape[1]
    for j in range(L):
        self._kvmask[b * L + j] = self._mask[b * S + j] if j < S else 1


def decode_step_padded(self, x):
    """decode_step() after prefill_padded(): the new token sees its own prompt's keys only."""
    self._check_decoding("decode_step_padded")
    if self._kc is None or not self._prompted or not getattr(self, "_padded", False):
        raise RuntimeError("Attention: decode_step_padded() called before prefill_padded()")
    _check_token(self, x, "decode_step_padded")
    _decode_qkv(self, x)
    _show_new(self)
    self._pos += 1
    _decode_attend_padded(self)
    self._po.forward_kept(self._dy1, self._dctx1)       # y = ctx . Wo^T + bo
    return self._dy1


def _show_new(self):
    # the slot the new token is written to becomes visible in every sequence
    L = self._kc.shape[1]
    for b in range(self._kc.shape[0]):
        self._kvmask[b * L + self._pos] = 0


def _decode_attend_padded(self):
    # the new token's query against the visible cached keys (a kernel of 12 arguments: this
    # frame comes from the heap, one per step)
    backend.K.attention_forward(self._dctx1.data, self._datt.data, self._dq1.data, self._kc.data, self._vc.data,
                                self._kvmask, self._kc.shape[0], 1, self._kc.shape[1], self.embed_dim,
                                self.num_heads, 0)


def allocate(self, stage, shape, other, bufs):
    if stage == "_xkv":                               # context (B, Sk, E)
        B, Sk, E = shape
        self._xk = bufs.zeros("_xk", shape)
        self._xv = bufs.zeros("_xv", shape)
        self._xmask = bufs.bytes("_xmask", B * Sk)
    elif stage == "_xdec":                            # queries (B, T, E), context length Sk
        B, T, E = shape
        self._xq = bufs.zeros("_xq", shape)
        self._xctx = bufs.zeros("_xctx", shape)
        self._xy = bufs.zeros("_xy", shape)
        self._xatt = bufs.zeros("_xatt", (B, self.num_heads, T, other))
    elif stage == "_kvm":                             # hidden slots of the cache (B, L, E)
        self._kvmask = bufs.bytes("_kvmask", shape[0] * shape[1])
    elif stage == "_kv":                              # shape (B, capacity, E)
        self._kc = bufs.zeros("_kc", shape)
        self._vc = bufs.zeros("_vc", shape)
    else:                                             # "_dec": x (B, 1, E), capacity L
        B, E = shape[0], shape[2]
        self._dq1 = bufs.zeros("_dq1", (B, E))
        self._dk1 = bufs.zeros("_dk1", (B, E))
        self._dv1 = bufs.zeros("_dv1", (B, E))
        self._dctx1 = bufs.zeros("_dctx1", (B, E))
        self._datt = bufs.zeros("_datt", (B, self.num_heads, other))
        self._dy1 = bufs.zeros("_dy1", (B, 1, E))


_INF = float("inf")
