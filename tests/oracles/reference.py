"""NumPy float64 reference for every microformer layer, loss and optimizer.

Written from the math (seed 000: the tiny_ai Attention layer; seeds 001/002: masks and
cross-attention), never by calling lib/. Tests judge lib/ against these functions, and
`gradcheck` judges these functions against finite differences.
"""
import numpy as np

# ---------------------------------------------------------------- Dense: y = x W^T + b


def dense_forward(x, W, b=None):
    y = x @ W.T
    return y if b is None else y + b


def dense_backward(dy, x, W):
    """Returns dx, dW, db for y = x W^T + b (x may have any leading axes)."""
    x2 = x.reshape(-1, x.shape[-1])
    dy2 = dy.reshape(-1, dy.shape[-1])
    return dy @ W, dy2.T @ x2, dy2.sum(axis=0)


# ---------------------------------------------------------------- activations

_GELU_C = np.sqrt(2.0 / np.pi)
LEAKY_SLOPE = 0.01


def _erf(x):
    # erf from its Maclaurin series (|x| < 4) and its asymptotic series (|x| >= 4), float64:
    # the reference does not borrow the library's math.erf
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    small = np.abs(x) < 4.0
    xs = x[small]
    term = xs.copy()
    total = xs.copy()
    for n in range(1, 120):
        term = term * (-xs * xs) / n
        total = total + term / (2 * n + 1)
    out[small] = 2.0 / np.sqrt(np.pi) * total
    xl = np.abs(x[~small])
    # erfc(x) ~ exp(-x^2)/(x sqrt(pi)) (1 - 1/(2x^2) + 3/(4x^4) - 15/(8x^6) + 105/(16x^8))
    u = 1.0 / (2.0 * xl * xl)
    series = 1.0 - u + 3.0 * u ** 2 - 15.0 * u ** 3 + 105.0 * u ** 4
    out[~small] = np.sign(x[~small]) * (1.0 - np.exp(-xl * xl) / (xl * np.sqrt(np.pi)) * series)
    return out


def act_forward(kind, x):
    if kind == "relu":
        return np.maximum(x, 0.0)
    if kind == "leaky_relu":
        return np.where(x > 0, x, LEAKY_SLOPE * x)
    if kind == "gelu":
        return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))
    if kind == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(_GELU_C * (x + 0.044715 * x ** 3)))
    if kind == "tanh":
        return np.tanh(x)
    if kind == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    raise ValueError(kind)


def act_backward(kind, dy, x):
    if kind == "relu":
        return dy * (x > 0)
    if kind == "leaky_relu":
        return dy * np.where(x > 0, 1.0, LEAKY_SLOPE)
    if kind == "gelu":
        return dy * (0.5 * (1.0 + _erf(x / np.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi))
    if kind == "gelu_tanh":
        u = _GELU_C * (x + 0.044715 * x ** 3)
        th = np.tanh(u)
        du = _GELU_C * (1.0 + 3 * 0.044715 * x ** 2)
        return dy * (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th ** 2) * du)
    if kind == "tanh":
        return dy * (1.0 - np.tanh(x) ** 2)
    if kind == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-x))
        return dy * s * (1.0 - s)
    raise ValueError(kind)


# ---------------------------------------------------------------- GlobalAvgPool [B,S,E] -> [B,E]


def avgpool_forward(x):
    return x.mean(axis=1)


def avgpool_backward(dy, S):
    return np.repeat(dy[:, None, :], S, axis=1) / S


# ---------------------------------------------------------------- multi-head attention


def attention_mask(B, Sq, Sk, causal=False, key_padding_mask=None, visible_mask=None):
    """Boolean [B, Sq, Sk]: True where query i may look at key j (visible_mask [Sq, Sk]: an extra
    boolean mask, True = may look, e.g. a banded one)."""
    visible = np.ones((B, Sq, Sk), dtype=bool)
    if visible_mask is not None:
        visible &= np.asarray(visible_mask, dtype=bool)[None]
    if causal:
        shift = Sk - Sq   # query i sits at absolute position i + shift
        visible &= (np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + shift)[None]
    if key_padding_mask is not None:
        visible &= ~np.asarray(key_padding_mask, dtype=bool)[:, None, :]
    return visible


