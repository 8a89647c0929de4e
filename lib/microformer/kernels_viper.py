# microformer.kernels_viper: the kernels of kernels.py as @micropython.viper block-float loops.
# Same names, same signatures (outputs first, inputs, sizes); drop-in via set_backend('viper').
#
# NUMBER FORMAT. Viper has no native float, so the kernels read array('f') buffers as raw
# IEEE-754 bits through ptr32 and compute in integers:
#   * a float32 x = (-1)^s * m * 2^(e-150), m = 24-bit mantissa with the hidden bit, e = 1..254;
#   * a BLOCK (a row or column of an operand, K values) is quantized with one shared exponent:
#       Emax = largest biased exponent in the block, L = Emax - 126 - P,
#       q = round(m * 2^(e - Emax + P - 24)), clamped to |q| <= 2^P - 1, and x ~= q * 2^L.
#     So every block keeps P significant bits relative to its largest element (rel. err 2^-P-1).
#   * products are accumulated in an int, written back as float32 bits (normalize to 24 bits,
#     round to nearest, exponent, sign): _store() and its inline copies in the hot loops
#     (a viper-to-viper call costs as much as a Python call, so hot loops never call one).
#
# OVERFLOW ANALYSIS (the ESP32's viper int is 32 bits and wraps; the unix port's is 64 bits).
#   MAC loops (_gemm): P = 14, |q_a|, |q_b| <= 2^14 - 1; K is zero-padded to a multiple of 4 and
#     each 4-term chunk t = sum of 4 products has |t| <= 4 (2^14 - 1)^2 = 2^30 - 2^17 + 4. Chunks
#     are rounded and shifted right by s = clog2(K/4) before they are summed, so
#       |acc| <= (K/4) * (2^30 - 2^17 + 4 + 2^(s-1)) / 2^s < 2^30   (for K < 2^19).       [B1]
#     Short rows skip the shifts: K4 = 4 is one chunk (< 2^30); K4 = 8 sums two chunks,
#     |acc| <= 8 (2^14 - 1)^2 = 2^31 - 2^18 + 8 < 2^31, halved (rounded) before an addend.
#     Longer rows shift pairs of chunks (8 products, |t| <= 2^31 - 2^18 + 8) by the same s:
#     (K/8) (2^31 - 2^18 + 8 + 2^(s-1)) / 2^s <= (2^31 - 2^18 + 8 + 2^(s-1)) / 2 < 2^30 for s <= 18.
#     On a 64-bit host ptr32 loads zero-extend, so t (or the short-row acc) is computed modulo
#     2^32 and sign-extended from bit 31: the unix port reproduces the ESP32's wrap-around
#     exactly, and an overflow would show up as a wrong result in tests/test_viper.py, which
#     drives the bound with worst-case inputs (K = 1..9, 64, 1000, 4096).
#   Adding a bias / the old value (accumulate mode): |acc| < 2^30, addend aligned to < 2^30
#     before the add, so |sum| < 2^31. The dbias row of ones (q = 2^13) obeys [B1] too.     [B2]
#   Softmax / cross-entropy: no score or logit is converted to fixed point, only s - max: two
#     24-bit mantissas aligned to the larger exponent, |dv| < 2^25; cut to dv <= 2^16 and times
#     the 15-bit scale: < 2^31; y = (max - s) scale in Q16 capped at 2^23 (softmax; 2^21 in
#     cross-entropy) where exp(-y) is below float32 (resp. the 2^-30 probability floor), so the
#     ln2 reciprocal estimate (y >> 5) * 1477 < 2^31; exp in Q15 via Horner with r < ln2 in Q16:
#     r * t < 45426 * 2^15 < 2^31; Z = sum_j p_j 2^(zs - k_j) < Tk 2^(15 + zs) <= 2^30 for
#     Tk <= 2^15 (zs = 15 - clog2(Tk), at least 0; Tk < 2^16 is checked: < 2^31); weights
#     (p << 16) // zr with p < 2^15 (< 2^31); A.V is a [B1] MAC. The loss adds max - s_y
#     (normalized to [2^28, 2^29)) onto a sum kept below 2^30: < 2^31.                    [B3]
#   Softmax backward: dot = sum a_j dA_j from 30-bit products (12-bit halves: 2^24 * 2^6 plus
#     2^25 >> 6 < 2^30) shifted by h >= log2(2 Tk): |dot| < 2^29; dA_j - dot from 30-bit aligned
#     mantissas: < 2^31; then 15-bit values times 15-bit mantissas: < 2^30.                 [B4]
#   Adam/SGD: soft-float on 24-bit mantissas split into 15-bit halves; every product is
#     (< 2^16) * (< 2^15) < 2^31; sums of two aligned 30-bit values < 2^31.                  [B5]
#   Lines marked `#!chk v` are checked by tests/test_viper.py in an instrumented copy of this
#   module that asserts |v| < 2^31 after the line.
#
# SPECIAL VALUES. Zeros, -0.0 and subnormals quantize to 0 (subnormals are flushed).
#   +-inf and NaN are read as +-(2 - 2^-23) * 2^127 (NaN keeps its sign bit): results stay
#   finite or saturate to +-inf on the way out; the block-float kernels never produce NaN.
#   crossentropy_softmax returns nan if any logit is inf/NaN (so NonFiniteLossError fires).
#   Finite scores and logits are used over the whole float32 range (no clamp); a loss above
#   FLT_MAX (only with logits beyond +-1.7e38) is returned as inf, as float32 arithmetic gives.
#   Results whose exponent underflows float32 are flushed to 0.
#
# ERROR BOUNDS (for finite inputs; pinned by tests/test_viper.py and tests/test_viper_range.py,
# and listed in the README's "Tolerances" table). Each is stated next to its kernel:
#   _gemm (Dense, scores, A.V, pooling): block max     2^-11 K max|a| max|b| (+ 2^-11 |addend|)
#   add_inplace:                         element       2^-23 max(|a|, |b|) (the residual add is portable)
#   softmax weights:                     element       (2e-4 + 2e-5 (y + 1)) w, y = distance from max
#   attention backward:                  block max     dv 1e-3, dq dk 2e-3 of operand maxima (_softmax_back)
#   cross-entropy:                       value, 1/B    2^-20 |loss| + 1e-4; dlogits 1e-4 / B
#   Adam:                                lr, element   2e-3 lr per step (+ 2^-22 |p|); SGD is portable
#   attention output:                    value column  1e-3 max|v| of the column (from the same scores)
#   avgpool:                             block/element 2^-11 max_t |x| / 2^-13 of the element
#   relu / leaky relu:                   element       exact / 1e-4 (0.01 x with a 15-bit mantissa)
#
# Kernels not worth a viper loop here (GELU/TANH/SIGMOID activations, mse, sum_squares) fall
# back to the portable kernels (they allocate boxed floats).
import micropython
from array import array
from math import frexp as _frexp
from . import kernels as _pk

RELU = 0
LEAKY_RELU = 1
GELU = 2
TANH = 3
SIGMOID = 4
LEAKY_SLOPE = _pk.LEAKY_SLOPE

# ---- module scratch (grown on demand, so steady-state calls allocate nothing) ---------------
_D = array("i", [0] * 32)      # 24..29 _softmax parameters; 31 the length of _S[0] (_gemm checks it)
_S = [array("i", [0] * 64)]    # int scratch: quantized blocks
_F = [array("f", [0.0] * 64)]  # float scratch: dA / dS rows of the attention backward
_ONES = [array("f", [1.0] * 16)]
_CF = array("f", [0.0, 0.0, 1.0, 0.0])  # floats handed to viper as float32 bits (adam_update)
_SCALE = {}                    # head size -> (mantissa Q15, exponent) of 1/sqrt(hs)


