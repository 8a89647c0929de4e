# microformer.viper_gemm: the block-float GEMM every matmul goes through (Dense, the attention
# products, mean pooling) and the kernels built on it.
import micropython
from array import array
from micropython import const
from .viper_common import _BL, _filled, _iscratch, _mant15, _ones, _S

# what _gemm computes (`kind`); x y z w u are its sizes, in this order:
MM_FORWARD = const(1)       # (N, C, OC, hasbias, keep):  out (N, OC) = inp (N, C) . W (OC, C)^T (+ bias); keep: see _gemm
MM_DINP = const(2)          # (N, C, OC, acc):      dinp (N, C) = dout (N, OC) . W (OC, C)  (acc: +=)
MM_DWEIGHT = const(3)       # (N, C, OC, hasbias):  dW (OC, C) += dout^T . inp (and bias: db (OC,) += dout^T . 1)
MM_DBIAS = const(4)         # (N, C, OC):           db (OC,) += dout^T . ones (N,)
HEAD_SCORES = const(5)      # (B, Tq, Tk, C, NH):   att[b,h,t,j] = a[b,t,h] . b[b,j,h]    (att, A = q, B = k)
HEAD_CONTEXT = const(6)     # (B, Tq, Tk, C, NH):   out[b,t,h] = sum_j att[b,h,t,j] b[b,j,h]  (A = att)
HEAD_TRANSPOSED = const(7)  # (B, Tq, Tk, C, NH):   out[b,j,h] = sum_t att[b,h,t,j] b[b,t,h]  (A = att)
MEAN_POOL = const(8)        # (B, T, C):            out[b,c] = sum_t inp[b,t,c] * b[t]     (b = 1/T)
DECODE_SCORES = const(9)    # (B, T, L, C, NH):     att[b,h,j] = a[b,h] . b[b,j,h], j < T  (a = q (B, C), b = cache (B, L, C), att (B, NH, L))
DECODE_CONTEXT = const(10)  # (B, T, L, C, NH):     out[b,h] = sum_{j<T} att[b,h,j] b[b,j,h]   (A = att, b = cache)
# the int scratch (ints) _gemm holds B's quantized rows in without growing it further (or A's M
# rows of KT4 when more; PIECES): in pieces when they need more (one row at least); 4096 ints, 16 KB
_PIECE = const(4096)
# what is added to each output
_ADD_NONE = const(0)
_ADD_OLD = const(1)         # the old value (accumulate)
_ADD_BIAS = const(2)        # bias[n]


