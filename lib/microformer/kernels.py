# microformer.kernels: the portable loops, llm.c style.
# Every kernel takes its outputs first, then inputs, then sizes; none allocates.
# Buffers are flat float32 arrays (array('f')); shape comments name their layout.
# kernels_viper.py holds the same functions with the same signatures.
from math import exp, frexp, log as _log, sqrt, tanh
from .actkind import GELU, GELU_TANH, LEAKY_RELU, LEAKY_SLOPE, RELU, SIGMOID, TANH, erf  # noqa: F401
_GELU_C = 0.7978845608028654  # sqrt(2/pi)
_RSQRT2 = 0.7071067811865476  # 1/sqrt(2)
_RSQRT2PI = 0.3989422804014327  # 1/sqrt(2 pi)


def zero(buf, n):
    for i in range(n):
        buf[i] = 0.0


def matmul_forward(out, inp, weight, bias, N, C, OC):
    # out (N, OC) = inp (N, C) . weight (OC, C)^T + bias (OC,); bias may be None
    for n in range(N):
        ib = n * C
        ob = n * OC
        for o in range(OC):
            wb = o * C
            s = 0.0 if bias is None else bias[o]
            for c in range(C):
                s += inp[ib + c] * weight[wb + c]
            out[ob + o] = s


def matmul_forward_kept(out, inp, weight, bias, N, C, OC, keep):
    # matmul_forward; keep (a list of one item, owned by the caller) lets a backend keep a
    # prepared copy of the weight between calls (the viper one does for a few rows); unused here
    matmul_forward(out, inp, weight, bias, N, C, OC)


def matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC):
    # in the forward pass this was out (N, OC) = inp (N, C) . weight (OC, C)^T + bias
    # dinp (N, C) = dout . weight        (written; skipped when None)
    # dweight (OC, C) += dout^T . inp    (accumulated; skipped when None)
    # dbias (OC,) += sum over N of dout  (accumulated; skipped when None)
    if dinp is not None:
        zero(dinp, N * C)
        matmul_backward_input_acc(dinp, dout, weight, N, C, OC)
    if dweight is not None:
        for o in range(OC):
            wb = o * C
            for c in range(C):
                s = 0.0
                di = o
                ii = c
                for n in range(N):
                    s += dout[di] * inp[ii]
                    di += OC
                    ii += C
                dweight[wb + c] += s
    if dbias is not None:
        for o in range(OC):
            s = 0.0
            di = o
            for n in range(N):
                s += dout[di]
                di += OC
            dbias[o] += s


def matmul_backward_input(dinp, dout, weight, N, C, OC):
    # matmul_backward's input gradient alone: dinp (N, C) = dout (N, OC) . weight (OC, C) (written)
    matmul_backward(dinp, None, None, dout, None, weight, N, C, OC)


def matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC):
    # matmul_backward's weight gradients alone: dweight (OC, C) += dout^T . inp; dbias (OC,) +=
    # sum_n dout (None: skipped). With matmul_backward_input: the same values as matmul_backward,
    # in calls of few arguments (a caller's frame stays small: see kernels_viper)
    matmul_backward(None, dweight, dbias, dout, inp, None, N, C, OC)


def matmul_backward_input_acc(dinp, dout, weight, N, C, OC):
    # dinp (N, C) += dout (N, OC) . weight (OC, C): a second projection's input gradient,
    # accumulated (self-attention's x feeds Q, K and V)
    for n in range(N):
        ib = n * C
        ob = n * OC
        for c in range(C):
            s = 0.0
            wi = c
            for o in range(OC):
                s += dout[ob + o] * weight[wi]
                wi += C
            dinp[ib + c] += s


def q8_matmul_forward(out, inp, q, scale, bias, N, C, OC):
    # out (N, OC) = inp (N, C) . W^T + bias (OC,), W = q (OC, C) * scale (OC,): an int8 weight
    # (array('b')) with one float scale per output row (quant.py); bias may be None
    for n in range(N):
        ib = n * C
        ob = n * OC
        for o in range(OC):
            wb = o * C
            s = 0.0
            for c in range(C):
                s += inp[ib + c] * q[wb + c]
            s *= scale[o]
            out[ob + o] = s if bias is None else s + bias[o]


def q8_matmul_backward_input(dinp, dout, q, scale, N, C, OC, acc):
    # in the forward pass this was out = inp . W^T, W = q * scale (q8_matmul_forward)
    # dinp (N, C) = dout (N, OC) . W, written (acc 0) or added (acc 1)
    for n in range(N):
        ib = n * C
        ob = n * OC
        for c in range(C):
            s = 0.0
            wi = c
            for o in range(OC):
                s += dout[ob + o] * scale[o] * q[wi]
                wi += C
            dinp[ib + c] = dinp[ib + c] + s if acc else s


def attention_forward(out, att, q, k, v, mask, B, Tq, Tk, C, NH, causal):
    # q (B, Tq, C), k v (B, Tk, C): projected queries, keys, values; head h owns
    #   columns h*hs .. (h+1)*hs of C, hs = C // NH
    # att (B, NH, Tq, Tk): softmax weights, written; masked weights are exactly 0
    # out (B, Tq, C): per-head context A . V, heads concatenated
    # mask (B, Tk) bytes-like, nonzero = padded key; or None
    # causal: nonzero -> query t sees keys j <= t + (Tk - Tq)
    # a query row with no visible key gets weights 0 and output 0
    hs = C // NH
    scale = 1.0 / sqrt(hs)
    shift = Tk - Tq
    for b in range(B):
        for t in range(Tq):
            qb = (b * Tq + t) * C
            last = _last_key(t, Tk, shift, causal)
            for h in range(NH):
                ab = ((b * NH + h) * Tq + t) * Tk
                qh = qb + h * hs
                # pass 1: scaled scores (as stored, float32) and their max over visible keys
                m = 0.0
                seen = 0
                over = 0
                for j in range(Tk):
                    if j > last or (mask is not None and mask[b * Tk + j]):
                        att[ab + j] = 0.0
                        continue
                    att[ab + j] = _dot(q, qh, k, (b * Tk + j) * C + h * hs, hs) * scale
                    s = att[ab + j]
                    if s - s != 0.0:
                        over = 1
                    if not seen or s > m:
                        m = s
                    seen = 1
                # pass 2: exponentials of score - max (<= 1; the max gives 1, so the sum is >= 1)
                if seen:
                    if over:
                        # a score beyond float32 (inputs ~1e20): recomputed at 2^-128 scale
                        # (NaN inputs stay NaN there)
                        total = _softmax_rescored(att, ab, q, qh, k, b * Tk * C + h * hs, C,
                                                  last + 1, mask, b * Tk, hs, scale)
                    else:
                        total = 0.0
                        for j in range(last + 1):
                            if mask is not None and mask[b * Tk + j]:
                                continue
                            e = exp(att[ab + j] - m)
                            att[ab + j] = e
                            total += e
                    inv = 1.0 / total
                    for j in range(last + 1):
                        att[ab + j] *= inv
                # pass 3: context = sum_j att[j] * v[j]
                for i in range(hs):
                    out[qh + i] = _wsum(att, ab, v, b * Tk * C + h * hs + i, C, last + 1)


