# microformer.attention: multi-head scaled dot-product attention (the seed's Attention layer).
#   Q = x Wq^T + bq, K = c Wk^T + bk, V = c Wv^T + bv      (c = context, or x itself)
#   A_h = softmax(Q_h K_h^T / sqrt(D) + mask), ctx_h = A_h V_h, y = concat_h(ctx_h) Wo^T + bo
from . import backend
from .layer import Layer, check_tensor, shape_error
from .dropout import check_p
from .tensor import Rng, Tensor, default_rng, dropout_seed, xavier_uniform


def _linear(out, inp, W, bias, N, C, OC, keep=None):
    # out (N, OC) = inp (N, C) . W^T + bias; W a float32 Tensor (keep: matmul_forward_kept's) or
    # an int8 weight (quant.py)
    if W.__class__ is not Tensor:
        W.forward(out, inp, bias, N, C, OC)
    elif keep is None:
        backend.K.matmul_forward(out, inp, W.data, bias, N, C, OC)
    else:
        backend.K.matmul_forward_kept(out, inp, W.data, bias, N, C, OC, keep)


def _linear_back(dinp, dW, db, dout, inp, W, N, C, OC):
    # matmul_backward, W a float32 Tensor or an int8 weight (frozen: dW is None)
    if W.__class__ is Tensor:
        backend.K.matmul_backward(dinp, dW, db, dout, inp, W.data, N, C, OC)
    else:
        W.backward(dinp, dW, db, dout, inp, N, C, OC)


