# microformer.viper_softmax: softmax and losses: attention (scores, softmax, context and their
# backward) and softmax cross-entropy.
import micropython
from array import array
from micropython import const
from .viper_common import _BL, _G, _S, _filled, _fscratch, _gscratch, _iscratch, _mant15, _store
from .viper_elementwise import dropout_apply
from .viper_gemm import DECODE_CONTEXT, DECODE_SCORES, HEAD_CONTEXT, HEAD_SCORES, HEAD_TRANSPOSED, _gemm

# _softmax's parameters, slots of _D
_TK = const(0)          # keys per row
_CAUSAL = const(1)      # 1: query t sees keys j <= t + Tk - Tq
_SCALE_M = const(2)     # 1/sqrt(hs): mantissa (Q15)
_SCALE_E = const(3)     # ... and its exponent
_MASKED = const(4)      # 1: a padding mask is given
_B = const(5)           # batch size
_RS = const(6)          # row stride of att (Tk, or the cache length L when decoding)
_D = array("i", [0] * 7)
_NO = array("i")               # an empty operand: _gemm asked only for the scratch it needs
_SCALE = {}                    # head size -> (mantissa Q15, exponent) of 1/sqrt(hs)


def _scale_of(hs):
    sc = _SCALE.get(hs)
    if sc is None:
        sc = _SCALE[hs] = _mant15(1.0 / (hs ** 0.5))
    return sc


# ---- attention -------------------------------------------------------------------------------
# ERROR BOUND (tests/mp/test_viper_range.py): for any finite float32 scores, every weight w_j is
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
    bl = ptr8(_BL)                      # bit lengths (the cut of dv)
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
                    gap(x, m, e, dv, de, sh)
                    y = 0
                    if dv > 0:
                        # dv cut to < 2^16 (rounded): n = bit length of dv >> 16
                        n = 0
                        if dv >= 0x10000:
                            tt = dv >> 16               # 1 .. 511: n = its bit length
                            if tt >= 256:
                                n = 9
                            else:
                                n = bl[tt]
                            dv = ((dv >> (n - 1)) + 1) >> 1            # <= 2^16
                        v = dv * sm                                     #!chk v
                        sh = de - 150 + n + se + 16     # y = v * 2^sh in Q16
                        scaled(v, sh, y, 23)
                    if y >= ycap:
                        continue                    # weight 0 (below float32 range)
                    expq15(y, k, r, p)
                    if p > 32767:
                        p = 32767
                    S[j] = p
                    S[Tk + j] = k
                    if k < 30:
                        z += (p << zs) >> k                             #!chk z
                # Z = zr * 2^(zn - 15 - zs), zr in [2^14, 2^15) rounded (z >= 32767 << zs)
                bitlen(z, zn)                   # the smallest zn with (z >> zn) < 2^15
                zn -= 15
                if zn < 0:
                    zn = 0
                zr = z
                if zn > 0:
                    zr = ((z >> (zn - 1)) + 1) >> 1
                    if zr >= 0x8000:
                        zr = zr >> 1
                        zn += 1
                # pass 3: w_j = p_j 2^-k_j / Z = (p_j 2^16 / zr) 2^(zs - zn - 16 - k_j)
                for j in range(Tk):
                    p = S[j]
                    if p == 0:
                        pa[ab + j] = 0
                        continue
                    w = (p << 16) // zr                 # [2^15, 2^17)
                    e = 150 + zs - zn - 16 - S[Tk + j] - 7
                    if w < 0x10000:
                        w = w << 8
                        e -= 1
                    else:
                        w = w << 7
                    if e <= 0:
                        pa[ab + j] = 0
                    else:
                        pa[ab + j] = (e << 23) | (w & 0x7FFFFF)
                ab += rs