def attention_forward(x, p, num_heads, causal=False, key_padding_mask=None, context=None, visible_mask=None):
    """x [B,S,E]; p: dict Wq Wk Wv Wo [E,E] and bq bk bv bo [E] (or absent).

    Returns y and a cache holding every intermediate the seeds name:
    scores_raw (Q K^T), scores_scaled (/sqrt(D)), scores_masked (-inf where hidden),
    A (softmax weights, exactly 0 where hidden; an all-hidden row is all 0), ctx.
    """
    c = x if context is None else context
    B, S, E = x.shape
    Sk = c.shape[1]
    H = num_heads
    D = E // H
    Q = dense_forward(x, p["Wq"], p.get("bq"))
    K = dense_forward(c, p["Wk"], p.get("bk"))
    V = dense_forward(c, p["Wv"], p.get("bv"))
    Qh = Q.reshape(B, S, H, D).transpose(0, 2, 1, 3)     # [B,H,S,D]
    Kh = K.reshape(B, Sk, H, D).transpose(0, 2, 1, 3)    # [B,H,Sk,D]
    Vh = V.reshape(B, Sk, H, D).transpose(0, 2, 1, 3)
    raw = Qh @ Kh.transpose(0, 1, 3, 2)                  # [B,H,S,Sk]
    scaled = raw / np.sqrt(D)
    visible = attention_mask(B, S, Sk, causal, key_padding_mask, visible_mask)[:, None]   # [B,1,S,Sk]
    masked = np.where(visible, scaled, -np.inf)
    row_max = np.where(visible.any(axis=-1, keepdims=True),
                       np.max(np.where(visible, scaled, -1e300), axis=-1, keepdims=True), 0.0)
    e = np.where(visible, np.exp(np.where(visible, scaled, 0.0) - row_max), 0.0)
    z = e.sum(axis=-1, keepdims=True)
    A = np.divide(e, z, out=np.zeros_like(e), where=z > 0)
    ctx_h = A @ Vh                                        # [B,H,S,D]
    ctx = ctx_h.transpose(0, 2, 1, 3).reshape(B, S, E)
    y = dense_forward(ctx, p["Wo"], p.get("bo"))
    cache = dict(x=x, c=c, Q=Q, K=K, V=V, Qh=Qh, Kh=Kh, Vh=Vh, scores_raw=raw,
                 scores_scaled=scaled, scores_masked=masked, A=A, ctx=ctx, H=H, D=D)
    return y, cache


def attention_backward(dy, cache, p):
    """Returns dx, grads (dWq.. dbo) and dcontext (None for self-attention)."""
    x, c, A = cache["x"], cache["c"], cache["A"]
    B, S, E = x.shape
    Sk = c.shape[1]
    H, D = cache["H"], cache["D"]
    g = {}
    dctx, g["dWo"], g["dbo"] = dense_backward(dy, cache["ctx"], p["Wo"])
    dctx_h = dctx.reshape(B, S, H, D).transpose(0, 2, 1, 3)          # [B,H,S,D]
    dVh = A.transpose(0, 1, 3, 2) @ dctx_h                            # A^T dctx
    dA = dctx_h @ cache["Vh"].transpose(0, 1, 3, 2)                   # dctx V^T
    dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True)) / np.sqrt(D)  # softmax backward, scale
    dQh = dS @ cache["Kh"]
    dKh = dS.transpose(0, 1, 3, 2) @ cache["Qh"]
    dQ = dQh.transpose(0, 2, 1, 3).reshape(B, S, E)
    dK = dKh.transpose(0, 2, 1, 3).reshape(B, Sk, E)
    dV = dVh.transpose(0, 2, 1, 3).reshape(B, Sk, E)
    dx, g["dWq"], g["dbq"] = dense_backward(dQ, x, p["Wq"])
    dc_k, g["dWk"], g["dbk"] = dense_backward(dK, c, p["Wk"])
    dc_v, g["dWv"], g["dbv"] = dense_backward(dV, c, p["Wv"])
    if cache["c"] is cache["x"]:
        return dx + dc_k + dc_v, g, None
    return dx, g, dc_k + dc_v


