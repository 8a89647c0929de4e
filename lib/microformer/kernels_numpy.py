# microformer.kernels_numpy: the kernels of kernels.py over NumPy, for CPython on the host.
# Same functions, same signatures, same buffers: every flat array('f') is viewed in place with
# numpy.frombuffer (no copy), so layers, optimizers and checkpoints are unchanged. Arithmetic runs
# in float64 and is rounded to float32 once, on the store, as the portable loops do under CPython,
# except the dense products (matmul_*), which run in float32 as PyTorch's do (see there).
# Host only: the board has no NumPy (make deploy and mip leave this file out).
# The matrices here are small: a multi-threaded BLAS only spins (30x slower on a loaded 2-core
# machine), so OpenBLAS gets one thread unless the environment or an earlier numpy import decided.
import os
import sys

if "numpy" not in sys.modules:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

from math import erf as _erf1  # noqa: E402

from . import kernels as _pk  # noqa: E402
from .kernels import GELU, GELU_TANH, LEAKY_RELU, LEAKY_SLOPE, RELU, SIGMOID, TANH, _GELU_C  # noqa: E402

_erf = np.frompyfunc(_erf1, 1, 1)      # math.erf elementwise (NumPy has no erf of its own)


def _phi_cdf(x):
    # Phi(x) = 0.5 (1 + erf(x / sqrt 2))
    return 0.5 * (1.0 + _erf(x * 0.7071067811865476).astype(_F64))

_F32 = np.float32
_F64 = np.float64


def _v(buf, n):
    # a writable float32 view of the first n elements of buf (array('f')): no copy
    return np.frombuffer(buf, dtype=_F32, count=n)


def _d(buf, n, *shape):
    # the first n elements of buf as float64 (a copy), shaped
    return np.frombuffer(buf, dtype=_F32, count=n).astype(_F64).reshape(shape)


def _mask(mask, B, Tk):
    # (B, Tk) bool, True = padded key; None when there is no mask
    if mask is None:
        return None
    return np.frombuffer(bytes(mask), dtype=np.uint8, count=B * Tk).reshape(B, Tk) != 0


def zero(buf, n):
    _v(buf, n)[:] = 0.0


# The dense products run in float32 (single-precision BLAS, straight into the output buffers): as
# PyTorch does on the CPU, and twice the speed of float64 products and their copies. Their error
# stays far inside the backend's tolerance (tests/unit/test_numpy_backend.py: 1e-5 of the largest
# value against the portable loops): a KS-term float32 dot product is off by about sqrt(KS) float32
# roundings of its terms' magnitudes.

def matmul_forward(out, inp, weight, bias, N, C, OC):
    # out (N, OC) = inp (N, C) . weight (OC, C)^T + bias (OC,); bias may be None
    r = _v(out, N * OC).reshape(N, OC)
    np.matmul(_v(inp, N * C).reshape(N, C), _v(weight, OC * C).reshape(OC, C).T, out=r)
    if bias is not None:
        r += _v(bias, OC)


def matmul_forward_kept(out, inp, weight, bias, N, C, OC, keep):
    # matmul_forward (keep: a backend's prepared weight; nothing to prepare here)
    matmul_forward(out, inp, weight, bias, N, C, OC)


def matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC):
    # in the forward pass this was out (N, OC) = inp (N, C) . weight (OC, C)^T + bias
    # dinp (N, C) = dout . weight (written); dweight (OC, C) += dout^T . inp; dbias += sum_N dout
    g = _v(dout, N * OC).reshape(N, OC)
    if dinp is not None:
        np.matmul(g, _v(weight, OC * C).reshape(OC, C), out=_v(dinp, N * C).reshape(N, C))
    if dweight is not None:
        w = _v(dweight, OC * C).reshape(OC, C)
        w += g.T @ _v(inp, N * C).reshape(N, C)
    if dbias is not None:
        b = _v(dbias, OC)
        b += g.sum(axis=0, dtype=_F64)                # float64 sum, rounded once on the add


def matmul_backward_input(dinp, dout, weight, N, C, OC):
    # matmul_backward's input gradient alone: dinp (N, C) = dout (N, OC) . weight (OC, C) (written)
    matmul_backward(dinp, None, None, dout, None, weight, N, C, OC)


def matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC):
    # matmul_backward's weight gradients alone: dweight (OC, C) += dout^T . inp; dbias (OC,) +=
    # sum_n dout (None: skipped). With matmul_backward_input: the same values as matmul_backward,
    # in calls of few arguments (a caller's frame stays small: see kernels_viper)
    matmul_backward(None, dweight, dbias, dout, inp, None, N, C, OC)


def matmul_backward_input_acc(dinp, dout, weight, N, C, OC):
    # dinp (N, C) += dout (N, OC) . weight (OC, C)
    d = _v(dinp, N * C).reshape(N, C)
    d += _v(dout, N * OC).reshape(N, OC) @ _v(weight, OC * C).reshape(OC, C)


def _q8(q, scale, OC, C):
    # W = q (OC, C) int8 * scale (OC,) float32, as float64 (exact: q * scale fits a double)
    w = np.frombuffer(q, dtype=np.int8, count=OC * C).astype(_F64).reshape(OC, C)
    return w * np.frombuffer(scale, dtype=_F32, count=OC).astype(_F64)[:, None]


