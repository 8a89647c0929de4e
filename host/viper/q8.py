# microformer.viper_q8: the GEMM of int8 frozen weights (quant.py), forward and input gradient.
# A module of its own, loaded on first use, so that a model without int8 weights does not load it.
import micropython
from micropython import const
from .viper_common import _iscratch, _S


# ---- int8 weights (quant.py): w[o, c] = q[o, c] * scale[o], q in [-128, 127] ----------------
Q8_FORWARD = const(1)       # out (N, OC) = inp (N, C) . W^T (+ bias (OC,) when flag)
Q8_DINP = const(2)          # dinp (N, C) = dout (N, OC) . W (+= the old dinp when flag)


# The weight's int8 rows are read as they are: no quantization of the weight per call. Each row of
# the other operand is quantized to P = 14 bits of its block (the row: inp[m, :] for Q8_FORWARD;
# the products dout[m, n] scale[n] for Q8_DINP, each formed from 15-bit mantissas and normalized,
# then cut to 14 bits of the row's largest), and the int8 values multiply those ints.
# OVERFLOW BOUND [B6]: |a| <= 2^14 (the block-quantized row; rounding can reach 2^14 exactly),
#   |q| <= 2^7, so a product is below 2^21 in magnitude and a chunk of 8 below 2^24. The KT terms make
#   n8 = ceil(KT/8) chunks; each chunk is shifted right (rounded) by sh8 = max(0, clog2(n8) - 5), so
#   |acc| <= n8 (2^24 / 2^sh8 + 1) <= 2^29 + n8 < 2^30 for KT < 2^25 (KT <= 256 needs no shift:
#   the sum is exact). Q8_FORWARD then scales: acc rounded to at most 15 bits (2^15 after
#   rounding) times the scale's 24-bit mantissa rounded to 15 bits (<= 2^15): <= 2^30. The addend
#   (bias, or the old dinp: a 24-bit mantissa) is aligned by addto0: |sum| <= 2^30 + 2^24 < 2^31.
#   Q8_DINP's products: two 15-bit mantissas (<= 2^15 each): <= 2^30, normalized by norm30.
#   tests/mp/test_int8.py::test_viper_int8_worst_case drives every bound with worst-case operands
#   (KT = 1 .. 4096, q = -128 and 127, inputs at FLT_MAX) on both MicroPython ports.
# ERROR BOUND (relative to the block maxima, as _gemm's): the quantized row is within 2^-13 of
#   its largest |value| per element and the weight is exact, so an output summing KT products is
#   within 2^-11 KT max|a_row| max|w_row| of W_deq x (Q8_FORWARD: the input row m and the weight
#   row o; Q8_DINP: the row of dout[m, n] scale[n] times 127, i.e. at most max|dout_m| max|W|),
#   the 15-bit scale and acc roundings included, plus 2^-11 of the addend and the float32 rounding.
@micropython.viper
def _q8(v: int, qa: ptr32, qb: ptr32, out, a, w, scale, bias, s, kind: int, N: int, C: int, OC: int, flag: int) -> int:
    S = ptr32(s)
    po = ptr32(out)
    pa = ptr32(a)
    pw = ptr8(w)
    psc = ptr32(scale)
    pbias = ptr32(bias)
    sa = uint(S)
    P = 14
    lim = 16383
    b30 = 30                            # variables: constant folding would make bigint objects
    b31 = 31
    top = 1 << b30
    sgn = 1 << b31
    KT = C                               # terms per output, outputs per row, the weight's strides
    R = OC
    wr = C                              # from one output to the next
    wk = 1                              # from one term to the next
    if kind == Q8_DINP:
        KT = OC
        R = C
        wr = 1
        wk = C
    if KT + KT > int(len(s)):
        return KT + KT
    n8 = (KT + 7) >> 3
    sh8 = 0
    while (32 << sh8) < n8:
        sh8 += 1
    rh = (1 << sh8) >> 1
    for m in range(N):
        if kind == Q8_FORWARD:
            # row m of inp, quantized into S[0 : KT]: inp ~= S[k] 2^(base - 150)
            i0 = m * C
            qb = ptr32(sa)
            quantize(pa, 1)
            eb = base - 150
        else:
            q8_drow()
            eb = pm + 16
        for r in range(R):
            q8_dot(acc)
            e = eb + sh8
            if kind == Q8_FORWARD and acc != 0:
                q8_scale(acc, e)
            oi = m * R + r
            if flag:
                x = pbias[r]
                if kind == Q8_DINP:
                    x = po[oi]
                decode(x, xm, xe)
                if xe != 0:
                    xe = xe - 150
                    addto0(acc, e, xm, xe, sh)
            store(po, oi, acc, e)
    return 0


def q8_matmul_forward(out, inp, q, scale, bias, N, C, OC):
    # out (N, OC) = inp (N, C) . W^T + bias (OC,), W = q (OC, C) int8 * scale (OC,); bias may be None
    s = _S[0]
    if bias is None:
        if _q8(0, 0, 0, out, inp, q, scale, out, s, Q8_FORWARD, N, C, OC, 0):
            _q8(0, 0, 0, out, inp, q, scale, out, _iscratch(2 * C), Q8_FORWARD, N, C, OC, 0)
    elif _q8(0, 0, 0, out, inp, q, scale, bias, s, Q8_FORWARD, N, C, OC, 1):
        _q8(0, 0, 0, out, inp, q, scale, bias, _iscratch(2 * C), Q8_FORWARD, N, C, OC, 1)


def q8_matmul_backward_input(dinp, dout, q, scale, N, C, OC, acc):
    # dinp (N, C) = dout (N, OC) . W, written (acc 0) or added (acc 1); W = q (OC, C) * scale (OC,)
    if _q8(0, 0, 0, dinp, dout, q, scale, dinp, _S[0], Q8_DINP, N, C, OC, acc):
        _q8(0, 0, 0, dinp, dout, q, scale, dinp, _iscratch(2 * OC), Q8_DINP, N, C, OC, acc)
