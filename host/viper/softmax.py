# microformer.viper_softmax: softmax and losses: attention (scores, softmax, context and their
# backward) and softmax cross-entropy.
import micropython
from array import array
from micropython import const
from .viper_common import _fscratch, _gscratch, _iscratch, _mant15, _store
from .viper_elementwise import dropout_apply
from .viper_gemm import DECODE_CONTEXT, DECODE_SCORES, HEAD_CONTEXT, HEAD_SCORES, HEAD_TRANSPOSED, _mm

# _softmax's parameters, slots of _D
_TK = const(0)          # keys per row
_CAUSAL = const(1)      # 1: query t sees keys j <= t + Tk - Tq
_SCALE_M = const(2)     # 1/sqrt(hs): mantissa (Q15)
_SCALE_E = const(3)     # ... and its exponent
_MASKED = const(4)      # 1: a padding mask is given
_B = const(5)           # batch size
_RS = const(6)          # row stride of att (Tk, or the cache length L when decoding)
_D = array("i", [0] * 7)
_SCALE = {}                    # head size -> (mantissa Q15, exponent) of 1/sqrt(hs)


def _scale_of(hs):
    sc = _SCALE.get(hs)
    if sc is None:
        sc = _SCALE[hs] = _mant15(1.0 / (hs ** 0.5))
    return sc


# ---- attention -------------------------------------------------------------------------------
# ERROR BOUND (tests/test_viper_range.py): for any finite float32 scores, every weight w_j is
#   within 2e-4 w_j + 2e-5 (y_j + 1) w_j of the softmax of the same scores (relative to the
#   element), y_j = (max - s_j) * scale, and 0 where w_j < 2^-126; rows sum to 1 within 4e-4.
#   Scores are never clamped: only the difference y_j >= 128 (weight < 3e-56, 0 in float32) is.
@micropython.viper
def _softmax(att, mask, d, s, NH: int, Tq: int):
    # att (B, NH, Tq, Tk): raw scores in, softmax(scores * scale) out, in place  [B3]
    # Only s_j - max is needed: it is formed from the aligned 24-bit mantissas of the two
    # float32 scores (exact to half an ulp of the larger), so any finite score works.
    D = ptr32(d)
    S = ptr32(s)
    pa = ptr32(att)
    pm = ptr8(mask)
    Tk = D[_TK]
    causal = D[_CAUSAL]
    sm = D[_SCALE_M]
    se = D[_SCALE_E]
    hasmask = D[_MASKED]
    rs = D[_RS]
    b31 = 31
    sx = 1 << b31                       # (v ^ sx) - sx sign-extends a zero-extended int32 load
    se = (se ^ sx) - sx
    shift = Tk - Tq
    ycap = 1 << 23                      # y = (max - s) scale in Q16 >= 128: weight < 2^-184, 0
    zs = 15                             # Z = sum_j e_j in Q(15 + zs), < 2^30 (Tk < 2^16: < 2^31)
    while zs > 0 and (1 << (15 - zs)) < Tk:
        zs -= 1
    ab = 0
    for b in range(D[_B]):
        for h in range(NH):
            for t in range(Tq):
                last = Tk - 1
                if causal:
                    last = t + shift
                    if last > Tk - 1:
                        last = Tk - 1
                softmax_max()                   # pass 1: the row max as mx * 2^(ex - 150)
                # pass 2: y_j = (max - s_j) scale in Q16; e_j = exp(-y_j) = p_j 2^(-15 - k_j)
                # with p_j in [2^14, 2^15) kept apart from k_j; Z = sum_j e_j in Q(15 + zs)
                z = 0
                for j in range(Tk):
                    S[j] = 0
                    if j > last or (hasmask and pm[b * Tk + j] != 0):
                        continue
                    x = pa[ab + j]
                    softmax_exp(x, p, k)
                    if p == 0:
                        continue                    # weight 0 (below float32 range)
                    S[j] = p
                    S[Tk + j] = k
                    if k < 30:
                        z += (p << zs) >> k                             #!chk z
                # Z = zr * 2^(zn - 15 - zs), zr in [2^14, 2^15) rounded (z >= 32767 << zs)
                znorm(z, zr, zn)
                # pass 3: w_j = p_j 2^-k_j / Z = (p_j 2^16 / zr) 2^(zs - zn - 16 - k_j)
                for j in range(Tk):
                    p = S[j]
                    if p == 0:
                        pa[ab + j] = 0
                        continue
                    wbits(p, S[Tk + j], w, e)
                    if e <= 0:
                        pa[ab + j] = 0
                    else:
                        pa[ab + j] = (e << 23) | (w & 0x7FFFFF)
                ab += rs