def _dot(a, ai, b, bi, n):
    # sum_i a[ai + i] * b[bi + i] for i < n, added in order from 0.0 (the attention scores)
    s = 0.0
    for i in range(n):
        s += a[ai + i] * b[bi + i]
    return s


def _wsum(w, wi, v, vi, C, n):
    # sum_j w[wi + j] * v[vi + j C] for j < n, added in order from 0.0 (a context entry)
    s = 0.0
    for j in range(n):
        s += w[wi + j] * v[vi]
        vi += C
    return s


def _dv_add(dv, v, vh, dout, qh, a, hs):
    # dv[vh + i] += a * dout[qh + i] for i < hs; returns dout[qh:] . v[vh:] (dA of the key)
    s = 0.0
    for i in range(hs):
        g = dout[qh + i]
        s += g * v[vh + i]
        dv[vh + i] += a * g
    return s


def _dq_dk_add(dq, dk, q, k, qh, kh, ds, hs):
    # dq[qh:] += ds * k[kh:]; dk[kh:] += ds * q[qh:] (hs entries): one key's score gradient
    for i in range(hs):
        dq[qh + i] += ds * k[kh + i]
        dk[kh + i] += ds * q[qh + i]


def _softmax_back_row(dq, dk, q, k, att, ab, da, dot, scale, qh, kb, C, n, hs):
    # dS_j = A_j (dA_j - dot) * scale for the keys j < n with A_j = att[ab + j] != 0 (dA_j =
    # da[j]): dq[qh:] += dS_j k_j and dk_j += dS_j q, with k_j (and dk_j) at kb + j C
    for j in range(n):
        a = att[ab + j]
        if a == 0.0:
            continue
        ds = a * (da[j] - dot) * scale
        _dq_dk_add(dq, dk, q, k, qh, kb + j * C, ds, hs)


def _zero_qkv(dq, dk, dv, nq, nkv):
    # the attention gradients zeroed before they are accumulated: dq (nq,), dk and dv (nkv,)
    zero(dq, nq)
    zero(dk, nkv)
    zero(dv, nkv)


def _softmax_rescored(att, ab, q, qh, k, kb, kstride, n, mask, mb, hs, scale):
    # The rare path of a row whose scores overflow float32 (|q.k| > 3.4e38, e.g. inputs ~1e20):
    # each score is recomputed from q and k scaled by 2^-64 (so q.k by 2^-128, finite), and
    # exp((s - max) * 2^128) is written for keys j < n not masked (mask[mb + j]); the sum is
    # returned (>= 1: the max contributes 1). Scores that far apart give weights 1 and 0.
    t = 5.421010862427522e-20       # 2^-64
    ms = 0.0
    seen = 0
    for j in range(n):
        if mask is not None and mask[mb + j]:
            continue
        kh = kb + j * kstride
        s = 0.0
        for i in range(hs):
            s += (q[qh + i] * t) * (k[kh + i] * t)
        att[ab + j] = s * scale
        s = att[ab + j]                 # as stored (float32): the max below is one of these
        if not seen or s > ms:
            ms = s
        seen = 1
    total = 0.0
    big = 1.8446744073709552e19     # 2^64
    for j in range(n):
        if mask is not None and mask[mb + j]:
            continue
        e = exp(((att[ab + j] - ms) * big) * big)
        att[ab + j] = e
        total += e
    return total


def attention_backward(dq, dk, dv, scratch, dout, att, q, k, v, B, Tq, Tk, C, NH):
    # in the forward pass this was out = softmax(q.k^T * scale (+mask)) . v, per head
    # dq (B, Tq, C), dk dv (B, Tk, C): written
    # scratch (>= Tk,): one row of dA
    # dout (B, Tq, C): gradient of the concatenated context
    # att (B, NH, Tq, Tk): the forward's weights (0 where masked, so masked keys get no gradient)
    hs = C // NH
    scale = 1.0 / sqrt(hs)
    _zero_qkv(dq, dk, dv, B * Tq * C, B * Tk * C)
    for b in range(B):
        for t in range(Tq):
            qb = (b * Tq + t) * C
            for h in range(NH):
                ab = ((b * NH + h) * Tq + t) * Tk
                qh = qb + h * hs
                # dA[j] = dctx . v[j];  dv[j] += A[j] * dctx;  dot = sum_j dA[j] * A[j]
                dot = 0.0
                for j in range(Tk):
                    a = att[ab + j]
                    s = _dv_add(dv, v, (b * Tk + j) * C + h * hs, dout, qh, a, hs)
                    scratch[j] = s
                    dot += s * a
                # softmax backward: dS = A * (dA - dot) * scale; dq += dS . k; dk += dS * q
                _softmax_back_row(dq, dk, q, k, att, ab, scratch, dot, scale, qh, b * Tk * C + h * hs, C, Tk, hs)