def _iscratch(n):
    s = _S[0]
    if len(s) < n:
        s = _S[0] = array("i", [0] * (n + n // 4 + 16))
    _D[31] = len(s)                     # what _gemm checks its scratch needs against
    return s


def _fscratch(n):
    f = _F[0]
    if len(f) < n:
        f = _F[0] = array("f", [0.0] * (n + n // 4 + 16))
    return f


def _ones(n):
    o = _ONES[0]
    if len(o) < n:
        o = _ONES[0] = array("f", [1.0] * (n + n // 4 + 16))
    return o


def _mant15(x):
    # float x >= 0 -> (m, e) with x ~= m * 2^e and 2^14 <= m < 2^15 (m = 0 for x == 0)
    if x <= 0.0:
        return 0, 0
    f, e = _frexp(x)
    m = int(f * 32768.0 + 0.5)
    if m >= 32768:
        m >>= 1
        e += 1
    return m, e - 15


def _scale_of(hs):
    sc = _SCALE.get(hs)
    if sc is None:
        sc = _SCALE[hs] = _mant15(1.0 / (hs ** 0.5))
    return sc


# ---- element helpers (cold paths; hot loops inline the same code) -------------------------
@micropython.viper
def _chk(x: int):
    # debug guard used by the instrumented copy in tests: |x| must fit a 32-bit signed int
    b = 30                              # a variable: the compiler would fold 1 << 30 into a bigint
    lim = (1 << b) + ((1 << b) - 1)
    if x > lim or x < 0 - lim - 1:
        raise OverflowError("viper int32 bound exceeded")


@micropython.viper
def _store(buf, i: int, v: int, e: int):
    # buf[i] = v * 2^e as float32 bits; |v| < 2^31. Round to nearest, flush underflow, inf on overflow.
    # The hot kernels carry inline copies of this body (same names: sg t sh be, or k-prefixed).
    p = ptr32(buf)
    sg = 0
    if v < 0:
        sg = 1
        v = 0 - v
    if v == 0:
        p[i] = 0
    else:
        if v >= 0x1000000:
            t = v >> 24                     # 1 .. 127: sh = its bit length
            sh = 1
            if t >= 16:
                t = t >> 4
                sh += 4
            if t >= 4:
                t = t >> 2
                sh += 2
            if t >= 2:
                sh += 1
            v = (v + (1 << (sh - 1))) >> sh
            e += sh
            if v >= 0x1000000:
                v = v >> 1
                e += 1
        else:
            if v < 0x100:
                v = v << 16
                e -= 16
            if v < 0x10000:
                v = v << 8
                e -= 8
            if v < 0x100000:
                v = v << 4
                e -= 4
            if v < 0x400000:
                v = v << 2
                e -= 2
            if v < 0x800000:
                v = v << 1
                e -= 1
        be = e + 150
        if be >= 255:
            be = 255
            p[i] = (sg << 31) | (be << 23)
        elif be <= 0:
            p[i] = 0
        else:
            p[i] = (sg << 31) | (be << 23) | (v & 0x7FFFFF)


# ---- the block-float GEMM every matmul goes through --------------------------------------
# out[o + b1*ob1 + b2*ob2 + m*osm + n*osn] (=|+=) sum_k A[a + ... + m*asm + k*ask] * B[b + ... + n*bsn + k*bsk]
# The geometry is not passed in: `kind` names the product and x y z w u its sizes, so a call is a
# single viper call (the Python wrappers cost more than the math at Iris sizes):
#   1 matmul forward  (N, C, OC, hasbias):  out (N, OC) = inp (N, C) . W (OC, C)^T (+ bias)
#   2 matmul dinp     (N, C, OC, acc):      dinp (N, C) = dout (N, OC) . W (OC, C)  (acc: +=)
#   3 matmul dweight  (N, C, OC, hasbias):  dW (OC, C) += dout^T . inp (and bias: db (OC,) += dout^T . 1)
#   4 matmul dbias    (N, C, OC):           db (OC,) += dout^T . ones (N,)
#   5 per-head scores (B, Tq, Tk, C, NH):   att[b,h,t,j] = a[b,t,h] . b[b,j,h]    (att, A = q, B = k)
#   6 per-head ctx    (B, Tq, Tk, C, NH):   out[b,t,h] = sum_j att[b,h,t,j] b[b,j,h]  (A = att)
#   7 per-head A^T.   (B, Tq, Tk, C, NH):   out[b,j,h] = sum_t att[b,h,t,j] b[b,t,h]  (A = att)
#   8 mean pool       (B, T, C):            out[b,c] = sum_t inp[b,t,c] * b[t]     (b = 1/T)
# s: int scratch of d[31] ints; if it needs more, nothing is computed and the size is returned
# (the caller grows the scratch and calls again); 0 when done.
# ERROR BOUND (relative to the block maxima): every operand is rounded to 14 bits of its block's
#   largest magnitude (|x - x~| <= 2^-13 max|x|), so an output summing K products is within
#   2^-11 K max|a_row| max|b_row| of the exact sum, plus 2^-11 of an addend (bias, accumulated
#   gradient) and the final float32 rounding. A small element next to a large one in the same
#   block keeps only the bits above 2^-14 of the large one (tests/test_viper_range.py).
@micropython.viper
def _gemm(v: int, e: int, i: int, out, a, b, bias, d, s, kind: int, x: int, y: int, z: int, w: int, u: int) -> int:
    # v e i: the hottest locals; as the first three they live in registers (callers pass 0s)
    D = ptr32(d)
    S = ptr32(s)
    po = ptr32(out)
    pa = ptr32(a)
    pb = ptr32(b)
    pbias = ptr32(bias)
    nb1 = 1
    nb2 = 1
    asb1 = 0
    asb2 = 0
    bsb1 = 0
    bsb2 = 0
    osb1 = 0
    osb2 = 0
    mode = 0
    if kind <= 4:
        # x N, y C, z OC, w hasbias
        if kind == 1:
            M = x
            N = z
            K = y
            if w:
                mode = 2
            asm = y
            ask = 1
            bsn = y
            bsk = 1
            osm = z
            osn = 1
        elif kind == 2:
            M = x
            N = y
            K = z
            if w:
                mode = 1                # dinp += dout . W (for a future accumulate kernel)
            asm = z
            ask = 1
            bsn = 1
            bsk = y
            osm = y
            osn = 1
        elif kind == 3:
            M = z
            N = y
            K = x
            mode = 1
            asm = 1
            ask = z
            bsn = 1
            bsk = y
            osm = y
            osn = 1
        else:
            M = z
            N = 1
            K = x
            mode = 1
            asm = 1
            ask = z
            bsn = 0
            bsk = 1
            osm = 1
            osn = 1
    elif kind <= 7:
        # x B, y Tq, z Tk, w C, u NH
        hs = w // u
        nb1 = x
        nb2 = u
        if kind == 5:
            M = y
            N = z
            K = hs
            asm = w
            ask = 1
            asb1 = y * w
            asb2 = hs
            bsn = w
            bsk = 1
            bsb1 = z * w
            bsb2 = hs
            osm = z
            osn = 1
            osb1 = u * y * z
            osb2 = y * z
        elif kind == 6:
            M = y
            N = hs
            K = z
            asm = z
            ask = 1
            asb1 = u * y * z
            asb2 = y * z
            bsn = 1
            bsk = w
            bsb1 = z * w
            bsb2 = hs
            osm = w
            osn = 1
            osb1 = y * w
            osb2 = hs
        else:
            M = z
            N = hs
            K = y
            asm = 1
            ask = z
            asb1 = u * y * z
            asb2 = y * z
            bsn = 1
            bsk = w
            bsb1 = y * w
            bsb2 = hs
            osm = w
            osn = 1
            osb1 = z * w
            osb2 = hs
    else:
        # x B, y T, z C
        nb1 = x
        M = z
        N = 1
        K = y
        asm = 1
        ask = z
        asb1 = y * z
        bsn = 0
        bsk = 1
        osm = 1
        osn = 0
        osb1 = z
    P = 14                              # bits per operand [B1]
    lim = 16383                         # 2^P - 1
    K4 = (K + 3) & (0 - 4)              # K rounded up to a multiple of 4 (zero padded)
    nc = K4 >> 2
    NB = N                              # B rows quantized: N, plus a row of ones when the
    fuse = 0                            # bias gradient rides along (kind 3 with a bias)
    if kind == 3 and w:
        NB = N + 1
        fuse = 1
    xq = NB * K4                        # S[0 : NB*K4] B rows, S[xq : xq+NB] B exponents
    ex = xq + NB                        # S[ex : ex+K4] the current A row
    bd = ex + K4                        # S[bd : bd+2N] bias[n] decoded (mode 2): mantissa, exponent
    if bd + N + N > D[31]:
        return bd + N + N
    sh4 = 0                             # each 4-term chunk sum is shifted right by sh4 [B1]
    if nc > 2:
        while (1 << sh4) < nc:
            sh4 += 1
    rh = (1 << sh4) >> 1
    b31 = 31                            # variables: constant folding would make bigint objects
    b16 = 16
    sgn = 1 << b31                      # sign-extend int32 from bit 31 (a no-op on 32-bit ints):
    m32 = (1 << b16) * (1 << b16) - 1   # ptr32 loads of S zero-extend on 64-bit hosts; sums are
    for k in range(K, K4):              # exact mod 2^32 and bounded below 2^31, so this restores them
        S[ex + k] = 0
    if mode == 2:
        for n in range(N):
            v = pbias[n]
            xe = (v >> 23) & 0xFF
            xm = 0
            if xe != 0:
                xm = (v & 0x7FFFFF) | 0x800000
                if xe == 255:
                    xm = 0xFFFFFF
                    xe = 254
                if (v >> 31) & 1:
                    xm = 0 - xm
            S[bd + n + n] = xm
            S[bd + n + n + 1] = xe - 150
    if fuse:
        for k in range(K4):
            S[N * K4 + k] = 0
        for k in range(K):
            S[N * K4 + k] = 8192        # 1.0 quantized: 2^23 >> 10 with exponent 127
        S[xq + N] = 127
    for b1 in range(nb1):
        for b2 in range(nb2):
            ab = b1 * asb1 + b2 * asb2
            bb = b1 * bsb1 + b2 * bsb2
            ob = b1 * osb1 + b2 * osb2
            # quantize the N rows of B (block = row n, K values; see the header)
            j = 0
            for n in range(N):
                i0 = bb + n * bsn
                emax = 0
                i = i0
                for k in range(K):
                    e = (pb[i] >> 23) & 0xFF
                    if e > emax:
                        emax = e
                    i += bsk
                if emax == 255:
                    emax = 254
                base = emax + 24 - P
                i = i0
                for k in range(K):
                    v = pb[i]
                    i += bsk
                    e = (v >> 23) & 0xFF
                    q = 0
                    if e != 0:
                        mm = (v & 0x7FFFFF) | 0x800000
                        if e == 255:
                            mm = 0xFFFFFF
                            e = 254
                        sh = base - e           # >= 24 - P = 10
                        if sh <= 30:
                            q = (mm + (1 << (sh - 1))) >> sh
                            if q > lim:
                                q = lim
                            if (v >> 31) & 1:
                                q = 0 - q
                    S[j] = q
                    j += 1
                for k in range(K, K4):
                    S[j] = 0
                    j += 1
                S[xq + n] = emax
            for m in range(M):
                # quantize row m of A into S[ex : ex + K]
                i0 = ab + m * asm
                emax = 0
                i = i0
                for k in range(K):
                    e = (pa[i] >> 23) & 0xFF
                    if e > emax:
                        emax = e
                    i += ask
                if emax == 255:
                    emax = 254
                base = emax + 24 - P
                i = i0
                j = ex
                for k in range(K):
                    v = pa[i]
                    i += ask
                    e = (v >> 23) & 0xFF
                    q = 0
                    if e != 0:
                        mm = (v & 0x7FFFFF) | 0x800000
                        if e == 255:
                            mm = 0xFFFFFF
                            e = 254
                        sh = base - e
                        if sh <= 30:
                            q = (mm + (1 << (sh - 1))) >> sh
                            if q > lim:
                                q = lim
                            if (v >> 31) & 1:
                                q = 0 - q
                    S[j] = q
                    j += 1
                ea = emax - 252 - P - P + sh4
                a0 = S[ex]
                a1 = S[ex + 1]
                a2 = S[ex + 2]
                a3 = S[ex + 3]
                a4 = 0
                a5 = 0
                a6 = 0
                a7 = 0
                if nc == 2:
                    a4 = S[ex + 4]
                    a5 = S[ex + 5]
                    a6 = S[ex + 6]
                    a7 = S[ex + 7]
                pw = po
                oi = ob + m * osm
                i = 0                           # B row index for short rows
                jn = 0                          # B row index for long rows
                for n in range(NB):
                    if n == N:                  # the ones row: dbias[m] += sum_k A[m, k]
                        pw = pbias
                        oi = m
                    # [B1] |q| <= 2^14 - 1: a 4-term chunk t has |t| <= 2^30 - 2^17 + 4, so K <= 4
                    # needs no shift and K <= 8 sums two chunks to |acc| <= 2^31 - 2^18 + 8; longer
                    # rows shift each chunk (rounded) by sh4 = clog2(K4/4): |acc| < 2^30
                    if nc == 1:
                        acc = a0 * S[i] + a1 * S[i + 1] + a2 * S[i + 2] + a3 * S[i + 3]
                        acc = ((acc & m32) ^ sgn) - sgn                 #!chk acc
                        i += 4
                    elif nc == 2:
                        acc = (a0 * S[i] + a1 * S[i + 1] + a2 * S[i + 2] + a3 * S[i + 3]
                               + a4 * S[i + 4] + a5 * S[i + 5] + a6 * S[i + 6] + a7 * S[i + 7])
                        acc = ((acc & m32) ^ sgn) - sgn                 #!chk acc
                        i += 8
                    else:
                        # pairs of chunks (8 products, |t| <= 2^31 - 2^18 + 8) share one shift
                        acc = 0
                        ia = ex
                        for c in range(nc >> 1):
                            t = (S[ia] * S[jn] + S[ia + 1] * S[jn + 1] + S[ia + 2] * S[jn + 2] + S[ia + 3] * S[jn + 3]
                                 + S[ia + 4] * S[jn + 4] + S[ia + 5] * S[jn + 5] + S[ia + 6] * S[jn + 6]
                                 + S[ia + 7] * S[jn + 7])
                            t = ((t & m32) ^ sgn) - sgn                 #!chk t
                            acc += (t + rh) >> sh4                          #!chk acc
                            ia += 8
                            jn += 8
                        if nc & 1:
                            t = S[ia] * S[jn] + S[ia + 1] * S[jn + 1] + S[ia + 2] * S[jn + 2] + S[ia + 3] * S[jn + 3]
                            t = ((t & m32) ^ sgn) - sgn                 #!chk t
                            acc += (t + rh) >> sh4                          #!chk acc
                            jn += 4
                    e = ea + S[xq + n]          # value = acc * 2^e
                    # addend: the old output (accumulate) or bias[n]  [B2]
                    if mode != 0:
                        if nc == 2:             # |acc| < 2^31 -> < 2^30 before an addend
                            acc = (acc + 1) >> 1
                            e += 1
                        if mode == 1:
                            v = pw[oi]
                            xe = (v >> 23) & 0xFF
                            xm = 0
                            if xe != 0:
                                xm = (v & 0x7FFFFF) | 0x800000
                                if xe == 255:
                                    xm = 0xFFFFFF
                                    xe = 254
                                if (v >> 31) & 1:
                                    xm = 0 - xm
                            xe = xe - 150
                        else:
                            xm = (S[bd + n + n] ^ sgn) - sgn
                            xe = (S[bd + n + n + 1] ^ sgn) - sgn
                        if xm != 0:
                            if acc == 0:
                                acc = xm
                                e = xe
                            elif xe <= e:
                                sh = e - xe
                                if sh > 30:
                                    xm = 0
                                else:
                                    xm = (xm + ((1 << sh) >> 1)) >> sh
                                acc += xm                               #!chk acc
                            else:
                                uu = xe - e
                                if uu > 6:
                                    uu = 6
                                xm = xm << uu
                                sh = xe - uu - e
                                if sh > 30:
                                    acc = 0
                                elif sh > 0:
                                    acc = (acc + (1 << (sh - 1))) >> sh
                                acc += xm                               #!chk acc
                                e = xe - uu
                    # pack acc * 2^e into float32 bits (same as _store, inlined)
                    v = acc
                    sg = 0
                    if v < 0:
                        sg = 1
                        v = 0 - v
                    if v == 0:
                        pw[oi] = 0
                    else:
                        if v >= 0x1000000:
                            t = v >> 24                     # 1 .. 127: sh = its bit length
                            sh = 1
                            if t >= 16:
                                t = t >> 4
                                sh += 4
                            if t >= 4:
                                t = t >> 2
                                sh += 2
                            if t >= 2:
                                sh += 1
                            v = (v + (1 << (sh - 1))) >> sh
                            e += sh
                            if v >= 0x1000000:
                                v = v >> 1
                                e += 1
                        else:
                            if v < 0x100:
                                v = v << 16
                                e -= 16
                            if v < 0x10000:
                                v = v << 8
                                e -= 8
                            if v < 0x100000:
                                v = v << 4
                                e -= 4
                            if v < 0x400000:
                                v = v << 2
                                e -= 2
                            if v < 0x800000:
                                v = v << 1
                                e -= 1
                        be = e + 150
                        if be >= 255:
                            be = 255
                            pw[oi] = (sg << 31) | (be << 23)
                        elif be <= 0:
                            pw[oi] = 0
                        else:
                            pw[oi] = (sg << 31) | (be << 23) | (v & 0x7FFFFF)
                    oi += osn
    return 0


def _mm(out, a, b, bias, kind, x, y, z, w, u):
    # _gemm with the module scratch (_D[31] = its length, kept by _iscratch), grown on demand
    n = _gemm(0, 0, 0, out, a, b, bias, _D, _S[0], kind, x, y, z, w, u)
    if n:
        _gemm(0, 0, 0, out, a, b, bias, _D, _iscratch(n), kind, x, y, z, w, u)


# ---- simple elementwise kernels --------------------------------------------------------------
@micropython.viper
def _zero(buf, n: int):
    p = ptr32(buf)
    for i in range(n):
        p[i] = 0


def zero(buf, n):
    _zero(buf, n)


@micropython.viper
def _add2(out, inp, n: int, s):
    # out (n,) += inp (n,), two floats at a time through one shared exponent per pair  [B2]
    # ERROR BOUND: within 2^-23 of the larger operand (30-bit aligned mantissas, one rounding)
    po = ptr32(out)
    pi = ptr32(inp)
    for i in range(n):
        y = pi[i]
        ye = (y >> 23) & 0xFF
        if ye == 0:
            continue
        x = po[i]
        xe = (x >> 23) & 0xFF
        if xe == 0:
            po[i] = y
            continue
        xm = (x & 0x7FFFFF) | 0x800000
        ym = (y & 0x7FFFFF) | 0x800000
        if xe == 255:
            xm = 0xFFFFFF
            xe = 254
        if ye == 255:
            ym = 0xFFFFFF
            ye = 254
        # 6 guard bits: mantissas to 30 bits, the smaller one shifted right (rounded)
        xm = xm << 6
        ym = ym << 6
        if xe >= ye:
            sh = xe - ye
            if sh > 30:
                ym = 0
            elif sh > 0:
                ym = (ym + (1 << (sh - 1))) >> sh
            e = xe
        else:
            sh = ye - xe
            if sh > 30:
                xm = 0
            elif sh > 0:
                xm = (xm + (1 << (sh - 1))) >> sh
            e = ye
        if (x >> 31) & 1:
            xm = 0 - xm
        if (y >> 31) & 1:
            ym = 0 - ym
        v = xm + ym                                                 #!chk xm, ym, v
        e = e - 156
        sg = 0
        if v < 0:
            sg = 1
            v = 0 - v
        if v == 0:
            po[i] = 0
        else:
            if v >= 0x1000000:
                t = v >> 24                     # 1 .. 127: sh = its bit length
                sh = 1
                if t >= 16:
                    t = t >> 4
                    sh += 4
                if t >= 4:
                    t = t >> 2
                    sh += 2
                if t >= 2:
                    sh += 1
                v = (v + (1 << (sh - 1))) >> sh
                e += sh
                if v >= 0x1000000:
                    v = v >> 1
                    e += 1
            else:
                if v < 0x100:
                    v = v << 16
                    e -= 16
                if v < 0x10000:
                    v = v << 8
                    e -= 8
                if v < 0x100000:
                    v = v << 4
                    e -= 4
                if v < 0x400000:
                    v = v << 2
                    e -= 2
                if v < 0x800000:
                    v = v << 1
                    e -= 1
            be = e + 150
            if be >= 255:
                be = 255
                po[i] = (sg << 31) | (be << 23)
            elif be <= 0:
                po[i] = 0
            else:
                po[i] = (sg << 31) | (be << 23) | (v & 0x7FFFFF)


def add_inplace(out, inp, n):
    _add2(out, inp, n, None)


def matmul_forward(out, inp, weight, bias, N, C, OC):
    # out (N, OC) = inp (N, C) . weight (OC, C)^T + bias (OC,); bias may be None
    if bias is None:
        _mm(out, inp, weight, out, 1, N, C, OC, 0, 0)
    else:
        _mm(out, inp, weight, bias, 1, N, C, OC, 1, 0)


def matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC):
    # in the forward pass this was out (N, OC) = inp (N, C) . weight (OC, C)^T + bias
    # dinp (N, C) = dout . weight (written); dweight (OC, C) += dout^T . inp; dbias (OC,) += sum_n dout
    if dinp is not None:
        _mm(dinp, dout, weight, dinp, 2, N, C, OC, 0, 0)
    if dweight is None:
        if dbias is not None:
            _mm(dbias, dout, _ones(N), dbias, 4, N, C, OC, 0, 0)
    elif dbias is None:
        _mm(dweight, dout, inp, dweight, 3, N, C, OC, 0, 0)
    else:                               # dbias as an extra row of ones in the dweight product
        _mm(dweight, dout, inp, dbias, 3, N, C, OC, 1, 0)


def matmul_backward_input_acc(dinp, dout, weight, N, C, OC):
    # dinp (N, C) += dout (N, OC) . weight (OC, C)   (_gemm kind 2 with its accumulate flag)
    _mm(dinp, dout, weight, dinp, 2, N, C, OC, 1, 0)


# ---- attention -------------------------------------------------------------------------------
# _D fields for _softmax: 24 Tk, 25 causal, 26 scale mantissa (Q15), 27 scale exponent,
#   28 mask present, 29 B
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
    Tk = D[24]
    causal = D[25]
    sm = D[26]
    se = D[27]
    hasmask = D[28]
    b31 = 31
    sx = 1 << b31                       # (v ^ sx) - sx sign-extends a zero-extended int32 load
    se = (se ^ sx) - sx
    shift = Tk - Tq
    ycap = 1 << 23                      # y = (max - s) scale in Q16 >= 128: weight < 2^-184, 0
    zs = 15                             # Z = sum_j e_j in Q(15 + zs), < 2^30 (Tk < 2^16: < 2^31)
    while zs > 0 and (1 << (15 - zs)) < Tk:
        zs -= 1
    ab = 0
    for b in range(D[29]):
        for h in range(NH):
            for t in range(Tq):
                last = Tk - 1
                if causal:
                    last = t + shift
                    if last > Tk - 1:
                        last = Tk - 1
                # pass 1: the largest visible score, compared as sign-magnitude ints
                mk = 0
                mj = 0 - 1
                for j in range(Tk):
                    if j > last or (hasmask and pm[b * Tk + j] != 0):
                        continue
                    x = pa[ab + j]
                    e = (x >> 23) & 0xFF
                    v = (e << 23) | (x & 0x7FFFFF)
                    if e == 255:                # inf / NaN: +-FLT_MAX
                        v = ((e - 1) << 23) | 0x7FFFFF
                    if (x >> 31) & 1:
                        v = 0 - v
                    if mj < 0 or v > mk:
                        mk = v
                        mj = j
                # the max as a signed mantissa mx * 2^(ex - 150) (0 for zeros / subnormals)
                mx = 0
                ex = 1
                if mj >= 0:
                    x = pa[ab + mj]
                    e = (x >> 23) & 0xFF
                    if e != 0:
                        mx = (x & 0x7FFFFF) | 0x800000
                        ex = e
                        if e == 255:
                            mx = 0xFFFFFF
                            ex = 254
                        if (x >> 31) & 1:
                            mx = 0 - mx
                # pass 2: y_j = (max - s_j) scale in Q16; e_j = exp(-y_j) = p_j 2^(-15 - k_j)
                # with p_j in [2^14, 2^15) kept apart from k_j; Z = sum_j e_j in Q(15 + zs)
                z = 0
                for j in range(Tk):
                    S[j] = 0
                    if j > last or (hasmask and pm[b * Tk + j] != 0):
                        continue
                    x = pa[ab + j]
                    e = (x >> 23) & 0xFF
                    m = 0
                    if e != 0:
                        m = (x & 0x7FFFFF) | 0x800000
                        if e == 255:
                            m = 0xFFFFFF
                            e = 254
                        if (x >> 31) & 1:
                            m = 0 - m
                    else:
                        e = 1
                    # dv * 2^(de - 150) = max - s_j >= 0, |dv| < 2^25: the smaller exponent's
                    # mantissa shifted right (rounded), a 24-bit shift or more leaves 0
                    if ex >= e:
                        sh = ex - e
                        if sh > 24:
                            m = 0
                        elif sh > 0:
                            m = ((m >> (sh - 1)) + 1) >> 1
                        dv = mx - m
                        de = ex
                    else:
                        sh = e - ex
                        dv = 0 - m
                        if sh <= 24:
                            dv = dv + (((mx >> (sh - 1)) + 1) >> 1)
                        de = e
                    y = 0
                    if dv > 0:
                        # dv cut to < 2^16 (rounded): n = bit length of dv >> 16
                        n = 0
                        if dv >= 0x10000:
                            tt = dv >> 16               # 1 .. 511
                            if tt >= 256:
                                tt = tt >> 8
                                n += 8
                            if tt >= 16:
                                tt = tt >> 4
                                n += 4
                            if tt >= 4:
                                tt = tt >> 2
                                n += 2
                            if tt >= 2:
                                tt = tt >> 1
                                n += 1
                            n += 1
                            dv = ((dv >> (n - 1)) + 1) >> 1            # <= 2^16
                        v = dv * sm                                     #!chk v
                        sh = de - 150 + n + se + 16     # y = v * 2^sh in Q16
                        if sh >= 0:
                            if sh > 23 or v > (ycap >> sh):
                                y = ycap
                            else:
                                y = v << sh
                        elif sh > 0 - 31:
                            y = ((v >> (0 - sh - 1)) + 1) >> 1
                    if y >= ycap:
                        continue                    # weight 0 (below float32 range)
                    # k = y // ln2 (ln 2 = 45426 in Q16), r = y - k ln2 in [0, ln2): a
                    # reciprocal estimate ((y >> 5) * 1477 < 2^31 for y < 2^23) low by at most 1
                    k = (y >> 5) * 1477                                 #!chk k
                    k = k >> 21
                    r = y - k * 45426
                    if r >= 45426:
                        r -= 45426
                        k += 1
                    # e^-r = 1 - r(1 - r/2(1 - r/3(1 - r/4(1 - r/5(1 - r/6))))), Q15 terms;
                    # (r p) >> 16 < 45426 * 2^15 / 2^16 < 2^15, so /5 and /3 are exact reciprocal
                    # multiplies (x < 2^16: x // 3 = (x * 43691) >> 17, x // 5 = (x * 52429) >> 18;
                    # products < 2^31)
                    p = 32768 - ((r * 5461) >> 16)          # 5461 = 2^15/6
                    p = 32768 - ((((r * p) >> 16) * 52429) >> 18)   #!chk p
                    p = 32768 - (((r * p) >> 16) >> 2)
                    p = 32768 - ((((r * p) >> 16) * 43691) >> 17)
                    p = 32768 - (((r * p) >> 16) >> 1)
                    p = 32768 - ((r * p) >> 16)
                    if p > 32767:
                        p = 32767
                    S[j] = p
                    S[Tk + j] = k
                    if k < 30:
                        z += (p << zs) >> k                             #!chk z
                # Z = zr * 2^(zn - 15 - zs), zr in [2^14, 2^15) rounded (z >= 32767 << zs)
                zn = 0
                while (z >> zn) >= 0x8000:
                    zn += 1
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
                ab += Tk


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
                md = ((y & 0x7FFFFF) | 0x800000) << 6               # < 2^30
                if ed == 255:
                    md = 0xFFFFFF
                    md = md << 6
                if (y >> 31) & 1:
                    md = 0 - md
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
            elif me >= de:
                sh = me - de
                if sh > 30:
                    o = 0
                else:
                    o = (o + ((1 << sh) >> 1)) >> sh
                v = md - o                                          #!chk v
                e = me
            else:
                sh = de - me
                if sh > 30:
                    md = 0
                else:
                    md = (md + ((1 << sh) >> 1)) >> sh
                v = md - o                                          #!chk v
                e = de
            # v * 2^e (|v| < 2^31) times a (15 bits) times scale (15 bits); |v| cut to < 2^15
            neg = 0
            if v < 0:
                neg = 1
                v = 0 - v
            while v >= 0x800000:
                v = v >> 8
                e += 8
            if v >= 0x80000:
                v = v >> 4
                e += 4
            if v >= 0x20000:
                v = v >> 2
                e += 2
            if v >= 0x10000:
                v = v >> 1
                e += 1
            if v >= 0x8000:
                v = v >> 1
                e += 1
            ma = ((x & 0x7FFFFF) | 0x800000) >> 9
            if ea == 255:
                ma = 0x7FFF
            v = ((v * ma) >> 15) * sm                               #!chk v
            # pack v * 2^(e + ea - 126 + se) into float32 bits (_store inlined; v < 2^30)
            e = e + ea - 126 + se
            sg = neg
            if v == 0:
                pd[ab + j] = 0
            else:
                if v >= 0x1000000:
                    t = v >> 24                     # 1 .. 127: sh = its bit length
                    sh = 1
                    if t >= 16:
                        t = t >> 4
                        sh += 4
                    if t >= 4:
                        t = t >> 2
                        sh += 2
                    if t >= 2:
                        sh += 1
                    v = (v + (1 << (sh - 1))) >> sh
                    e += sh
                    if v >= 0x1000000:
                        v = v >> 1
                        e += 1
                else:
                    if v < 0x100:
                        v = v << 16
                        e -= 16
                    if v < 0x10000:
                        v = v << 8
                        e -= 8
                    if v < 0x100000:
                        v = v << 4
                        e -= 4
                    if v < 0x400000:
                        v = v << 2
                        e -= 2
                    if v < 0x800000:
                        v = v << 1
                        e -= 1
                be = e + 150
                if be >= 255:
                    be = 255
                    pd[ab + j] = (sg << 31) | (be << 23)
                elif be <= 0:
                    pd[ab + j] = 0
                else:
                    pd[ab + j] = (sg << 31) | (be << 23) | (v & 0x7FFFFF)
        ab += Tk


def attention_forward(out, att, q, k, v, mask, B, Tq, Tk, C, NH, causal):
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
    _mm(att, q, k, att, 5, B, Tq, Tk, C, NH)         # scores att[b,h,t,j] = q[b,t,h] . k[b,j,h]
    _D[24] = Tk
    _D[25] = causal
    _D[26] = sc[0]
    _D[27] = sc[1]
    _D[29] = B
    if mask is None:
        _D[28] = 0
        _softmax(att, _D, _D, _iscratch(Tk + Tk), NH, Tq)
    else:
        _D[28] = 1
        _softmax(att, mask, _D, _iscratch(Tk + Tk), NH, Tq)
    _mm(out, att, v, out, 6, B, Tq, Tk, C, NH)        # context out[b,t,h] = sum_j att[b,h,t,j] v[b,j,h]


def attention_backward(dq, dk, dv, scratch, dout, att, q, k, v, B, Tq, Tk, C, NH):
    # in the forward pass this was out = softmax(q.k^T * scale (+mask)) . v, per head
    # dq (B, Tq, C), dk dv (B, Tk, C): written; scratch is unused (the module keeps its own)
    # dout (B, Tq, C); att (B, NH, Tq, Tk) the forward's weights
    F = _fscratch(B * NH * Tq * Tk)    # (B, NH, Tq, Tk): dA, then dS
    _mm(F, dout, v, F, 5, B, Tq, Tk, C, NH)          # dA[b,h,t,j] = dout[b,t,h] . v[b,j,h]
    _mm(dv, att, dout, dv, 7, B, Tq, Tk, C, NH)      # dv[b,j,h] = sum_t att[b,h,t,j] dout[b,t,h]
    sc = _scale_of(C // NH)
    _softmax_back(0, 0, 0, F, att, B * NH * Tq, Tk, sc[0], sc[1])   # dS = A (dA - rowsum(dA A)) / sqrt(hs)
    _mm(dq, F, k, dq, 6, B, Tq, Tk, C, NH)           # dq[b,t,h] = sum_j dS[b,h,t,j] k[b,j,h]
    _mm(dk, F, q, dk, 7, B, Tq, Tk, C, NH)           # dk[b,j,h] = sum_t dS[b,h,t,j] q[b,t,h]


# ---- activations -----------------------------------------------------------------------------
@micropython.viper
def _relu(out, inp, n: int, leaky: int):
    # out (n,) = relu(inp): x > 0 iff the sign bit is clear and the bits are not 0 (subnormals
    # count); NaN -> 0. leaky: 0.01 x (15-bit mantissa product, via _store)
    po = ptr32(out)
    pi = ptr32(inp)
    for i in range(n):
        x = pi[i]
        e = (x >> 23) & 0xFF
        if e == 255 and (x & 0x7FFFFF) != 0:
            po[i] = 0
        elif ((x >> 31) & 1) == 0 and x != 0:
            po[i] = x
        elif leaky and e != 0:
            m = (x & 0x7FFFFF) | 0x800000
            if e == 255:
                m = 0xFFFFFF
                e = 254
            _store(out, i, 0 - (m >> 9) * 20972, e - 141 - 21)   # 0.01 ~ 20972 * 2^-21
        else:
            po[i] = 0


@micropython.viper
def _relu_back(dinp, dout, inp, n: int, leaky: int):
    # dinp (n,) = dout where inp > 0, else 0 (or 0.01 dout); NaN dout -> 0
    pd = ptr32(dinp)
    pg = ptr32(dout)
    pi = ptr32(inp)
    for i in range(n):
        x = pi[i]
        g = pg[i]
        e = (g >> 23) & 0xFF
        if e == 255 and (g & 0x7FFFFF) != 0:
            pd[i] = 0
        elif ((x >> 31) & 1) == 0 and x != 0 and not (((x >> 23) & 0xFF) == 255 and (x & 0x7FFFFF) != 0):
            pd[i] = g
        elif leaky and e != 0:
            m = (g & 0x7FFFFF) | 0x800000
            if e == 255:
                m = 0xFFFFFF
                e = 254
            v = (m >> 9) * 20972
            if (g >> 31) & 1:
                v = 0 - v
            _store(dinp, i, v, e - 141 - 21)
        else:
            pd[i] = 0


def act_forward(out, inp, N, kind):
    # out (N,) = f(inp (N,)); RELU and LEAKY_RELU in viper, the smooth ones portable
    if kind == RELU or kind == LEAKY_RELU:
        _relu(out, inp, N, kind)
    else:
        _pk.act_forward(out, inp, N, kind)


def act_backward(dinp, dout, inp, out, N, kind):
    # in the forward pass this was out = f(inp); dinp (N,) = f'(inp) * dout (written)
    if kind == RELU or kind == LEAKY_RELU:
        _relu_back(dinp, dout, inp, N, kind)
    else:
        _pk.act_backward(dinp, dout, inp, out, N, kind)


# ---- pooling (through _gemm with a constant 1/T vector) ----------------------------------
_INV = {}                               # T -> array('f') of T copies of 1/T


def _invs(T):
    a = _INV.get(T)
    if a is None:
        a = _INV[T] = array("f", [1.0 / T] * T)
    return a


@micropython.viper
def _bcast(dinp, dout, B: int, T: int, C: int, im: int, ie: int):
    # dinp (B, T, C) = dout (B, C) * im * 2^ie, broadcast over T: each value is computed once,
    # (m >> 8) * im < 2^16 * 2^15 = 2^31, rounded to float32 like _store, then copied T times
    pi = ptr32(dinp)
    po = ptr32(dout)
    TC = T * C
    b31 = 31                            # a variable: 1 << 31 would be folded into a bigint
    for b in range(B):
        for c in range(C):
            x = po[b * C + c]
            ex = (x >> 23) & 0xFF
            r = 0
            if ex != 0:
                m = (x & 0x7FFFFF) | 0x800000
                if ex == 255:
                    m = 0xFFFFFF
                    ex = 254
                v = (m >> 8) * im                                   #!chk v
                e = ex - 142 + ie
                sh = 0
                t = v >> 24
                while t != 0:
                    t = t >> 1
                    sh += 1
                if sh > 0:
                    v = (v + (1 << (sh - 1))) >> sh
                    e += sh
                    if v >= 0x1000000:
                        v = v >> 1
                        e += 1
                while v < 0x800000:
                    v = v << 1
                    e -= 1
                be = e + 150
                if be >= 255:
                    be = 255
                    r = be << 23
                elif be > 0:
                    r = (be << 23) | (v & 0x7FFFFF)
                if (x >> 31) & 1:
                    r = r | (1 << b31)
                if be <= 0:
                    r = 0
            i = b * TC + c
            for t in range(T):
                pi[i] = r
                i += C


_INVT = {}                              # T -> (mantissa Q15, exponent) of 1/T


def _invT(T):
    sc = _INVT.get(T)
    if sc is None:
        sc = _INVT[T] = _mant15(1.0 / T)
    return sc


def avgpool_forward(out, inp, B, T, C):
    # out (B, C) = mean over T of inp (B, T, C)
    # ERROR BOUND: a _gemm with K = T and 1/T: within 2^-11 max_t |inp[b, t, c]|; the backward
    #   (_bcast, dout / T with a 15-bit 1/T) within 2^-13 of each element
    _mm(out, inp, _invs(T), out, 8, B, T, C, 0, 0)


def avgpool_backward(dinp, dout, B, T, C):
    # dinp (B, T, C) = dout (B, C) / T, broadcast over T (written)
    sc = _invT(T)
    _bcast(dinp, dout, B, T, C, sc[0], sc[1])


# ---- softmax cross-entropy -------------------------------------------------------------------
_R = array("i", [0] * 8)            # results of _xent: 4 non-finite flag


# ERROR BOUND (tests/test_viper_range.py): for any finite float32 logits, the loss is within
#   2^-20 |loss| + 1e-4 of the true mean of max - s_y + ln sum_j exp(s_j - max) (absolute part:
#   the 15-bit exponentials), and dlogits within 1e-4 / B of (softmax - onehot) / B (element,
#   relative to the largest possible |dlogit| 1/B); probabilities below 2^-30 become 0.
#   Logits are never clamped: s_j - max is formed from aligned mantissas, only a difference of
#   32 or more (probability < 2^-46) is capped, and max - s_y enters the loss at full range.
@micropython.viper
def _xent(dlogits, logits, labels, B: int, V: int, ibm: int, ibe: int, s, r, lnt, lf):
    # logits (B, V) -> dlogits (B, V) = (softmax - onehot) / B; loss parts in r (see _R)  [B3]
    pl = ptr32(logits)
    S = ptr32(s)
    R = ptr32(r)
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
            e = (x >> 23) & 0xFF
            v = (e << 23) | (x & 0x7FFFFF)
            if e == 255:
                bad = 1
                v = ((e - 1) << 23) | 0x7FFFFF
            if (x >> 31) & 1:
                v = 0 - v
            if j == 0 or v > mk:
                mk = v
                mj = j
        x = pl[lb + mj]
        ex = (x >> 23) & 0xFF
        mx = 0
        if ex == 0:
            ex = 1
        else:
            mx = (x & 0x7FFFFF) | 0x800000
            if ex == 255:
                mx = 0xFFFFFF
                ex = 254
            if (x >> 31) & 1:
                mx = 0 - mx
        # exp(s_j - max) = t_j * 2^(-15 - k_j) with t_j in Q15 kept apart from k_j, so small
        # probabilities keep 15 significant bits; z = sum in Q(zq), zq = 29 - clog2(V)
        z = 0
        for j in range(V):
            x = pl[lb + j]
            e = (x >> 23) & 0xFF
            m = 0
            if e != 0:
                m = (x & 0x7FFFFF) | 0x800000
                if e == 255:
                    m = 0xFFFFFF
                    e = 254
                if (x >> 31) & 1:
                    m = 0 - m
            else:
                e = 1
            # dv * 2^(de - 150) = max - s_j >= 0, |dv| < 2^25 (aligned mantissas, rounded)
            if ex >= e:
                sh = ex - e
                if sh > 24:
                    m = 0
                elif sh > 0:
                    m = ((m >> (sh - 1)) + 1) >> 1
                dv = mx - m
                de = ex
            else:
                sh = e - ex
                dv = 0 - m
                if sh <= 24:
                    dv = dv + (((mx >> (sh - 1)) + 1) >> 1)
                de = e
            yv = 0                                  # the difference in Q16, capped at ycap
            if dv > 0:
                sh = de - 134
                if sh >= 0:
                    if sh > 21 or dv > (ycap >> sh):
                        yv = ycap
                    else:
                        yv = dv << sh
                elif sh > 0 - 31:
                    yv = ((dv >> (0 - sh - 1)) + 1) >> 1
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
                elif le >= te:
                    sh = le - te
                    if sh > 30:
                        dv = 0
                    elif sh > 0:
                        dv = ((dv >> (sh - 1)) + 1) >> 1
                    lm = lm + dv                                    #!chk lm
                else:
                    sh = te - le
                    if sh > 30:
                        lm = 0
                    else:
                        lm = ((lm >> (sh - 1)) + 1) >> 1
                    lm = lm + dv                                    #!chk lm
                    le = te
                if lm >= top:
                    lm = (lm + 1) >> 1
                    le += 1
            k = yv // 45426
            rr = yv - k * 45426
            p = 0
            if k <= 29:
                p = 32768 - ((rr * 5461) >> 16)
                p = 32768 - ((rr * p) >> 16) // 5
                p = 32768 - ((rr * p) >> 16) // 4
                p = 32768 - ((rr * p) >> 16) // 3
                p = 32768 - ((rr * p) >> 16) // 2
                p = 32768 - ((rr * p) >> 16)
                z += (p << (zq - 15)) >> k                          #!chk z
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
    R[4] = bad
    # ---- the mean loss (sum_b (max - s_y) + ln prod_b z_b) / B as float32 bits in lf[0], so the
    # caller boxes one float. ln(pm * 2^pe) = ln(f) + N ln2 with f = pm / 2^15 in [1/2, 1),
    # N = pe + 15; ln f = ln(h / 256) + ln(1 + x), h = pm >> 7, x = (pm & 127) / (128 h) < 2^-7:
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
        v = gm
        e = ge
    elif gm == 0:
        v = lm
        e = le
    elif le >= ge:
        sh = le - ge
        if sh > 30:
            gm = 0
        elif sh > 0:
            gm = ((gm >> (sh - 1)) + 1) >> 1
        v = lm + gm                                         #!chk v
        e = le
    else:
        sh = ge - le
        if sh > 30:
            lm = 0
        else:
            lm = ((lm >> (sh - 1)) + 1) >> 1
        v = lm + gm                                         #!chk v
        e = ge
    if v < 0:                                               # rounding below an exact 0
        v = 0
    # v / B by long division: q < 2^30 once it has 29 bits or more; r < B, 2 r < 2^31
    q = v // B
    rem = v - q * B
    while q < 0x20000000 and v != 0:
        rem = rem << 1
        q = q << 1
        e -= 1
        if rem >= B:
            rem -= B
            q += 1
    _store(lf, 0, q, e)




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
    R = _R
    _xent(dlogits, logits, labels, B, V, ib[0], ib[1], _iscratch(2 * V), R, _LNT, _LF)
    if R[4]:
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


# ---- optimizers: soft float on the raw bits ---------------------------------------------------
# Values are (M, E) int pairs, x = M * 2^E, normalized to 2^29 <= |M| < 2^30 after every add;
# products use the top 15 bits of each side ([B5]: < 2^30), sums of two aligned 30-bit values
# < 2^31. The final p - step is an aligned add with 6 guard bits and round-to-nearest, so a
# step below half an ulp of p vanishes exactly as it would in float32, and no sooner.
# _C slots (ints): 0,1 beta1; 2,3 1-beta1; 4,5 beta2; 6,7 1-beta2; 8,9 lr/bc1 (Adam) or lr (SGD);
#   10,11 1/bc2; 12,13 eps; 14,15 weight decay (Adam decoupled: lr*wd); 16 decoupled; 17 momentum
#   present, 18,19 momentum  (each pair is a 15-bit mantissa and an exponent, see _mant15)
_C = array("i", [0] * 24)


@micropython.viper
def _adam(p, g, m, v, n: int, c):
    pp = ptr32(p)
    pg = ptr32(g)
    pm = ptr32(m)
    pv = ptr32(v)
    C = ptr32(c)
    b31 = 31
    sx = 1 << b31
    b1m = C[0]
    b1e = (C[1] ^ sx) - sx
    o1m = C[2]
    o1e = (C[3] ^ sx) - sx
    b2m = C[4]
    b2e = (C[5] ^ sx) - sx
    o2m = C[6]
    o2e = (C[7] ^ sx) - sx
    am = C[8]
    ae = (C[9] ^ sx) - sx
    rbm = C[10]
    rbe = (C[11] ^ sx) - sx
    epm = C[12]
    epe = (C[13] ^ sx) - sx
    wdm = C[14]
    wde = (C[15] ^ sx) - sx
    dec = C[16]
    b30 = 30
    top = 1 << b30                      # 2^30 (a literal would be folded into a bigint)
    for i in range(n):
        # ---- d = g (+ wd p) ------------------------------------------------------------
        x = pg[i]
        e = (x >> 23) & 0xFF
        dm = 0
        de = 0
        if e != 0:
            dm = ((x & 0x7FFFFF) | 0x800000) << 6
            if e == 255:
                dm = 0xFFFFFF
                dm = dm << 6
            if (x >> 31) & 1:
                dm = 0 - dm
            de = e - 156
        if wdm != 0:
            y = pp[i]
            e = (y >> 23) & 0xFF
            if e != 0:
                t = ((y & 0x7FFFFF) | 0x800000) >> 9
                if e == 255:
                    t = 0x7FFF
                t = t * wdm                                         #!chk t
                if (y >> 31) & 1:
                    t = 0 - t
                te = e - 141 + wde
                if dec:
                    # AdamW: p -= lr wd p, as an aligned add onto p itself
                    pmm = ((y & 0x7FFFFF) | 0x800000) << 6
                    if (y >> 31) & 1:
                        pmm = 0 - pmm
                    sh = e - 156 - te
                    if sh > 30:
                        t = 0
                    elif sh > 0:
                        t = (t + (1 << (sh - 1))) >> sh
                    _store(p, i, pmm - t, e - 156)
                else:
                    # d += wd p
                    if dm == 0:
                        dm = t
                        de = te
                    elif de >= te:
                        sh = de - te
                        if sh > 30:
                            t = 0
                        else:
                            t = (t + ((1 << sh) >> 1)) >> sh
                        dm = dm + t                                 #!chk dm
                    else:
                        sh = te - de
                        if sh > 30:
                            dm = 0
                        else:
                            dm = (dm + ((1 << sh) >> 1)) >> sh
                        dm = dm + t
                        de = te
        # normalize d to 2^29 <= |d| < 2^30 (or 0)
        if dm != 0:
            neg = 0
            if dm < 0:
                neg = 1
                dm = 0 - dm
            while dm >= top:
                dm = dm >> 1
                de += 1
            if dm < 0x4000:
                dm = dm << 16
                de -= 16
            if dm < 0x400000:
                dm = dm << 8
                de -= 8
            if dm < 0x4000000:
                dm = dm << 4
                de -= 4
            if dm < 0x10000000:
                dm = dm << 2
                de -= 2
            if dm < 0x20000000:
                dm = dm << 1
                de -= 1
            if neg:
                dm = 0 - dm
        # ---- m = beta1 m + (1 - beta1) d ---------------------------------------------------
        x = pm[i]
        e = (x >> 23) & 0xFF
        mm = 0
        me = 0
        if e != 0:
            mm = (((x & 0x7FFFFF) | 0x800000) >> 9) * b1m          # < 2^30
            if e == 255:
                mm = 0x7FFF * b1m
            if (x >> 31) & 1:
                mm = 0 - mm
            me = e - 141 + b1e
        t = (dm >> 15) * o1m                                        #!chk t
        te = de + 15 + o1e
        if dm == 0:
            t = 0
        if mm == 0:
            mm = t
            me = te
        elif t != 0:
            if me >= te:
                sh = me - te
                if sh > 30:
                    t = 0
                else:
                    t = (t + ((1 << sh) >> 1)) >> sh
                mm = mm + t                                         #!chk mm
            else:
                sh = te - me
                if sh > 30:
                    mm = 0
                else:
                    mm = (mm + ((1 << sh) >> 1)) >> sh
                mm = mm + t
                me = te
        kv = mm
        ke = me
        ks = 0
        if kv < 0:
            ks = 1
            kv = 0 - kv
        if kv == 0:
            pm[i] = 0
        else:
            if kv >= 0x1000000:
                kt = kv >> 24                     # 1 .. 127: kh = its bit length
                kh = 1
                if kt >= 16:
                    kt = kt >> 4
                    kh += 4
                if kt >= 4:
                    kt = kt >> 2
                    kh += 2
                if kt >= 2:
                    kh += 1
                kv = (kv + (1 << (kh - 1))) >> kh
                ke += kh
                if kv >= 0x1000000:
                    kv = kv >> 1
                    ke += 1
            else:
                if kv < 0x100:
                    kv = kv << 16
                    ke -= 16
                if kv < 0x10000:
                    kv = kv << 8
                    ke -= 8
                if kv < 0x100000:
                    kv = kv << 4
                    ke -= 4
                if kv < 0x400000:
                    kv = kv << 2
                    ke -= 2
                if kv < 0x800000:
                    kv = kv << 1
                    ke -= 1
            kb = ke + 150
            if kb >= 255:
                kb = 255
                pm[i] = (ks << 31) | (kb << 23)
            elif kb <= 0:
                pm[i] = 0
            else:
                pm[i] = (ks << 31) | (kb << 23) | (kv & 0x7FFFFF)
        # ---- v = beta2 v + (1 - beta2) d^2 ----------------------------------------------
        x = pv[i]
        e = (x >> 23) & 0xFF
        vm = 0
        ve = 0
        if e != 0:
            vm = (((x & 0x7FFFFF) | 0x800000) >> 9) * b2m
            if e == 255:
                vm = 0x7FFF * b2m
            ve = e - 141 + b2e
        t = 0
        te = 0
        if dm != 0:
            t = dm >> 15
            t = ((t * t) >> 15) * o2m                               #!chk t
            te = de + de + 30 + 15 + o2e
        if vm == 0:
            vm = t
            ve = te
        elif t != 0:
            if ve >= te:
                sh = ve - te
                if sh > 30:
                    t = 0
                else:
                    t = (t + ((1 << sh) >> 1)) >> sh
                vm = vm + t                                         #!chk vm
            else:
                sh = te - ve
                if sh > 30:
                    vm = 0
                else:
                    vm = (vm + ((1 << sh) >> 1)) >> sh
                vm = vm + t
                ve = te
        kv = vm
        ke = ve
        ks = 0
        if kv < 0:
            ks = 1
            kv = 0 - kv
        if kv == 0:
            pv[i] = 0
        else:
            if kv >= 0x1000000:
                kt = kv >> 24                     # 1 .. 127: kh = its bit length
                kh = 1
                if kt >= 16:
                    kt = kt >> 4
                    kh += 4
                if kt >= 4:
                    kt = kt >> 2
                    kh += 2
                if kt >= 2:
                    kh += 1
                kv = (kv + (1 << (kh - 1))) >> kh
                ke += kh
                if kv >= 0x1000000:
                    kv = kv >> 1
                    ke += 1
            else:
                if kv < 0x100:
                    kv = kv << 16
                    ke -= 16
                if kv < 0x10000:
                    kv = kv << 8
                    ke -= 8
                if kv < 0x100000:
                    kv = kv << 4
                    ke -= 4
                if kv < 0x400000:
                    kv = kv << 2
                    ke -= 2
                if kv < 0x800000:
                    kv = kv << 1
                    ke -= 1
            kb = ke + 150
            if kb >= 255:
                kb = 255
                pv[i] = (ks << 31) | (kb << 23)
            elif kb <= 0:
                pv[i] = 0
            else:
                pv[i] = (ks << 31) | (kb << 23) | (kv & 0x7FFFFF)
        if mm == 0:
            continue
        # ---- step = (lr / bc1) m / (sqrt(v / bc2) + eps) -----------------------------------
        # s = sqrt(v * rb): v * rb normalized to [2^28, 2^30) with an even exponent, isqrt
        sm = 0
        sme = 0
        if vm > 0:
            while vm >= top:
                vm = vm >> 1
                ve += 1
            if vm < 0x4000:
                vm = vm << 16
                ve -= 16
            if vm < 0x400000:
                vm = vm << 8
                ve -= 8
            if vm < 0x4000000:
                vm = vm << 4
                ve -= 4
            if vm < 0x10000000:
                vm = vm << 2
                ve -= 2
            if vm < 0x20000000:
                vm = vm << 1
                ve -= 1
            x = (vm >> 15) * rbm                                    #!chk x
            e = ve + 15 + rbe
            if e & 1:
                x = x >> 1
                e += 1
            # r = floor(sqrt(x)), x in [2^27, 2^30): a chord of sqrt over x's octave (low by
            # < 3 %), two Newton steps (then within +-1) and an exact fix-up; r*r <= 2^30
            if x >= 0x20000000:
                r = 23170 + ((((x - 0x20000000) >> 14) * 9598) >> 15)
            elif x >= 0x10000000:
                r = 16384 + ((((x - 0x10000000) >> 13) * 6787) >> 15)
            else:
                r = 11585 + ((((x - 0x8000000) >> 12) * 4799) >> 15)
            r = (r + x // r) >> 1
            r = (r + x // r) >> 1
            while r * r > x:
                r -= 1
            while (r + 1) * (r + 1) <= x:
                r += 1
            sm = r                                                  # < 2^15
            sme = e >> 1
        # den = s + eps, both aligned, then 15 significant bits
        den = epm
        dne = epe
        if sm != 0:
            if sme >= dne:
                sh = sme - dne
                if sh > 30:
                    den = 0
                else:
                    den = (den + ((1 << sh) >> 1)) >> sh
                den = den + sm
                dne = sme
            else:
                sh = dne - sme
                if sh <= 30:
                    den = den + ((sm + ((1 << sh) >> 1)) >> sh)
        while den >= 0x8000:
            den = den >> 1
            dne += 1
        while den < 0x4000:
            den = den << 1
            dne -= 1
        # num = a m, m normalized to 30 bits
        neg = 0
        if mm < 0:
            neg = 1
            mm = 0 - mm
        while mm >= top:
            mm = mm >> 1
            me += 1
        if mm < 0x4000:
            mm = mm << 16
            me -= 16
        if mm < 0x400000:
            mm = mm << 8
            me -= 8
        if mm < 0x4000000:
            mm = mm << 4
            me -= 4
        if mm < 0x10000000:
            mm = mm << 2
            me -= 2
        if mm < 0x20000000:
            mm = mm << 1
            me -= 1
        num = (mm >> 15) * am                                       #!chk num
        ne = me + 15 + ae
        q = num // den                                              # [2^14, 2^16)
        qe = ne - dne
        # ---- p -= q * 2^qe, aligned add with 6 guard bits ----------------------------------
        y = pp[i]
        e = (y >> 23) & 0xFF
        if e == 0:
            if neg:
                q = 0 - q
            kv = 0 - q
            ke = qe
            ks = 0
            if kv < 0:
                ks = 1
                kv = 0 - kv
            if kv == 0:
                pp[i] = 0
            else:
                if kv >= 0x1000000:
                    kt = kv >> 24                     # 1 .. 127: kh = its bit length
                    kh = 1
                    if kt >= 16:
                        kt = kt >> 4
                        kh += 4
                    if kt >= 4:
                        kt = kt >> 2
                        kh += 2
                    if kt >= 2:
                        kh += 1
                    kv = (kv + (1 << (kh - 1))) >> kh
                    ke += kh
                    if kv >= 0x1000000:
                        kv = kv >> 1
                        ke += 1
                else:
                    if kv < 0x100:
                        kv = kv << 16
                        ke -= 16
                    if kv < 0x10000:
                        kv = kv << 8
                        ke -= 8
                    if kv < 0x100000:
                        kv = kv << 4
                        ke -= 4
                    if kv < 0x400000:
                        kv = kv << 2
                        ke -= 2
                    if kv < 0x800000:
                        kv = kv << 1
                        ke -= 1
                kb = ke + 150
                if kb >= 255:
                    kb = 255
                    pp[i] = (ks << 31) | (kb << 23)
                elif kb <= 0:
                    pp[i] = 0
                else:
                    pp[i] = (ks << 31) | (kb << 23) | (kv & 0x7FFFFF)
            continue
        pmm = ((y & 0x7FFFFF) | 0x800000) << 6
        if e == 255:
            pmm = 0xFFFFFF
            pmm = pmm << 6
        if (y >> 31) & 1:
            pmm = 0 - pmm
        pe = e - 156
        q = q << 14                                                 # < 2^30
        qe -= 14
        if neg:
            q = 0 - q
        if pe >= qe:
            sh = pe - qe
            if sh > 30:
                q = 0
            else:
                q = (q + ((1 << sh) >> 1)) >> sh
            kv = pmm - q
            ke = pe
        else:
            sh = qe - pe
            if sh > 30:
                pmm = 0
            else:
                pmm = (pmm + ((1 << sh) >> 1)) >> sh
            kv = pmm - q
            ke = qe
        ks = 0
        if kv < 0:
            ks = 1
            kv = 0 - kv
        if kv == 0:
            pp[i] = 0
        else:
            if kv >= 0x1000000:
                kt = kv >> 24                     # 1 .. 127: kh = its bit length
                kh = 1
                if kt >= 16:
                    kt = kt >> 4
                    kh += 4
                if kt >= 4:
                    kt = kt >> 2
                    kh += 2
                if kt >= 2:
                    kh += 1
                kv = (kv + (1 << (kh - 1))) >> kh
                ke += kh
                if kv >= 0x1000000:
                    kv = kv >> 1
                    ke += 1
            else:
                if kv < 0x100:
                    kv = kv << 16
                    ke -= 16
                if kv < 0x10000:
                    kv = kv << 8
                    ke -= 8
                if kv < 0x100000:
                    kv = kv << 4
                    ke -= 4
                if kv < 0x400000:
                    kv = kv << 2
                    ke -= 2
                if kv < 0x800000:
                    kv = kv << 1
                    ke -= 1
            kb = ke + 150
            if kb >= 255:
                kb = 255
                pp[i] = (ks << 31) | (kb << 23)
            elif kb <= 0:
                pp[i] = 0
            else:
                pp[i] = (ks << 31) | (kb << 23) | (kv & 0x7FFFFF)


@micropython.viper
def _m15div(c, slot: int, cf, ia: int, ib: int):
    # c[slot], c[slot+1] = _mant15(cf[ia] / cf[ib]) for positive float32 operands, without boxing
    # a float: 16-bit restoring division of the 24-bit mantissas (r < 2^26), then the same
    # round-half-up to 15 bits as _mant15 (floor((floor(x 2^15) + 1) / 2) = floor(x 2^14 + 1/2))
    C = ptr32(c)
    F = ptr32(cf)
    a = F[ia]
    b = F[ib]
    ea = (a >> 23) & 0xFF
    eb = (b >> 23) & 0xFF
    if ea == 0 or eb == 0:
        C[slot] = 0
        C[slot + 1] = 0
        return
    r = (a & 0x7FFFFF) | 0x800000
    d = (b & 0x7FFFFF) | 0x800000
    e = ea - eb
    if r < d:
        r = r << 1
        e -= 1
    q = 1                               # the ratio is now in [1, 2)
    r = r - d
    for k in range(15):
        r = r << 1
        q = q << 1
        if r >= d:
            r = r - d
            q = q | 1
    m = (q + 1) >> 1                    # [2^14, 2^15]
    if m >= 32768:
        m = m >> 1
        e += 1
    C[slot] = m
    C[slot + 1] = e - 14


def _setc(slot, x):
    m, e = _mant15(x)
    C = _C
    C[slot] = m
    C[slot + 1] = e


_LAST = [None, None, None, None, None, None, None, None]


def adam_update(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2, decoupled):
    # Adam (decoupled: AdamW). bc1 = 1 - beta1^t, bc2 = 1 - beta2^t for step t.
    # p, g, m, v (n,): m and v are the moment estimates, updated in place
    # ERROR BOUND: p within 2e-3 lr per step (+ 2^-22 |p|) of the portable update; m and v within
    #   2e-3 of the magnitudes entering them (|new| + |old| + |g| + wd |p|, squared for v)
    # The constants are converted only when they change: the hyperparameters (boxed floats
    # allowed, rare), and bc1/bc2 once per step, through float32 slots and viper (no allocation).
    L = _LAST
    if not (L[0] is lr and L[1] is beta1 and L[2] is beta2 and L[3] is eps
            and L[4] is weight_decay and L[7] is decoupled):
        _setc(0, beta1)
        _setc(2, 1.0 - beta1)
        _setc(4, beta2)
        _setc(6, 1.0 - beta2)
        _setc(12, eps)
        _setc(14, (lr * weight_decay) if decoupled else weight_decay)
        _C[16] = 1 if decoupled else 0
        L[0] = lr
        L[1] = beta1
        L[2] = beta2
        L[3] = eps
        L[4] = weight_decay
        L[5] = None
        L[7] = decoupled
    if not (L[5] is bc1 and L[6] is bc2):
        CF = _CF
        CF[0] = lr
        CF[1] = bc1
        CF[3] = bc2
        _m15div(_C, 8, CF, 0, 1)        # lr / bc1
        _m15div(_C, 10, CF, 2, 3)       # 1 / bc2
        L[5] = bc1
        L[6] = bc2
    _adam(p, g, m, v, n, _C)

# ---- portable fallbacks (boxed floats; not on the hot path of the models we train) -----------
mse = _pk.mse
sum_squares = _pk.sum_squares
sgd_update = _pk.sgd_update
scale_inplace = _pk.scale_inplace


# ---- every other portable kernel (layernorm, embedding, ...) until it gets a viper loop ---------
def _fill_from_portable(g):
    for name in dir(_pk):
        if not name.startswith("_") and name not in g:
            g[name] = getattr(_pk, name)


_fill_from_portable(globals())


# ---- convolution (Conv1D) --------------------------------------------------------------------
# conv1d_forward / conv1d_backward: the windows are gathered into float scratch as raw bits (an
# exact copy: im2col, zero bits where a tap falls in the padding), then multiplied by the
# block-float _gemm above. So the only arithmetic on values is _gemm's, with its [B1]/[B2]
# overflow analysis; the gathers do index arithmetic only, on indices below the buffer
# lengths (< 2^29 floats on any board): the lines marked #!chk check it.
#   forward  out (n Lout, OCg) = col (n Lout, Cg K) . W_g (OCg, Cg K)^T + bias_g   (_gemm kind 1)
#   dweight  dW_g (OCg, Cg K) += dy_g^T (OCg, n Lout) . col (n Lout, Cg K) (+ dbias)  (kind 3)
#   dinput   dx_g (n L, Cg) = dcol (n L, K OCg) . Wt_g (Cg, K OCg)^T                 (kind 1)
#     dcol[b, p, j OCg + o] = dy[b, t, o] where p + pad - j dil = t stride (0 <= t < Lout), else 0;
#     Wt_g[c, j OCg + o] = W[g OCg + o, c, j]: the transposed convolution as a gather, no adds.
# Per group g, over chunks of n samples so the gathers need at most CONV_SCRATCH floats each
# (n >= 1: a single sample may need more; the scratch then grows to fit it).
# ERROR BOUND (each output element, the _gemm bound with the gathered K):
#   forward  2^-11 (Cg K) max|window| max|W[o]| + 2^-11 |bias[o]|
#   dweight  2^-11 (n Lout) max|dy[:, :, o]| max|x taps of (c, j)| per chunk, + 2^-11 |dW| per
#            chunk (the running sum is _gemm's addend)
#   dbias    2^-11 (n Lout) max|dy[:, :, o]| per chunk, + 2^-11 |db| per chunk
#   dinput   2^-11 (K OCg) max|dcol row| max|Wt_g[c]|
# (tests/test_conv.py pins them at 2e-3 of the block maxima, on worst-case inputs on the 32-bit port.)
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
def _im2col(col, x, b0: int, nb: int, L: int, C: int, Lout: int, K: int, st: int, pad: int, dil: int, c0: int, Cg: int):
    # col (nb Lout, Cg K): col[bi Lout + t, c K + j] = x[b0 + bi, t st + j dil - pad, c0 + c], 0 in the padding
    pc = ptr32(col)
    px = ptr32(x)
    CK = Cg * K
    oi = 0
    for bi in range(nb):
        xb = (b0 + bi) * L * C + c0                                 #!chk xb
        for t in range(Lout):
            p0 = t * st - pad                                       #!chk p0
            for j in range(K):
                p = p0 + j * dil                                    #!chk p
                i = oi + j
                if p < 0 or p >= L:
                    for c in range(Cg):
                        pc[i] = 0
                        i += K
                else:
                    xi = xb + p * C                                 #!chk xi
                    for c in range(Cg):
                        pc[i] = px[xi + c]
                        i += K
            oi += CK


@micropython.viper
def _dcol(col, dy, b0: int, nb: int, L: int, OC: int, Lout: int, K: int, st: int, pad: int, dil: int, o0: int, OCg: int):
    # col (nb L, K OCg): col[bi L + p, j OCg + o] = dy[b0 + bi, t, o0 + o] where p + pad - j dil = t st,
    # 0 <= t < Lout; 0 where no output position t used input p through tap j
    pc = ptr32(col)
    pd = ptr32(dy)
    KO = K * OCg
    oi = 0
    for bi in range(nb):
        db = (b0 + bi) * Lout * OC + o0                             #!chk db
        for p in range(L):
            for j in range(K):
                u = p + pad - j * dil                               #!chk u
                i = oi + j * OCg
                t = 0 - 1
                if u >= 0:
                    t = u // st
                    if t * st != u or t >= Lout:
                        t = 0 - 1
                if t < 0:
                    for o in range(OCg):
                        pc[i + o] = 0
                else:
                    di = db + t * OC                                #!chk di
                    for o in range(OCg):
                        pc[i + o] = pd[di + o]
            oi += KO


@micropython.viper
def _wperm(wt, w, o0: int, OCg: int, Cg: int, K: int):
    # wt (Cg, K OCg): wt[c, j OCg + o] = w[o0 + o, c, j]   (w: (OC, Cg, K))
    pt = ptr32(wt)
    pw = ptr32(w)
    KO = K * OCg
    for o in range(OCg):
        wb = (o0 + o) * Cg * K                                      #!chk wb
        for c in range(Cg):
            ti = c * KO + o
            for j in range(K):
                pt[ti] = pw[wb]
                ti += OCg
                wb += 1


def _conv_chunk(per_sample, B):
    n = CONV_SCRATCH // per_sample if per_sample else B
    return 1 if n < 1 else (B if n > B else n)


def conv1d_forward(out, inp, weight, bias, B, L, C, Lout, OC, K, stride, pad, dil, groups):
    # out (B, Lout, OC)[b,t,o] = bias[o] + sum_{c,j} weight[o,c,j] inp[b, t stride + j dil - pad, g Cg + c]
    Cg = C // groups
    OCg = OC // groups
    CK = Cg * K
    nb = _conv_chunk(Lout * CK, B)
    col = _cvbuf(0, nb * Lout * CK)
    for g in range(groups):
        wg = weight
        bg = bias
        if groups > 1:
            wg = _cvbuf(1, OCg * CK)
            _cvcopy(wg, weight, 1, 0, 0, 0, g * OCg * CK, OCg * CK)
            if bias is not None:
                bg = _cvbuf(2, OCg)
                _cvcopy(bg, bias, 1, 0, 0, 0, g * OCg, OCg)
        for b0 in range(0, B, nb):
            n = B - b0 if B - b0 < nb else nb
            _im2col(col, inp, b0, n, L, C, Lout, K, stride, pad, dil, g * Cg, Cg)
            direct = groups == 1 and n == B
            y = out if direct else _cvbuf(3, n * Lout * OCg)
            if bg is None:
                _mm(y, col, wg, y, 1, n * Lout, CK, OCg, 0, 0)
            else:
                _mm(y, col, wg, bg, 1, n * Lout, CK, OCg, 1, 0)
            if not direct:
                _cvcopy(out, y, n * Lout, OC, b0 * Lout * OC + g * OCg, OCg, 0, OCg)


def conv1d_backward(dinp, dweight, dbias, dout, inp, weight, B, L, C, Lout, OC, K, stride, pad, dil, groups):
    # in the forward pass this was out[b,t,o] = bias[o] + sum_{c,j} weight[o,c,j] inp[b, t stride + j dil - pad, g Cg + c]
    # dinp (B, L, C) written; dweight (OC, Cg, K) and dbias (OC,) accumulated; None = skipped
    Cg = C // groups
    OCg = OC // groups
    CK = Cg * K
    if dweight is not None or dbias is not None:
        nb = _conv_chunk(Lout * CK + Lout * OCg, B)
        col = _cvbuf(0, nb * Lout * CK)
        for g in range(groups):
            whole = groups == 1
            dw = dweight
            db = dbias
            if not whole:
                if dweight is not None:
                    dw = _cvbuf(4, OCg * CK)
                    _cvcopy(dw, dweight, 1, 0, 0, 0, g * OCg * CK, OCg * CK)
                if dbias is not None:
                    db = _cvbuf(5, OCg)
                    _cvcopy(db, dbias, 1, 0, 0, 0, g * OCg, OCg)
            for b0 in range(0, B, nb):
                n = B - b0 if B - b0 < nb else nb
                N = n * Lout
                if whole and n == B:
                    dyg = dout
                else:
                    dyg = _cvbuf(3, N * OCg)
                    _cvcopy(dyg, dout, N, OCg, 0, OC, b0 * Lout * OC + g * OCg, OCg)
                if dw is None:
                    _mm(db, dyg, _ones(N), db, 4, N, CK, OCg, 0, 0)
                    continue
                _im2col(col, inp, b0, n, L, C, Lout, K, stride, pad, dil, g * Cg, Cg)
                if db is None:
                    _mm(dw, dyg, col, dw, 3, N, CK, OCg, 0, 0)
                else:
                    _mm(dw, dyg, col, db, 3, N, CK, OCg, 1, 0)
            if not whole:
                if dweight is not None:
                    _cvcopy(dweight, dw, 1, 0, g * OCg * CK, 0, 0, OCg * CK)
                if dbias is not None:
                    _cvcopy(dbias, db, 1, 0, g * OCg, 0, 0, OCg)
    if dinp is not None:
        KO = K * OCg
        nb = _conv_chunk(L * KO + L * Cg, B)
        dcol = _cvbuf(0, nb * L * KO)
        wt = _cvbuf(1, Cg * KO)
        for g in range(groups):
            _wperm(wt, weight, g * OCg, OCg, Cg, K)
            for b0 in range(0, B, nb):
                n = B - b0 if B - b0 < nb else nb
                _dcol(dcol, dout, b0, n, L, OC, Lout, K, stride, pad, dil, g * OCg, OCg)
                direct = groups == 1 and n == B
                dx = dinp if direct else _cvbuf(3, n * L * Cg)
                _mm(dx, dcol, wt, dx, 1, n * L, KO, Cg, 0, 0)
                if not direct:
                    _cvcopy(dinp, dx, n * L, C, b0 * L * C + g * Cg, Cg, 0, Cg)


# max and average pooling along the sequence (MaxPool1D / AvgPool1D) stay on the portable loops
# (comparisons and a 1/K scale: no multiply-accumulate worth a block-float kernel)
