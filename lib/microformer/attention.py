# microformer.attention: multi-head scaled dot-product attention (the seed's Attention layer).
#   Q = x Wq^T + bq, K = c Wk^T + bk, V = c Wv^T + bv      (c = context, or x itself)
#   A_h = softmax(Q_h K_h^T / sqrt(D) + mask), ctx_h = A_h V_h, y = concat_h(ctx_h) Wo^T + bo
from . import backend
from .layer import Layer, check_tensor, shape_error
from .tensor import Tensor, default_rng, xavier_uniform


class Attention(Layer):
    """Attention(embed_dim, num_heads, use_bias=True, causal=False): x [B,S,E] -> y [B,S,E].

    forward(x, key_padding_mask=None, context=None):
      key_padding_mask [B,Sk] (nested lists or a flat bytes-like, nonzero = padded key);
      context [B,Sk,E] gives cross-attention (K and V from context).
    """

    def __init__(self, embed_dim, num_heads, use_bias=True, causal=False, rng=None):
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

    def cache_floats(self, in_shape):
        B, S, E = in_shape
        # Q K V ctx y and their grads (dctx dQ dK dV dx tmp), plus A [B,H,S,S]
        return 11 * B * S * E + B * self.num_heads * S * S + S

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
        if not isinstance(mask, (list, tuple)) or len(mask) != B:
            raise ValueError("Attention: key_padding_mask must be [B,Sk] = [%d,%d] nested lists, got %r"
                             % (B, Sk, type(mask).__name__))
        buf = self._mbuf if getattr(self, "_mbuf", None) is not None and len(self._mbuf) == B * Sk \
            else bytearray(B * Sk)
        self._mbuf = buf
        for b in range(B):
            row = mask[b]
            if not isinstance(row, (list, tuple)) or len(row) != Sk:
                raise ValueError("Attention: key_padding_mask row %d must have %d entries, got %r"
                                 % (b, Sk, row))
            for j in range(Sk):
                buf[b * Sk + j] = 1 if row[j] else 0
        return buf

    def forward(self, x, key_padding_mask=None, context=None):
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
        mask = self._mask_bytes(key_padding_mask, B, Sk)
        K = backend.K
        bias = self.use_bias
        Q = self._buffer("_Q", (B, S, E))
        Kc = self._buffer("_K", (B, Sk, E))
        V = self._buffer("_V", (B, Sk, E))
        ctx = self._buffer("_ctx", (B, S, E))
        A = self._buffer("_A", (B, self.num_heads, S, Sk))
        y = self._buffer("_y", (B, S, E))
        K.matmul_forward(Q.data, x.data, self.Wq.data, self.bq.data if bias else None, B * S, E, E)
        K.matmul_forward(Kc.data, c.data, self.Wk.data, self.bk.data if bias else None, B * Sk, E, E)
        K.matmul_forward(V.data, c.data, self.Wv.data, self.bv.data if bias else None, B * Sk, E, E)
        K.attention_forward(ctx.data, A.data, Q.data, Kc.data, V.data, mask,
                            B, S, Sk, E, self.num_heads, 1 if self.causal else 0)
        K.matmul_forward(y.data, ctx.data, self.Wo.data, self.bo.data if bias else None, B * S, E, E)
        self._x = x
        self._c = context
        return y

    def backward(self, dy):
        self._need_forward(self._x)
        x = self._x
        c = self._c if self._c is not None else x
        B, S, E = x.shape
        Sk = c.shape[1]
        check_tensor("Attention", "dy", dy)
        if dy.shape != (B, S, E):
            raise shape_error("Attention", "dy", "[%d,%d,%d]" % (B, S, E), dy.shape)
        K = backend.K
        train = self.trainable
        bias = train and self.use_bias
        dctx = self._buffer("_dctx", (B, S, E))
        dQ = self._buffer("_dQ", (B, S, E))
        dK = self._buffer("_dK", (B, Sk, E))
        dV = self._buffer("_dV", (B, Sk, E))
        dx = self._buffer("_dx", (B, S, E))
        tmp = self._buffer("_dtmp", (B, Sk, E))
        scratch = self._buffer("_scratch", (Sk,))
        # output projection: dWo += dy^T ctx, dctx = dy Wo
        K.matmul_backward(dctx.data, self.dWo.data if train else None, self.dbo.data if bias else None,
                          dy.data, self._ctx.data, self.Wo.data, B * S, E, E)
        # per head: dV = A^T dctx, dA = dctx V^T, dS = A (dA - rowsum(dA A)) / sqrt(D), dQ = dS K, dK = dS^T Q
        K.attention_backward(dQ.data, dK.data, dV.data, scratch.data, dctx.data, self._A.data,
                             self._Q.data, self._K.data, self._V.data, B, S, Sk, E, self.num_heads)
        # input projections: dW += dProj^T x, dx (+)= dProj W
        K.matmul_backward(dx.data, self.dWq.data if train else None, self.dbq.data if bias else None,
                          dQ.data, x.data, self.Wq.data, B * S, E, E)
        dc = dx
        if self._c is not None:
            dc = self._buffer("_dcontext", (B, Sk, E))
            K.matmul_backward(dc.data, self.dWk.data if train else None, self.dbk.data if bias else None,
                              dK.data, c.data, self.Wk.data, B * Sk, E, E)
        else:
            K.matmul_backward(tmp.data, self.dWk.data if train else None, self.dbk.data if bias else None,
                              dK.data, c.data, self.Wk.data, B * Sk, E, E)
            K.add_inplace(dc.data, tmp.data, B * Sk * E)
        K.matmul_backward(tmp.data, self.dWv.data if train else None, self.dbv.data if bias else None,
                          dV.data, c.data, self.Wv.data, B * Sk, E, E)
        K.add_inplace(dc.data, tmp.data, B * Sk * E)
        if self._c is not None:
            return dx, dc
        return dx

    def weights(self, b=0, h=0):
        """The last forward's attention weights of batch item b, head h: [S][Sk] lists."""
        self._need_forward(self._x)
        B, H, S, Sk = self._A.shape
        if not (0 <= b < B) or not (0 <= h < H):
            raise ValueError("Attention: weights(b, h) needs 0 <= b < %d and 0 <= h < %d, got (%r, %r)"
                             % (B, H, b, h))
        base = (b * H + h) * S * Sk
        d = self._A.data
        return [[d[base + i * Sk + j] for j in range(Sk)] for i in range(S)]