@micropython.viper
def _softmax_back(j: int, x: int, ab: int, ds, att, rows: int, Tk: int, sm: int, se: int):
    # j x ab: the hottest locals; as the first three they live in registers (callers pass 0s)
    # in the forward pass this was att = softmax(scores * scale), rows = B * NH * Tq
    # ds (rows, Tk): dA in, dS = A * (dA - sum_j dA_j A_j) * scale out, in place.
    # dA_j - dot cancels when attention is peaked, so dot is built from 30-bit products
    # (24x24-bit mantissas split in 12-bit halves) instead of block-float.  [B4]
    # ERROR BOUND (attention backward as a whole, dA and the dq/dk/dv GEMMs included): dv within
    #   1e-3 max_t A[t,j] max_t |dout[t,col]|; dq (dk) within 2e-3 G max|k| (max|q|) of the
    #   column, G = max A hs max|dout| max|v| / sqrt(hs) of the query row (of the batch item and
    #   head): dS = A (dA - dot) cancels, so the bound is relative to its operands' block maxima.
    pd = ptr32(ds)
    pa = ptr32(att)
    h = 1                               # headroom: 2^h >= 2 Tk
    while (1 << h) < Tk + Tk:
        h += 1
    ab = 0
    for r in range(rows):
        # pass 1: largest product exponent
        pmax = 0
        for j in range(Tk):
            ea = (pa[ab + j] >> 23) & 0xFF
            ed = (pd[ab + j] >> 23) & 0xFF
            if ea != 0 and ed != 0 and ea + ed > pmax:
                pmax = ea + ed
        # pass 2: dot = sum_j a_j dA_j = dot_i * 2^(pmax - 282 + h), |dot_i| < 2^29
        dot = 0
        if pmax != 0:
            for j in range(Tk):
                x = pa[ab + j]
                y = pd[ab + j]
                ea = (x >> 23) & 0xFF
                ed = (y >> 23) & 0xFF
                if ea == 0 or ed == 0:
                    continue
                ma = (x & 0x7FFFFF) | 0x800000
                md = (y & 0x7FFFFF) | 0x800000
                if ea == 255:
                    ma = 0xFFFFFF
                if ed == 255:
                    md = 0xFFFFFF
                ah = ma >> 12
                al = ma & 0xFFF
                dh = md >> 12
                dl = md & 0xFFF
                p = (ah * dh << 6) + ((ah * dl + al * dh) >> 6)    # ma*md / 2^18 < 2^30
                sh = pmax - ea - ed + h
                if sh > 30:
                    p = 0
                else:
                    p = (p + (1 << (sh - 1))) >> sh
                if ((x ^ y) >> 31) & 1:
                    p = 0 - p
                dot += p                                            #!chk dot
        de = pmax - 282 + h
        # pass 3: ds_j = a_j (dA_j - dot) scale
        for j in range(Tk):
            x = pa[ab + j]
            ea = (x >> 23) & 0xFF
            if ea == 0:
                pd[ab + j] = 0
                continue
            y = pd[ab + j]
            ed = (y >> 23) & 0xFF
            md = 0
            if ed != 0:
                mant30(y, md, ed)
            me = ed - 156
            o = dot
            if pmax == 0:
                o = 0
            # diff = md * 2^me - o * 2^de, aligned to the larger exponent
            if md == 0:
                v = 0 - o
                e = de
            elif o == 0:
                v = md
                e = me
            else:
                alignsub(md, me, o, de, v, e, sh)
            # v * 2^e (|v| < 2^31) times a (15 bits) times scale (15 bits); |v| cut to < 2^15
            unsign(v, neg)
            while v >= 0x800000:
                v = v >> 8
                e += 8
            down(v, e, 0x80000, 4)
            down(v, e, 0x20000, 2)
            down(v, e, 0x10000, 1)
            down(v, e, 0x8000, 1)
            ma = ((x & 0x7FFFFF) | 0x800000) >> 9
            if ea == 255:
                ma = 0x7FFF
            v = ((v * ma) >> 15) * sm                               #!chk v
            # pack v * 2^(e + ea - 126 + se) into float32 bits (v < 2^30)
            e = e + ea - 126 + se
            sg = neg
            pack(pd, ab + j, v, e, sg)
        ab += Tk


# ---- small heads: the whole attention of a layer in one viper call ---------------------------
# At head sizes hs <= _SMALL_HS with at most _SMALL_T queries and keys (Iris: hs 4, T 4) the
# GEMM path pays more for its per-call setup, its per-block quantization and the packing of
# every intermediate than for the products. These kernels quantize each operand of a head once
# (quant2) and keep scores, weights and gradients as integers of one exponent per head block (or
# per row / column where the bound below needs it); only the results are packed to float32.
_SMALL_HS = const(8)
_SMALL_T = const(16)


def _scale_table():
    # 1/sqrt(hs) for hs = 0 .. _SMALL_HS: mantissa Q15 at 2 hs, exponent at 2 hs + 1
    t = array("i", [0] * (2 * _SMALL_HS + 2))
    for hs in range(1, _SMALL_HS + 1):
        t[2 * hs], t[2 * hs + 1] = _scale_of(hs)
    return t


_HSC = _scale_table()


