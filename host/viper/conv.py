# microformer.viper_conv: Conv1D forward and backward on the block-float GEMM (im2col gathers).
import micropython
from array import array
from .viper_common import _ones
from .viper_gemm import _mm
# conv1d_forward / conv1d_backward: the windows are gathered into float scratch as raw bits (an
# exact copy: im2col, zero bits where a tap falls in the padding), then multiplied by the
# block-float _gemm (viper_gemm). So the only arithmetic on values is _gemm's, with its [B1]/[B2]
# overflow analysis; the gathers do index arithmetic only, on indices below the buffer
# lengths (< 2^29 floats on any board): the lines marked #!chk check it.
#   forward  out (n Lout, OCg) = col (n Lout, Cg KS) . W_g (OCg, Cg KS)^T + bias_g   (_gemm kind 1)
#   dweight  dW_g (OCg, Cg KS) += dy_g^T (OCg, n Lout) . col (n Lout, Cg KS) (+ dbias)  (kind 3)
#   dinput   dx_g (n L, Cg) = dcol (n L, KS OCg) . Wt_g (Cg, KS OCg)^T                 (kind 1)
#     dcol[b, p, j OCg + o] = dy[b, t, o] where p + pad - j dil = t stride (0 <= t < Lout), else 0;
#     Wt_g[c, j OCg + o] = W[g OCg + o, c, j]: the transposed convolution as a gather, no adds.
# Per group g, over chunks of n samples so the gathers need at most CONV_SCRATCH floats each
# (n >= 1: a single sample may need more; the scratch then grows to fit it).
# ERROR BOUND (each output element, the _gemm bound with the gathered KS):
#   forward  2^-11 (Cg KS) max|window| max|W[o]| + 2^-11 |bias[o]|
#   dweight  2^-11 (n Lout) max|dy[:, :, o]| max|x taps of (c, j)| per chunk, + 2^-11 |dW| per
#            chunk (the running sum is _gemm's addend)
#   dbias    2^-11 (n Lout) max|dy[:, :, o]| per chunk, + 2^-11 |db| per chunk
#   dinput   2^-11 (KS OCg) max|dcol row| max|Wt_g[c]|
# (tests/mp/test_conv.py pins them at 2e-3 of the block maxima, on worst-case inputs on the 32-bit port.)
CONV_SCRATCH = 16384
_CV = [array("f", [0.0] * 16) for _ in range(6)]   # 0 windows, 1 weights, 2 bias, 3 out/dy, 4 dW, 5 db