# out[o + b1*ob1 + b2*ob2 + m*osm + n*osn] (=|+=) sum_k A[a + ... + m*asm + k*ask] * B[b + ... + n*bsn + k*bsk]
# The geometry is not passed in: `kind` names the product and x y z w u its sizes, so a call is a
# single viper call (the Python wrappers cost more than the math at Iris sizes).
# s: int scratch; if it needs more, nothing is computed and the size is returned (the caller
# grows the scratch and calls again); 0 when done.
# PIECES: B's quantized rows are held in pieces of rp rows, as many as fit in the scratch s, taken
# as at least _PIECE ints and at least A's M rows of KT4 (so s is not grown past the larger of
# about _PIECE and the A operand's own size for a large B; always at least one row): each
# piece's outputs are computed for every A row, whose quantized row is made again per piece.
# Each output is still one A row times one B row, quantized alike, so the result is bit for bit
# the same whatever the piece size (tests/mp/test_viper_pieces.py). The cost is A's quantization
# once more per extra piece: with pieces of at least M rows' worth, at most as much again as
# quantizing B, and none when B fits (a Dense layer's weight at a micro-batch of more rows than
# it has outputs: the encoder's FFN at S = 32 from 8 samples on).
# ERROR BOUND (relative to the block maxima): every operand is rounded to 14 bits of its block's
#   largest magnitude (|x - x~| <= 2^-13 max|x|), so an output summing KT products is within
#   2^-11 KT max|a_row| max|b_row| of the exact sum, plus 2^-11 of an addend (bias, accumulated
#   gradient) and the final float32 rounding. A small element next to a large one in the same
#   block keeps only the bits above 2^-14 of the large one (tests/mp/test_viper_range.py).
@micropython.viper
def _gemm(v: int, qb: ptr32, qa: ptr32, out, a, b, bias, s, kind: int, x: int, y: int, z: int, w: int, u: int) -> int:
    # v qa qb: the hottest locals (the packed value, the A and B row pointers of the inner
    # products); as the first three they live in registers (callers pass 0s)
    S = ptr32(s)
    po = ptr32(out)
    pa = ptr32(a)
    pb = ptr32(b)
    pbias = ptr32(bias)
    sa = uint(S)                        # S's address: mac4 moves pointers along its rows
    bl = ptr8(_BL)                      # bit lengths: store_bl's normalizing shift
    gemm_geometry()                     # M N KT, the strides and the addend of `kind`
    P = 14                              # bits per operand [B1]
    lim = 16383                         # 2^P - 1
    KT4 = (KT + 3) & (0 - 4)              # KT rounded up to a multiple of 4 (zero padded)
    nc = KT4 >> 2
    NB = N                              # B rows quantized: N, plus a row of ones when the
    fuse = 0                            # bias gradient rides along (MM_DWEIGHT with a bias)
    if kind == MM_DWEIGHT and w:
        NB = N + 1
        fuse = 1
    gemm_piece()                        # rp: B rows per piece (see PIECES)
    xq = rp * KT4                        # S[0 : rp*KT4] a piece of B rows, S[xq : xq+rp] their exponents
    ex = xq + rp                        # S[ex : ex+KT4] the current A row
    bd = ex + KT4                        # S[bd : bd+2N] bias[n] decoded (_ADD_BIAS): mantissa, exponent
    cp = bd + N + N                     # S[cp : cp + N*KT] the weight's bits (MM_FORWARD, u = 1)
    need = cp
    if kind == MM_FORWARD and u:
        need = cp + N * KT
    if need > int(len(s)):
        return need
    sh4 = 0                             # each 4-term chunk sum is shifted right by sh4 [B1]
    if nc > 2:
        while (1 << sh4) < nc:
            sh4 += 1
    rh = (1 << sh4) >> 1
    # ptr32 loads of S zero-extend where ints are 64 bits wide; the sums are exact mod 2^32 and
    # bounded below 2^31, so (x << s32) >> s32 sign-extends them from bit 31: s32 = 32 there,
    # 0 (two shifts by nothing) on the board's 32-bit ints. (A variable: constant folding
    # would make a bigint object.)
    b16 = 16
    s32 = 0
    if (1 << b16) * (1 << b16) != 0:    # 2^32: 0 on 32-bit ints (wraps)
        s32 = 32
    for k in range(KT, KT4):
        S[ex + k] = 0
    if mode == _ADD_BIAS:
        for n in range(N):
            v = pbias[n]
            decode(v, xm, xe)
            S[bd + n + n] = xm
            S[bd + n + n + 1] = xe - 150
    for b1 in range(nb1):
        for b2 in range(nb2):
            ab = b1 * asb1 + b2 * asb2
            bb = b1 * bsb1 + b2 * bsb2
            ob = b1 * osb1 + b2 * osb2
            # B's rows are kept (MM_FORWARD with u = 1: s is the weight's own scratch, and its
            # copy of the weight's bits at S[cp ...] says the quantized rows are this weight's)
            kept(same)
            n0 = 0
            while n0 < NB:                      # the pieces of B rows n0 <= n < n1
                n1 = n0 + rp
                if n1 > NB:
                    n1 = NB
                xn = xq - n0                    # B row n's exponent at S[xn + n]
                # quantize the rows n0 .. n1 - 1 of B (block = row n, KT values; see
                # kernels_viper.py), unless kept; row N is the ones row of a fused bias gradient
                gemm_bpiece()
                for m in range(M):
                    # quantize row m of A into S[ex : ex + KT]
                    i0 = ab + m * asm
                    qb = ptr32(sa + (ex << 2))
                    quantize(pa, ask)
                    ea = emax - 252 - P - P + sh4
                    gemm_arow()
                    pw = po
                    oi = ob + m * osm + n0 * osn
                    qb = ptr32(sa)              # B row n0; the MAC moves it to the next row
                    gemm_outs(v)                # the outputs n0 .. n1 - 1 of row m (v: the accumulator)
                n0 = n1
    return 0


# The wrappers below are viper functions too: a bytecode function whose arguments, locals and
# value stack exceed 11 words takes its frame from the GC heap on every call (MicroPython's
# VM_MAX_STATE_ON_STACK), which slows down as garbage builds up; a viper function has no such
# frame (host/tools/frames.py lists the frames, tests/mp/test_frames.py guards the hot paths).
_NONE = None                            # viper compares objects with a global, not the literal