@micropython.viper
def _softmax_back(j: int, x: int, ab: int, ds, att, rows: int, Tk: int, sm: int, se: int, do: int, ao: int):
    # j x ab: the hottest locals; as the first three they live in registers (callers pass 0s)
    # in the forward pass this was att = softmax(scores * scale), rows = B * NH * Tq
    # ds (rows, Tk) from float do on: dA in, dS = A * (dA - sum_j dA_j A_j) * scale out, in
    # place; att (rows, Tk) from float ao on. Each row is computed from its own values only.
    # dA_j - dot cancels when attention is peaked, so dot is built from 30-bit products
    # (24x24-bit mantissas split in 12-bit halves) instead of block-float.  [B4]
    # ERROR BOUND (attention backward as a whole, dA and the dq/dk/dv GEMMs included): dv within
    #   1e-3 max_t A[t,j] max_t |dout[t,col]|; dq (dk) within 2e-3 G max|k| (max|q|) of the
    #   column, G = max A hs max|dout| max|v| / sqrt(hs) of the query row (of the batch item and
    #   head): dS = A (dA - dot) cancels, so the bound is relative to its operands' block maxima.
    pd = ptr32(ds)
    pd = ptr32(uint(pd) + (do << 2))
    pa = ptr32(att)
    pa = ptr32(uint(pa) + (ao << 2))
    bl = ptr8(_BL)                      # bit lengths (the cut to 15 bits, the store)
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
            if v >= 0x8000:             # truncated to 15 bits: n = bit length - 15
                bitlen(v, n)
                n -= 15
                v = v >> n
                e += n
            ma = ((x & 0x7FFFFF) | 0x800000) >> 9
            if ea == 255:
                ma = 0x7FFF
            v = ((v * ma) >> 15) * sm                               #!chk v
            # pack v * 2^(e + ea - 126 + se) into float32 bits (v < 2^30)
            e = e + ea - 126 + se
            sg = neg
            pack_bl(pd, ab + j, v, e, sg)
        ab += Tk


# The attention entry points are viper functions: a bytecode function whose arguments, locals
# and stack exceed 11 words gets its frame from the GC heap on every call (and that allocation
# slows as garbage builds up between collections); a viper function has no such frame, and it
# calls _gemm, _softmax and _softmax_back directly. The arithmetic is that of the kernels below
# (the same calls in the same order as before, so the results are bit-identical).
@micropython.viper
def _head_mm(out, a, b, kind: int, B: int, Tq: int, Tk: int, C: int, NH: int):
    # one per-head product of _gemm (`kind`: HEAD_* / DECODE_*) with the module scratch, grown on demand
    n = int(_gemm(0, 0, 0, out, a, b, out, _S[0], kind, B, Tq, Tk, C, NH))
    if n:
        _gemm(0, 0, 0, out, a, b, out, _iscratch(n), kind, B, Tq, Tk, C, NH)


def _keys_error(name, n):
    raise ValueError("%s: Tk must be < 65536 keys, got %d" % (name, n))


@micropython.viper
def _softmax_rows(att, mask, B: int, Tq: int, Tk: int, rs: int, NH: int, causal: int, hs: int):
    # _softmax over att (B, NH, Tq, rs), the first Tk columns of each row, head size hs;
    # mask (B, Tk) bytes-like or None
    sc = _scale_of(hs)
    D = ptr32(_D)
    D[_TK] = Tk
    D[_CAUSAL] = causal
    D[_SCALE_M] = int(sc[0])
    D[_SCALE_E] = int(sc[1])
    D[_B] = B
    D[_RS] = rs
    m = mask
    D[_MASKED] = 1
    if not mask:                        # None (viper has no `is None`)
        m = _D
        D[_MASKED] = 0
    _softmax(att, m, _D, _iscratch(Tk + Tk), NH, Tq)