# ERROR BOUND (tests/test_viper_range.py, small-head cases): the scores of query row t carry
#   |ds| <= hs 2^(1-P) max|q_t| max|k_bh| / sqrt(hs) (P = 14 for hs <= 4, else 13; k_bh: every
#   key of the batch item and head), which moves a weight by at most a factor e^(2 |ds|); from
#   those scores the weights obey the _softmax bound, and out[t, col] is within
#   (2^-14 + Tk 2^-16) max_j |v[b, j, col]| of sum_j w_j v[j, col] (15-bit weights, 14-bit
#   values per column): with the softmax's 4e-4, within 1e-3 max|v| of the column, as the GEMM
#   path. OVERFLOW [B3]: |score| <= hs (2^P - 1)^2 < 2^30, so max - s < 2^31; then as _softmax
#   (the difference cut to 16 bits times the 15-bit scale); the context sums 15-bit weights (sum
#   <= 2^15 + Tk / 2) times 14-bit values: < 2^30.
@micropython.viper
def _attn_small(j: int, acc: int, c: int, out, att, qin, kin, vin, mask, s, d):
    # j acc c: the hottest locals; as the first three they live in registers (callers pass 0s)
    # qin (B, Tq, C), kin vin (B, Tk, C); out (B, Tq, C), att (B, NH, Tq, Tk) written
    # d: B Tq Tk C NH causal hasmask; mask (B, Tk) bytes when hasmask (else any buffer)
    D = ptr32(d)
    S = ptr32(s)
    po = ptr32(out)
    pa = ptr32(att)
    pq = ptr32(qin)
    pk = ptr32(kin)
    pv = ptr32(vin)
    pm = ptr8(mask)
    hasmask = D[6]
    B = D[0]
    Tq = D[1]
    Tk = D[2]
    C = D[3]
    NH = D[4]
    causal = D[5]
    H = ptr32(_HSC)
    hs = C // NH
    sm = H[hs + hs]
    b31 = 31
    sx = 1 << b31                       # (v ^ sx) - sx sign-extends a zero-extended int32 load, and
    b16 = 16                            # & m32 first a sum of such loads' products (exact mod 2^32)
    m32 = (1 << b16) * (1 << b16) - 1
    se = (H[hs + hs + 1] ^ sx) - sx
    Pqk = 13                            # bits of q and k: hs (2^P - 1)^2 < 2^30
    if hs <= 4:
        Pqk = 14
    oV = Tk * hs                        # S: [0, oV) the head's keys (by rows), [oV, 2 oV) values
    oE = oV + oV                        # (by columns); [oE, oE + hs) the value columns' bases;
    oQ = oE + hs                        # [oQ, oQ + hs) the query row; the keys' bases,
    oKe = oQ + hs                       # then p_j, k_j of the exponentials, then the weights
    oP = oKe + Tk                       # in Q15 (for the context)
    oK = oP + Tk
    oW = oK + Tk
    shift = Tk - Tq
    ycap = 1 << 23                      # y = (max - s) scale in Q16 >= 128: weight < 2^-184, 0
    zs = 15                             # Z = sum_j e_j in Q(15 + zs), < 2^30 (as _softmax)
    while zs > 0 and (1 << (15 - zs)) < Tk:
        zs -= 1
    ab = 0
    for b in range(B):
        for h in range(NH):
            i0 = b * Tk * C + h * hs
            P = Pqk
            for j in range(Tk):         # each key row is a block (as the GEMM's rows)
                quant1(pk, i0 + j * C, hs, 1, S, j * hs)
                S[oKe + j] = base
            P = 14
            for c in range(hs):         # each value column is a block
                quant1(pv, i0 + c, Tk, C, S, oV + c * Tk)
                S[oE + c] = base
            for ti in range(Tq):
                last = Tk - 1
                if causal:
                    last = ti + shift
                    if last > Tk - 1:
                        last = Tk - 1
                qi = (b * Tq + ti) * C + h * hs
                P = Pqk
                quant1(pq, qi, hs, 1, S, oQ)
                qbase = base - 300
                # the visible scores q_t . k_j, unscaled, as float32 bits in att (as the GEMM path)
                for j in range(last + 1):
                    if hasmask and pm[b * Tk + j] != 0:
                        continue
                    acc = 0
                    kj = j * hs
                    for c in range(hs):
                        acc += S[oQ + c] * S[kj + c]
                    acc = ((acc & m32) ^ sx) - sx                   #!chk acc
                    e = qbase + S[oKe + j]
                    store(pa, ab + j, acc, e)
                softmax_max()
                # e_j = exp(-(max - s_j) scale) = p_j 2^(-15 - k_j); Z = sum_j e_j in Q(15 + zs)
                z = 0
                for j in range(Tk):
                    S[oP + j] = 0
                    if j > last or (hasmask and pm[b * Tk + j] != 0):
                        continue
                    x = pa[ab + j]
                    softmax_exp(x, p, kk)
                    S[oP + j] = p
                    S[oK + j] = kk
                    if p != 0 and kk < 30:
                        z += (p << zs) >> kk                        #!chk z
                # the weights as float32 (att) and in Q15 (S[oW ...], for the context)
                zr = 0
                zn = 0
                if z:
                    znorm(z, zr, zn)
                for j in range(Tk):
                    p = S[oP + j]
                    S[oW + j] = 0
                    if p == 0:
                        pa[ab + j] = 0
                        continue
                    wbits(p, S[oK + j], w, e)
                    if e <= 0:
                        pa[ab + j] = 0
                    else:
                        pa[ab + j] = (e << 23) | (w & 0x7FFFFF)
                        sh = 135 - e                # w 2^(e - 150) in Q15
                        rsh(w, sh)
                        S[oW + j] = w
                # the context out[t, c] = sum_j w_j v[j, c]
                oi = qi
                for c in range(hs):
                    acc = 0
                    vj = oV + c * Tk
                    for j in range(last + 1):
                        acc += S[oW + j] * S[vj + j]
                    acc = ((acc & m32) ^ sx) - sx                   #!chk acc
                    e = S[oE + c] - 165
                    store(po, oi, acc, e)
                    oi += 1
                ab += Tk


_DS = array("i", [0] * 7)            # the small kernels' shapes: B Tq Tk C NH causal hasmask


@micropython.viper
def attention_forward(out, att, q, k, v, mask, B: int, Tq: int, Tk: int, C: int, NH: int, causal: int):
    # q (B, Tq, C), k v (B, Tk, C); head h owns columns h*hs .. (h+1)*hs, hs = C // NH
    # att (B, NH, Tq, Tk): softmax weights (0 where masked); out (B, Tq, C): heads concatenated
    # mask (B, Tk) bytes-like (nonzero = padded) or None; causal: query t sees keys j <= t + Tk - Tq
    # A viper function (no heap frame per call): small heads run _attn_small, others the GEMM path.
    hs = C // NH
    if hs > _SMALL_HS or Tq > _SMALL_T or Tk > _SMALL_T:
        _attention_forward_gemm(out, att, q, k, v, mask, B, Tq, Tk, C, NH, causal)
        return
    D = ptr32(_DS)
    D[0] = B
    D[1] = Tq
    D[2] = Tk
    D[3] = C
    D[4] = NH
    D[5] = causal
    m = mask
    D[6] = 1
    if not mask:                        # None (no viper `is None`)
        m = _DS
        D[6] = 0
    _attn_small(0, 0, 0, out, att, q, k, v, m, _iscratch(2 * Tk * hs + 2 * hs + 4 * Tk), _DS)