def act_forward(out, inp, N, kind):
    # out (N,) = f(inp (N,))
    # NaN propagates as in torch (relu(nan) = nan)
    if kind == RELU:
        for i in range(N):
            x = inp[i]
            out[i] = 0.0 if x <= 0.0 else x
    elif kind == LEAKY_RELU:
        for i in range(N):
            x = inp[i]
            out[i] = x if x > 0.0 else LEAKY_SLOPE * x
    elif kind == GELU:
        # 0.5 x (1 + erf(x / sqrt 2))
        for i in range(N):
            x = inp[i]
            out[i] = 0.5 * x * (1.0 + erf(x * _RSQRT2))
    elif kind == GELU_TANH:
        # tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        for i in range(N):
            x = inp[i]
            out[i] = 0.5 * x * (1.0 + tanh(_GELU_C * (x + 0.044715 * x * x * x)))
    elif kind == TANH:
        for i in range(N):
            out[i] = tanh(inp[i])
    elif kind == SIGMOID:
        for i in range(N):
            x = inp[i]
            if x >= 0.0:
                out[i] = 1.0 / (1.0 + exp(-x))
            else:
                e = exp(x)
                out[i] = e / (1.0 + e)
    else:
        raise ValueError("act_forward: unknown activation kind %r" % kind)


def act_backward(dinp, dout, inp, out, N, kind):
    # in the forward pass this was out = f(inp); dinp (N,) = f'(inp) * dout (written)
    # as torch: relu passes dout where not inp <= 0 (a NaN inp included), leaky_relu where inp > 0
    if kind == RELU:
        for i in range(N):
            dinp[i] = 0.0 if inp[i] <= 0.0 else dout[i]
    elif kind == LEAKY_RELU:
        for i in range(N):
            dinp[i] = dout[i] if inp[i] > 0.0 else LEAKY_SLOPE * dout[i]
    elif kind == GELU:
        # d/dx x Phi(x) = Phi(x) + x phi(x)
        for i in range(N):
            x = inp[i]
            dinp[i] = dout[i] * (0.5 * (1.0 + erf(x * _RSQRT2)) + x * _RSQRT2PI * exp(-0.5 * x * x))
    elif kind == GELU_TANH:
        for i in range(N):
            x = inp[i]
            th = tanh(_GELU_C * (x + 0.044715 * x * x * x))
            dth = (1.0 - th * th) * _GELU_C * (1.0 + 3.0 * 0.044715 * x * x)
            dinp[i] = dout[i] * (0.5 * (1.0 + th) + 0.5 * x * dth)
    elif kind == TANH:
        for i in range(N):
            y = out[i]
            dinp[i] = dout[i] * (1.0 - y * y)
    elif kind == SIGMOID:
        for i in range(N):
            y = out[i]
            dinp[i] = dout[i] * y * (1.0 - y)
    else:
        raise ValueError("act_backward: unknown activation kind %r" % kind)


def avgpool_forward(out, inp, B, T, C):
    # out (B, C) = mean over T of inp (B, T, C)
    inv = 1.0 / T
    for b in range(B):
        for c in range(C):
            s = 0.0
            ii = b * T * C + c
            for t in range(T):
                s += inp[ii]
                ii += C
            out[b * C + c] = s * inv


def avgpool_backward(dinp, dout, B, T, C):
    # dinp (B, T, C) = dout (B, C) / T, broadcast over T (written)
    inv = 1.0 / T
    for b in range(B):
        for c in range(C):
            g = dout[b * C + c] * inv
            ii = b * T * C + c
            for t in range(T):
                dinp[ii] = g
                ii += C


def crossentropy_softmax(dlogits, logits, labels, B, V):
    # logits (B, V), labels (B,) ints in [0, V)
    # returns the mean over B of -log softmax(logits)[label]
    # dlogits (B, V) = (softmax(logits) - onehot(label)) / B (written)
    total = 0.0
    invb = 1.0 / B
    for b in range(B):
        lb = b * V
        m = logits[lb]
        for i in range(1, V):
            if logits[lb + i] > m:
                m = logits[lb + i]
        z = 0.0
        for i in range(V):
            e = exp(logits[lb + i] - m)
            dlogits[lb + i] = e
            z += e
        y = labels[b]
        total += m + _log(z) - logits[lb + y]
        invz = 1.0 / z
        for i in range(V):
            dlogits[lb + i] = dlogits[lb + i] * invz * invb
        dlogits[lb + y] -= invb
    return total * invb


def mse(dpred, pred, target, N):
    # returns mean over N of (pred - target)^2; dpred (N,) = 2 (pred - target) / N (written)
    total = 0.0
    k = 2.0 / N
    for i in range(N):
        d = pred[i] - target[i]
        total += d * d
        dpred[i] = k * d
    return total / N


def sum_squares(g, n):
    s = 0.0
    for i in range(n):
        x = g[i]
        s += x * x
    return s


def max_exponent(buf, n):
    # the largest exponent field (0 .. 255) of buf[0 .. n) as float32 values: every |x| is below
    # 2^(e - 126); 255 when one is NaN or inf (the optimizer's bound, optim.py)
    e = 0
    for i in range(n):
        x = buf[i]
        if x - x != 0.0:
            return 255
        if x != 0.0:
            f = frexp(x)[1] + 126          # |x| = m 2^f', m in [0.5, 1): field f' + 126
            if f > e:
                e = f
    return e


def max_exponent_pairs(params, j):
    # max_exponent over the weights (j = 0) or the gradients (j = 1) of (param, grad) Tensor pairs
    e = 0
    for pair in params:
        t = pair[j]
        e = max(e, max_exponent(t.data, t.size))
    return e


def scale_inplace(g, n, factor):
    for i in range(n):
        g[i] *= factor


def sgd_update(p, g, buf, n, lr, momentum, weight_decay):
    # p (n,) -= lr * step, step = g + wd p, with momentum buf = momentum buf + step
    for i in range(n):
        d = g[i]
        if weight_decay:
            d += weight_decay * p[i]
        if buf is not None:
            d += momentum * buf[i]
            buf[i] = d
        p[i] -= lr * d


def adam_update(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2, decoupled):
    # Adam (decoupled: AdamW). bc1 = 1 - beta1^t, bc2 = 1 - beta2^t for step t.
    # m, v (n,): first and second moment estimates, updated in place
    a = lr / bc1
    rb2 = 1.0 / bc2
    for i in range(n):
        d = g[i]
        if weight_decay:
            if decoupled:
                p[i] -= lr * weight_decay * p[i]
            else:
                d += weight_decay * p[i]
        mi = beta1 * m[i] + (1.0 - beta1) * d
        vi = beta2 * v[i] + (1.0 - beta2) * d * d
        m[i] = mi
        v[i] = vi
        p[i] -= a * mi / (sqrt(vi * rb2) + eps)