@micropython.viper
def _mm(out, a, b, bias, kind: int, x: int, y: int, z: int, w: int, u: int):
    # _gemm with the module scratch, grown on demand
    n = int(_gemm(0, 0, 0, out, a, b, bias, _S[0], kind, x, y, z, w, u))
    if n:
        _gemm(0, 0, 0, out, a, b, bias, _iscratch(n), kind, x, y, z, w, u)


# A few rows (decoding: one token) cost little next to quantizing the weight each call, so a
# call with N <= _KEEP_N keeps the weight's quantized rows in scratch the caller owns (keep, a
# list of one item, made here on first use, or by keep_weight), with a copy of the weight's bits
# that each call compares first: a changed weight (a training step, load_state_dict, a write by
# hand) is quantized again, so the result is always that of the weight as it is now, bit for bit
# matmul_forward's (each output is one A row times one B row, computed alike in either path).
# A call with more rows uses the kept rows when they exist (a prompt before decoding), else
# matmul_forward (training never makes them).
# The kept rows are split in parts of at most _KEEP_PART ints of scratch (a few rows of the
# weight each, 12 KB): one large array per weight cannot be placed in a fragmented heap of a few
# hundred KB (a board without PSRAM) where many small ones can. A part writes its rows of the
# output to the keep's own buffer; they are copied to theirs in the output.
_KEEP_N = const(4)
_KEEP_PART = const(3072)