@micropython.viper
def attention_forward(out, att, q, k, v, mask, B: int, Tq: int, Tk: int, C: int, NH: int, causal: int):
    # q (B, Tq, C), k v (B, Tk, C); head h owns columns h*hs .. (h+1)*hs, hs = C // NH
    # ERROR BOUND: the scores carry the _gemm bound (|ds| <= 2^-11 hs max|q_h| max|k_h| / sqrt(hs),
    #   which moves a weight by at most a factor e^(2 |ds|)); from those scores the weights obey
    #   the _softmax bound and out is within 1e-3 max_j |v[b, j, col]| (masked keys included:
    #   they share the block).
    # att (B, NH, Tq, Tk): softmax weights (0 where masked); out (B, Tq, C): heads concatenated
    # mask (B, Tk) bytes-like (nonzero = padded) or None; causal: query t sees keys j <= t + Tk - Tq
    if Tk >= 65536:                     # the softmax sum Z needs Tk < 2^16 [B3]
        _keys_error("attention_forward", Tk)
    _head_mm(att, q, k, HEAD_SCORES, B, Tq, Tk, C, NH)         # scores att[b,h,t,j] = q[b,t,h] . k[b,j,h]
    _softmax_rows(att, mask, B, Tq, Tk, Tk, NH, causal, C // NH)
    _head_mm(out, att, v, HEAD_CONTEXT, B, Tq, Tk, C, NH)        # context out[b,t,h] = sum_j att[b,h,t,j] v[b,j,h]


@micropython.viper
def attention_decode(out, att, q, kc, vc, B: int, T: int, L: int, C: int, NH: int):
    # one causal query per sequence against the first T cached keys (itself included):
    # q (B, C); kc vc (B, L, C): cached keys/values, rows 0..T-1 valid
    # att (B, NH, L): weights, columns 0..T-1 written; out (B, C): heads concatenated
    # ERROR BOUND: attention_forward's (the same GEMM blocks and softmax, on the cache in place)
    if T >= 65536:
        _keys_error("attention_decode", T)
    _head_mm(att, q, kc, DECODE_SCORES, B, T, L, C, NH)
    _softmax_rows(att, None, B, 1, T, L, NH, 0, C // NH)
    _head_mm(out, att, vc, DECODE_CONTEXT, B, T, L, C, NH)


def reserve_decode(B, L, C, NH):
    # not a kernel: the module scratch attention_decode needs at its largest over the tokens
    # T = 1 .. L of a cache of L, made now at its exact size, so that decoding never grows it
    # token by token (each growth leaves the old block as a hole in the heap). _gemm reports what
    # a product needs when its scratch is smaller, computing nothing; the softmax takes 2 T ints.
    # Every T is asked: with B's rows in pieces (gemm.py, PIECES) the need is not largest at T = L.
    n = L + L
    for kind in (DECODE_SCORES, DECODE_CONTEXT):
        for T in range(1, L + 1):
            k = int(_gemm(0, 0, 0, _NO, _NO, _NO, _NO, _NO, kind, B, T, L, C, NH))
            if k > n:
                n = k
    if len(_S[0]) < n:
        _S[0] = None                    # the old one can go before the new one is made
        _S[0] = _filled("i", n, 0)
    return n


# A call over one item (B = 1, as Attention's backward makes for large weights) of more than
# PIECE floats of weights keeps no (NH, Tq, Tk) block of its own: dv is computed first (the
# weights' last reader), then dA = dout . v for R query rows of every head at a time (a piece of
# NH R Tk floats, R = PIECE // (NH Tk), at least 1; the piece's dout rows copied to the front of
# the dropout scratch, so no view is made) becomes dS over those rows and is copied over the
# weights' rows; dq and dk then read dS from att. A row of dA depends on its dout row and the rows
# of v only (the GEMM quantizes per row) and the softmax backward goes row by row, so every
# output is the one-block path's, bit for bit; the scratch is one piece instead of the block
# (S = 46, 2 heads: 4 KB instead of 17 KB). att holds dS after it (Attention.weights() refuses
# after a backward). Otherwise: one block, as always.
PIECE = const(1024)


def _one_item(n):
    raise ValueError("attention_backward_rows: B must be 1 (one batch item per call), got %d" % n)


@micropython.viper
def attention_backward(dq, dk, dv, scratch, dout, att, q, k, v, B: int, Tq: int, Tk: int, C: int, NH: int):
    # in the forward pass this was out = softmax(q.k^T * scale (+mask)) . v, per head
    # dq (B, Tq, C), dk dv (B, Tk, C): written; scratch is unused (the module keeps its own)
    # dout (B, Tq, C); att (B, NH, Tq, Tk) the forward's weights (dS once done, above PIECE)
    if B == 1 and NH * Tq * Tk > PIECE:
        attention_backward_rows(dq, dk, dv, dout, att, q, k, v, B, Tq, Tk, C, NH)
    else:
        attention_backward_block(dq, dk, dv, dout, att, q, k, v, B, Tq, Tk, C, NH)


@micropython.viper
def attention_backward_rows(dq, dk, dv, dout, att, q, k, v, B: int, Tq: int, Tk: int, C: int, NH: int):
    # attention_backward of one item (B = 1) in pieces of rows, any size; att holds dS after it
    if B != 1:
        _one_item(B)
    _head_mm(dv, att, dout, HEAD_TRANSPOSED, 1, Tq, Tk, C, NH)  # dv[j,h] = sum_t att[h,t,j] dout[t,h]
    _ds_rows(dout, att, v, Tq, Tk, C, NH)
    _head_mm(dq, att, k, HEAD_CONTEXT, 1, Tq, Tk, C, NH)       # dq[t,h] = sum_j dS[h,t,j] k[j,h]
    _head_mm(dk, att, q, HEAD_TRANSPOSED, 1, Tq, Tk, C, NH)    # dk[j,h] = sum_t dS[h,t,j] q[t,h]


@micropython.viper
def attention_backward_block(dq, dk, dv, dout, att, q, k, v, B: int, Tq: int, Tk: int, C: int, NH: int):
    # attention_backward in one (B, NH, Tq, Tk) block of the module scratch (any size; att kept)
    F = _fscratch(B * NH * Tq * Tk)    # (B, NH, Tq, Tk): dA, then dS
    _head_mm(F, dout, v, HEAD_SCORES, B, Tq, Tk, C, NH)        # dA[b,h,t,j] = dout[b,t,h] . v[b,j,h]
    _head_mm(dv, att, dout, HEAD_TRANSPOSED, B, Tq, Tk, C, NH)  # dv[b,j,h] = sum_t att[b,h,t,j] dout[b,t,h]
    _scores_back(dq, dk, F, att, q, k, B, Tq, Tk, C, NH)


@micropython.viper
def _ds_rows(dout, att, v, Tq: int, Tk: int, C: int, NH: int):
    # att (NH, Tq, Tk): the weights A in, dS = A (dA - rowsum(dA A)) / sqrt(hs) out, dA = dout . v
    # computed R rows of every head at a time in the module scratch
    R = PIECE // (NH * Tk)
    if R < 1:
        R = 1
    if R > Tq:
        R = Tq
    F = _fscratch(NH * R * Tk)          # (NH, r, Tk): one piece's dA, then its dS
    D = _gscratch(R * C)                # (r, C): the piece's dout rows
    sc = _scale_of(C // NH)
    sm = int(sc[0])
    se = int(sc[1])
    t0 = 0
    while t0 < Tq:
        r = R
        if Tq - t0 < r:
            r = Tq - t0
        _copy_rows(D, 0, dout, t0 * C, r * C)
        _head_mm(F, D, v, HEAD_SCORES, 1, r, Tk, C, NH)
        for h in range(NH):
            a0 = (h * Tq + t0) * Tk
            _softmax_back(0, 0, 0, F, att, r, Tk, sm, se, h * r * Tk, a0)
            _copy_rows(att, a0, F, h * r * Tk, r * Tk)
        t0 += r


@micropython.viper
def _copy_rows(dst, d0: int, src, s0: int, n: int):
    # dst[d0 : d0 + n] = src[s0 : s0 + n], bit for bit
    pd = ptr32(dst)
    ps = ptr32(src)
    for i in range(n):
        pd[d0 + i] = ps[s0 + i]


@micropython.viper
def _scores_back(dq, dk, F, att, q, k, B: int, Tq: int, Tk: int, C: int, NH: int):
    # F (B, NH, Tq, Tk) holds dA; it becomes dS = A (dA - rowsum(dA A)) / sqrt(hs); then
    # dq[b,t,h] = sum_j dS[b,h,t,j] k[b,j,h] and dk[b,j,h] = sum_t dS[b,h,t,j] q[b,t,h] (written)
    sc = _scale_of(C // NH)
    _softmax_back(0, 0, 0, F, att, B * NH * Tq, Tk, sc[0], sc[1], 0, 0)
    _head_mm(dq, F, k, HEAD_CONTEXT, B, Tq, Tk, C, NH)
    _head_mm(dk, F, q, HEAD_TRANSPOSED, B, Tq, Tk, C, NH)


# ---- dropout on the attention weights: A' = A keep / (1 - p) ---------------------------------
# ERROR BOUND: A' is exact (dropout_apply: the float32 products); then the GEMM bounds with A' in
#   place of A (weights up to 1/(1 - p), so the context bound 1e-3 max|v| grows by that factor),
#   and the softmax backward's on dA = keep (dout . v) / (1 - p).


def _dropped_block(n):
    # not a kernel: the dropped weights' block of the module scratch _G, grown to exactly n floats
    # (not the quarter more _gscratch adds for calls that grow a little at a time: a (B, NH, Tq, Tk)
    # block keeps its size for a fit, and a quarter of it is KBs at S = 50)
    g = _G[0]
    if len(g) < n:
        _G[0] = None                    # the old one can go before the new one is made
        g = _G[0] = _filled("f", n, 0.0)
    return g


@micropython.viper
def attention_context(out, att, keep, v, B: int, Tq: int, Tk: int, C: int, NH: int, scale):
    # out (B, Tq, C) = per head (att * keep * scale) . v, heads concatenated
    n = B * NH * Tq * Tk
    G = _dropped_block(n)
    dropout_apply(G, att, keep, n, scale)
    _head_mm(out, G, v, HEAD_CONTEXT, B, Tq, Tk, C, NH)


@micropython.viper
def attention_backward_dropout(dq, dk, dv, scratch, dout, att, keep, q, k, v, B: int, Tq: int, Tk: int, C: int,
                               NH: int, pscale):
    # in the forward pass this was out = (A * keep * pscale) . v, A = softmax(q.k^T * scale + mask)
    # dq (B, Tq, C), dk dv (B, Tk, C): written; scratch is unused (the module keeps its own)
    # One (B, NH, Tq, Tk) block of the module scratch (the one attention_context fills): A' for
    # dv first (its only reader), then dA and dS over it, so no second block of that size exists
    # (the two products are independent: the same bits as computing dA first)
    n = B * NH * Tq * Tk
    G = _dropped_block(n)
    dropout_apply(G, att, keep, n, pscale)                      # A' = keep pscale A
    _head_mm(dv, G, dout, HEAD_TRANSPOSED, B, Tq, Tk, C, NH)    # dv[b,j,h] = sum_t A'[b,h,t,j] dout[b,t,h]
    _head_mm(G, dout, v, HEAD_SCORES, B, Tq, Tk, C, NH)         # dout[b,t,h] . v[b,j,h] over A'
    dropout_apply(G, G, keep, n, pscale)                        # dA = keep pscale (dout . v)
    _scores_back(dq, dk, G, att, q, k, B, Tq, Tk, C, NH)


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


# ERROR BOUND (tests/mp/test_viper_range.py): for any finite float32 logits, the loss is within
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
    pdl = ptr32(dlogits)
    bl = ptr8(_BL)                      # bit lengths (the stores of dlogits)
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
        bitlen(z, zre)                  # z >> zre < 2^16, zre the smallest such
        zre -= 16
        if zre < 0:
            zre = 0
        zr = z >> zre
        xent_grad()                     # dlogits of row b
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
    # (the loss is computed in viper; the returned float is the only object allocated; the work
    # is in _xent_run, so that this frame stays within 11 words and comes from the C stack)
    if _xent_run(dlogits, logits, labels, B, V):
        return _NAN
    return _LF[0]


@micropython.viper
def _xent_run(dlogits, logits, labels, B: int, V: int) -> int:
    ib = _xent_ib(B, V)
    return int(_xent(dlogits, logits, labels, B, V, ib[0], ib[1], _iscratch(2 * V), _LNT, _LF))


def _xent_ib(B, V):
    # 1 / B as (15-bit mantissa, exponent), after the int32 limits of _xent [B3]: the sum z needs
    # V <= 2^14, the log of the product of the B sums (N ln2 in Q16) B log2(V) < 45000
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
    return ib


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