class Attention(Layer):
    """Attention(embed_dim, num_heads, use_bias=True, causal=False): x [B,S,E] -> y [B,S,E].

    forward(x, key_padding_mask=None, context=None, lengths=None):
      key_padding_mask [B,Sk] (nested lists or a flat bytes-like, nonzero = padded key);
      lengths: B ints, keys j >= lengths[b] are padding (the tail-padding shortcut);
      context [B,Sk,E] gives cross-attention (K and V from context).
    A masked weight is exactly 0; a query whose keys are all masked gets weights 0, context 0
    (so its output is bo) and no gradient.

    KV cache (causal self-attention): y = prefill(x [B,S,E]) then y_t = decode_step(x_t [B,1,E])
    per new token; capacity max_len (here or in prefill). kv_bytes_per_token() = 8 * E.

    dropout=p: in training mode the softmax weights are dropped with probability p and the kept
    ones scaled by 1/(1-p) before they weight V (torch.nn.MultiheadAttention's dropout); eval()
    turns it off. kv_tile=T: the weights are computed over tiles of T keys with an online softmax
    and never stored (no [B,H,S,Sk] buffer: memory O(B S E) instead of O(B H S Sk)); backward
    recomputes them from the per-row max and sum. Same results as the standard path within
    float32 rounding (README: Tolerances); weights() / stages() are then not available, and
    dropout > 0 needs the stored weights (kv_tile=None).
    """

    lora_q = lora_k = lora_v = lora_o = None    # LoRA adapters on the projections (lora.py)
    backward_stops = True

    def __init__(self, embed_dim, num_heads, use_bias=True, causal=False, rng=None, max_len=None,
                 dropout=0.0, kv_tile=None):
        if not isinstance(embed_dim, int) or embed_dim < 1:
            raise ValueError("Attention: embed_dim must be a positive int, got %r" % (embed_dim,))
        if not isinstance(num_heads, int) or num_heads < 1 or embed_dim % num_heads:
            raise ValueError("Attention: embed_dim %d must be divisible by num_heads, got num_heads=%r"
                             % (embed_dim, num_heads))
        E = embed_dim
        self.embed_dim = E
        self.num_heads = num_heads
        self.head_dim = E // num_heads
        self.use_bias = use_bias
        self.causal = bool(causal)
        if max_len is not None and (not isinstance(max_len, int) or max_len < 1):
            raise ValueError("Attention: max_len must be a positive int or None, got %r" % (max_len,))
        self.max_len = max_len
        self._pos = 0
        self._kc = None
        self._wkeep = ([None], [None], [None], [None])  # decode_step: prepared Wq Wk Wv Wo (backend's)
        rng = rng or default_rng()
        for n in ("q", "k", "v", "o"):
            setattr(self, "W" + n, xavier_uniform(Tensor((E, E), name="W" + n), E, E, rng))  # (E, E)
            setattr(self, "dW" + n, Tensor.zeros((E, E), "dW" + n))
            if use_bias:
                setattr(self, "b" + n, Tensor.zeros((E,), "b" + n))                       # (E,)
                setattr(self, "db" + n, Tensor.zeros((E,), "db" + n))
            else:
                setattr(self, "b" + n, None)
                setattr(self, "db" + n, None)
        self._x = None
        self.dropout = check_p("Attention", dropout)
        if kv_tile is not None and (isinstance(kv_tile, bool) or not isinstance(kv_tile, int) or kv_tile < 1):
            raise ValueError("Attention: kv_tile must be a positive int (keys per tile) or None, got %r"
                             % (kv_tile,))
        if kv_tile is not None and self.dropout > 0.0:
            raise ValueError("Attention: dropout=%r needs the stored attention weights, which kv_tile=%d "
                             "never keeps: use dropout=0 with kv_tile" % (dropout, kv_tile))
        self.kv_tile = kv_tile
        # the attention-weight dropout's generator: from the dropout stream (mf.seed resets it),
        # not from the weights' generator, so the weights do not depend on p
        self._drop_rng = Rng(dropout_seed()) if self.dropout > 0.0 else None
        self._dropped = False

    def params(self):
        out = []
        for n in ("q", "k", "v", "o"):
            out.append((getattr(self, "W" + n), getattr(self, "dW" + n)))
            if self.use_bias:
                out.append((getattr(self, "b" + n), getattr(self, "db" + n)))
        for n in ("q", "k", "v", "o"):
            a = getattr(self, "lora_" + n)
            if a is not None:
                out.extend(a.params())
        return out

    def _adapted(self):
        return (self.lora_q is not None or self.lora_k is not None or self.lora_v is not None
                or self.lora_o is not None)

    def _no_lora(self, what):
        if self._adapted():
            raise ValueError("Attention: %s runs on the base weights only: merge the LoRA adapters "
                             "first (mf.merge_lora(model))" % what)

    def state_parts(self):
        # nn.MultiheadAttention(E, H, batch_first=True): in_proj = [Wq; Wk; Wv] [3E, E]
        out = [("in_proj_weight", [self.Wq, self.Wk, self.Wv])]
        if self.use_bias:
            out.append(("in_proj_bias", [self.bq, self.bk, self.bv]))
        out.append(("out_proj.weight", [self.Wo]))
        if self.use_bias:
            out.append(("out_proj.bias", [self.bo]))
        for n, name in (("q", "q_proj."), ("k", "k_proj."), ("v", "v_proj."), ("o", "out_proj.")):
            a = getattr(self, "lora_" + n)
            if a is not None:
                for k, t in a.state_parts():
                    out.append((name + k, t))
        return out

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        if len(in_shape) != 3 or in_shape[2] != self.embed_dim:
            raise shape_error("Attention", "input", "[B,S,%d]" % self.embed_dim, in_shape)

    def cache_floats(self, in_shape):
        B, S, E = in_shape
        H = self.num_heads
        if self.kv_tile is not None:
            # Q K V ctx y and their grads, the row stats [B,H,S,2] and one tile
            return 10 * B * S * E + 2 * B * H * S + self.kv_tile
        # Q K V ctx y and their grads (dctx dQ dK dV dx), plus A [B,H,S,S] (and its byte mask)
        drop = (B * H * S * S + 3) // 4 if self.dropout > 0.0 else 0
        return 10 * B * S * E + B * H * S * S + S + drop

    def _check_x(self, x, what):
        check_tensor("Attention", what, x)
        E = self.embed_dim
        if len(x.shape) != 3 or x.shape[2] != E:
            raise shape_error("Attention", what, "[B,S,%d]" % E, x.shape)

    def _mask_bytes(self, mask, B, Sk, buf=None):
        if mask is None:
            return None
        if isinstance(mask, (bytes, bytearray)):
            if len(mask) != B * Sk:
                raise ValueError("Attention: key_padding_mask must be [B,Sk] = [%d,%d], got %d bytes"
                                 % (B, Sk, len(mask)))
            return mask
        if not isinstance(mask, (list, tuple)):
            raise ValueError("Attention: key_padding_mask must be [B,Sk] = [%d,%d] (nested lists or %d bytes), got %s"
                             % (B, Sk, B * Sk, type(mask).__name__))
        if len(mask) != B:
            raise ValueError("Attention: key_padding_mask must be [B,Sk] = [%d,%d] nested lists, got %d rows"
                             % (B, Sk, len(mask)))
        buf = self._mbuf if buf is None else buf
        for b in range(B):
            row = mask[b]
            if not isinstance(row, (list, tuple)) or len(row) != Sk:
                raise ValueError("Attention: key_padding_mask row %d must have %d entries, got %r"
                                 % (b, Sk, row))
            for j in range(Sk):
                buf[b * Sk + j] = 1 if row[j] else 0
        return buf

    def _lengths_mask(self, lengths, B, Sk, buf=None):
        if not isinstance(lengths, (list, tuple)) or len(lengths) != B:
            raise ValueError("Attention: lengths must be a list of B=%d ints in [0, %d], got %r"
                             % (B, Sk, lengths))
        buf = self._mbuf if buf is None else buf
        for b in range(B):
            n = lengths[b]
            if not isinstance(n, int) or n < 0 or n > Sk:
                raise ValueError("Attention: lengths[%d] must be an int in [0, %d], got %r" % (b, Sk, n))
            for j in range(Sk):
                buf[b * Sk + j] = 1 if j >= n else 0
        return buf

    def forward(self, x, key_padding_mask=None, context=None, lengths=None):
        self._check_x(x, "x")
        B, S, E = x.shape
        c = x
        if context is not None:
            self._check_x(context, "context")
            if context.shape[0] != B:
                raise shape_error("Attention", "context", "[%d,Sk,%d]" % (B, E), context.shape)
            c = context
        Sk = c.shape[1]
        if self.causal and context is not None and Sk < S:
            raise ValueError("Attention: causal cross-attention needs Sk >= S, got Sk=%d S=%d" % (Sk, S))
        if lengths is not None and key_padding_mask is not None:
            raise ValueError("Attention: give key_padding_mask or lengths, not both")
        # the buffers follow x's shape and, for cross-attention, the context's
        self._buffers("_fwd", x.shape, None if context is None else c.shape)
        if lengths is not None:
            mask = self._lengths_mask(lengths, B, Sk)
        else:
            mask = self._mask_bytes(key_padding_mask, B, Sk)
        self._mask = mask
        K = backend.K
        bias = self.use_bias
        Q = self._Q              # (separate assignments: a 6-way unpack builds a tuple each step)
        Kc = self._Kt
        V = self._V
        ctx = self._ctx
        A = self._A
        y = self._y
        self._project_qkv(Q, Kc, V, x, c, B * S, B * Sk)
        H = self.num_heads
        causal = 1 if self.causal else 0
        if self.kv_tile is not None:
            K.attention_forward_tiled(ctx.data, self._stats.data, self._tile.data, Q.data, Kc.data, V.data,
                                      mask, B, S, Sk, E, H, causal, self.kv_tile)
        else:
            K.attention_forward(ctx.data, A.data, Q.data, Kc.data, V.data, mask, B, S, Sk, E, H, causal)
        self._dropped = self.training and self.dropout > 0.0
        if self._dropped:
            # dropout on the weights: ctx = (A * keep / (1-p)) V
            self._drop_rng.keep_mask(self._keep, B * H * S * Sk, self._drop_threshold(), K)
            K.attention_context(ctx.data, A.data, self._keep, V.data, B, S, Sk, E, H, self._drop_scale())
        _linear(y.data, ctx.data, self.Wo, self.bo.data if bias else None, B * S, E, E)
        if self.lora_o is not None:
            self.lora_o.forward_add(y.data, ctx.data, B * S)
        self._x = x
        self._c = context
        return y

    def _allocate(self, stage, shape, other, bufs):
        B, S, E = shape
        H = self.num_heads
        if stage == "_fwd" or stage == "_bwd":
            Sk = S if other is None else other[1]
            if stage == "_fwd":
                self._Q = bufs.zeros("_Q", (B, S, E))
                self._Kt = bufs.zeros("_Kt", (B, Sk, E))   # the keys (K names the kernels)
                self._V = bufs.zeros("_V", (B, Sk, E))
                self._ctx = bufs.zeros("_ctx", (B, S, E))
                if self.kv_tile is None:
                    self._A = bufs.zeros("_A", (B, H, S, Sk))
                    if self.dropout > 0.0:
                        self._keep = bufs.bytes("_keep", B * H * S * Sk)
                    else:
                        self._keep = bufs.none("_keep")
                else:                                     # tiled: row max and sum, one tile of scores
                    self._A = bufs.none("_A")
                    self._stats = bufs.zeros("_stats", (B, H, S, 2))
                    self._tile = bufs.zeros("_tile", (min(self.kv_tile, Sk),))
                self._y = bufs.zeros("_y", (B, S, E))
                self._mbuf = bufs.bytes("_mbuf", B * Sk)  # a key_padding_mask / lengths as bytes
            else:
                self._dctx = bufs.zeros("_dctx", (B, S, E))
                self._dQ = bufs.zeros("_dQ", (B, S, E))
                self._dx = bufs.zeros("_dx", (B, S, E))
                self._dK = bufs.zeros("_dK", (B, Sk, E))
                self._dV = bufs.zeros("_dV", (B, Sk, E))
                self._scratch = bufs.zeros("_scratch", (Sk,))
                if other is None:
                    self._dcontext = bufs.none("_dcontext")
                else:
                    self._dcontext = bufs.zeros("_dcontext", other)
        elif stage in _CACHED_STAGES:
            self._allocate_cached(stage, shape, other, bufs)
        elif stage == "_kv":                              # shape (B, capacity, E)
            self._kc = bufs.zeros("_kc", shape)
            self._vc = bufs.zeros("_vc", shape)
        else:                                             # "_dec": x (B, 1, E), capacity L
            L = other
            self._dq1 = bufs.zeros("_dq1", (B, E))
            self._dk1 = bufs.zeros("_dk1", (B, E))
            self._dv1 = bufs.zeros("_dv1", (B, E))
            self._dctx1 = bufs.zeros("_dctx1", (B, E))
            self._datt = bufs.zeros("_datt", (B, H, L))
            self._dy1 = bufs.zeros("_dy1", (B, 1, E))

    def backward(self, dy, grads=True, need_dx=True):
        # a frozen projection has no grad buffers (None): the kernels skip them; need_dx=False
        # (self-attention only): the input gradient is not computed (returns None). Returns dx;
        # cross-attention keeps the context's gradient in self.dcontext (else None)
        self._need_forward(self._x)
        self.dcontext = None
        x = self._x
        c = self._c if self._c is not None else x
        B, S, E = x.shape
        Sk = c.shape[1]
        check_tensor("Attention", "dy", dy)
        if dy.shape != x.shape:
            raise shape_error("Attention", "dy", "[%d,%d,%d]" % (B, S, E), dy.shape)
        K = backend.K
        train = grads and self.trainable
        bias = train and self.use_bias
        self._buffers("_bwd", x.shape, None if self._c is None else c.shape)
        dctx = self._dctx
        dQ = self._dQ
        dK = self._dK
        dV = self._dV
        dx = self._dx
        scratch = self._scratch
        # output projection: dWo += dy^T ctx, dctx = dy Wo
        _linear_back(dctx.data, self.dWo.data if train else None, self.dbo.data if bias else None,
                     dy.data, self._ctx.data, self.Wo, B * S, E, E)
        if self.lora_o is not None:
            self.lora_o.backward_add(dy.data, self._ctx.data, dctx.data, B * S, train)
        # per head: dV = A^T dctx, dA = dctx V^T, dS = A (dA - rowsum(dA A)) / sqrt(D), dQ = dS K, dK = dS^T Q
        H = self.num_heads
        if self.kv_tile is not None:              # the weights recomputed from the row max and sum
            K.attention_backward_tiled(dQ.data, dK.data, dV.data, self._tile.data, dctx.data, self._ctx.data,
                                       self._stats.data, self._Q.data, self._Kt.data, self._V.data, self._mask,
                                       B, S, Sk, E, H, 1 if self.causal else 0)
        elif self._dropped:                       # A' = A * keep / (1-p) weighted V
            K.attention_backward_dropout(dQ.data, dK.data, dV.data, scratch.data, dctx.data, self._A.data,
                                         self._keep, self._Q.data, self._Kt.data, self._V.data,
                                         B, S, Sk, E, H, self._drop_scale())
        else:
            K.attention_backward(dQ.data, dK.data, dV.data, scratch.data, dctx.data, self._A.data,
                                 self._Q.data, self._Kt.data, self._V.data, B, S, Sk, E, H)
        # input projections: dW += dProj^T x, dx (+)= dProj W
        if not need_dx and self._c is None:       # nothing below needs dx: weight grads only
            self._project_back(None, dQ, x, self.Wq, self.dWq, self.dbq, train, bias, B * S, self.lora_q)
            self._project_back(None, dK, x, self.Wk, self.dWk, self.dbk, train, bias, B * S, self.lora_k)
            self._project_back(None, dV, x, self.Wv, self.dWv, self.dbv, train, bias, B * S, self.lora_v)
            return None
        _linear_back(dx.data, self.dWq.data if train else None, self.dbq.data if bias else None,
                     dQ.data, x.data, self.Wq, B * S, E, E)
        if self.lora_q is not None:
            self.lora_q.backward_add(dQ.data, x.data, dx.data, B * S, train)
        # K and V: their weight grads, then their input grads added into dx (or dcontext)
        dc = dx
        if self._c is not None:
            dc = self._dcontext
            K.zero(dc.data, B * Sk * E)
        self._project_back(dc, dK, c, self.Wk, self.dWk, self.dbk, train, bias, B * Sk, self.lora_k)
        self._project_back(dc, dV, c, self.Wv, self.dWv, self.dbv, train, bias, B * Sk, self.lora_v)
        if self._c is not None:
            self.dcontext = dc
        return dx

    def _drop_threshold(self):
        return int(self.dropout * 16777216 + 0.5)     # as Dropout: drop when the top 24 bits are below

    def _drop_scale(self):
        return 0.0 if self.dropout >= 1.0 else 1.0 / (1.0 - self.dropout)

    def _no_weights(self, what):
        if self.kv_tile is not None:
            raise ValueError("Attention: %s needs the stored attention weights, which kv_tile=%d never "
                             "keeps (build it with kv_tile=None to look at them)" % (what, self.kv_tile))

    def _project_back(self, dc, dP, c, W, dW, db, train, bias, N, lora):
        # in the forward pass this was P = c W^T + b (+ the adapter's): dW += dP^T c,
        # db += sum dP, dc += dP W (dc None: skipped)
        K = backend.K
        E = self.embed_dim
        dw = dW.data if train else None
        dbb = db.data if bias else None
        if dw is not None or dbb is not None:
            _linear_back(None, dw, dbb, dP.data, c.data, W, N, E, E)
        if dc is not None:
            if W.__class__ is Tensor:
                K.matmul_backward_input_acc(dc.data, dP.data, W.data, N, E, E)
            else:                                 # an int8 weight (quant.py)
                W.backward_input_acc(dc.data, dP.data, N, E, E)
        if lora is not None:
            lora.backward_add(dP.data, c.data, None if dc is None else dc.data, N, train)

    def weights(self, b=0, h=0):
        """The last forward's attention weights of batch item b, head h: [S][Sk] lists."""
        self._no_weights("weights()")
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

    # ------------------------------------------------------------ KV cache (generation)

    def kv_bytes_per_token(self):
        """Bytes the cache holds per token per sequence: K and V rows, float32."""
        return 2 * 4 * self.embed_dim

    def kv_cache_bytes(self):
        """Bytes the allocated cache holds (0 before prefill)."""
        return 0 if self._kc is None else 2 * 4 * self._kc.size

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

    def _check_decoding(self, what):
        if not self.causal:
            raise ValueError("Attention: %s needs causal=True self-attention (this layer has causal=False)"
                             % what)

    def prefill(self, x, max_len=None):
        """Causal forward over the prompt x [B,S,E]; keeps its K and V in a cache of max_len tokens."""
        self._check_decoding("prefill")
        self._check_x(x, "x")
        B, S, E = x.shape
        cap = max_len if max_len is not None else self.max_len
        if cap is None:
            raise ValueError("Attention: prefill needs a cache capacity: Attention(..., max_len=N) "
                             "or prefill(x, max_len=N)")
        if not isinstance(cap, int) or cap < S:
            raise ValueError("Attention: max_len must be an int >= prompt length %d, got %r" % (S, cap))
        drop = self.training               # generation never drops: the prompt runs as in eval()
        self.training = False
        try:
            y = self.forward(x)
        finally:
            self.training = drop
        self._buffers("_kv", (B, cap, E))                   # the cache: (B, L, E)
        K = backend.K
        K.kv_store(self._kc.data, self._Kt.data, B, S, cap, E, 0)
        K.kv_store(self._vc.data, self._V.data, B, S, cap, E, 0)
        self._pos = S
        self._padded = False
        return y

    def _check_token(self, x, who):
        # one new token per cached sequence, and room for it in the cache: (B, L, E)
        B, L, E = self._kc.shape
        check_tensor("Attention", "x", x)
        if x.shape != (B, 1, E):
            raise shape_error("Attention", "x", "[%d,1,%d] (one token per cached sequence)" % (B, E), x.shape)
        if self._pos >= L:
            raise ValueError("Attention: KV cache is full: max_len=%d tokens, %s would write position %d"
                             % (L, who, self._pos))
        return B, L, E

    def _project_qkv(self, q, k, v, x, c, Nq, Nk):
        # q (Nq, E) = x . Wq^T + bq; k, v (Nk, E) = c . Wk^T + bk, c . Wv^T + bv (c = x: self-attention)
        bias = self.use_bias
        E = self.embed_dim
        _linear(q.data, x.data, self.Wq, self.bq.data if bias else None, Nq, E, E)
        _linear(k.data, c.data, self.Wk, self.bk.data if bias else None, Nk, E, E)
        _linear(v.data, c.data, self.Wv, self.bv.data if bias else None, Nk, E, E)
        if self.lora_q is not None:
            self.lora_q.forward_add(q.data, x.data, Nq)
        if self.lora_k is not None:
            self.lora_k.forward_add(k.data, c.data, Nk)
        if self.lora_v is not None:
            self.lora_v.forward_add(v.data, c.data, Nk)

    def _decode_qkv(self, x, B, L, E):
        # a decoding step's first half: q, k, v of the new token; k and v into the cache at _pos
        self._no_lora("decoding")
        K = backend.K
        bias = self.use_bias
        self._buffers("_dec", x.shape, L)
        keep = self._wkeep
        _linear(self._dq1.data, x.data, self.Wq, self.bq.data if bias else None, B, E, E, keep[0])
        _linear(self._dk1.data, x.data, self.Wk, self.bk.data if bias else None, B, E, E, keep[1])
        _linear(self._dv1.data, x.data, self.Wv, self.bv.data if bias else None, B, E, E, keep[2])
        K.kv_store(self._kc.data, self._dk1.data, B, 1, L, E, self._pos)
        K.kv_store(self._vc.data, self._dv1.data, B, 1, L, E, self._pos)

    def _decode_out(self, B, E):
        # a decoding step's last part: y = ctx . Wo^T + bo
        y = self._dy1
        _linear(y.data, self._dctx1.data, self.Wo, self.bo.data if self.use_bias else None,
                B, E, E, self._wkeep[3])
        return y

    def decode_step(self, x):
        """One new token per sequence, x [B,1,E] -> y [B,1,E], attending to every cached token."""
        self._check_decoding("decode_step")
        if self._kc is None:
            raise RuntimeError("Attention: decode_step() called before prefill()")
        B, L, E = self._check_token(x, "decode_step")
        self._decode_qkv(x, B, L, E)
        self._pos += 1
        backend.K.attention_decode(self._dctx1.data, self._datt.data, self._dq1.data, self._kc.data, self._vc.data,
                                   B, self._pos, L, E, self.num_heads)
        return self._decode_out(B, E)

    # ------------------------------------------------------------ the stages, for golden vectors

    def stages(self):
        """The last forward's intermediates as Tensors [B,H,S,Sk]: scores before scaling, after
        scaling, after masking (-inf where hidden), softmax weights; plus Q K V ctx [B,*,E]."""
        self._no_weights("stages()")
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

    # ---- cached cross-attention and padded decoding ----------------------------------------
    # Cross-attention generation: cache_context(memory) projects K and V of the context once;
    # cross_step(x) then attends from new queries to them (with the context's padding mask).
    # Padded self-attention generation: prefill_padded(x, lengths) is prefill() with a key padding
    # mask (a batch of prompts of different lengths, padded at the tail); decode_step_padded(x_t)
    # keeps the padded slots hidden for every later token. The attention itself does not know
    # positions: a caller adding positional encodings gives sample b's new token position
    # lengths[b] + t, not S + t.

    def cache_context(self, context, key_padding_mask=None, lengths=None):
        """K and V of context [B,Sk,E] computed once for cross_step(); its padding (mask or lengths)."""
        self._check_x(context, "context")
        if lengths is not None and key_padding_mask is not None:
            raise ValueError("Attention: give key_padding_mask or lengths, not both")
        B, Sk, E = context.shape
        self._buffers("_xkv", context.shape)
        if lengths is not None:
            mask = self._lengths_mask(lengths, B, Sk, self._xmask)
        else:
            mask = self._mask_bytes(key_padding_mask, B, Sk, self._xmask)
        self._xm = mask                                  # None, self._xmask or the caller's bytes
        self._no_lora("cache_context")
        bias = self.use_bias
        _linear(self._xk.data, context.data, self.Wk, self.bk.data if bias else None, B * Sk, E, E)
        _linear(self._xv.data, context.data, self.Wv, self.bv.data if bias else None, B * Sk, E, E)
        return self._xk

    def cross_step(self, x):
        """Queries x [B,T,E] -> y [B,T,E] attending to the context cached by cache_context()."""
        have = getattr(self, "_xkv", None)
        if have is None:
            raise RuntimeError("Attention: cross_step() called before cache_context()")
        B, Sk, E = have.shape
        check_tensor("Attention", "x", x)
        if len(x.shape) != 3 or x.shape[0] != B or x.shape[2] != E:
            raise shape_error("Attention", "x", "[%d,T,%d] (the cached context's batch)" % (B, E), x.shape)
        T = x.shape[1]
        self._no_lora("cross_step")
        K = backend.K
        bias = self.use_bias
        self._buffers("_xdec", x.shape, Sk)
        q = self._xq
        ctx = self._xctx
        y = self._xy
        _linear(q.data, x.data, self.Wq, self.bq.data if bias else None, B * T, E, E)
        K.attention_forward(ctx.data, self._xatt.data, q.data, self._xk.data, self._xv.data,
                            self._xm, B, T, Sk, E, self.num_heads, 0)
        _linear(y.data, ctx.data, self.Wo, self.bo.data if bias else None, B * T, E, E)
        return y

    def prefill_padded(self, x, lengths=None, key_padding_mask=None, max_len=None):
        """prefill() for prompts of different lengths: x [B,S,E] padded, lengths B ints (or a
        key_padding_mask [B,S]); padded slots stay hidden from every later token."""
        self._check_decoding("prefill_padded")
        if lengths is None and key_padding_mask is None:
            raise ValueError("Attention: prefill_padded needs lengths or key_padding_mask (else use prefill)")
        self.prefill(x, max_len)                        # K and V in the cache (no padding yet) ...
        B, S, E = x.shape
        drop = self.training                            # ... and the output with the padding,
        self.training = False                           # never dropped (generation)
        try:
            self.forward(x, key_padding_mask, None, lengths)
        finally:
            self.training = drop
        L = self._kc.shape[1]
        self._buffers("_kvm", self._kc.shape)
        m = self._kvmask
        src = self._mask
        for b in range(B):
            for j in range(L):
                m[b * L + j] = src[b * S + j] if j < S else 1
        self._padded = True
        return self._y

    def decode_step_padded(self, x):
        """decode_step() after prefill_padded(): the new token sees its own prompt's keys only."""
        self._check_decoding("decode_step_padded")
        if self._kc is None or not getattr(self, "_padded", False):
            raise RuntimeError("Attention: decode_step_padded() called before prefill_padded()")
        B, L, E = self._check_token(x, "decode_step_padded")
        self._decode_qkv(x, B, L, E)
        m = self._kvmask
        for b in range(B):
            m[b * L + self._pos] = 0
        self._pos += 1
        backend.K.attention_forward(self._dctx1.data, self._datt.data, self._dq1.data, self._kc.data, self._vc.data,
                                    m, B, 1, L, E, self.num_heads, 0)
        return self._decode_out(B, E)

    def _allocate_cached(self, stage, shape, other, bufs):
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
        else:                                             # "_kvm": hidden slots of the cache (B, L, E)
            self._kvmask = bufs.bytes("_kvmask", shape[0] * shape[1])
    # ---- end of cached cross-attention and padded decoding ----------------------------------


_CACHED_STAGES = ("_xkv", "_xdec", "_kvm")

_INF = float("inf")
