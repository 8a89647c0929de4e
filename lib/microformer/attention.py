# microformer.attention: multi-head scaled dot-product attention (the seed's Attention layer).
#   Q = x Wq^T + bq, K = c Wk^T + bk, V = c Wv^T + bv      (c = context, or x itself)
#   A_h = softmax(Q_h K_h^T / sqrt(D) + mask), ctx_h = A_h V_h, y = concat_h(ctx_h) Wo^T + bo
from . import backend
from .layer import Layer, check_tensor, shape_error
from .tensor import Tensor, default_rng, xavier_uniform


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
    """

    def __init__(self, embed_dim, num_heads, use_bias=True, causal=False, rng=None, max_len=None):
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
        self._keep = ([None], [None], [None], [None])   # decode_step: prepared Wq Wk Wv Wo (backend's)
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

    def params(self):
        out = []
        for n in ("q", "k", "v", "o"):
            out.append((getattr(self, "W" + n), getattr(self, "dW" + n)))
            if self.use_bias:
                out.append((getattr(self, "b" + n), getattr(self, "db" + n)))
        return out

    def _state(self):
        # nn.MultiheadAttention(E, H, batch_first=True): in_proj = [Wq; Wk; Wv] [3E, E]
        out = [("in_proj_weight", [self.Wq, self.Wk, self.Wv])]
        if self.use_bias:
            out.append(("in_proj_bias", [self.bq, self.bk, self.bv]))
        out.append(("out_proj.weight", [self.Wo]))
        if self.use_bias:
            out.append(("out_proj.bias", [self.bo]))
        return out

    def check_input_shape(self, in_shape):
        Layer.check_input_shape(self, in_shape)
        if len(in_shape) != 3 or in_shape[2] != self.embed_dim:
            raise shape_error("Attention", "input", "[B,S,%d]" % self.embed_dim, in_shape)

    def cache_floats(self, in_shape):
        B, S, E = in_shape
        # Q K V ctx y and their grads (dctx dQ dK dV dx), plus A [B,H,S,S]
        return 10 * B * S * E + B * self.num_heads * S * S + S

    def _check_x(self, x, what):
        check_tensor("Attention", what, x)
        E = self.embed_dim
        if len(x.shape) != 3 or x.shape[2] != E:
            raise shape_error("Attention", what, "[B,S,%d]" % E, x.shape)

    def _mask_bytes(self, mask, B, Sk):
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
        buf = self._mbuf
        for b in range(B):
            row = mask[b]
            if not isinstance(row, (list, tuple)) or len(row) != Sk:
                raise ValueError("Attention: key_padding_mask row %d must have %d entries, got %r"
                                 % (b, Sk, row))
            for j in range(Sk):
                buf[b * Sk + j] = 1 if row[j] else 0
        return buf

    def _lengths_mask(self, lengths, B, Sk):
        if not isinstance(lengths, (list, tuple)) or len(lengths) != B:
            raise ValueError("Attention: lengths must be a list of B=%d ints in [0, %d], got %r"
                             % (B, Sk, lengths))
        buf = self._mbuf
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
        Kc = self._K
        V = self._V
        ctx = self._ctx
        A = self._A
        y = self._y
        K.matmul_forward(Q.data, x.data, self.Wq.data, self.bq.data if bias else None, B * S, E, E)
        K.matmul_forward(Kc.data, c.data, self.Wk.data, self.bk.data if bias else None, B * Sk, E, E)
        K.matmul_forward(V.data, c.data, self.Wv.data, self.bv.data if bias else None, B * Sk, E, E)
        K.attention_forward(ctx.data, A.data, Q.data, Kc.data, V.data, mask,
                            B, S, Sk, E, self.num_heads, 1 if self.causal else 0)
        K.matmul_forward(y.data, ctx.data, self.Wo.data, self.bo.data if bias else None, B * S, E, E)
        self._x = x
        self._c = context
        return y

    def _allocate(self, stage, shape, other):
        B, S, E = shape
        if stage == "_fwd" or stage == "_bwd":
            Sk = S if other is None else other[1]
            if stage == "_fwd":
                self._Q = Tensor.zeros((B, S, E))
                self._K = Tensor.zeros((B, Sk, E))
                self._V = Tensor.zeros((B, Sk, E))
                self._ctx = Tensor.zeros((B, S, E))
                self._A = Tensor.zeros((B, self.num_heads, S, Sk))
                self._y = Tensor.zeros((B, S, E))
                self._mbuf = bytearray(B * Sk)            # a key_padding_mask / lengths as bytes
            else:
                self._dctx = Tensor.zeros((B, S, E))
                self._dQ = Tensor.zeros((B, S, E))
                self._dx = Tensor.zeros((B, S, E))
                self._dK = Tensor.zeros((B, Sk, E))
                self._dV = Tensor.zeros((B, Sk, E))
                self._scratch = Tensor.zeros((Sk,))
                self._dcontext = None if other is None else Tensor.zeros(other)
        elif stage == "_kv":                              # shape (B, capacity, E)
            self._kc = Tensor.zeros(shape)
            self._vc = Tensor.zeros(shape)
        else:                                             # "_dec": x (B, 1, E), capacity L
            L = other
            self._dq1 = Tensor.zeros((B, E))
            self._dk1 = Tensor.zeros((B, E))
            self._dv1 = Tensor.zeros((B, E))
            self._dctx1 = Tensor.zeros((B, E))
            self._datt = Tensor.zeros((B, self.num_heads, L))
            self._dy1 = Tensor.zeros((B, 1, E))

    def backward(self, dy, grads=True):
        self._need_forward(self._x)
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
        K.matmul_backward(dctx.data, self.dWo.data if train else None, self.dbo.data if bias else None,
                          dy.data, self._ctx.data, self.Wo.data, B * S, E, E)
        # per head: dV = A^T dctx, dA = dctx V^T, dS = A (dA - rowsum(dA A)) / sqrt(D), dQ = dS K, dK = dS^T Q
        K.attention_backward(dQ.data, dK.data, dV.data, scratch.data, dctx.data, self._A.data,
                             self._Q.data, self._K.data, self._V.data, B, S, Sk, E, self.num_heads)
        # input projections: dW += dProj^T x, dx (+)= dProj W
        K.matmul_backward(dx.data, self.dWq.data if train else None, self.dbq.data if bias else None,
                          dQ.data, x.data, self.Wq.data, B * S, E, E)
        # K and V: their weight grads, then their input grads added into dx (or dcontext)
        dc = dx
        if self._c is not None:
            dc = self._dcontext
            K.zero(dc.data, B * Sk * E)
        self._project_back(dc, dK, c, self.Wk, self.dWk, self.dbk, train, bias, B * Sk)
        self._project_back(dc, dV, c, self.Wv, self.dWv, self.dbv, train, bias, B * Sk)
        if self._c is not None:
            return dx, dc
        return dx

    def _project_back(self, dc, dP, c, W, dW, db, train, bias, N):
        # in the forward pass this was P = c W^T + b: dW += dP^T c, db += sum dP, dc += dP W
        K = backend.K
        E = self.embed_dim
        K.matmul_backward(None, dW.data if train else None, db.data if bias else None,
                          dP.data, c.data, W.data, N, E, E)
        K.matmul_backward_input_acc(dc.data, dP.data, W.data, N, E, E)

    def weights(self, b=0, h=0):
        """The last forward's attention weights of batch item b, head h: [S][Sk] lists."""
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
        y = self.forward(x)
        self._buffers("_kv", (B, cap, E))                   # the cache: (B, L, E)
        K = backend.K
        K.kv_store(self._kc.data, self._K.data, B, S, cap, E, 0)
        K.kv_store(self._vc.data, self._V.data, B, S, cap, E, 0)
        self._pos = S
        return y

    def decode_step(self, x):
        """One new token per sequence, x [B,1,E] -> y [B,1,E], attending to every cached token."""
        self._check_decoding("decode_step")
        if self._kc is None:
            raise RuntimeError("Attention: decode_step() called before prefill()")
        B, L, E = self._kc.shape
        check_tensor("Attention", "x", x)
        if x.shape != (B, 1, E):
            raise shape_error("Attention", "x", "[%d,1,%d] (one token per cached sequence)" % (B, E), x.shape)
        if self._pos >= L:
            raise ValueError("Attention: KV cache is full: max_len=%d tokens, decode_step would write position %d"
                             % (L, self._pos))
        K = backend.K
        bias = self.use_bias
        self._buffers("_dec", x.shape, L)
        q = self._dq1
        k = self._dk1
        v = self._dv1
        ctx = self._dctx1
        att = self._datt
        y = self._dy1
        keep = self._keep
        K.matmul_forward_kept(q.data, x.data, self.Wq.data, self.bq.data if bias else None, B, E, E, keep[0])
        K.matmul_forward_kept(k.data, x.data, self.Wk.data, self.bk.data if bias else None, B, E, E, keep[1])
        K.matmul_forward_kept(v.data, x.data, self.Wv.data, self.bv.data if bias else None, B, E, E, keep[2])
        K.kv_store(self._kc.data, k.data, B, 1, L, E, self._pos)
        K.kv_store(self._vc.data, v.data, B, 1, L, E, self._pos)
        self._pos += 1
        K.attention_decode(ctx.data, att.data, q.data, self._kc.data, self._vc.data,
                           B, self._pos, L, E, self.num_heads)
        K.matmul_forward_kept(y.data, ctx.data, self.Wo.data, self.bo.data if bias else None, B, E, E, keep[3])
        return y

    def cache_len(self):
        """Tokens in the KV cache."""
        return self._pos

    # ------------------------------------------------------------ the stages, for golden vectors

    def stages(self):
        """The last forward's intermediates as Tensors [B,H,S,Sk]: scores before scaling, after
        scaling, after masking (-inf where hidden), softmax weights; plus Q K V ctx [B,*,E]."""
        self._need_forward(self._x)
        B, H, S, Sk = self._A.shape
        E = self.embed_dim
        K = backend.K
        out = {}
        scale = 1.0 / (self.head_dim ** 0.5)
        for name, sc, masked in (("scores_raw", 1.0, 0), ("scores_scaled", scale, 0),
                                 ("scores_masked", scale, 1)):
            t = Tensor.zeros((B, H, S, Sk), name)
            K.attention_scores(t.data, self._Q.data, self._K.data, self._mask if masked else None,
                               B, S, Sk, E, H, sc, 1 if (masked and self.causal) else 0, -_INF)
            out[name] = t
        out["weights"] = self._A
        out["Q"], out["K"], out["V"], out["ctx"] = self._Q, self._K, self._V, self._ctx
        return out


_INF = float("inf")