# The whole optimizer step (optim.py): every tensor of the model in one call, written into shadow
# buffers so that a refused step changes nothing. params: `count` (param, grad) Tensor pairs;
# every other buffer holds one value per parameter, the tensors end to end (N values).
# Returns -1, or the index of the first pair whose gradient, weight or new value is not finite.

def _finite(x):
    return x - x == 0.0


def _stretch(dst, src, o, n, so):
    # dst[o : o + n] = src[so : so + n]; a view of dst's stretch (a whole-step kernel's shadow)
    for i in range(n):
        dst[o + i] = src[so + i]
    return memoryview(dst)[o:o + n]


def _all_finite(*bufs):
    for b in bufs:
        if b is not None:
            for x in b:
                if not _finite(x):
                    return False
    return True


STEP_FROZEN = -3        # adam_step / sgd_step (every backend): a pair's gradient is None (frozen)


def _frozen(params):
    # True when a (param, grad) pair has no grad buffer (a parameter frozen after the optimizer
    # was made): the whole-step kernels then answer STEP_FROZEN and write nothing
    for pair in params:
        if pair[1].data is None:
            return True
    return False


def _whole_step(stretch, finite, newp, params, count, news, olds, run):
    # the whole-step walk over the (param, grad) pairs, through a module's stretch and finite (the
    # portable kernels here, kernels_numpy's over NumPy views): each pair's weight and states
    # (olds, e.g. the moments) copied into its stretch of the shadows (newp, news), updated there
    # by run(P, g, views, n), then checked: -1, or the first pair with a non-finite value
    o = 0
    bad = -1
    for k in range(count):
        g = params[k][1].data
        n = len(g)
        P = stretch(newp, params[k][0].data, o, n, 0)
        views = [stretch(news[i], olds[i], o, n, o) for i in range(len(olds))]
        run(P, g, views, n)
        if bad < 0 and not (finite(g, P) and finite(*views)):
            bad = k
        o += n
    return bad


def _adam_step(update, stretch, finite, newp, newm, newv, params, m, v, count, lr, beta1, beta2, eps,
               weight_decay, t, decoupled):
    bc1 = 1.0 - beta1 ** t
    bc2 = 1.0 - beta2 ** t

    def run(P, g, s, n):
        update(P, g, s[0], s[1], n, lr, beta1, beta2, eps, weight_decay, bc1, bc2, decoupled)
    return _whole_step(stretch, finite, newp, params, count, (newm, newv), (m, v), run)


def _sgd_step(update, stretch, finite, newp, newbuf, params, buf, count, lr, momentum, weight_decay):
    def run(P, g, s, n):
        update(P, g, s[0] if s else None, n, lr, momentum, weight_decay)
    return _whole_step(stretch, finite, newp, params, count, () if buf is None else (newbuf,),
                       () if buf is None else (buf,), run)


def adam_step(newp, news, params, olds, hyper):
    # newp, news = [newm, newv] (N,) = adam_update's p, m, v of every (param, grad) pair for step t,
    # the pairs' stretches one after another; olds = [m, v] (N,): the moments (read);
    # hyper = [lr, beta1, beta2, eps, weight_decay, decoupled, t] (a list the optimizer keeps: the
    # call passes five references). Returns -1, or the index of the first pair whose gradient or
    # new weight or moment is not finite, or STEP_FROZEN
    if _frozen(params):
        return STEP_FROZEN
    lr, beta1, beta2, eps, weight_decay, decoupled, t = hyper[:7]     # (an 8th: viper's size record)
    return _adam_step(adam_update, _stretch, _all_finite, newp, news[0], news[1], params, olds[0], olds[1],
                      len(params), lr, beta1, beta2, eps, weight_decay, t, decoupled)


def sgd_step(newp, news, params, olds, hyper):
    # newp (N,), news = [newbuf] (N,) = sgd_update's p and buf of every pair (olds = [buf] (N,)
    # read; both [] for no momentum); hyper = [lr, momentum, weight_decay]. Returns -1 or the
    # first pair with a non-finite value, or STEP_FROZEN
    if _frozen(params):
        return STEP_FROZEN
    lr, momentum, weight_decay = hyper[:3]                 # (a 4th: viper's size record)
    return _sgd_step(sgd_update, _stretch, _all_finite, newp, news[0] if news else None, params,
                     olds[0] if olds else None, len(params), lr, momentum, weight_decay)


def _commit(stretch, params, newp, count):
    # each weight of the `count` (param, grad) pairs = its stretch of newp (N,), through a module's
    # stretch (here and in kernels_numpy)
    o = 0
    for k in range(count):
        p = params[k][0].data
        n = len(p)
        stretch(p, newp, 0, n, o)
        o += n


def params_commit(params, newp, count, seen=None):
    # the weights of the `count` (param, grad) pairs = their stretches of newp (N,), bit for bit
    # (seen: the viper backend's record of checked sizes, unused here)
    _commit(_stretch, params, newp, count)


# ---------------------------------------------------------------- attention family
# LayerNorm, residual adds, embedding lookup, sinusoidal positions, the KV cache and the
# attention stages the golden vectors check. Same conventions: outputs first, no allocation.


def add_forward(out, a, b, n):
    # out (n,) = a (n,) + b (n,)   (a residual connection; out may be a or b)
    for i in range(n):
        out[i] = a[i] + b[i]