# ---------------------------------------------------------------- losses


def softmax_cross_entropy(logits, labels):
    """Mean over B of -log softmax(logits)[label]; returns loss and dlogits."""
    B = logits.shape[0]
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    loss = -logp[np.arange(B), labels].mean()
    d = np.exp(logp)
    d[np.arange(B), labels] -= 1.0
    return loss, d / B


def mse(pred, target):
    d = pred - target
    return (d ** 2).mean(), 2.0 * d / d.size


# ---------------------------------------------------------------- optimizers (one step)


def sgd_step(p, g, buf, lr, momentum=0.0, weight_decay=0.0):
    """PyTorch SGD: d = g + wd p; buf = momentum buf + d; p -= lr buf. Returns p, buf."""
    d = g + weight_decay * p
    if momentum:
        buf = momentum * buf + d
        d = buf
    return p - lr * d, buf


def adam_step(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, decoupled=False):
    """Adam (decoupled=True: AdamW) at step t (1-based). Returns p, m, v."""
    if weight_decay and decoupled:
        p = p * (1.0 - lr * weight_decay)
    elif weight_decay:
        g = g + weight_decay * p
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    mhat = m / (1 - beta1 ** t)
    vhat = v / (1 - beta2 ** t)
    return p - lr * mhat / (np.sqrt(vhat) + eps), m, v


def clip_grad_norm(grads, max_norm):
    norm = np.sqrt(sum(float((g ** 2).sum()) for g in grads))
    if norm > max_norm:
        grads = [g * (max_norm / norm) for g in grads]
    return grads, norm


# ---------------------------------------------------------------- finite differences


def gradcheck(f, x, dy, eps=1e-6):
    """Numerical d(sum(f(x) * dy))/dx by central differences (x is perturbed in place)."""
    grad = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        up = float((f() * dy).sum())
        x[i] = old - eps
        down = float((f() * dy).sum())
        x[i] = old
        grad[i] = (up - down) / (2 * eps)
    return grad


# ---------------------------------------------------------------- the attention family
# LayerNorm, FeedForward, Embedding, PositionalEncoding, the pre-norm EncoderBlock (seeds 001/002).