def q8_matmul_forward(out, inp, q, scale, bias, N, C, OC):
    # out (N, OC) = inp (N, C) . W^T + bias, W = q (OC, C) * scale (OC,) (quant.py)
    r = _d(inp, N * C, N, C) @ _q8(q, scale, OC, C).T
    if bias is not None:
        r += _d(bias, OC, OC)
    _v(out, N * OC)[:] = r.ravel()


def q8_matmul_backward_input(dinp, dout, q, scale, N, C, OC, acc):
    # dinp (N, C) = dout (N, OC) . W, written (acc 0) or added (acc 1); W = q * scale
    r = (_d(dout, N * OC, N, OC) @ _q8(q, scale, OC, C)).ravel()
    d = _v(dinp, N * C)
    d[:] = d.astype(_F64) + r if acc else r


def _heads(buf, B, T, C, NH):
    # (B, T, C) -> (B, NH, T, hs) float64
    return _d(buf, B * T * C, B, T, NH, C // NH).transpose(0, 2, 1, 3)


def _visible(mask, B, Tq, Tk, causal):
    # (B, 1, Tq, Tk) bool: True where query t may see key j
    vis = np.ones((B, 1, Tq, Tk), dtype=bool)
    if causal:
        shift = Tk - Tq
        vis &= (np.arange(Tk)[None, :] <= np.arange(Tq)[:, None] + shift)[None, None]
    m = _mask(mask, B, Tk)
    if m is not None:
        vis &= ~m[:, None, None, :]
    return vis


def _softmax_visible(s, vis):
    # softmax over the last axis among visible entries; hidden entries and rows with no
    # visible entry get 0
    s = np.where(vis, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(vis, np.exp(s - m), 0.0)
    z = e.sum(axis=-1, keepdims=True)
    return np.divide(e, z, out=np.zeros_like(e), where=z > 0.0)


def attention_forward(out, att, q, k, v, mask, B, Tq, Tk, C, NH, causal):
    # q (B, Tq, C), k v (B, Tk, C); att (B, NH, Tq, Tk) written, masked weights exactly 0;
    # out (B, Tq, C) = per-head softmax(q.k^T / sqrt(hs)) . v, heads concatenated
    hs = C // NH
    s = (_heads(q, B, Tq, C, NH) @ _heads(k, B, Tk, C, NH).transpose(0, 1, 3, 2)) * (1.0 / np.sqrt(hs))
    a = _softmax_visible(s, _visible(mask, B, Tq, Tk, causal))
    _v(att, B * NH * Tq * Tk)[:] = a.ravel()
    a = a.astype(_F32).astype(_F64)           # the stored weights, as the portable loops use them
    ctx = a @ _heads(v, B, Tk, C, NH)          # (B, NH, Tq, hs)
    _v(out, B * Tq * C)[:] = ctx.transpose(0, 2, 1, 3).ravel()


def attention_backward(dq, dk, dv, scratch, dout, att, q, k, v, B, Tq, Tk, C, NH):
    # in the forward pass this was out = softmax(q.k^T * scale (+mask)) . v, per head
    # dq (B, Tq, C), dk dv (B, Tk, C): written; att: the forward's weights (0 where masked)
    hs = C // NH
    scale = 1.0 / np.sqrt(hs)
    a = _d(att, B * NH * Tq * Tk, B, NH, Tq, Tk)
    g = _heads(dout, B, Tq, C, NH)
    qh = _heads(q, B, Tq, C, NH)
    kh = _heads(k, B, Tk, C, NH)
    vh = _heads(v, B, Tk, C, NH)
    da = g @ vh.transpose(0, 1, 3, 2)                      # (B, NH, Tq, Tk)
    dvh = a.transpose(0, 1, 3, 2) @ g                      # (B, NH, Tk, hs)
    dot = (da * a).sum(axis=-1, keepdims=True)
    ds = a * (da - dot) * scale
    dqh = ds @ kh
    dkh = ds.transpose(0, 1, 3, 2) @ qh
    _v(dq, B * Tq * C)[:] = dqh.transpose(0, 2, 1, 3).ravel()
    _v(dk, B * Tk * C)[:] = dkh.transpose(0, 2, 1, 3).ravel()
    _v(dv, B * Tk * C)[:] = dvh.transpose(0, 2, 1, 3).ravel()


def _act(x, kind):
    if kind == RELU:
        return np.where(x <= 0.0, 0.0, x)             # NaN propagates, as torch.relu
    if kind == LEAKY_RELU:
        return np.where(x > 0.0, x, LEAKY_SLOPE * x)
    if kind == GELU:
        return x * _phi_cdf(x)
    if kind == GELU_TANH:
        return 0.5 * x * (1.0 + np.tanh(_GELU_C * (x + 0.044715 * x * x * x)))
    if kind == TANH:
        return np.tanh(x)
    if kind == SIGMOID:
        e = np.exp(-np.abs(x))
        return np.where(x >= 0.0, 1.0 / (1.0 + e), e / (1.0 + e))
    raise ValueError("act_forward: unknown activation kind %r" % kind)


def act_forward(out, inp, N, kind):
    # out (N,) = f(inp (N,))
    _v(out, N)[:] = _act(_d(inp, N, N), kind)


def act_backward(dinp, dout, inp, out, N, kind):
    # in the forward pass this was out = f(inp); dinp (N,) = f'(inp) * dout (written)
    g = _d(dout, N, N)
    if kind == RELU:
        r = np.where(_d(inp, N, N) <= 0.0, 0.0, g)    # passes dout where not inp <= 0 (NaN too)
    elif kind == LEAKY_RELU:
        r = np.where(_d(inp, N, N) > 0.0, g, LEAKY_SLOPE * g)
    elif kind == GELU:
        x = _d(inp, N, N)
        r = g * (_phi_cdf(x) + x * 0.3989422804014327 * np.exp(-0.5 * x * x))
    elif kind == GELU_TANH:
        x = _d(inp, N, N)
        th = np.tanh(_GELU_C * (x + 0.044715 * x * x * x))
        dth = (1.0 - th * th) * _GELU_C * (1.0 + 3.0 * 0.044715 * x * x)
        r = g * (0.5 * (1.0 + th) + 0.5 * x * dth)
    elif kind == TANH:
        y = _d(out, N, N)
        r = g * (1.0 - y * y)
    elif kind == SIGMOID:
        y = _d(out, N, N)
        r = g * y * (1.0 - y)
    else:
        raise ValueError("act_backward: unknown activation kind %r" % kind)
    _v(dinp, N)[:] = r


def avgpool_forward(out, inp, B, T, C):
    # out (B, C) = mean over T of inp (B, T, C)
    _v(out, B * C)[:] = (_d(inp, B * T * C, B, T, C).sum(axis=1) * (1.0 / T)).ravel()


def avgpool_backward(dinp, dout, B, T, C):
    # dinp (B, T, C) = dout (B, C) / T, broadcast over T (written)
    g = _d(dout, B * C, B, 1, C) * (1.0 / T)
    _v(dinp, B * T * C)[:] = np.broadcast_to(g, (B, T, C)).ravel()


def crossentropy_softmax(dlogits, logits, labels, B, V):
    # returns the mean over B of -log softmax(logits)[label];
    # dlogits (B, V) = (softmax(logits) - onehot(label)) / B (written)
    x = _d(logits, B * V, B, V)
    y = np.asarray(labels[:B], dtype=np.intp)
    m = x.max(axis=1, keepdims=True)
    e = np.exp(x - m)
    z = e.sum(axis=1, keepdims=True)
    rows = np.arange(B)
    loss = float((m[:, 0] + np.log(z[:, 0]) - x[rows, y]).sum() / B)
    g = e / z / B
    g[rows, y] -= 1.0 / B
    _v(dlogits, B * V)[:] = g.ravel()
    return loss


def mse(dpred, pred, target, N):
    # returns mean over N of (pred - target)^2; dpred (N,) = 2 (pred - target) / N (written)
    d = _d(pred, N, N) - _d(target, N, N)
    _v(dpred, N)[:] = (2.0 / N) * d
    return float((d * d).sum() / N)


def sum_squares(g, n):
    x = _d(g, n, n)
    return float((x * x).sum())


def scale_inplace(g, n, factor):
    x = _v(g, n)
    x[:] = x.astype(_F64) * factor


def sgd_update(p, g, buf, n, lr, momentum, weight_decay):
    # p (n,) -= lr * step, step = g + wd p, with momentum buf = momentum buf + step
    pv = _v(p, n)
    d = _d(g, n, n)
    if weight_decay:
        d = d + weight_decay * pv.astype(_F64)
    if buf is not None:
        b = _v(buf, n)
        b[:] = d + momentum * b.astype(_F64)
        d = b.astype(_F64)
    pv[:] = pv.astype(_F64) - lr * d


def adam_update(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2, decoupled):
    # Adam (decoupled: AdamW). bc1 = 1 - beta1^t, bc2 = 1 - beta2^t for step t.
    pv = _v(p, n)
    d = _d(g, n, n)
    if weight_decay:
        if decoupled:
            pv[:] = pv.astype(_F64) - lr * weight_decay * pv.astype(_F64)
        else:
            d = d + weight_decay * pv.astype(_F64)
    mv = _v(m, n)
    vv = _v(v, n)
    mv[:] = beta1 * mv.astype(_F64) + (1.0 - beta1) * d
    vv[:] = beta2 * vv.astype(_F64) + (1.0 - beta2) * d * d
    mi = mv.astype(_F64)
    vi = vv.astype(_F64)
    pv[:] = pv.astype(_F64) - (lr / bc1) * mi / (np.sqrt(vi * (1.0 / bc2)) + eps)


def _stretch(dst, src, o, n, so):
    # dst[o : o + n] = src[so : so + n]; the view of dst's stretch
    d = _v(dst, o + n)[o:]
    d[:] = _v(src, so + n)[so:]
    return d


_SCRATCH = {}


def _scratch(n):
    # four float64 buffers of n values, kept per n: a step's temporaries without an allocation
    # (arrays this size would each be a fresh mmap, page faults included, on every step)
    s = _SCRATCH.get(n)
    if s is None:
        if len(_SCRATCH) > 8:
            _SCRATCH.clear()
        s = _SCRATCH[n] = np.empty((4, n), dtype=_F64)
    return s


def _gather(params, count, which, out):
    # the weights (which 0) or gradients (1) of the `count` (param, grad) pairs end to end (N,),
    # as float64 into out: one copy for the whole step instead of a kernel call per tensor
    if count:                           # (np.concatenate refuses an empty list: no pairs, no values)
        np.concatenate([np.frombuffer(params[k][which].data, dtype=_F32) for k in range(count)], out=out)
    return out


def _flag(params, count, *bufs):
    # -1 when every value of bufs (each (N,), the pairs end to end) is finite, else the index of the
    # pair that holds the first non-finite one. A float64 sum of float32 values cannot overflow, so
    # a finite sum of sums means every value is finite (inf and NaN propagate; inf - inf is NaN).
    if np.isfinite(sum(float(b.sum(dtype=_F64)) for b in bufs)):
        return -1
    ok = np.logical_and.reduce([np.isfinite(b) for b in bufs])
    i = int(np.argmin(ok))
    o = 0
    for k in range(count):
        o += len(params[k][1].data)
        if i < o:
            return k
    return count - 1


def adam_step(newp, news, params, olds, hyper):
    # adam_update of every (param, grad) pair for step t into newp, news = [newm, newv] (N,);
    # olds = [m, v] (N,) read; hyper = [lr, beta1, beta2, eps, weight_decay, decoupled, t] (as
    # kernels.adam_step). The same float64 expressions as adam_update, over all tensors at once
    # (the same bits). Returns as kernels.adam_step (STEP_FROZEN too).
    if _pk._frozen(params):
        return _pk.STEP_FROZEN
    lr, beta1, beta2, eps, weight_decay, decoupled, t = hyper[:7]     # (an 8th: viper's size record)
    newm, newv = news
    m, v = olds
    count = len(params)
    bc1 = 1.0 - beta1 ** t
    bc2 = 1.0 - beta2 ** t
    n = 0
    for k in range(count):
        n += len(params[k][1].data)
    g, p, t1, t2 = _scratch(n)
    _gather(params, count, 1, g)
    _gather(params, count, 0, p)
    d = g
    if weight_decay:
        if decoupled:
            p[:] = (p - lr * weight_decay * p).astype(_F32)                # stored, then read back
        else:
            d = g + weight_decay * p
    # every operation in float64 (dtype=), in adam_update's order; stores round once to float32
    mv = _v(newm, n)
    np.multiply(_v(m, n), beta1, out=t1, dtype=_F64)
    np.multiply(d, 1.0 - beta1, out=t2)
    np.add(t1, t2, out=mv, casting="same_kind")
    vv = _v(newv, n)
    np.multiply(_v(v, n), beta2, out=t1, dtype=_F64)
    np.multiply(d, 1.0 - beta2, out=t2)
    t2 *= d
    np.add(t1, t2, out=vv, casting="same_kind")
    np.multiply(vv, 1.0 / bc2, out=t1, dtype=_F64)
    np.sqrt(t1, out=t1)
    t1 += eps
    np.multiply(mv, lr / bc1, out=t2, dtype=_F64)
    t2 /= t1
    pv = _v(newp, n)
    np.subtract(p, t2, out=pv, casting="same_kind")
    return _flag(params, count, g, pv, mv, vv)


def sgd_step(newp, news, params, olds, hyper):
    # sgd_update of every (param, grad) pair into newp (and news = [newbuf]) (N,); olds = [buf]
    # (N,) read, both [] for no momentum; hyper = [lr, momentum, weight_decay]. The same float64
    # expressions as sgd_update, over all tensors at once. Returns as kernels.sgd_step.
    if _pk._frozen(params):
        return _pk.STEP_FROZEN
    lr, momentum, weight_decay = hyper[:3]                 # (a 4th: viper's size record)
    buf = olds[0] if olds else None
    newbuf = news[0] if news else None
    count = len(params)
    n = 0
    for k in range(count):
        n += len(params[k][1].data)
    g, p = _scratch(n)[:2]
    _gather(params, count, 1, g)
    _gather(params, count, 0, p)
    d = g
    if weight_decay:
        d = g + weight_decay * p
    pv = _v(newp, n)
    if buf is None:
        pv[:] = p - lr * d
        return _flag(params, count, g, pv)
    b = _v(newbuf, n)
    b[:] = d + momentum * _d(buf, n, n)
    pv[:] = p - lr * b.astype(_F64)
    return _flag(params, count, g, pv, b)


def params_commit(params, newp, count, seen=None):
    # the weights of the (param, grad) pairs = their stretches of newp (N,) (seen: unused, as in
    # kernels.params_commit)
    _pk._commit(_stretch, params, newp, count)


def add_forward(out, a, b, n):
    # out (n,) = a (n,) + b (n,)   (out may be a or b)
    _v(out, n)[:] = _d(a, n, n) + _d(b, n, n)


def layernorm_forward(out, inp, ln, N, C, eps):
    # ln = [weight, bias, mean, rstd, ...] (kernels.layernorm_forward)
    # out (N, C) = (inp - mean) * rstd * weight + bias; mean rstd (N,) saved, biased variance
    weight, bias, mean, rstd = ln[0], ln[1], ln[2], ln[3]
    x = _d(inp, N * C, N, C)
    mu = x.sum(axis=1) * (1.0 / C)
    xc = x - mu[:, None]
    s = 1.0 / np.sqrt((xc * xc).sum(axis=1) * (1.0 / C) + eps)
    _v(mean, N)[:] = mu
    _v(rstd, N)[:] = s
    m32 = _d(mean, N, N)                      # the stored statistics, as the portable loops use them
    s32 = _d(rstd, N, N)
    _v(out, N * C)[:] = ((x - m32[:, None]) * s32[:, None] * _d(weight, C, C) + _d(bias, C, C)).ravel()


def layernorm_backward(dinp, dout, inp, ln, N, C):
    # ln = [weight, bias, mean, rstd, dweight, dbias] (kernels.layernorm_backward)
    # in the forward pass this was out = xhat * weight + bias, xhat = (inp - mean) * rstd
    weight, mean, rstd, dweight, dbias = ln[0], ln[2], ln[3], ln[4], ln[5]
    g = _d(dout, N * C, N, C)
    s = _d(rstd, N, N)[:, None]
    xh = (_d(inp, N * C, N, C) - _d(mean, N, N)[:, None]) * s
    w = _d(weight, C, C)
    dn = g * w
    a = dn.sum(axis=1, keepdims=True) * (1.0 / C)
    bs = (dn * xh).sum(axis=1, keepdims=True) * (1.0 / C)
    if dweight is not None:
        dw = _v(dweight, C)
        dw[:] = dw.astype(_F64) + (g * xh).sum(axis=0)
    if dbias is not None:
        db = _v(dbias, C)
        db[:] = db.astype(_F64) + g.sum(axis=0)
    _v(dinp, N * C)[:] = (s * (dn - a - xh * bs)).ravel()


def embedding_forward(out, ids, table, N, C, V):
    # out (N, C) = table[ids]; returns -1, or the index of the first id that is not an int in
    # [0, V) (rows before it are written, that row and later ones are not)
    x = _d(ids, N, N)
    bad = np.nonzero(~((x >= 0.0) & (x < V) & (np.floor(x) == x)))[0]
    n = int(bad[0]) if bad.size else N
    t = _v(table, V * C).reshape(V, C)
    _v(out, N * C).reshape(N, C)[:n] = t[x[:n].astype(np.intp)]
    return n if bad.size else -1


def embedding_backward(dtable, dout, ids, N, C):
    # in the forward pass this was out (N, C) = table[ids]; dtable (V, C) += dout rows
    idx = _d(ids, N, N).astype(np.intp)
    V = len(dtable) // C
    acc = _d(dtable, V * C, V, C)
    np.add.at(acc, idx, _d(dout, N * C, N, C))
    _v(dtable, V * C)[:] = acc.ravel()


def posenc_table(pe, L, C):
    # pe (L, C): pe[p, 2i] = sin(p * div_i), pe[p, 2i+1] = cos(p * div_i), div_i = exp(-2i ln(10000) / C)
    div = np.exp(np.arange(0, C, 2) * (-np.log(10000.0) / C))
    a = np.arange(L)[:, None] * div[None, :]
    t = np.zeros((L, C))
    t[:, 0::2] = np.sin(a)
    t[:, 1::2] = np.cos(a)[:, :C // 2]
    _v(pe, L * C)[:] = t.ravel()


def posenc_forward(out, inp, pe, B, S, C, start):
    # out (B, S, C) = inp (B, S, C) + pe[start + s]
    p = _d(pe, (start + S) * C, start + S, C)[start:]
    _v(out, B * S * C)[:] = (_d(inp, B * S * C, B, S, C) + p[None]).ravel()


def kv_store(cache, src, B, S, L, C, pos):
    # cache (B, L, C)[:, pos:pos+S, :] = src (B, S, C)
    _v(cache, B * L * C).reshape(B, L, C)[:, pos:pos + S] = _v(src, B * S * C).reshape(B, S, C)


def attention_decode(out, att, q, kc, vc, B, T, L, C, NH):
    # one causal query per sequence against the first T cached keys; att (B, NH, L): columns
    # 0..T-1 written; out (B, C): heads concatenated
    hs = C // NH
    qh = _d(q, B * C, B, NH, 1, hs)
    kh = _d(kc, B * L * C, B, L, NH, hs)[:, :T].transpose(0, 2, 3, 1)     # (B, NH, hs, T)
    vh = _d(vc, B * L * C, B, L, NH, hs)[:, :T].transpose(0, 2, 1, 3)     # (B, NH, T, hs)
    s = (qh @ kh) * (1.0 / np.sqrt(hs))                                   # (B, NH, 1, T)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    a = e / e.sum(axis=-1, keepdims=True)
    _v(att, B * NH * L).reshape(B, NH, L)[:, :, :T] = a[:, :, 0]
    a = a.astype(_F32).astype(_F64)
    _v(out, B * C)[:] = (a @ vh).ravel()


def attention_scores(out, q, k, mask, B, Tq, Tk, C, NH, scale, causal, hidden):
    # out (B, NH, Tq, Tk) = (q_h . k_h) * scale; a hidden key (padded, or future when causal)
    # gets `hidden` instead
    s = (_heads(q, B, Tq, C, NH) @ _heads(k, B, Tk, C, NH).transpose(0, 1, 3, 2)) * scale
    vis = np.broadcast_to(_visible(mask, B, Tq, Tk, causal), s.shape)
    _v(out, B * NH * Tq * Tk)[:] = np.where(vis, s, hidden).ravel()


# ---------------------------------------------------------------- guards of the training step

def max_exponent(buf, n):
    # the largest exponent field of buf[0 .. n) (kernels.max_exponent): 255 for a NaN or inf
    if n == 0:
        return 0
    return int(((_v(buf, n).view(np.uint32) >> 23) & 0xFF).max())


def max_exponent_pairs(params, j):
    # max_exponent over the weights (j = 0) or gradients (j = 1) of (param, grad) pairs
    e = 0
    for pair in params:
        t = pair[j]
        e = max(e, max_exponent(t.data, t.size))
    return e


def first_nonfinite(buf, n):
    # index of the first NaN or +-inf in buf (n,), or -1
    bad = np.flatnonzero(~np.isfinite(_v(buf, n)))
    return int(bad[0]) if bad.size else -1


def copy(dst, src, n):
    # dst (n,) = src (n,), bit for bit
    _v(dst, n)[:] = _v(src, n)


# ---------------------------------------------------------------- convolution and 1-D pooling
# (B, L, C) channels-last; windows gathered with one fancy index over the zero-padded input.

def _taps(Lout, KS, stride, dil):
    # (Lout, KS) positions in the padded input: t stride + j dil
    return np.arange(Lout)[:, None] * stride + np.arange(KS)[None, :] * dil


def conv1d_forward(out, inp, weight, bias, B, L, C, Lout, OC, KS, stride, pad, dil, groups):
    # out (B, Lout, OC)[b,t,o] = bias[o] + sum_{c,j} weight[o,c,j] inp[b, t stride + j dil - pad, g Cg + c]
    Cg, OCg = C // groups, OC // groups
    xp = np.zeros((B, L + 2 * pad, C))
    xp[:, pad:pad + L] = _d(inp, B * L * C, B, L, C)
    cols = xp[:, _taps(Lout, KS, stride, dil)]                         # (B, Lout, KS, C)
    w = _d(weight, OC * Cg * KS, OC, Cg, KS)
    y = np.empty((B, Lout, OC))
    for g in range(groups):
        y[:, :, g * OCg:(g + 1) * OCg] = np.einsum("btjc,ocj->bto", cols[..., g * Cg:(g + 1) * Cg],
                                                  w[g * OCg:(g + 1) * OCg])
    if bias is not None:
        y += _d(bias, OC, OC)
    _v(out, B * Lout * OC)[:] = y.ravel()


def conv1d_backward(dinp, dweight, dbias, dout, inp, weight, B, L, C, Lout, OC, KS, stride, pad, dil, groups):
    # in the forward pass this was out[b,t,o] = bias[o] + sum_{c,j} weight[o,c,j] inp[b, t stride + j dil - pad, g Cg + c]
    # dinp (B, L, C) written; dweight (OC, Cg, KS) and dbias (OC,) accumulated; None = skipped
    Cg, OCg = C // groups, OC // groups
    taps = _taps(Lout, KS, stride, dil)
    dy = _d(dout, B * Lout * OC, B, Lout, OC)
    w = _d(weight, OC * Cg * KS, OC, Cg, KS)
    if dweight is not None:
        xp = np.zeros((B, L + 2 * pad, C))
        xp[:, pad:pad + L] = _d(inp, B * L * C, B, L, C)
        cols = xp[:, taps]
        dw = np.empty((OC, Cg, KS))
        for g in range(groups):
            dw[g * OCg:(g + 1) * OCg] = np.einsum("bto,btjc->ocj", dy[:, :, g * OCg:(g + 1) * OCg],
                                                 cols[..., g * Cg:(g + 1) * Cg])
        v = _v(dweight, OC * Cg * KS)
        v[:] = v.astype(_F64) + dw.ravel()
    if dbias is not None:
        v = _v(dbias, OC)
        v[:] = v.astype(_F64) + dy.sum(axis=(0, 1))
    if dinp is not None:
        dcols = np.empty((B, Lout, KS, C))
        for g in range(groups):
            dcols[..., g * Cg:(g + 1) * Cg] = np.einsum("bto,ocj->btjc", dy[:, :, g * OCg:(g + 1) * OCg],
                                                       w[g * OCg:(g + 1) * OCg])
        dxp = np.zeros((B, L + 2 * pad, C))
        np.add.at(dxp, (slice(None), taps), dcols)
        _v(dinp, B * L * C)[:] = dxp[:, pad:pad + L].ravel()


def maxpool1d_forward(out, idx, inp, pool):
    B, L, C, Lout, KS, stride, pad = pool
    # out (B, Lout, C) = window maxima; idx (B, Lout, C) ints: their positions (first on ties)
    xp = np.full((B, L + 2 * pad, C), -np.inf)
    xp[:, pad:pad + L] = _d(inp, B * L * C, B, L, C)
    taps = _taps(Lout, KS, stride, 1)
    win = xp[:, taps]                                                 # (B, Lout, KS, C)
    j = win.argmax(axis=2)                                            # first maximum
    np.frombuffer(idx, dtype=np.int32, count=B * Lout * C)[:] = (taps[None, :, :1] + j - pad).ravel()
    _v(out, B * Lout * C)[:] = np.take_along_axis(win, j[:, :, None, :], axis=2).ravel()


def maxpool1d_backward(dinp, dout, idx, pool):
    B, L, C, Lout, _, _, _ = pool
    # in the forward pass this was out[b,t,c] = inp[b, idx[b,t,c], c]; dinp (B, L, C) written
    pos = np.frombuffer(idx, dtype=np.int32, count=B * Lout * C).reshape(B, Lout, C)
    dx = np.zeros((B, L, C))
    bi = np.arange(B)[:, None, None]
    ci = np.arange(C)[None, None, :]
    np.add.at(dx, (bi, pos, ci), _d(dout, B * Lout * C, B, Lout, C))
    _v(dinp, B * L * C)[:] = dx.ravel()


def avgpool1d_forward(out, inp, pool):
    B, L, C, Lout, KS, stride, pad = pool
    # out (B, Lout, C) = (1/KS) sum over each window (padding counts as 0)
    xp = np.zeros((B, L + 2 * pad, C))
    xp[:, pad:pad + L] = _d(inp, B * L * C, B, L, C)
    _v(out, B * Lout * C)[:] = (xp[:, _taps(Lout, KS, stride, 1)].sum(axis=2) * (1.0 / KS)).ravel()


def avgpool1d_backward(dinp, dout, pool):
    B, L, C, Lout, KS, stride, pad = pool
    # in the forward pass this was out[b,t,c] = (1/KS) sum_{p in window t} inp[b,p,c]; dinp written
    g = _d(dout, B * Lout * C, B, Lout, C) * (1.0 / KS)
    dxp = np.zeros((B, L + 2 * pad, C))
    np.add.at(dxp, (slice(None), _taps(Lout, KS, stride, 1)), np.broadcast_to(g[:, :, None, :], (B, Lout, KS, C)))
    _v(dinp, B * L * C)[:] = dxp[:, pad:pad + L].ravel()


def posembed_backward(dtable, dout, B, S, C, start):
    # in the forward pass this was out = inp + table[start + s]; dtable rows start.. += sum_b dout
    L = len(dtable) // C
    t = _v(dtable, L * C).reshape(L, C)
    t[start:start + S] = t[start:start + S].astype(_F64) + _d(dout, B * S * C, B, S, C).sum(axis=0)


# ---------------------------------------------------------------- dropout and tiled attention

def _keep(keep, n, *shape):
    # the first n bytes of a keep mask as float64 0 / 1, shaped
    return np.frombuffer(keep, dtype=np.uint8, count=n).astype(_F64).reshape(shape)


def dropout_mask(keep, state, n, threshold):
    # the portable kernel's draws: each xorshift32 step depends on the one before (nothing to
    # vectorize)
    _pk.dropout_mask(keep, state, n, threshold)


def dropout_apply(out, inp, keep, n, scale):
    # out (n,) = inp * scale where keep[i], else 0
    _v(out, n)[:] = _d(inp, n, n) * _keep(keep, n, n) * scale


def attention_context(out, att, keep, v, B, Tq, Tk, C, NH, scale):
    # out (B, Tq, C) = per head (att * keep * scale) . v, heads concatenated
    n = B * NH * Tq * Tk
    a = _d(att, n, B, NH, Tq, Tk) * _keep(keep, n, B, NH, Tq, Tk) * scale
    ctx = a @ _heads(v, B, Tk, C, NH)
    _v(out, B * Tq * C)[:] = ctx.transpose(0, 2, 1, 3).ravel()


def attention_backward_dropout(dq, dk, dv, scratch, dout, att, keep, q, k, v, B, Tq, Tk, C, NH, pscale):
    # in the forward pass this was out = (A * keep * pscale) . v, A = softmax(q.k^T * scale + mask)
    hs = C // NH
    scale = 1.0 / np.sqrt(hs)
    n = B * NH * Tq * Tk
    a = _d(att, n, B, NH, Tq, Tk)
    kp = _keep(keep, n, B, NH, Tq, Tk) * pscale
    g = _heads(dout, B, Tq, C, NH)
    qh = _heads(q, B, Tq, C, NH)
    kh = _heads(k, B, Tk, C, NH)
    vh = _heads(v, B, Tk, C, NH)
    da = (g @ vh.transpose(0, 1, 3, 2)) * kp               # (B, NH, Tq, Tk)
    dvh = (a * kp).transpose(0, 1, 3, 2) @ g
    dot = (da * a).sum(axis=-1, keepdims=True)
    ds = a * (da - dot) * scale
    _v(dq, B * Tq * C)[:] = (ds @ kh).transpose(0, 2, 1, 3).ravel()
    _v(dk, B * Tk * C)[:] = (ds.transpose(0, 1, 3, 2) @ qh).transpose(0, 2, 1, 3).ravel()
    _v(dv, B * Tk * C)[:] = dvh.transpose(0, 2, 1, 3).ravel()


def _tile_scores(qh, kh, visible, j0, j1, scale):
    # scaled scores of keys j0..j1-1 (B, NH, Tq, j1-j0), rounded to float32 as stored, and
    # where they are visible
    s = (qh @ kh[:, :, j0:j1].transpose(0, 1, 3, 2)) * scale
    with np.errstate(over="ignore"):                  # beyond float32: inf, refused below
        s = s.astype(_F32).astype(_F64)
    vis = visible[..., j0:j1]
    if np.any(np.isinf(s) & vis):
        raise OverflowError("attention_forward_tiled: a score q.k/sqrt(D) is beyond float32; "
                            "the standard path (kv_tile=None) handles it")
    return s, vis


def attention_forward_tiled(out, stats, tile, q, k, v, mask, heads):
    B, Tq, Tk, C, NH, causal, T = heads
    # out (B, Tq, C), stats (B, NH, Tq, 2) = (max m, sum l of exp(s - m)) per row: online softmax
    # over tiles of T keys; tile is unused here (NumPy holds one (B, NH, Tq, T) block at a time)
    hs = C // NH
    scale = 1.0 / np.sqrt(hs)
    qh = _heads(q, B, Tq, C, NH)
    kh = _heads(k, B, Tk, C, NH)
    vh = _heads(v, B, Tk, C, NH)
    visible = _visible(mask, B, Tq, Tk, causal)
    m = np.full((B, NH, Tq, 1), -np.inf)
    l = np.zeros((B, NH, Tq, 1))
    acc = np.zeros((B, NH, Tq, hs))
    for j0 in range(0, Tk, T):
        j1 = min(j0 + T, Tk)
        s, vis = _tile_scores(qh, kh, visible, j0, j1, scale)
        s = np.where(vis, s, -np.inf)
        mn = np.maximum(m, s.max(axis=-1, keepdims=True))
        safe = np.where(np.isfinite(mn), mn, 0.0)
        alpha = np.where(np.isfinite(m), np.exp(m - safe), 0.0)
        e = np.where(vis, np.exp(s - safe), 0.0)
        l = l * alpha + e.sum(axis=-1, keepdims=True)
        acc = acc * alpha + e @ vh[:, :, j0:j1]
        m = mn
    ctx = np.divide(acc, l, out=np.zeros_like(acc), where=l > 0.0)
    _v(out, B * Tq * C)[:] = ctx.transpose(0, 2, 1, 3).ravel()
    st = np.concatenate([np.where(np.isfinite(m), m, 0.0), l], axis=-1)
    _v(stats, B * NH * Tq * 2)[:] = st.ravel()


def attention_backward_tiled(dq, dk, dv, tile, dout, out, stats, q, k, v, mask, heads):
    B, Tq, Tk, C, NH, causal, _ = heads
    # in the forward pass this was out = softmax(q.k^T * scale + mask) . v (attention_forward_tiled);
    # the weights are recomputed per tile of keys from the stored row max and sum
    hs = C // NH
    scale = 1.0 / np.sqrt(hs)
    T = max(1, min(Tk, 64))
    qh = _heads(q, B, Tq, C, NH)
    kh = _heads(k, B, Tk, C, NH)
    vh = _heads(v, B, Tk, C, NH)
    g = _heads(dout, B, Tq, C, NH)
    st = _d(stats, B * NH * Tq * 2, B, NH, Tq, 2)
    m = st[..., 0:1]
    l = st[..., 1:2]
    inv = np.divide(1.0, l, out=np.zeros_like(l), where=l > 0.0)
    d = (g * _heads(out, B, Tq, C, NH)).sum(axis=-1, keepdims=True)
    dqh = np.zeros_like(qh)
    dkh = np.zeros_like(kh)
    dvh = np.zeros_like(vh)
    visible = _visible(mask, B, Tq, Tk, causal)
    for j0 in range(0, Tk, T):
        j1 = min(j0 + T, Tk)
        s, vis = _tile_scores(qh, kh, visible, j0, j1, scale)
        a = np.where(vis, np.exp(np.where(vis, s, 0.0) - m), 0.0) * inv
        dvh[:, :, j0:j1] = a.transpose(0, 1, 3, 2) @ g
        da = g @ vh[:, :, j0:j1].transpose(0, 1, 3, 2)
        ds = a * (da - d) * scale
        dqh += ds @ kh[:, :, j0:j1]
        dkh[:, :, j0:j1] = ds.transpose(0, 1, 3, 2) @ qh
    _v(dq, B * Tq * C)[:] = dqh.transpose(0, 2, 1, 3).ravel()
    _v(dk, B * Tk * C)[:] = dkh.transpose(0, 2, 1, 3).ravel()
    _v(dv, B * Tk * C)[:] = dvh.transpose(0, 2, 1, 3).ravel()


def kv_shift(cache, B, L, C, n):
    # cache (B, L, C): rows n..L-1 move to rows 0..L-n-1 per sequence
    c = _v(cache, B * L * C).reshape(B, L, C)
    c[:, :L - n] = c[:, n:].copy()


def argmax(buf, off, n):
    # index i < n of the largest buf[off + i], the first on ties; NaN never larger (as `>`)
    a = np.frombuffer(buf, dtype=_F32, count=off + n)[off:]
    best = 0
    if n > 1 and not np.isnan(a[0]):
        b = np.where(np.isnan(a), -np.inf, a)
        best = int(np.argmax(b))
        if b[best] == -np.inf:
            best = 0
    return best


def gather_rows(dst, src, idx, start, B, F):
    # dst (B, F): row k = src row idx[start + k]
    rows = np.asarray(idx[start:start + B], dtype=np.intp)
    s = np.frombuffer(src, dtype=_F32).reshape(-1, F)
    _v(dst, B * F)[:] = s[rows].ravel()