def layernorm_forward(out, inp, ln, N, C, eps):
    # ln = [weight, bias, mean, rstd, ...]: the layer's arrays, one argument (a call of few
    # arguments keeps the calling layer's frame off the heap)
    # inp (N, C): rows normalised over C; weight bias (C,): gamma, beta
    # out (N, C) = (inp - mean) * rstd * weight + bias
    # mean rstd (N,): saved for the backward pass, rstd = 1 / sqrt(var + eps) (biased var)
    weight = ln[0]
    bias = ln[1]
    mean = ln[2]
    rstd = ln[3]
    invc = 1.0 / C
    for n in range(N):
        ib = n * C
        m = 0.0
        for c in range(C):
            m += inp[ib + c]
        m *= invc
        v = 0.0
        for c in range(C):
            d = inp[ib + c] - m
            v += d * d
        if v - v != 0.0:
            # the squares overflowed (finite inputs ~1e20 with single-precision floats): the
            # same statistics from the row divided by its largest |x| (NaN / inf inputs: NaN)
            a = 0.0
            for c in range(C):
                x = abs(inp[ib + c])
                if x > a:
                    a = x
            if a > 0.0 and a - a == 0.0:
                ia = 1.0 / a
                ms = 0.0
                for c in range(C):
                    ms += inp[ib + c] * ia
                ms *= invc
                vs = 0.0
                for c in range(C):
                    d = inp[ib + c] * ia - ms
                    vs += d * d
                rs = 1.0 / sqrt(vs * invc + eps * ia * ia)
                mean[n] = ms * a
                rstd[n] = rs * ia
                for c in range(C):
                    out[ib + c] = (inp[ib + c] * ia - ms) * rs * weight[c] + bias[c]
                continue
        s = 1.0 / sqrt(v * invc + eps)
        mean[n] = m
        rstd[n] = s
        for c in range(C):
            out[ib + c] = (inp[ib + c] - m) * s * weight[c] + bias[c]


def layernorm_backward(dinp, dout, inp, ln, N, C):
    # ln = [weight, bias, mean, rstd, dweight, dbias] (as layernorm_forward's, plus the grads)
    # in the forward pass this was out = xhat * weight + bias, xhat = (inp - mean) * rstd
    # dinp (N, C) = rstd * (dnorm - mean_c(dnorm) - xhat * mean_c(dnorm * xhat)), dnorm = dout * weight
    # dweight (C,) += sum_n dout * xhat;  dbias (C,) += sum_n dout   (skipped when None)
    weight = ln[0]
    mean = ln[2]
    rstd = ln[3]
    dweight = ln[4]
    dbias = ln[5]
    invc = 1.0 / C
    for n in range(N):
        ib = n * C
        m = mean[n]
        s = rstd[n]
        a = 0.0
        bsum = 0.0
        for c in range(C):
            xh = (inp[ib + c] - m) * s
            dn = dout[ib + c] * weight[c]
            a += dn
            bsum += dn * xh
        a *= invc
        bsum *= invc
        for c in range(C):
            g = dout[ib + c]
            xh = (inp[ib + c] - m) * s
            if dweight is not None:
                dweight[c] += g * xh
            if dbias is not None:
                dbias[c] += g
            dinp[ib + c] = s * (g * weight[c] - a - xh * bsum)


def embedding_forward(out, ids, table, N, C, V):
    # ids (N,): token ids stored as floats; table (V, C); out (N, C) = table[ids]
    # returns -1, or the index of the first id that is not an int in [0, V) (that row is not written)
    for n in range(N):
        v = ids[n]
        if not (0.0 <= v < V):
            return n
        t = int(v)
        if t != v:
            return n
        tb = t * C
        ob = n * C
        for c in range(C):
            out[ob + c] = table[tb + c]
    return -1


def embedding_backward(dtable, dout, ids, N, C):
    # in the forward pass this was out (N, C) = table[ids]; dtable (V, C) += dout rows (accumulated)
    for n in range(N):
        tb = int(ids[n]) * C
        ob = n * C
        for c in range(C):
            dtable[tb + c] += dout[ob + c]


def posenc_table(pe, L, C):
    # pe (L, C): pe[p, 2i] = sin(p * div_i), pe[p, 2i+1] = cos(p * div_i), div_i = exp(-2i ln(10000) / C)
    # (the loop is sinusoid.py's, loaded here on first use: PositionalEncoding runs it without
    # loading this module)
    from .sinusoid import sinusoid
    sinusoid(pe, L, C)


def posenc_forward(out, inp, pe, B, S, C, start):
    # out (B, S, C) = inp (B, S, C) + pe[start + s] (pe (L, C), L >= start + S)
    for b in range(B):
        for s in range(S):
            ib = (b * S + s) * C
            pb = (start + s) * C
            for c in range(C):
                out[ib + c] = inp[ib + c] + pe[pb + c]


def kv_store(cache, src, B, S, L, C, pos):
    # cache (B, L, C)[:, pos:pos+S, :] = src (B, S, C)
    for b in range(B):
        for s in range(S):
            cb = (b * L + pos + s) * C
            sb = (b * S + s) * C
            for c in range(C):
                cache[cb + c] = src[sb + c]


def attention_decode(out, att, q, kc, vc, B, T, L, C, NH):
    # one causal query per sequence against the first T cached keys (itself included):
    # q (B, C): the new token's query; kc vc (B, L, C): cached keys/values, rows 0..T-1 valid
    # att (B, NH, L): weights, columns 0..T-1 written; out (B, C): heads concatenated
    # the same operations in the same order as attention_forward with causal=1
    hs = C // NH
    scale = 1.0 / sqrt(hs)
    for b in range(B):
        for h in range(NH):
            ab = (b * NH + h) * L
            qh = b * C + h * hs
            m = 0.0
            over = 0
            for j in range(T):
                att[ab + j] = _dot(q, qh, kc, (b * L + j) * C + h * hs, hs) * scale
                s = att[ab + j]
                if s - s != 0.0:
                    over = 1
                if j == 0 or s > m:
                    m = s
            if over:
                total = _softmax_rescored(att, ab, q, qh, kc, b * L * C + h * hs, C, T, None, 0, hs, scale)
            else:
                total = 0.0
                for j in range(T):
                    e = exp(att[ab + j] - m)
                    att[ab + j] = e
                    total += e
            inv = 1.0 / total
            for j in range(T):
                att[ab + j] *= inv
            for i in range(hs):
                out[qh + i] = _wsum(att, ab, vc, b * L * C + h * hs + i, C, T)


def attention_scores(out, q, k, mask, B, Tq, Tk, C, NH, scale, causal, hidden):
    # out (B, NH, Tq, Tk) = (q_h . k_h) * scale; a hidden key (padded, or future when causal)
    # gets `hidden` instead (e.g. -inf). The stages the golden vectors check, not the fast path.
    hs = C // NH
    shift = Tk - Tq
    for b in range(B):
        for h in range(NH):
            for t in range(Tq):
                qh = (b * Tq + t) * C + h * hs
                ob = ((b * NH + h) * Tq + t) * Tk
                for j in range(Tk):
                    if (causal and j > t + shift) or (mask is not None and mask[b * Tk + j]):
                        out[ob + j] = hidden
                        continue
                    out[ob + j] = _dot(q, qh, k, (b * Tk + j) * C + h * hs, hs) * scale