def _attention_forward_gemm(out, att, q, k, v, mask, B, Tq, Tk, C, NH, causal):
    # q (B, Tq, C), k v (B, Tk, C); head h owns columns h*hs .. (h+1)*hs, hs = C // NH
    # ERROR BOUND: the scores carry the _gemm bound (|ds| <= 2^-11 hs max|q_h| max|k_h| / sqrt(hs),
    #   which moves a weight by at most a factor e^(2 |ds|)); from those scores the weights obey
    #   the _softmax bound and out is within 1e-3 max_j |v[b, j, col]| (masked keys included:
    #   they share the block). The KV-cache decode step (attention_decode) is portable.
    # att (B, NH, Tq, Tk): softmax weights (0 where masked); out (B, Tq, C): heads concatenated
    # mask (B, Tk) bytes-like (nonzero = padded) or None; causal: query t sees keys j <= t + Tk - Tq
    if Tk >= 65536:                     # the softmax sum Z needs Tk < 2^16 [B3]
        raise ValueError("attention_forward: Tk must be < 65536 keys, got %d" % Tk)
    sc = _scale_of(C // NH)
    _mm(att, q, k, att, HEAD_SCORES, B, Tq, Tk, C, NH)         # scores att[b,h,t,j] = q[b,t,h] . k[b,j,h]
    D = _D
    D[_TK] = Tk
    D[_CAUSAL] = causal
    D[_SCALE_M] = sc[0]
    D[_SCALE_E] = sc[1]
    D[_B] = B
    D[_RS] = Tk
    if mask is None:
        D[_MASKED] = 0
        _softmax(att, D, D, _iscratch(Tk + Tk), NH, Tq)
    else:
        D[_MASKED] = 1
        _softmax(att, mask, D, _iscratch(Tk + Tk), NH, Tq)
    _mm(out, att, v, out, HEAD_CONTEXT, B, Tq, Tk, C, NH)        # context out[b,t,h] = sum_j att[b,h,t,j] v[b,j,h]


def attention_decode(out, att, q, kc, vc, B, T, L, C, NH):
    # one causal query per sequence against the first T cached keys (itself included):
    # q (B, C); kc vc (B, L, C): cached keys/values, rows 0..T-1 valid
    # att (B, NH, L): weights, columns 0..T-1 written; out (B, C): heads concatenated
    # ERROR BOUND: attention_forward's (the same GEMM blocks and softmax, on the cache in place)
    if T >= 65536:
        raise ValueError("attention_decode: T must be < 65536 keys, got %d" % T)
    sc = _scale_of(C // NH)
    _mm(att, q, kc, att, DECODE_SCORES, B, T, L, C, NH)
    D = _D
    D[_TK] = T
    D[_CAUSAL] = 0
    D[_SCALE_M] = sc[0]
    D[_SCALE_E] = sc[1]
    D[_B] = B
    D[_RS] = L
    D[_MASKED] = 0
    _softmax(att, D, D, _iscratch(T + T), NH, 1)
    _mm(out, att, vc, out, DECODE_CONTEXT, B, T, L, C, NH)


# ERROR BOUND (tests/test_viper_range.py, small-head cases), T = max(Tq, Tk) <= 16, quantized
#   with block float of P bits (|x - x~| <= 2^-P max|x| of the block):
#   dv[j, col] within Tq 2^(1-PA) max_t A[t, j] max_t |dout[t, col]| (A's column and dout's column
#     are blocks; PA = 14 for Tq <= 8, else 13);
#   dA[t, j] = dout_t . v_j within hs 2^(1-P) max|dout_t| max|v_bh| (P = 14 for hs <= 4, else 13;
#     v_bh: the head's values), then cut to 15 bits of the row's largest |dA|, A to 2^-16;
#   dS = A (dA - dot) scale: within 2^-13 G_t, G_t = hs max|dout_t| max|v_bh| scale;
#   dq[t, col] within Tk 2^(-Q) max_j |dS[t, j]| max|k[:, col]| plus the dS error times
#     Tk max|k[:, col]| (the row of dS a block of Q bits, k's columns of 13), Q = min(15,
#     17 - clog2 T); dk[j, col] the same with Tq, max|dS| of the head and max|q[:, col]|.
# OVERFLOW: dA < hs 2^(2P) <= 2^30; dot = sum_j A15_j dA15_j < (2^15 + Tk/2) 2^15 < 2^31;
#   dS_j = A15_j (dA15_j - dot15) = a (1 - a) (dA_j - mean of the others) 2^15 < 2^29 (+ rounding);
#   dS aligned to Q <= 15 bits, times the 15-bit scale < 2^30; the MACs: T 2^Q 2^13 <= 2^30 and
#   Tq (2^PA - 1)^2 < 2^31.
@micropython.viper
def _attn_small_back(j: int, acc: int, c: int, dq, dk, dv, dout, att, qin, kin, vin, s, d):
    # j acc c: the hottest locals; as the first three they live in registers (callers pass 0s)
    # in the forward pass this was out = softmax(q.k^T * scale (+mask)) . v, per head (_attn_small)
    # dq (B, Tq, C), dk dv (B, Tk, C): written; dout (B, Tq, C); att (B, NH, Tq, Tk); d: B Tq Tk C NH
    D = ptr32(d)
    S = ptr32(s)
    pa = ptr32(att)
    pdo = ptr32(dout)
    pq = ptr32(qin)
    pk = ptr32(kin)
    pv = ptr32(vin)
    pdq = ptr32(dq)
    pdk = ptr32(dk)
    pdv = ptr32(dv)
    B = D[0]
    Tq = D[1]
    Tk = D[2]
    C = D[3]
    NH = D[4]
    H = ptr32(_HSC)
    hs = C // NH
    sm = H[hs + hs]
    b31 = 31
    sx = 1 << b31                       # sign extension of zero-extended loads, as _attn_small
    b16 = 16
    m32 = (1 << b16) * (1 << b16) - 1
    se = (H[hs + hs + 1] ^ sx) - sx
    Pv = 13                             # dout rows and the head's values: hs (2^P - 1)^2 < 2^30
    if hs <= 4:
        Pv = 14
    PA = 13                             # A and dout columns: Tq (2^PA - 1)^2 < 2^31
    if Tq <= 8:
        PA = 14
    T = Tq
    if Tk > T:
        T = Tk
    Q = 17                              # bits of the head's dS block: T 2^Q 2^13 <= 2^30
    while (1 << (17 - Q)) < T:
        Q -= 1
    if Q > 15:
        Q = 15
    # scratch: the head's values (rows), dout / k / q by columns, a dout row, an A column, a dA
    # row, dS (Tq, Tk), per row: dS's exponent and bit length; the columns' bases
    oDc = Tk * hs
    oKc = oDc + hs * Tq
    oQc = oKc + hs * Tk
    oDr = oQc + hs * Tq
    oAc = oDr + hs
    oA = oAc + Tq
    oS = oA + Tk
    oF = oS + Tq * Tk
    oM = oF + Tq
    oB = oM + Tq                        # bases: dout columns, k columns, q columns (hs each)
    for b in range(B):
        for h in range(NH):
            i0 = b * Tk * C + h * hs    # the head's first key / value
            iq = b * Tq * C + h * hs    # its first query / dout row
            ab = (b * NH + h) * Tq * Tk
            P = Pv
            quant2(pv, i0, Tk, hs, C, S, 0)
            vbase = base
            for c in range(hs):
                P = PA
                quant1(pdo, iq + c, Tq, C, S, oDc + c * Tq)
                S[oB + c] = base
                P = 13
                quant1(pk, i0 + c, Tk, C, S, oKc + c * Tk)
                S[oB + hs + c] = base
                quant1(pq, iq + c, Tq, C, S, oQc + c * Tq)
                S[oB + hs + hs + c] = base
            # per query row: dA, dot, dS = A (dA - dot) as ints of the row's exponent F_t
            for ti in range(Tq):
                P = Pv
                quant1(pdo, iq + ti * C, hs, 1, S, oDr)
                mx = 0
                for j in range(Tk):
                    acc = 0
                    vj = j * hs
                    for c in range(hs):
                        acc += S[oDr + c] * S[vj + c]
                    acc = ((acc & m32) ^ sx) - sx                   #!chk acc
                    S[oA + j] = acc
                    if acc > mx:
                        mx = acc
                    elif 0 - acc > mx:
                        mx = 0 - acc
                sd = 0                          # dA cut to 15 bits of the row's largest
                while (mx >> sd) >= 0x8000:
                    sd += 1
                dot = 0
                r0 = ab + ti * Tk
                for j in range(Tk):
                    x = (S[oA + j] ^ sx) - sx
                    if sd > 0:
                        x = ((x >> (sd - 1)) + 1) >> 1
                    S[oA + j] = x
                    y = pa[r0 + j]
                    e = (y >> 23) & 0xFF
                    a = 0
                    if e != 0:
                        a = (y & 0x7FFFFF) | 0x800000
                        sh = 135 - e            # A in Q15
                        rsh(a, sh)
                    S[oS + ti * Tk + j] = a
                    dot += a * x                                    #!chk dot
                dot = ((dot >> 14) + 1) >> 1
                mx = 0
                for j in range(Tk):
                    a = S[oS + ti * Tk + j]
                    x = 0
                    if a != 0:
                        x = a * (((S[oA + j] ^ sx) - sx) - dot)     #!chk x
                    S[oS + ti * Tk + j] = x
                    if x > mx:
                        mx = x
                    elif 0 - x > mx:
                        mx = 0 - x
                n = 0
                while (mx >> n) != 0:
                    n += 1
                F = base + vbase + sd - 315     # dS_t,j = x 2^F (before the scale)
                S[oF + ti] = F
                S[oM + ti] = n
                # dq[t, c] = sum_j dS[t, j] k[j, c], the row's dS a block of Q bits, times the scale
                oi = iq + ti * C
                qs = n - Q
                for j in range(Tk):
                    x = (S[oS + ti * Tk + j] ^ sx) - sx
                    if x != 0:
                        if qs > 0:
                            rsh(x, qs)
                        else:
                            x = x << (0 - qs)
                        x = (x * sm + 0x4000) >> 15                 #!chk x
                    S[oA + j] = x
                for c in range(hs):
                    acc = 0
                    if n:
                        kc = oKc + c * Tk
                        for j in range(Tk):
                            acc += S[oA + j] * S[kc + j]
                        acc = ((acc & m32) ^ sx) - sx               #!chk acc
                    e = F + qs + se + 15 + S[oB + hs + c] - 150
                    store(pdq, oi + c, acc, e)
            # the head's dS as one block of Q bits, times the scale: dS_t,j = x 2^G
            G = 0
            seen = 0
            for ti in range(Tq):
                if S[oM + ti] != 0:
                    g = S[oM + ti] + ((S[oF + ti] ^ sx) - sx)
                    if seen == 0 or g > G:
                        G = g
                        seen = 1
            if seen:
                for ti in range(Tq):
                    sh = G - Q - ((S[oF + ti] ^ sx) - sx)
                    for j in range(Tk):
                        x = (S[oS + ti * Tk + j] ^ sx) - sx
                        if x != 0:
                            if sh > 0:
                                rsh(x, sh)
                            else:
                                x = x << (0 - sh)
                            x = (x * sm + 0x4000) >> 15                 #!chk x
                        S[oS + ti * Tk + j] = x
            G = G - Q + se + 15
            # dv[j, c] = sum_t A[t, j] dout[t, c] (A's column j a block)
            for jk in range(Tk):
                P = PA
                quant1(pa, ab + jk, Tq, Tk, S, oAc)
                ae = base - 300
                oi = i0 + jk * C
                for c in range(hs):
                    acc = 0
                    dc = oDc + c * Tq
                    for j in range(Tq):
                        acc += S[oAc + j] * S[dc + j]
                    acc = ((acc & m32) ^ sx) - sx                   #!chk acc
                    e = ae + S[oB + c]
                    store(pdv, oi + c, acc, e)
            # dk[j, c] = sum_t dS[t, j] q[t, c] (dS of the head one block)
            for jk in range(Tk):
                oi = i0 + jk * C
                for c in range(hs):
                    acc = 0
                    if seen:
                        qc = oQc + c * Tq
                        i = oS + jk
                        for j in range(Tq):
                            acc += S[i] * S[qc + j]
                            i += Tk
                        acc = ((acc & m32) ^ sx) - sx               #!chk acc
                    e = G + S[oB + hs + hs + c] - 150
                    store(pdk, oi + c, acc, e)


@micropython.viper
def attention_backward(dq, dk, dv, scratch, dout, att, q, k, v, B: int, Tq: int, Tk: int, C: int, NH: int):
    # in the forward pass this was out = softmax(q.k^T * scale (+mask)) . v, per head
    # dq (B, Tq, C), dk dv (B, Tk, C): written; scratch is unused (the module keeps its own)
    # dout (B, Tq, C); att (B, NH, Tq, Tk) the forward's weights
    # A viper function (no heap frame per call): small heads run _attn_small_back, others the GEMM path.
    hs = C // NH
    if hs > _SMALL_HS or Tq > _SMALL_T or Tk > _SMALL_T:
        _attention_backward_gemm(dq, dk, dv, dout, att, q, k, v, B, Tq, Tk, C, NH)
        return
    D = ptr32(_DS)
    D[0] = B
    D[1] = Tq
    D[2] = Tk
    D[3] = C
    D[4] = NH
    _attn_small_back(0, 0, 0, dq, dk, dv, dout, att, q, k, v,
                     _iscratch(Tk * hs + 2 * hs * Tq + hs * Tk + hs + 4 * Tq + Tk + Tq * Tk + 3 * hs), _DS)


def _attention_backward_gemm(dq, dk, dv, dout, att, q, k, v, B, Tq, Tk, C, NH):
    # attention_backward through the GEMM: dA, dv, then dS and dq, dk (_scores_back)
    F = _fscratch(B * NH * Tq * Tk)    # (B, NH, Tq, Tk): dA, then dS
    _mm(F, dout, v, F, HEAD_SCORES, B, Tq, Tk, C, NH)          # dA[b,h,t,j] = dout[b,t,h] . v[b,j,h]
    _mm(dv, att, dout, dv, HEAD_TRANSPOSED, B, Tq, Tk, C, NH)      # dv[b,j,h] = sum_t att[b,h,t,j] dout[b,t,h]
    _scores_back(dq, dk, F, att, q, k, B, Tq, Tk, C, NH)


def _scores_back(dq, dk, F, att, q, k, B, Tq, Tk, C, NH):
    # F (B, NH, Tq, Tk) holds dA; it becomes dS = A (dA - rowsum(dA A)) / sqrt(hs); then
    # dq[b,t,h] = sum_j dS[b,h,t,j] k[b,j,h] and dk[b,j,h] = sum_t dS[b,h,t,j] q[b,t,h] (written)
    sc = _scale_of(C // NH)
    _softmax_back(0, 0, 0, F, att, B * NH * Tq, Tk, sc[0], sc[1])
    _mm(dq, F, k, dq, HEAD_CONTEXT, B, Tq, Tk, C, NH)
    _mm(dk, F, q, dk, HEAD_TRANSPOSED, B, Tq, Tk, C, NH)


# ---- dropout on the attention weights: A' = A keep / (1 - p) ---------------------------------
# ERROR BOUND: A' is exact (dropout_apply: the float32 products); then the GEMM bounds with A' in
#   place of A (weights up to 1/(1 - p), so the context bound 1e-3 max|v| grows by that factor),
#   and the softmax backward's on dA = keep (dout . v) / (1 - p).


def attention_context(out, att, keep, v, B, Tq, Tk, C, NH, scale):
    # out (B, Tq, C) = per head (att * keep * scale) . v, heads concatenated
    n = B * NH * Tq * Tk
    G = _gscratch(n)
    dropout_apply(G, att, keep, n, scale)
    _mm(out, G, v, out, HEAD_CONTEXT, B, Tq, Tk, C, NH)


def attention_backward_dropout(dq, dk, dv, scratch, dout, att, keep, q, k, v, B, Tq, Tk, C, NH, pscale):
    # in the forward pass this was out = (A * keep * pscale) . v, A = softmax(q.k^T * scale + mask)
    # dq (B, Tq, C), dk dv (B, Tk, C): written; scratch is unused (the module keeps its own)
    n = B * NH * Tq * Tk
    F = _fscratch(n)
    G = _gscratch(n)
    _mm(F, dout, v, F, HEAD_SCORES, B, Tq, Tk, C, NH)          # dout[b,t,h] . v[b,j,h]
    dropout_apply(F, F, keep, n, pscale)                        # dA = keep pscale (dout . v)
    dropout_apply(G, att, keep, n, pscale)                      # A' = keep pscale A
    _mm(dv, G, dout, dv, HEAD_TRANSPOSED, B, Tq, Tk, C, NH)     # dv[b,j,h] = sum_t A'[b,h,t,j] dout[b,t,h]
    _scores_back(dq, dk, F, att, q, k, B, Tq, Tk, C, NH)


# ---- softmax cross-entropy -------------------------------------------------------------------


@micropython.viper
def _mean_loss(lf, lnt, B: int, lm: int, le: int, pm: int, pe: int):
    # the mean loss (sum_b (max - s_y) + ln prod_b z_b) / B as float32 bits in lf[0], so the
    # caller boxes one float; sum_b (max - s_y) = lm 2^le, prod_b z_b = pm 2^pe (2^14 <= pm < 2^15).
    # ln(pm * 2^pe) = ln(f) + N ln2 with f = pm / 2^15 in [1/2, 1), N = pe + 15; ln f = ln(h / 256) + ln(1 + x), h = pm >> 7, x = (pm & 127) / (128 h) < 2^-7:
    # the table lnt[h - 128] = -ln(h / 256) in Q24, ln(1 + x) ~ x - x^2 / 2 (error < 2^-22).
    # Integer part I and a Q24 fraction F are kept apart, so no term needs more than 31 bits.
    LT = ptr32(lnt)
    h = pm >> 7
    x = ((pm & 127) << 17) // h                             # Q24, < 2^17
    xs = x >> 4
    lnf = x - ((xs * xs) >> 17) - LT[h - 128]               # Q24, in (-ln2 2^24, 0]
    N = pe + 15                                             # |N| < 2^15 (B log2 V < 2^15)
    # N ln2 in Q16 (ln2 = (45426 + 6135 / 2^16) / 2^16): |N 45426| < 2^31; |F| < 2^26
    nl = N * 45426 + ((N * 6135) >> 16)                     #!chk nl
    I = nl >> 16
    F = ((nl & 0xFFFF) << 8) + lnf                          #!chk F
    I += F >> 24
    F = F & 0xFFFFFF
    # ln prod z_b = gm * 2^ge, |gm| < 2^30 (I >= -1: rounding can put it just below 0)
    if I < 32:
        gm = (I << 24) + F
        ge = 0 - 24
    else:
        sh = 24
        while I >= (1 << (29 - sh)):
            sh -= 1
        gm = (I << sh) + (F >> (24 - sh))                   #!chk gm
        ge = 0 - sh
    # total = lm * 2^le + gm * 2^ge, aligned to the larger exponent: |sum| < 2^31
    if lm == 0:
        lm = gm
        le = ge
    elif gm != 0:
        addto(lm, le, gm, ge, sh)
    v = lm
    e = le
    if v < 0:                                               # rounding below an exact 0
        v = 0
    # v / B by long division (v < 2^31, B <= 2^30)
    ldiv(v, e, B, q, rem)
    _store(lf, 0, v, e)


# ERROR BOUND (tests/test_viper_range.py): for any finite float32 logits, the loss is within
#   2^-20 |loss| + 1e-4 of the true mean of max - s_y + ln sum_j exp(s_j - max) (absolute part:
#   the 15-bit exponentials), and dlogits within 1e-4 / B of (softmax - onehot) / B (element,
#   relative to the largest possible |dlogit| 1/B); probabilities below 2^-30 become 0.
#   Logits are never clamped: s_j - max is formed from aligned mantissas, only a difference of
#   32 or more (probability < 2^-46) is capped, and max - s_y enters the loss at full range.
@micropython.viper
def _xent(dlogits, logits, labels, B: int, V: int, ibm: int, ibe: int, s, lnt, lf) -> int:
    # logits (B, V) -> dlogits (B, V) = (softmax - onehot) / B, the mean loss as float32 bits in
    # lf[0]; returns 1 if a logit is inf or NaN (the loss is then not defined), else 0  [B3]
    pl = ptr32(logits)
    S = ptr32(s)
    b31 = 31
    sx = 1 << b31                       # sign-extends S[] loads (not the int args: those are signed)
    ycap = 1 << 21                      # (max - s_j) in Q16 capped at 32: k > 29, probability 0
    b30 = 30
    top = 1 << b30                      # 2^30 (a literal would be folded into a bigint)
    lm = 0                              # sum_b (max_b - s_y): lm * 2^le, 0 <= lm < 2^30
    le = 0
    pm = 1 << 14                        # running product of z_b / 2^15: pm * 2^pe
    pe = 0 - 14
    bad = 0
    zq = 29
    while (1 << (29 - zq)) < V:
        zq -= 1
    for b in range(B):
        lb = b * V
        y = int(labels[b])
        # pass 1: the largest logit, compared as sign-magnitude ints (inf/NaN: +-FLT_MAX, flagged)
        mk = 0
        mj = 0
        for j in range(V):
            x = pl[lb + j]
            key(x, v, e)
            if e == 255:
                bad = 1
            if j == 0 or v > mk:
                mk = v
                mj = j
        x = pl[lb + mj]
        decode(x, mx, ex)
        if ex == 0:
            ex = 1
        # exp(s_j - max) = t_j * 2^(-15 - k_j) with t_j in Q15 kept apart from k_j, so small
        # probabilities keep 15 significant bits; z = sum in Q(zq), zq = 29 - clog2(V)
        z = 0
        for j in range(V):
            x = pl[lb + j]
            gap(x, m, e, dv, de, sh)
            yv = 0                                  # the difference in Q16, capped at ycap
            if dv > 0:
                sh = de - 134
                scaled(dv, sh, yv, 21)
            if j == y and dv > 0:
                # the loss term max - s_y = dv * 2^(de - 150), uncapped: dv to [2^28, 2^29),
                # then an aligned add onto lm (< 2^30 + 2^29 < 2^31) and lm back below 2^30
                te = de - 150
                while dv < 0x10000000:
                    dv = dv << 1
                    te -= 1
                if lm == 0:
                    lm = dv
                    le = te
                else:
                    addto(lm, le, dv, te, sh)
                if lm >= top:
                    lm = (lm + 1) >> 1
                    le += 1
            expq15(yv, k, rr, p)
            if k <= 29:
                z += (p << (zq - 15)) >> k                          #!chk z
            else:
                p = 0
            S[j] = p
            S[V + j] = k
        # z normalized to zr < 2^16 (zr * 2^zr_e = z in Q(zq))
        zr = z
        zre = 0
        while zr >= 65536:
            zr = zr >> 1
            zre += 1
        for j in range(V):
            if j == y:
                # p_y - 1 = -(z - e_y) / z, from the exact integer sum of the others
                o = z - ((S[j] << (zq - 15)) >> S[V + j])
                e = 0
                while o != 0 and o < (1 << 29):
                    o = o << 1
                    e -= 1
                q = o // zr                                         #!chk q
                _store(dlogits, lb + j, 0 - q * ibm, e - zre + ibe)
            else:
                q = (S[j] << 15) // zr                              #!chk q
                _store(dlogits, lb + j, q * ibm, zq - 30 - S[V + j] - zre + ibe)
        z = z >> (zq - 15)
        # pm * 2^pe *= z / 2^15, mantissa kept in [2^14, 2^15)
        while z >= 32768:
            z = z >> 1
            pe += 1
        pm = pm * z                                         #!chk pm
        pe -= 15
        while pm >= 32768:
            pm = pm >> 1
            pe += 1
    _mean_loss(lf, lnt, B, lm, le, pm, pe)
    return bad


def crossentropy_softmax(dlogits, logits, labels, B, V):
    # logits (B, V), labels (B,) ints in [0, V); returns the mean of -log softmax[label];
    # dlogits (B, V) = (softmax(logits) - onehot(label)) / B (written)
    # (the loss is computed in viper; the returned float is the only object allocated)
    # int32 limits of _xent [B3]: the sum z needs V <= 2^14, the log of the product of the B sums
    # (N ln2 in Q16) B log2(V) < 45000
    if V > 16384:
        raise ValueError("crossentropy_softmax (viper): at most 16384 classes, got V=%d" % V)
    if B > 3000:
        lv = 0
        while (1 << lv) < V:
            lv += 1
        if B * lv >= 45000:
            raise ValueError("crossentropy_softmax (viper): B * log2(V) must be < 45000, got B=%d V=%d"
                             " (use smaller batches)" % (B, V))
    ib = _INVB.get(B)
    if ib is None:
        ib = _INVB[B] = _mant15(1.0 / B)
    if _xent(dlogits, logits, labels, B, V, ib[0], ib[1], _iscratch(2 * V), _LNT, _LF):
        return _NAN
    return _LF[0]


_INVB = {}
_LF = array("f", [0.0])             # the loss as float32, written by _xent
_NAN = float("nan")


# -ln(h / 256) in Q24 for h = 128 .. 255, little-endian int32 (built once on the host:
# [int(-log(h / 256.0) * 2**24 + 0.5) for h in range(128, 256)]; a literal, so importing
# this module makes no float garbage)
_LNT = array("i", (
    b'\x18r\xb1\x00\x15t\xaf\x00\x03z\xad\x00\xd1\x83\xab\x00q\x91\xa9\x00\xd4\xa2\xa7\x00'
    b'\xeb\xb7\xa5\x00\xa9\xd0\xa3\x00\x00\xed\xa1\x00\xe1\x0c\xa0\x00@0\x9e\x00\x11W\x9c\x00'
    b'E\x81\x9a\x00\xd2\xae\x98\x00\xab\xdf\x96\x00\xc3\x13\x95\x00\x11K\x93\x00\x87\x85\x91\x00'
    b'\x1b\xc3\x8f\x00\xc2\x03\x8e\x00rG\x8c\x00 \x8e\x8a\x00\xc1\xd7\x88\x00L$\x87\x00'
    b'\xb7s\x85\x00\xf8\xc5\x83\x00\x06\x1b\x82\x00\xd7r\x80\x00c\xcd~\x00\xa0*}\x00'
    b'\x85\x8a{\x00\x0b\xedy\x00(Rx\x00\xd5\xb9v\x00\t$u\x00\xbc\x90s\x00'
    b'\xe7\xffq\x00\x82qp\x00\x84\xe5n\x00\xe8[m\x00\xa5\xd4k\x00\xb5Oj\x00'
    b'\x10\xcdh\x00\xb0Lg\x00\x8d\xcee\x00\xa2Rd\x00\xe7\xd8b\x00Vaa\x00'
    b'\xe9\xeb_\x00\x9ax^\x00b\x07]\x00<\x98[\x00!+Z\x00\x0c\xc0X\x00'
    b"\xf7VW\x00\xdd\xefU\x00\xb8\x8aT\x00\x82'S\x007\xc6Q\x00\xd1fP\x00"
    b'J\tO\x00\x9e\xadM\x00\xc8SL\x00\xc2\xfbJ\x00\x88\xa5I\x00\x16QH\x00'
    b'f\xfeF\x00s\xadE\x00:^D\x00\xb6\x10C\x00\xe2\xc4A\x00\xb9z@\x00'
    b'92?\x00\\\xeb=\x00\x1e\xa6<\x00{b;\x00p :\x00\xf8\xdf8\x00'
    b"\x0e\xa17\x00\xb1c6\x00\xda'5\x00\x88\xed3\x00\xb6\xb42\x00`}1\x00"
    b'\x83G0\x00\x1b\x13/\x00%\xe0-\x00\x9d\xae,\x00\x81~+\x00\xccO*\x00'
    b'{")\x00\x8b\xf6\'\x00\xf9\xcb&\x00\xc2\xa2%\x00\xe2z$\x00WT#\x00'
    b'\x1d/"\x001\x0b!\x00\x91\xe8\x1f\x00:\xc7\x1e\x00\'\xa7\x1d\x00X\x88\x1c\x00'
    b'\xc9j\x1b\x00vN\x1a\x00^3\x19\x00~\x19\x18\x00\xd3\x00\x17\x00Z\xe9\x15\x00'
    b'\x11\xd3\x14\x00\xf6\xbd\x13\x00\x05\xaa\x12\x00<\x97\x11\x00\x99\x85\x10\x00\x19u\x0f\x00'
    b'\xbae\x0e\x00yW\r\x00UJ\x0c\x00J>\x0b\x00W3\n\x00z)\t\x00'
    b'\xaf \x08\x00\xf5\x18\x07\x00I\x12\x06\x00\xaa\x0c\x05\x00\x16\x08\x04\x00\x89\x04\x03\x00'
    b'\x03\x02\x02\x00\x80\x00\x01\x00'
))