def keep_weight(keep, weight, bias, C, OC):
    # keep[0] = [weight, bias, hb, out (N, rows of the largest part), then per part: its first
    # row o, its rows r, weight rows view, bias rows view, scratch]; made again when the weight or
    # the bias is replaced by another array (a changed value is caught by the copy, not here)
    keep[0] = None                      # the old parts can go before the new ones are made
    KT4 = (C + 3) & (0 - 4)
    rows = max(1, (_KEEP_PART - KT4) // (KT4 + 3 + C))
    wv = memoryview(weight)
    k = [weight, bias, 0 if bias is None else 1, array("f", bytes(4 * min(rows, OC)))]
    for o in range(0, OC, rows):
        r = min(rows, OC - o)
        k += [o, r, wv[o * C:(o + r) * C], wv if bias is None else memoryview(bias)[o:o + r],
              _filled("i", r * KT4 + r + KT4 + 2 * r + r * C, 0)]
    keep[0] = k


def _keep_out(k, n):
    # the keep's output buffer, grown to n floats (more rows than before)
    k[3] = None
    k[3] = array("f", bytes(4 * n))


@micropython.viper
def _put_rows(out, o: int, OC: int, part, r: int, N: int):
    # out[m, o : o+r] = part[m, 0 : r] for the N rows m of out (N, OC), bit for bit
    po = ptr32(out)
    pp = ptr32(part)
    for m in range(N):
        for j in range(r):
            po[m * OC + o + j] = pp[m * r + j]


@micropython.viper
def matmul_forward_kept(out, inp, weight, bias, N: int, C: int, OC: int, keep):
    # matmul_forward, reusing the quantized weight kept in keep[0] while the weight is unchanged
    k = keep[0]                         # (the parts are made again only for another weight or
    if k is _NONE or k[0] is not weight or k[1] is not bias:    # bias: a bytecode call, whose
        if N > _KEEP_N:                                         # frame would come from the heap)
            matmul_forward(out, inp, weight, bias, N, C, OC)
            return
        keep_weight(keep, weight, bias, C, OC)
        k = keep[0]
    hb = int(k[2])
    n = int(len(k))
    if int(len(k[3])) < N * int(k[5]):
        _keep_out(k, N * int(k[5]))
    y = k[3]
    i = 4
    while i < n:
        r = int(k[i + 1])
        _gemm(0, 0, 0, y, inp, k[i + 2], k[i + 3], k[i + 4], MM_FORWARD, N, C, r, hb, 1)
        _put_rows(out, int(k[i]), OC, y, r, N)
        i += 5


@micropython.viper
def matmul_forward(out, inp, weight, bias, N: int, C: int, OC: int):
    # out (N, OC) = inp (N, C) . weight (OC, C)^T + bias (OC,); bias may be None
    if bias is _NONE:
        _mm(out, inp, weight, out, MM_FORWARD, N, C, OC, 0, 0)
    else:
        _mm(out, inp, weight, bias, MM_FORWARD, N, C, OC, 1, 0)


@micropython.viper
def matmul_backward(dinp, dweight, dbias, dout, inp, weight, N: int, C: int, OC: int):
    # in the forward pass this was out (N, OC) = inp (N, C) . weight (OC, C)^T + bias
    # dinp (N, C) = dout . weight (written); dweight (OC, C) += dout^T . inp; dbias (OC,) += sum_n dout
    if dinp is not _NONE:
        _mm(dinp, dout, weight, dinp, MM_DINP, N, C, OC, 0, 0)
    if dweight is _NONE:
        if dbias is not _NONE:
            _mm(dbias, dout, _ones(N), dbias, MM_DBIAS, N, C, OC, 0, 0)
    elif dbias is _NONE:
        _mm(dweight, dout, inp, dweight, MM_DWEIGHT, N, C, OC, 0, 0)
    else:                               # dbias as an extra row of ones in the dweight product
        _mm(dweight, dout, inp, dbias, MM_DWEIGHT, N, C, OC, 1, 0)


@micropython.viper
def matmul_backward_input(dinp, dout, weight, N: int, C: int, OC: int):
    # matmul_backward's input gradient alone: dinp (N, C) = dout (N, OC) . weight (OC, C) (written)
    _mm(dinp, dout, weight, dinp, MM_DINP, N, C, OC, 0, 0)


@micropython.viper
def matmul_backward_weight(dweight, dbias, dout, inp, N: int, C: int, OC: int):
    # matmul_backward's weight gradients alone: dweight (OC, C) += dout^T . inp; dbias (OC,) +=
    # sum_n dout (each skipped when None; the same calls as matmul_backward's)
    if dweight is _NONE:
        if dbias is not _NONE:
            _mm(dbias, dout, _ones(N), dbias, MM_DBIAS, N, C, OC, 0, 0)
    elif dbias is _NONE:
        _mm(dweight, dout, inp, dweight, MM_DWEIGHT, N, C, OC, 0, 0)
    else:
        _mm(dweight, dout, inp, dbias, MM_DWEIGHT, N, C, OC, 1, 0)


@micropython.viper
def matmul_backward_input_acc(dinp, dout, weight, N: int, C: int, OC: int):
    # dinp (N, C) += dout (N, OC) . weight (OC, C)   (MM_DINP with its accumulate flag)
    _mm(dinp, dout, weight, dinp, MM_DINP, N, C, OC, 1, 0)


# ---- pooling (through _gemm with a constant 1/T vector) ----------------------------------
_INV = {}                               # T -> array('f') of T copies of 1/T
_INVT = {}                              # T -> (mantissa Q15, exponent) of 1/T


def _invs(T):
    a = _INV.get(T)
    if a is None:
        a = _INV[T] = array("f", [1.0 / T] * T)
    return a


def _invT(T):
    sc = _INVT.get(T)
    if sc is None:
        sc = _INVT[T] = _mant15(1.0 / T)
    return sc


@micropython.viper
def _bcast(dinp, dout, B: int, T: int, C: int, im: int, ie: int):
    # dinp (B, T, C) = dout (B, C) * im * 2^ie, broadcast over T: each value is computed once,
    # (m >> 8) * im < 2^16 * 2^15 = 2^31, rounded to float32 like _store, then copied T times
    pi = ptr32(dinp)
    po = ptr32(dout)
    TC = T * C
    for b in range(B):
        for c in range(C):
            x = po[b * C + c]
            ex = (x >> 23) & 0xFF
            i = b * TC + c
            if ex == 0:
                pi[i] = 0
            else:
                m = (x & 0x7FFFFF) | 0x800000
                if ex == 255:
                    m = 0xFFFFFF
                    ex = 254
                v = (m >> 8) * im                                   #!chk v
                sg = (x >> 31) & 1
                e = ex - 142 + ie
                pack(pi, i, v, e, sg)
            r = pi[i]
            for t in range(1, T):
                i += C
                pi[i] = r


@micropython.viper
def avgpool_forward(out, inp, B: int, T: int, C: int):
    # out (B, C) = mean over T of inp (B, T, C)
    # ERROR BOUND: a _gemm with KT = T and 1/T: within 2^-11 max_t |inp[b, t, c]|; the backward
    #   (_bcast, dout / T with a 15-bit 1/T) within 2^-13 of each element
    _mm(out, inp, _invs(T), out, MEAN_POOL, B, T, C, 0, 0)


@micropython.viper
def avgpool_backward(dinp, dout, B: int, T: int, C: int):
    # dinp (B, T, C) = dout (B, C) / T, broadcast over T (written)
    sc = _invT(T)
    _bcast(dinp, dout, B, T, C, sc[0], sc[1])