def argmax(buf, off, n):
    # index i < n of the largest buf[off + i], the first one on ties; NaN is never larger (a NaN
    # first element stays the answer, as with `>` comparisons)
    best = 0
    for i in range(1, n):
        if buf[off + i] > buf[off + best]:
            best = i
    return best


def gather_rows(dst, src, idx, start, B, F):
    # dst (B, F): row k = src row idx[start + k] (src (*, F); idx a list of row numbers)
    for k in range(B):
        i = idx[start + k] * F
        o = k * F
        for f in range(F):
            dst[o + f] = src[i + f]


# ---------------------------------------------------------------- guards of the training step
# What keeps NaN / inf out of the weights (finite.py, optim.py): a scan and a copy.

def first_nonfinite(buf, n):
    # index of the first NaN or +-inf in buf (n,), or -1 (x - x is 0.0 for every finite x)
    for i in range(n):
        x = buf[i]
        if x - x != 0.0:
            return i
    return -1


def copy(dst, src, n):
    # dst (n,) = src (n,), bit for bit (NaN payloads and -0.0 included)
    if len(dst) == n and len(src) == n:
        dst[:] = src
    else:
        for i in range(n):
            dst[i] = src[i]


# ---------------------------------------------------------------- convolution and 1-D pooling
# Conv1D, MaxPool1D, AvgPool1D over channels-last buffers (B, L, C), and the learned positional
# embedding's table gradient. Same conventions: outputs first, sizes last, no allocation.
# Output length (torch's): Lout = (L + 2 pad - dil (KS - 1) - 1) // stride + 1 (pooling: dil = 1).
# Positions outside 0..L-1 are padding: 0 for convolution and average pooling (counted in the
# average's divisor KS, as torch's count_include_pad=True), -inf for max pooling.