def layernorm_forward(x, gamma, beta, eps=1e-5):
    """Normalise over the last axis (biased variance). Returns y and a cache."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - mean) * rstd
    return xhat * gamma + beta, dict(xhat=xhat, rstd=rstd, gamma=gamma)


def layernorm_backward(dy, cache):
    """Returns dx, dgamma, dbeta."""
    xhat, rstd, gamma = cache["xhat"], cache["rstd"], cache["gamma"]
    axes = tuple(range(dy.ndim - 1))
    dgamma = (dy * xhat).sum(axis=axes)
    dbeta = dy.sum(axis=axes)
    dn = dy * gamma
    dx = rstd * (dn - dn.mean(axis=-1, keepdims=True) - xhat * (dn * xhat).mean(axis=-1, keepdims=True))
    return dx, dgamma, dbeta


def feedforward_forward(x, p, kind="gelu"):
    """p: W1 [H,E], b1 [H], W2 [E,H], b2 [E]. y = act(x W1^T + b1) W2^T + b2."""
    h = dense_forward(x, p["W1"], p.get("b1"))
    a = act_forward(kind, h)
    return dense_forward(a, p["W2"], p.get("b2")), dict(x=x, h=h, a=a, kind=kind)


def feedforward_backward(dy, cache, p):
    g = {}
    da, g["dW2"], g["db2"] = dense_backward(dy, cache["a"], p["W2"])
    dh = act_backward(cache["kind"], da, cache["h"])
    dx, g["dW1"], g["db1"] = dense_backward(dh, cache["x"], p["W1"])
    return dx, g


def embedding_forward(ids, W):
    """ids: int array [B,S]; W [V,E] -> [B,S,E]."""
    return W[np.asarray(ids, dtype=np.int64)]


def embedding_backward(dy, ids, vocab):
    """dW [V,E]: every position's dy row added into its id's row."""
    dW = np.zeros((vocab, dy.shape[-1]))
    np.add.at(dW, np.asarray(ids, dtype=np.int64).ravel(), dy.reshape(-1, dy.shape[-1]))
    return dW


def positional_encoding(max_len, E):
    """The sinusoidal table [max_len, E] of the seeds:
    pe[:, 0::2] = sin(pos * div), pe[:, 1::2] = cos(pos * div), div = exp(-(2i) ln(10000) / E)."""
    pos = np.arange(max_len)[:, None].astype(np.float64)
    div = np.exp(-np.arange(0, E, 2) * np.log(10000.0) / E)
    pe = np.zeros((max_len, E))
    pe[:, 0::2] = np.sin(pos * div)
    pe[:, 1::2] = np.cos(pos * div)[:, :E // 2]
    return pe


def encoder_block_forward(x, p, num_heads, causal=False, key_padding_mask=None, kind="gelu", eps=1e-5,
                          visible_mask=None):
    """Pre-norm: x1 = x + Attn(LN1(x)); y = x1 + FFN(LN2(x1)).
    p: 'ln1.gamma' 'ln1.beta' 'attn.Wq'.. 'attn.bo' 'ln2.gamma' 'ln2.beta' 'ffn.W1'.. 'ffn.b2'."""
    sub = lambda prefix: {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)}
    h1, c1 = layernorm_forward(x, p["ln1.gamma"], p["ln1.beta"], eps)
    a, ca = attention_forward(h1, sub("attn."), num_heads, causal=causal, key_padding_mask=key_padding_mask,
                              visible_mask=visible_mask)
    x1 = x + a
    h2, c2 = layernorm_forward(x1, p["ln2.gamma"], p["ln2.beta"], eps)
    f, cf = feedforward_forward(h2, sub("ffn."), kind)
    return x1 + f, dict(c1=c1, ca=ca, c2=c2, cf=cf, sub=sub)


def encoder_block_backward(dy, cache, p):
    """Returns dx and the grads keyed 'dln1.gamma' .. 'dffn.b2'."""
    sub = cache["sub"]
    g = {}
    dh2, gf = feedforward_backward(dy, cache["cf"], sub("ffn."))
    dl2, g["dln2.gamma"], g["dln2.beta"] = layernorm_backward(dh2, cache["c2"])
    dx1 = dy + dl2
    dh1, ga, _ = attention_backward(dx1, cache["ca"], sub("attn."))
    dl1, g["dln1.gamma"], g["dln1.beta"] = layernorm_backward(dh1, cache["c1"])
    for k, v in gf.items():
        g["dffn." + k[1:]] = v
    for k, v in ga.items():
        if v is not None:
            g["dattn." + k[1:]] = v
    return dx1 + dl1, g


# ---------------------------------------------------------------- Conv1D, 1-D pooling, learned positions
# Channels last: x [B, L, C]. A tap j of output position t reads padded position t*stride + j*dilation
# (padded position q is input position q - padding; outside the input it is padding).


def conv1d_out_len(L, k, stride=1, padding=0, dilation=1):
    return (L + 2 * padding - dilation * (k - 1) - 1) // stride + 1


def conv1d_forward(x, W, b=None, stride=1, padding=0, dilation=1, groups=1):
    """y[b,t,o] = b[o] + sum_{c,j} W[o,c,j] xpad[b, t*stride + j*dilation, g*Cg + c], g = o // (Cout/groups);
    zero padding. W [Cout, Cin/groups, k]. Returns y [B, Lout, Cout] and a cache."""
    B, L, Cin = x.shape
    Cout, Cg, k = W.shape
    OCg = Cout // groups
    Lout = conv1d_out_len(L, k, stride, padding, dilation)
    xp = np.concatenate([np.zeros((B, padding, Cin)), x, np.zeros((B, padding, Cin))], axis=1)
    y = np.zeros((B, Lout, Cout))
    for o in range(Cout):
        g = o // OCg
        for j in range(k):
            start = j * dilation
            seg = xp[:, start:start + stride * (Lout - 1) + 1:stride, g * Cg:(g + 1) * Cg]   # (B, Lout, Cg)
            y[:, :, o] += seg @ W[o, :, j]
    if b is not None:
        y = y + b
    return y, (xp, W, stride, padding, dilation, groups, L)


def conv1d_backward(dy, cache):
    """dx [B,L,Cin], dW [Cout,Cg,k], db [Cout] of conv1d_forward."""
    xp, W, stride, padding, dilation, groups, L = cache
    Cout, Cg, k = W.shape
    OCg = Cout // groups
    Lout = dy.shape[1]
    dxp = np.zeros_like(xp)
    dW = np.zeros_like(W)
    for o in range(Cout):
        g = o // OCg
        for j in range(k):
            start = j * dilation
            sl = slice(start, start + stride * (Lout - 1) + 1, stride)
            seg = xp[:, sl, g * Cg:(g + 1) * Cg]
            dW[o, :, j] = np.einsum("bt,btc->c", dy[:, :, o], seg)
            dxp[:, sl, g * Cg:(g + 1) * Cg] += dy[:, :, o][:, :, None] * W[o, :, j]
    return dxp[:, padding:padding + L], dW, dy.sum(axis=(0, 1))


def _pool_windows(L, k, stride, padding):
    """Per output position, the input positions of its window that lie inside 0..L-1."""
    Lout = (L + 2 * padding - k) // stride + 1
    return [[q - padding for q in range(t * stride, t * stride + k) if 0 <= q - padding < L] for t in range(Lout)]


def maxpool1d_forward(x, k, stride=None, padding=0):
    """y[b,t,c] = max over window t (padding never wins); the first maximum is the one that gets
    the gradient. Returns y and a cache (the argmax positions)."""
    stride = stride or k
    B, L, C = x.shape
    wins = _pool_windows(L, k, stride, padding)
    y = np.zeros((B, len(wins), C))
    arg = np.zeros((B, len(wins), C), dtype=int)
    for t, w in enumerate(wins):
        vals = x[:, w, :]                              # (B, len(w), C)
        first = np.argmax(vals, axis=1)                # first occurrence of the maximum
        arg[:, t, :] = np.asarray(w)[first]
        y[:, t, :] = vals.max(axis=1)
    return y, (arg, x.shape)


def maxpool1d_backward(dy, cache):
    arg, shape = cache
    dx = np.zeros(shape)
    B, Lout, C = dy.shape
    for b in range(B):
        for t in range(Lout):
            for c in range(C):
                dx[b, arg[b, t, c], c] += dy[b, t, c]
    return dx


def avgpool1d_forward(x, k, stride=None, padding=0):
    """y[b,t,c] = (sum over window t) / k: padded positions count as zeros (count_include_pad)."""
    stride = stride or k
    B, L, C = x.shape
    wins = _pool_windows(L, k, stride, padding)
    return np.stack([x[:, w, :].sum(axis=1) / k for w in wins], axis=1)


def avgpool1d_backward(dy, L, k, stride=None, padding=0):
    stride = stride or k
    B, Lout, C = dy.shape
    dx = np.zeros((B, L, C))
    for t, w in enumerate(_pool_windows(L, k, stride, padding)):
        for q in w:
            dx[:, q, :] += dy[:, t, :] / k
    return dx


def learned_posembed_forward(x, W, start=0):
    """y[b,s] = x[b,s] + W[start + s] (W [max_len, E] learned)."""
    return x + W[start:start + x.shape[1]]


def learned_posembed_backward(dy, max_len, start=0):
    """dx = dy; dW rows start.. = sum over the batch of dy, other rows 0."""
    dW = np.zeros((max_len, dy.shape[2]))
    dW[start:start + dy.shape[1]] = dy.sum(axis=0)
    return dy, dW


# ---------------------------------------------------------------- the pre-norm DecoderBlock (seed 001)


def decoder_block_forward(x, memory, p, num_heads, tgt_key_padding_mask=None, memory_key_padding_mask=None,
                          kind="gelu", eps=1e-5):
    """x1 = x + SelfAttn_causal(LN1(x)); x2 = x1 + CrossAttn(LN2(x1), memory); y = x2 + FFN(LN3(x2)).
    p: 'ln1.*' 'self_attn.W*' 'ln2.*' 'cross_attn.W*' 'ln3.*' 'ffn.*' (as encoder_block_forward)."""
    sub = lambda prefix: {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)}
    h1, c1 = layernorm_forward(x, p["ln1.gamma"], p["ln1.beta"], eps)
    a, ca = attention_forward(h1, sub("self_attn."), num_heads, causal=True,
                              key_padding_mask=tgt_key_padding_mask)
    x1 = x + a
    h2, c2 = layernorm_forward(x1, p["ln2.gamma"], p["ln2.beta"], eps)
    c, cc = attention_forward(h2, sub("cross_attn."), num_heads, key_padding_mask=memory_key_padding_mask,
                              context=memory)
    x2 = x1 + c
    h3, c3 = layernorm_forward(x2, p["ln3.gamma"], p["ln3.beta"], eps)
    f, cf = feedforward_forward(h3, sub("ffn."), kind)
    return x2 + f, dict(c1=c1, ca=ca, c2=c2, cc=cc, c3=c3, cf=cf, sub=sub)


def decoder_block_backward(dy, cache, p):
    """Returns dx, dmemory and the grads keyed 'dln1.gamma' .. 'dffn.b2'."""
    sub = cache["sub"]
    g = {}
    dh3, gf = feedforward_backward(dy, cache["cf"], sub("ffn."))
    dl3, g["dln3.gamma"], g["dln3.beta"] = layernorm_backward(dh3, cache["c3"])
    dx2 = dy + dl3
    dh2, gc, dmem = attention_backward(dx2, cache["cc"], sub("cross_attn."))
    dl2, g["dln2.gamma"], g["dln2.beta"] = layernorm_backward(dh2, cache["c2"])
    dx1 = dx2 + dl2
    dh1, ga, _ = attention_backward(dx1, cache["ca"], sub("self_attn."))
    dl1, g["dln1.gamma"], g["dln1.beta"] = layernorm_backward(dh1, cache["c1"])
    for prefix, gg in (("dffn.", gf), ("dcross_attn.", gc), ("dself_attn.", ga)):
        for k, v in gg.items():
            if v is not None:
                g[prefix + k[1:]] = v
    return dx1 + dl1, dmem, g


# ---------------------------------------------------------------- what a torch forward does between layers
# (microformer.graph: a residual, a CLS position, a learned token before the sequence, a sum or a
# maximum over the sequence)


def residual_forward(x, f):
    """y = x + f(x); f a function of x."""
    return x + f(x)


def residual_backward(dy, df):
    """dx = dy + J_f^T dy, df(dy) giving the inner function's input gradient."""
    return dy + df(dy)