def _cvbuf(i, n):
    f = _CV[i]
    if len(f) < n:
        f = _CV[i] = array("f", [0.0] * (n + n // 4 + 16))
    return f


@micropython.viper
def _cvcopy(dst, src, n: int, ds: int, d0: int, ss: int, s0: int, w: int):
    # dst[r ds + d0 + i] = src[r ss + s0 + i] for r < n, i < w: raw bits, exact
    pd = ptr32(dst)
    ps = ptr32(src)
    for r in range(n):
        di = r * ds + d0                                            #!chk di
        si = r * ss + s0                                            #!chk si
        for i in range(w):
            pd[di + i] = ps[si + i]


@micropython.viper
def _im2col(col, x, b0: int, nb: int, L: int, C: int, Lout: int, KS: int, st: int, pad: int, dil: int, c0: int, Cg: int):
    # col (nb Lout, Cg KS): col[bi Lout + t, c KS + j] = x[b0 + bi, t st + j dil - pad, c0 + c], 0 in the padding
    pc = ptr32(col)
    px = ptr32(x)
    CK = Cg * KS
    oi = 0
    for bi in range(nb):
        xb = (b0 + bi) * L * C + c0                                 #!chk xb
        for t in range(Lout):
            p0 = t * st - pad                                       #!chk p0
            for j in range(KS):
                p = p0 + j * dil                                    #!chk p
                i = oi + j
                xi = 0 - 1                                          # in the padding
                if p >= 0 and p < L:
                    xi = xb + p * C                                 #!chk xi
                rowcopy(pc, i, px, xi, Cg, KS)
            oi += CK


@micropython.viper
def _dcol(col, dy, b0: int, nb: int, L: int, OC: int, Lout: int, KS: int, st: int, pad: int, dil: int, o0: int, OCg: int):
    # col (nb L, KS OCg): col[bi L + p, j OCg + o] = dy[b0 + bi, t, o0 + o] where p + pad - j dil = t st,
    # 0 <= t < Lout; 0 where no output position t used input p through tap j
    pc = ptr32(col)
    pd = ptr32(dy)
    KO = KS * OCg
    for bi in range(nb):
        db = (b0 + bi) * Lout * OC + o0                             #!chk db
        for p in range(L):
            for j in range(KS):
                u = p + pad - j * dil                               #!chk u
                i = (bi * L + p) * KO + j * OCg                     #!chk i
                di = 0 - 1                                          # no output used p through j
                if u >= 0:
                    t = u // st
                    if t * st == u and t < Lout:
                        di = db + t * OC                            #!chk di
                rowcopy(pc, i, pd, di, OCg, 1)


@micropython.viper
def _wperm(wt, w, o0: int, OCg: int, Cg: int, KS: int):
    # wt (Cg, KS OCg): wt[c, j OCg + o] = w[o0 + o, c, j]   (w: (OC, Cg, KS))
    pt = ptr32(wt)
    pw = ptr32(w)
    KO = KS * OCg
    for o in range(OCg):
        wb = (o0 + o) * Cg * KS                                      #!chk wb
        for c in range(Cg):
            ti = c * KO + o
            for j in range(KS):
                pt[ti] = pw[wb]
                ti += OCg
                wb += 1


def _conv_chunk(per_sample, B):
    n = CONV_SCRATCH // per_sample if per_sample else B
    return 1 if n < 1 else (B if n > B else n)


def _group(slot, full, groups, g, size):
    # group g's `size` values of `full` (None stays None): `full` itself when groups == 1, else a
    # copy of its slice g size .. (g + 1) size - 1 in conv buffer `slot`
    if full is None or groups == 1:
        return full
    part = _cvbuf(slot, size)
    _cvcopy(part, full, 1, 0, 0, 0, g * size, size)
    return part


def _ungroup(full, part, groups, g, size):
    # the inverse of _group: a group's slice copied back into `full` (nothing when it is `full`)
    if full is not None and groups > 1:
        _cvcopy(full, part, 1, 0, g * size, 0, 0, size)


def conv1d_forward(out, inp, weight, bias, B, L, C, Lout, OC, KS, stride, pad, dil, groups):
    # out (B, Lout, OC)[b,t,o] = bias[o] + sum_{c,j} weight[o,c,j] inp[b, t stride + j dil - pad, g Cg + c]
    Cg = C // groups
    OCg = OC // groups
    CK = Cg * KS
    nb = _conv_chunk(Lout * CK, B)
    col = _cvbuf(0, nb * Lout * CK)
    b0 = 0
    while b0 < B:                  # chunks of nb samples (a range with a variable step would allocate)
        n = B - b0 if B - b0 < nb else nb
        direct = groups == 1 and n == B
        for g in range(groups):
            wg = _group(1, weight, groups, g, OCg * CK)
            bg = _group(2, bias, groups, g, OCg)
            _im2col(col, inp, b0, n, L, C, Lout, KS, stride, pad, dil, g * Cg, Cg)
            y = out if direct else _cvbuf(3, n * Lout * OCg)
            if bg is None:
                _mm(y, col, wg, y, 1, n * Lout, CK, OCg, 0, 0)
            else:
                _mm(y, col, wg, bg, 1, n * Lout, CK, OCg, 1, 0)
            if not direct:
                _cvcopy(out, y, n * Lout, OC, b0 * Lout * OC + g * OCg, OCg, 0, OCg)
        b0 += nb


def conv1d_backward(dinp, dweight, dbias, dout, inp, weight, B, L, C, Lout, OC, KS, stride, pad, dil, groups):
    # in the forward pass this was out[b,t,o] = bias[o] + sum_{c,j} weight[o,c,j] inp[b, t stride + j dil - pad, g Cg + c]
    # dinp (B, L, C) written; dweight (OC, Cg, KS) and dbias (OC,) accumulated; None = skipped
    Cg = C // groups
    OCg = OC // groups
    CK = Cg * KS
    if dweight is not None or dbias is not None:
        nb = _conv_chunk(Lout * CK + Lout * OCg, B)
        col = _cvbuf(0, nb * Lout * CK)
        for g in range(groups):
            dw = _group(4, dweight, groups, g, OCg * CK)
            db = _group(5, dbias, groups, g, OCg)
            b0 = 0
            while b0 < B:              # (a range with a variable step would allocate)
                n = B - b0 if B - b0 < nb else nb
                N = n * Lout
                if groups == 1 and n == B:
                    dyg = dout
                else:
                    dyg = _cvbuf(3, N * OCg)
                    _cvcopy(dyg, dout, N, OCg, 0, OC, b0 * Lout * OC + g * OCg, OCg)
                if dw is None:
                    _mm(db, dyg, _ones(N), db, 4, N, CK, OCg, 0, 0)
                    b0 += nb
                    continue
                _im2col(col, inp, b0, n, L, C, Lout, KS, stride, pad, dil, g * Cg, Cg)
                if db is None:
                    _mm(dw, dyg, col, dw, 3, N, CK, OCg, 0, 0)
                else:
                    _mm(dw, dyg, col, db, 3, N, CK, OCg, 1, 0)
                b0 += nb
            _ungroup(dweight, dw, groups, g, OCg * CK)
            _ungroup(dbias, db, groups, g, OCg)
    if dinp is not None:
        KO = KS * OCg
        nb = _conv_chunk(L * KO + L * Cg, B)
        dcol = _cvbuf(0, nb * L * KO)
        wt = _cvbuf(1, Cg * KO)
        for g in range(groups):
            _wperm(wt, weight, g * OCg, OCg, Cg, KS)
            b0 = 0
            while b0 < B:              # (a range with a variable step would allocate)
                n = B - b0 if B - b0 < nb else nb
                _dcol(dcol, dout, b0, n, L, OC, Lout, KS, stride, pad, dil, g * OCg, OCg)
                direct = groups == 1 and n == B
                dx = dinp if direct else _cvbuf(3, n * L * Cg)
                _mm(dx, dcol, wt, dx, 1, n * L, KO, Cg, 0, 0)
                if not direct:
                    _cvcopy(dinp, dx, n * L, C, b0 * L * C + g * Cg, Cg, 0, Cg)
                b0 += nb


# max and average pooling along the sequence (MaxPool1D / AvgPool1D) stay on the portable loops
# (comparisons and a 1/KS scale: no multiply-accumulate worth a block-float kernel)