def _conv_walk(out, dinp, dweight, dbias, dout, inp, weight, bias, conv):
    # the walk both directions of the convolution share: every output (b, t, o), every tap j whose
    # input position p = t stride + j dil - pad lies in 0..L-1, the Cg channels of o's group g.
    # out not None: the forward (out written); otherwise the backward (dout read; dinp, dweight,
    # dbias accumulated where not None). conv = (B, L, C, Lout, OC, KS, stride, pad, dil, groups): the
    # sizes, one tuple (the kernels' own arguments stay positional: the viper and C versions fix them)
    B, L, C, Lout, OC, KS, stride, pad, dil, groups = conv
    Cg = C // groups
    OCg = OC // groups
    for b in range(B):
        for t in range(Lout):
            ob = (b * Lout + t) * OC
            p0 = t * stride - pad
            for o in range(OC):
                ib = b * L * C + (o // OCg) * Cg
                wb = o * Cg * KS
                if out is not None:
                    s = 0.0 if bias is None else bias[o]
                else:
                    g = dout[ob + o]
                    if dbias is not None:
                        dbias[o] += g
                for j in range(KS):
                    p = p0 + j * dil
                    if p < 0 or p >= L:
                        continue
                    xi = ib + p * C
                    wi = wb + j
                    if out is not None:
                        for c in range(Cg):
                            s += weight[wi] * inp[xi + c]
                            wi += KS
                        continue
                    for c in range(Cg):
                        if dinp is not None:
                            dinp[xi + c] += g * weight[wi]
                        if dweight is not None:
                            dweight[wi] += g * inp[xi + c]
                        wi += KS
                if out is not None:
                    out[ob + o] = s


def conv1d_forward(out, inp, weight, bias, B, L, C, Lout, OC, KS, stride, pad, dil, groups):
    # inp (B, L, C); weight (OC, C/groups, KS) as torch's Conv1d; bias (OC,) or None
    # out (B, Lout, OC): out[b,t,o] = bias[o] + sum_{c, j} weight[o,c,j] inp[b, t stride + j dil - pad, g Cg + c]
    #   Cg = C / groups input channels per group, g = o // (OC / groups) the group of output channel o
    _conv_walk(out, None, None, None, None, inp, weight, bias, (B, L, C, Lout, OC, KS, stride, pad, dil, groups))


def conv1d_backward(dinp, dweight, dbias, dout, inp, weight, B, L, C, Lout, OC, KS, stride, pad, dil, groups):
    # in the forward pass this was out[b,t,o] = bias[o] + sum_{c,j} weight[o,c,j] inp[b, t stride + j dil - pad, g Cg + c]
    # dinp (B, L, C) = the transposed convolution of dout (written; skipped when None)
    # dweight (OC, Cg, KS) += sum_{b,t} dout[b,t,o] inp[b, p(t,j), g Cg + c]  (accumulated; skipped when None)
    # dbias (OC,) += sum_{b,t} dout[b,t,o]                                  (accumulated; skipped when None)
    if dinp is not None:
        zero(dinp, B * L * C)
    _conv_walk(None, dinp, dweight, dbias, dout, inp, weight, None, (B, L, C, Lout, OC, KS, stride, pad, dil, groups))


def _pool_walk(dst, idx, src, pool, back):
    # the window walk every 1-D pooling kernel shares: for each (b, t, c), the positions lo..hi-1 of
    # window t (t stride - pad .. + KS - 1) that lie inside 0..L-1.
    # idx not None: max pooling, dst (B, Lout, C) = the window's max of src, idx its position (the
    #   first on ties, as torch); back: dst (B, L, C) += src[b,t,c] / KS over window t; otherwise
    #   average pooling, dst (B, Lout, C) = the window's sum of src / KS (padding counts as 0)
    B, L, C, Lout, KS, stride, pad = pool
    inv = 1.0 / KS
    for b in range(B):
        for t in range(Lout):
            p0 = t * stride - pad
            lo = p0 if p0 > 0 else 0
            hi = p0 + KS if p0 + KS < L else L
            ob = (b * Lout + t) * C
            for c in range(C):
                ii = (b * L + lo) * C + c
                if idx is not None:
                    best = src[ii]
                    at = lo
                    for p in range(lo + 1, hi):
                        ii += C
                        if src[ii] > best:
                            best = src[ii]
                            at = p
                    dst[ob + c] = best
                    idx[ob + c] = at
                elif back:
                    g = src[ob + c] * inv
                    for p in range(lo, hi):
                        dst[ii] += g
                        ii += C
                else:
                    s = 0.0
                    for p in range(lo, hi):
                        s += src[ii]
                        ii += C
                    dst[ob + c] = s * inv


def maxpool1d_forward(out, idx, inp, pool):
    # pool = (B, L, C, Lout, KS, stride, pad): the sizes (kernel_table.py: a pool)
    # out (B, Lout, C) = max over the window t stride - pad .. + KS - 1 (inside 0..L-1) of inp (B, L, C)
    # idx (B, Lout, C) ints: the position (0..L-1) of the maximum, the first one on ties (as torch)
    # a window must hold a real position (pad <= KS // 2 guarantees it)
    _pool_walk(out, idx, inp, pool, False)


def maxpool1d_backward(dinp, dout, idx, pool):
    # in the forward pass this was out[b,t,c] = inp[b, idx[b,t,c], c]
    # dinp (B, L, C): dout routed to the argmax positions, summed where windows share one (written)
    B, L, C, Lout, _, _, _ = pool
    zero(dinp, B * L * C)
    for b in range(B):
        for t in range(Lout):
            ob = (b * Lout + t) * C
            for c in range(C):
                dinp[(b * L + idx[ob + c]) * C + c] += dout[ob + c]


def avgpool1d_forward(out, inp, pool):
    # out (B, Lout, C) = (1/KS) sum over the window t stride - pad .. + KS - 1 of inp (padding counts as 0)
    _pool_walk(out, None, inp, pool, False)


def avgpool1d_backward(dinp, dout, pool):
    # in the forward pass this was out[b,t,c] = (1/KS) sum_{p in window t} inp[b,p,c]
    # dinp (B, L, C) = sum over the windows holding p of dout / KS (written)
    zero(dinp, pool[0] * pool[1] * pool[2])
    _pool_walk(dinp, None, dout, pool, True)


def posembed_backward(dtable, dout, B, S, C, start):
    # in the forward pass this was out (B, S, C) = inp + table[start + s] (posenc_forward)
    # dtable (L, C): rows start .. start + S - 1 += sum over B of dout (accumulated)
    for b in range(B):
        for s in range(S):
            ob = (b * S + s) * C
            tb = (start + s) * C
            for c in range(C):
                dtable[tb + c] += dout[ob + c]


# ---------------------------------------------------------------- dropout and tiled attention
# Dropout applies a keep mask (bytes, 1 = kept) drawn by dropout_mask (tensor.Rng.keep_mask); the
# attention-weight dropout applies one to the softmax weights on the fly. The tiled attention
# (Attention(..., kv_tile=T)) computes softmax(q.k^T * scale + mask) . v over tiles of T keys with
# an online softmax: per query row and head it keeps the running max m and sum l of exp(s - m)
# (stats, stored for the backward, which recomputes the weights key by key), never the
# (B, NH, Tq, Tk) weights. Same conventions: outputs first, sizes last, no allocation.


def dropout_mask(keep, state, n, threshold):
    # keep (n,) bytes: 1 where the top 24 bits of the next xorshift32 draw are >= threshold, else 0
    # (threshold = round(p 2^24) drops a fraction p); state: the generator's 32-bit state as its
    # 16-bit halves [hi, lo], advanced by n draws (halves: no int beyond 2^16 on a 32-bit port)
    hi = state[0]
    lo = state[1]
    for i in range(n):
        hi ^= ((hi << 13) | (lo >> 3)) & 0xFFFF         # x ^= x << 13 (mod 2^32)
        lo ^= (lo << 13) & 0xFFFF
        lo ^= hi >> 1                                   # x ^= x >> 17
        hi ^= ((hi << 5) | (lo >> 11)) & 0xFFFF         # x ^= x << 5
        lo ^= (lo << 5) & 0xFFFF
        keep[i] = 1 if ((hi << 8) | (lo >> 8)) >= threshold else 0
    state[0] = hi
    state[1] = lo


def dropout_apply(out, inp, keep, n, scale):
    # out (n,) = inp * scale where keep[i], else 0: dropout's forward (inp = x) and its
    # backward (inp = dy: the same mask and scale)
    for i in range(n):
        out[i] = inp[i] * scale if keep[i] else 0.0


def attention_context(out, att, keep, v, B, Tq, Tk, C, NH, scale):
    # out (B, Tq, C) = per head (att * keep * scale) . v, heads concatenated
    # att (B, NH, Tq, Tk): softmax weights; keep (B, NH, Tq, Tk) bytes, 1 = kept (dropout)
    hs = C // NH
    for b in range(B):
        for t in range(Tq):
            for h in range(NH):
                ab = ((b * NH + h) * Tq + t) * Tk
                ob = (b * Tq + t) * C + h * hs
                for i in range(hs):
                    s = 0.0
                    vi = b * Tk * C + h * hs + i
                    for j in range(Tk):
                        if keep[ab + j]:
                            s += att[ab + j] * v[vi]
                        vi += C
                    out[ob + i] = s * scale


def attention_backward_dropout(dq, dk, dv, scratch, dout, att, keep, q, k, v, B, Tq, Tk, C, NH, pscale):
    # in the forward pass this was out = (A * keep * pscale) . v, A = softmax(q.k^T * scale + mask)
    # dq (B, Tq, C), dk dv (B, Tk, C): written; scratch (>= Tk,): one row of dA
    # att (B, NH, Tq, Tk): A (before dropout); keep: the forward's mask (bytes, 1 = kept)
    # dv[j] += A'[j] dctx, dA[j] = keep[j] pscale (dctx . v[j]), dS = A (dA - sum dA A) * scale
    hs = C // NH
    scale = 1.0 / sqrt(hs)
    _zero_qkv(dq, dk, dv, B * Tq * C, B * Tk * C)
    for b in range(B):
        for t in range(Tq):
            for h in range(NH):
                ab = ((b * NH + h) * Tq + t) * Tk
                qh = (b * Tq + t) * C + h * hs
                dot = 0.0
                for j in range(Tk):
                    if not keep[ab + j]:
                        scratch[j] = 0.0
                        continue
                    a = att[ab + j] * pscale
                    s = _dv_add(dv, v, (b * Tk + j) * C + h * hs, dout, qh, a, hs)
                    s *= pscale
                    scratch[j] = s
                    dot += s * att[ab + j]
                _softmax_back_row(dq, dk, q, k, att, ab, scratch, dot, scale, qh, b * Tk * C + h * hs, C, Tk, hs)


def _last_key(t, Tk, shift, causal):
    # the last key query t may see (causal: t + shift, capped at Tk - 1)
    if causal and t + shift < Tk - 1:
        return t + shift
    return Tk - 1


def attention_forward_tiled(out, stats, tile, q, k, v, mask, heads):
    # heads = (B, Tq, Tk, C, NH, causal, T): the sizes, T keys per tile (kernel_table.py: heads)
    # q (B, Tq, C), k v (B, Tk, C), mask (B, Tk) bytes or None, causal as attention_forward
    # out (B, Tq, C): softmax(q.k^T / sqrt(hs) + mask) . v per head, heads concatenated
    # stats (B, NH, Tq, 2): the row's max m and sum l of exp(s - m) over its visible keys
    #   (l = 0: no visible key; then out = 0, as attention_forward)
    # tile (>= T,): scratch for one tile's scores / exponentials
    # Online softmax: per tile, m' = max(m, tile max), out = out e^(m - m') + sum_j e^(s_j - m') v_j,
    # l = l e^(m - m') + sum_j e^(s_j - m'); at the end out /= l. A score beyond float32 raises
    # OverflowError (the standard path rescales such rows; this one keeps no row to rescale).
    B, Tq, Tk, C, NH, causal, T = heads
    hs = C // NH
    scale = 1.0 / sqrt(hs)
    shift = Tk - Tq
    for b in range(B):
        for t in range(Tq):
            last = _last_key(t, Tk, shift, causal)
            for h in range(NH):
                qh = (b * Tq + t) * C + h * hs
                sb = ((b * NH + h) * Tq + t) * 2
                for i in range(hs):
                    out[qh + i] = 0.0
                m = 0.0
                l = 0.0
                j0 = 0
                while j0 <= last:
                    j1 = j0 + T
                    if j1 > last + 1:
                        j1 = last + 1
                    # scaled scores of the tile (as stored, float32) and their max
                    tm = 0.0
                    seen = 0
                    for j in range(j0, j1):
                        if mask is not None and mask[b * Tk + j]:
                            continue
                        tile[j - j0] = _dot(q, qh, k, (b * Tk + j) * C + h * hs, hs) * scale
                        s = tile[j - j0]
                        if s - s != 0.0 and s == s:
                            raise OverflowError("attention_forward_tiled: a score q.k/sqrt(D) is beyond "
                                                "float32 (%r); the standard path (kv_tile=None) handles it" % s)
                        if not seen or s > tm:
                            tm = s
                        seen = 1
                    if seen:
                        if l == 0.0:
                            mn = tm
                            alpha = 0.0
                        else:
                            mn = tm if tm > m else m
                            alpha = exp(m - mn)
                        ts = 0.0
                        for j in range(j0, j1):
                            if mask is not None and mask[b * Tk + j]:
                                tile[j - j0] = 0.0
                                continue
                            e = exp(tile[j - j0] - mn)
                            tile[j - j0] = e
                            ts += e
                        l = l * alpha + ts
                        m = mn
                        for i in range(hs):
                            s = _wsum(tile, 0, v, (b * Tk + j0) * C + h * hs + i, C, j1 - j0)
                            out[qh + i] = out[qh + i] * alpha + s
                    j0 = j1
                stats[sb] = m
                stats[sb + 1] = l
                if l > 0.0:
                    inv = 1.0 / l
                    for i in range(hs):
                        out[qh + i] *= inv


def attention_backward_tiled(dq, dk, dv, tile, dout, out, stats, q, k, v, mask, heads):
    # in the forward pass this was out = softmax(q.k^T * scale + mask) . v (attention_forward_tiled)
    # dq (B, Tq, C), dk dv (B, Tk, C): written; tile (>= 1,): a float32 cell
    # out (B, Tq, C): the forward's output; stats (B, NH, Tq, 2): its row max m and sum l
    # The weights are recomputed key by key: a_j = exp(s_j - m) / l; with D = dout . out (per head,
    # = sum_j dA_j a_j): dv_j += a_j dout, dA_j = dout . v_j, dS_j = a_j (dA_j - D) * scale,
    # dq += dS_j k_j, dk_j += dS_j q. heads: as attention_forward_tiled's (T unused).
    B, Tq, Tk, C, NH, causal, _ = heads
    hs = C // NH
    scale = 1.0 / sqrt(hs)
    shift = Tk - Tq
    _zero_qkv(dq, dk, dv, B * Tq * C, B * Tk * C)
    sb = 0                                          # stats rows in their (b, h, t) order
    for b in range(B):
        for h in range(NH):
            for t in range(Tq):
                m = stats[sb]
                l = stats[sb + 1]
                sb += 2
                if l == 0.0:
                    continue                        # no visible key: no gradient
                last = _last_key(t, Tk, shift, causal)
                qh = (b * Tq + t) * C + h * hs
                inv = 1.0 / l
                d = 0.0
                for i in range(hs):
                    d += dout[qh + i] * out[qh + i]
                for j in range(last + 1):
                    if mask is not None and mask[b * Tk + j]:
                        continue
                    kh = (b * Tk + j) * C + h * hs
                    tile[0] = _dot(q, qh, k, kh, hs) * scale     # the score as the forward stored it
                    a = exp(tile[0] - m) * inv
                    s = _dv_add(dv, v, kh, dout, qh, a, hs)
                    ds = a * (s - d) * scale
                    _dq_dk_add(dq, dk, q, k, qh, kh, ds, hs)


def kv_shift(cache, B, L, C, n):
    # cache (B, L, C): rows n..L-1 of every sequence move to rows 0..L-n-1 (the streaming window
    # drops its n oldest rows); rows L-n..L-1 keep their old values
    for b in range(B):
        dst = b * L * C
        src = dst + n * C
        for i in range((L - n) * C):
            cache[dst + i] = cache[src + i]