def select_position_forward(x, index):
    """x [B,S,E] -> x[:, index] [B,E]."""
    return x[:, index, :]


def select_position_backward(dy, S, index):
    """dx [B,S,E]: dy at position index, zeros elsewhere."""
    B, E = dy.shape
    dx = np.zeros((B, S, E))
    dx[:, index, :] = dy
    return dx


def prepend_token_forward(x, token):
    """x [B,S,E], token [E] -> [B,S+1,E] with the token at position 0 of every example."""
    B, S, E = x.shape
    return np.concatenate([np.broadcast_to(token.reshape(1, 1, E), (B, 1, E)), x], axis=1)


def prepend_token_backward(dy):
    """Returns dx [B,S,E] (positions 1..S) and dtoken [E] (position 0 summed over the batch)."""
    return dy[:, 1:, :], dy[:, 0, :].sum(axis=0)


def seq_sum_forward(x):
    return x.sum(axis=1)


def seq_sum_backward(dy, S):
    return np.repeat(dy[:, None, :], S, axis=1)


def seq_max_forward(x):
    return x.max(axis=1)


def seq_max_backward(dy, x):
    """The gradient goes to the first position holding each maximum."""
    B, S, E = x.shape
    dx = np.zeros_like(x, dtype=np.float64)
    arg = x.argmax(axis=1)                   # the first maximum
    for b in range(B):
        for e in range(E):
            dx[b, arg[b, e], e] = dy[b, e]
    return dx
