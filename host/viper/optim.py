# microformer.viper_optim: Adam / AdamW and SGD in soft float on the raw float32 bits.
import micropython
from array import array
from micropython import const
from math import sqrt
from .viper_common import _fscratch, _mant15

# ---- the whole optimizer step: every tensor in one call, into the shadow buffers ------------
# adam_step / sgd_step read the weights, gradients and moments of all tensors and write the new
# weights and moments into shadow buffers (the live ones are not touched), flagging any
# non-finite gradient, weight or result; params_commit then copies the new weights in. A step
# costs one viper call per kernel instead of a dozen per tensor.
#
# ADAM ELEMENT (AdamW's decay and Adam's coupled decay are branches taken only when wd != 0):
#   m' = beta1 m + (1 - beta1) d: two 15 x 15-bit products (< 2^30 each), aligned (the smaller
#        shifted right, 0 beyond 30 bits) and added: |s| < 2^31;
#   v' = v - (1 - beta2) v + (1 - beta2) d^2: v's 24-bit mantissa with 6 guard bits (< 2^30)
#        less its (1 - beta2) share (15 x 15 bits, shifted right by S2 >= 0), plus the d^2 term
#        (((d15 d15) >> 15) o2m < 2^30) aligned: < 2^31; beta2 so enters with 24 bits;
#   each sum is rounded to 24 bits by a table lookup of its bit length (_BL[s >> 23]: s below
#        2^24 takes a normalizing loop) and packed with round to nearest (ties up);
#   den = sqrt(v') + eps' in Q14-Q16: sqrt from the 257-entry table _SQ (2^14 sqrt(x), x in
#        [2, 8), the exponent's low bit and 7 mantissa bits index it, 8 more interpolate), eps'
#        added when it is not below 2^-16 of it; step = ((m'24 >> 8) cm) / den rounded (< 2^17);
#   p' = p - step: p's mantissa with 6 guard bits (< 2^30) and the step aligned to it (< 2^30),
#        then the same rounding; a step larger than p, a zero p and overflow take a general path.
# c = lr sqrt(bc2) / bc1 and eps' = eps sqrt(bc2) (so that step = c m' / (sqrt(v') + eps')), with
# bc = 1 - beta^t, are computed per step by _adam_consts from float32 bits and t: no float is boxed.
# ERROR BOUND (tests/mp/test_optim_fast.py): m' and v' within 2^-13 of |m'| + |old| + |d| (resp.
#   |v'| + |old| + d^2), p' within 2^-11 of the step plus 2^-22 |p'| (plus the 2^-14 relative
#   error of c); the step ignores eps' only below 2^-16 of sqrt(v').
# [B5'] every product is a 15- or 16-bit by 15-bit product (< 2^31), every sum of two aligned
#   values below 2^30 (< 2^31), the den lookup (SQ[j+1] - SQ[j]) * 255 < 2^23.
_AM_O1 = const(0)       # 1 - beta1: 15-bit mantissa
_AM_K1 = const(1)       #   the g-term's exponent offset (o1e + 15)
_AM_B1 = const(2)       # beta1: mantissa
_AM_KB1 = const(3)      #   its offset (b1e + 15)
_AM_O2 = const(4)       # 1 - beta2: mantissa
_AM_S2 = const(5)       #   its shift (-15 - o2e >= 0)
_AM_Q2 = const(6)       #   the d^2 term's exponent offset (-126 - S2)
_AM_CM = const(7)       # c: mantissa
_AM_CE = const(8)       #   exponent + 92
_AM_EPM = const(9)      # eps': mantissa
_AM_EPE = const(10)     #   exponent
_AM_E0 = const(11)      #   half-exponent of v' from which eps' is below 2^-16 of sqrt(v')
_AM_WDM = const(12)     # weight decay (coupled: wd; decoupled: lr wd): mantissa, 0 for none
_AM_WDE = const(13)     #   exponent (coupled) / shift (decoupled: -15 - e)
_AM_DEC = const(14)     # 1: AdamW
_AM = array("i", [0] * 15)
_AMF = array("f", [0.0] * 4)            # lr, beta1, beta2, eps as float32
_NOSEEN = ()                            # no record of checked sizes: every size is checked
# the whole-step kernels' job (a viper function takes at most four arguments, and its arguments
# would take the three registers the element loop needs): the record of checked sizes, newp,
# news, params, olds (_commit: the record, newp, count, params); the kernel takes them out
# (_NOSEEN in every slot between calls)
_REC = [_NOSEEN] * 5
_NONE = None                            # (viper compares objects, not the constant None)


def _bitlen(t):
    n = 0
    while t:
        t >>= 1
        n += 1
    return n


_TAB = [None, None]


def _tables():
    # _BL (512 bytes): for s < 2^31, _BL[(s >> 23) & 0x1FF] is (bit length of s) - 25, the shift
    # less one that rounds s to 24 bits; 255 below 2^24 (and for negative s: the upper half)
    # _SQ (257 ints): 2^14 sqrt(x) for x = 2 + j/64 (j <= 128), then 4 + (j - 128)/32
    if _TAB[0] is None:
        bl = bytearray(512)             # filled in place: no temporary lists
        for t in range(512):
            bl[t] = _bitlen(t) - 2 if 2 <= t < 256 else 255
        sq = array("i", bytes(4 * 257))
        for j in range(257):
            sq[j] = int(16384 * sqrt(2.0 + j / 64.0 if j <= 128 else 4.0 + (j - 128) / 32.0) + 0.5)
        _TAB[0] = bl
        _TAB[1] = sq
    return _TAB


@micropython.viper
def _isqrt(x: int) -> int:
    # floor(sqrt(x)) for 0 <= x <= 2^30, bit by bit (a candidate below 2^15 + 2^14: its square < 2^31)
    r = 0
    b = 1 << 15
    while b:
        c = r + b
        if c * c <= x:
            r = c
        b = b >> 1
    return r


@micropython.viper
def _adam_consts(c, cf, t: int):
    # c[_AM_CM ...]: c = lr sqrt(bc2) / bc1 and eps' = eps sqrt(bc2) as 15-bit mantissas for step t,
    # bc = 1 - beta^t, from the float32 bits of cf = [lr, beta1, beta2, eps] (lr, eps > 0, betas in
    # [0, 1); t = 0: cf = [lr, bc1, bc2, eps], bc in (0, 1]) with no float boxed: beta^t in Q30 by squaring and multiplying, each product
    # (a b) >> 30 from 15-bit halves (ah bh, ah bl + al bh < 2^31), truncated (2 units of 2^-30)
    C = ptr32(c)
    F = ptr32(cf)
    b30 = 30
    one = 1 << b30                                     # (a variable: 1 << 30 would be a bigint)
    bc1 = one
    bc2 = one
    for w in range(2):
        x = F[1 + w]
        e = ((x >> 23) & 0xFF) - 120
        bb = 0                                         # beta in Q30 (< 2^30)
        if ((x >> 23) & 0xFF) != 0 and e > -24:
            bb = (x & 0x7FFFFF) | 0x800000
            if e >= 0:
                bb = bb << e
            else:
                bb = bb >> (0 - e)
        r = one - bb                                   # t = 0: cf holds bc itself: r = 1 - bc
        if t != 0:
            r = one
        k = t
        while k != 0:
            if k & 1:
                r = (r >> 15) * (bb >> 15) + ((((r >> 15) * (bb & 0x7FFF)) + ((r & 0x7FFF) * (bb >> 15))) >> 15)  #!chk r
            bb = (bb >> 15) * (bb >> 15) + ((((bb >> 15) * (bb & 0x7FFF)) << 1) >> 15)   #!chk bb
            k = k >> 1
        if w == 0:
            bc1 = one - r                              # (0, 2^30]
        else:
            bc2 = one - r
    j = 0                                              # sqrt(bc2): bc2 2^(2j) in [2^28, 2^30]
    while bc2 < 0x10000000:
        bc2 = bc2 << 2
        j += 1
    r = int(_isqrt(bc2))                               # sqrt(bc2 / 2^30) = r 2^(-15 - j), r in [2^14, 2^15]
    j1 = 0                                             # bc1 2^j1 in [2^29, 2^30]
    while bc1 < 0x20000000:
        bc1 = bc1 << 1
        j1 += 1
    x = F[0]
    num = (((x & 0x7FFFFF) | 0x800000) >> 8) * r      #!chk num
    q = num // (bc1 >> 15)                             # bc1 = (bc1 >> 15) 2^(-15 - j1): q in (2^14, 2^17)
    ne = ((x >> 23) & 0xFF) - 142 - j + j1
    while q >= 0x8000:
        q = (q + 1) >> 1
        ne += 1
    C[_AM_CM] = q
    C[_AM_CE] = ne + 92
    x = F[3]
    num = (((x & 0x7FFFFF) | 0x800000) >> 9) * r      #!chk num
    ne = ((x >> 23) & 0xFF) - 156 - j
    while num >= 0x8000:
        num = (num + 1) >> 1
        ne += 1
    C[_AM_EPM] = num
    C[_AM_EPE] = ne
    C[_AM_E0] = ne + 95


@micropython.viper
def _adam_all() -> int:
    # the Adam step of every tensor (see the top of this section), its job in _REC (see adam_step);
    # returns -1, the index of the first tensor with a non-finite gradient, weight or result, or
    # -3 for a pair without a grad buffer; a size mismatch raises ValueError
    a = 0                               # the first three locals live in registers: the hot ones
    x = 0                               # (t is the most used; s next: 1030 against 1046 x86
    t = 0                               # instructions per parameter on the 32-bit port)
    b31 = 31
    sx = 1 << b31                       # (a variable: a literal 1 << 31 would be a bigint)
    infb = 255
    infb = infb << 23                   # +inf's bits
    T = _tables()
    BL = ptr8(T[0])
    SQ = ptr32(T[1])
    BADSIZE = _ADAM_BAD
    R = _REC
    SEEN = R[0]
    newp = R[1]
    news = R[2]
    params = R[3]
    olds = R[4]
    for k in range(5):
        R[k] = _NOSEEN                  # the module keeps no buffer between calls
    NONE = _NONE
    count = int(len(params))
    useseen = int(len(SEEN)) >= 3 * count     # the record covers every tensor
    M = olds[0]                         # the base: every other buffer by its offset from m
    m0 = int(ptr32(M))
    total = int(len(M))
    M = olds[1]
    dv = int(ptr32(M)) - m0
    if int(len(M)) < total:             # the parameters must fit the shortest buffer
        total = int(len(M))
    dpn = int(ptr32(newp)) - m0
    if int(len(newp)) < total:
        total = int(len(newp))
    M = news[0]
    dmn = int(ptr32(M)) - m0
    if int(len(M)) < total:
        total = int(len(M))
    M = news[1]
    dvn = int(ptr32(M)) - m0
    if int(len(M)) < total:
        total = int(len(M))
    adam_load()
    D1 = K1 - KB1
    cpl = 0                             # 1: Adam's coupled decay, d = g + wd p
    dcp = 0                             # 1: AdamW's decoupled decay of p
    if wdm != 0:
        cpl = 1 - dec
        dcp = dec
    o = 0
    for k in range(count):
        opt_tensor()
        if fits != 1:
            if fits == 0:
                raise ValueError(BADSIZE)
            return -3                   # kernels.STEP_FROZEN: a pair without a grad buffer
        while a < end:
            x = ptr32(a + dg)[0]
            if cpl:
                adam_coupled()
            eg = (x >> 23) & 0xFF
            t = ptr32(a)[0]
            em = (t >> 23) & 0xFF
            # ---- m' = beta1 m + (1 - beta1) d ----
            adam_m()
            # ---- v' = v - (1 - beta2) v + (1 - beta2) d^2 ----
            adam_v()
            # ---- p' = p (- lr wd p) - c m' / (sqrt(v') + eps') ----
            x = ptr32(a + dp)[0]
            if dcp:
                adam_decoupled()
            if s == 0:                          # p' = p; on to the next element
                opt_unchanged()
                a += 4
                continue
            h = xv2 >> 24
            j = (xv2 >> 16) & 0xFF
            t = SQ[j]
            den = t + (((SQ[j + 1] - t) * ((xv2 >> 8) & 0xFF)) >> 8)      #!chk den
            if h < E0:
                adam_den()
            q = (s >> 8) * cm                                           #!chk q
            q = (q + (den >> 1)) // den         # rounded: (2^31 + 2^15) // 2^14.5
            X = bm - h + CE                     # step = q 2^(X - 156)
            adam_pfast()
            if done == 0:
                adam_general()
            a += 4
        if bad:
            return k
    return -1


# SGD ELEMENT: d = g (+ wd p) + momentum buf is adam_m with 1 for (1 - beta1) and the momentum
# for beta1 (15 x 15-bit products, aligned, rounded through _BL: the new buffer), then
# p' = p - lr d as Adam's p' with the step q = ((d24 >> 8) lrm) >> 15 (< 2^16); non-finite inputs
# and results flag the tensor. ERROR BOUND as _sgd above (tests/mp/test_optim_fast.py).
_SGDC = array("i", [0] * 15)            # slots of _AM: lr in _AM_CM/_AM_CE, 1 in _AM_DEC for momentum


@micropython.viper
def _sgd_all() -> int:
    # the SGD step of every tensor, its job in _REC (see sgd_step); returns -1, the index of the
    # first tensor with a non-finite gradient, weight, buffer or result, or -3 for a pair without
    # a grad buffer; a size mismatch raises ValueError
    a = 0
    x = 0
    s = 0
    b31 = 31
    sx = 1 << b31
    infb = 255
    infb = infb << 23
    T = _tables()
    BL = ptr8(T[0])
    BADSIZE = _SGD_BAD
    R = _REC
    SEEN = R[0]
    newp = R[1]
    news = R[2]
    params = R[3]
    olds = R[4]
    for k in range(5):
        R[k] = _NOSEEN                  # the module keeps no buffer between calls
    NONE = _NONE
    count = int(len(params))
    useseen = int(len(SEEN)) >= 3 * count     # the record covers every tensor
    total = int(len(newp))
    hasbuf = int(ptr32(_SGDC)[_AM_DEC])    # 1: momentum buffers
    m0 = int(ptr32(newp))               # the base: newp (or the buffers, with momentum)
    dpn = 0
    dmn = 0
    if hasbuf:
        M = olds[0]
        m0 = int(ptr32(M))
        dpn = int(ptr32(newp)) - m0
        if int(len(M)) < total:
            total = int(len(M))
        M = news[0]
        dmn = int(ptr32(M)) - m0
        if int(len(M)) < total:
            total = int(len(M))
    C = ptr32(_SGDC)
    am_common(C)
    lrm = C[_AM_CM]
    LRE = (C[_AM_CE] ^ sx) - sx
    K1 = 0
    D1 = 0 - KB1
    o = 0
    for k in range(count):
        opt_tensor()
        if fits != 1:
            if fits == 0:
                raise ValueError(BADSIZE)
            return -3                   # kernels.STEP_FROZEN: a pair without a grad buffer
        while a < end:
            x = ptr32(a + dg)[0]
            if wdm != 0:
                adam_coupled()
            eg = (x >> 23) & 0xFF
            t = 0
            if hasbuf:
                t = ptr32(a)[0]
                if ((t >> 23) & 0xFF) == 255:
                    bad = 1
            em = (t >> 23) & 0xFF
            # ---- d = g + momentum buf: the new buffer (written at a + dmn, then p' over it) ----
            adam_m()
            # ---- p' = p - lr d ----
            x = ptr32(a + dp)[0]
            if s == 0:                          # p' = p; on to the next element
                opt_unchanged()
                a += 4
                continue
            q = (s >> 8) * lrm                                          #!chk q
            q = q >> 15
            X = bm + LRE                        # step = q 2^(X - 156)
            adam_pfast()
            if done == 0:
                adam_general()
            a += 4
        if bad:
            return k
    return -1


@micropython.viper
def _commit() -> int:
    # p.data of each of the first `count` (param, grad) pairs = its stretch of newp, bit for bit;
    # -2 on a size mismatch. Its job in _REC (params_commit, emptied here): the record of checked
    # sizes (or _NOSEEN), newp, count, params. With a record, the buffers written are the ones it
    # holds: those of the pairs when the step that filled it ran (no lookups per pair).
    a = 0                               # the copy's words in registers (not arguments: they
    off = 0                             # would take them)
    end = 0
    R = _REC
    SEEN = R[0]
    newp = R[1]
    count = int(R[2])
    params = R[3]
    for k in range(5):
        R[k] = _NOSEEN                  # the module keeps no buffer between calls
    S = int(ptr32(newp))
    total = int(len(newp))
    useseen = int(len(SEEN)) >= 3 * count
    o = 0
    for k in range(count):
        if useseen:
            kk = k + k + k
            pd = SEEN[kk]
            n = int(SEEN[kk + 2])
        else:
            pd = params[k][0].data
            n = int(len(pd))
        if o + n > total:
            return -2
        a = S + 4 * o
        off = int(ptr32(pd)) - a
        copy4(a, off, end, n)
        o += n
    return 0


@micropython.viper
def _max_exponent(buf, n: int) -> int:
    # the largest exponent field (0 .. 255) of the float32 values buf[0 .. n): 255 for a NaN or
    # inf, where the scan stops. The fields are compared in place (bits & the field's mask).
    a = int(ptr32(buf))
    end = a + 4 * n
    mask = 255
    mask = mask << 23                   # (a variable: the literal would be a bigint)
    e = 0
    while a < end:
        x = ptr32(a)[0] & mask
        if x > e:
            e = x
            if e == mask:
                break
        a += 4
    return e >> 23


def max_exponent(buf, n):
    # every |x| of buf[0 .. n) is below 2^(e - 126) for the answer e; 255: a NaN or inf (the
    # optimizer's bound, optim.py)
    if n > len(buf):
        raise ValueError("max_exponent: n must be at most len(buf) = %d, got %d" % (len(buf), n))
    return _max_exponent(buf, n)


@micropython.viper
def max_exponent_pairs(params, j: int) -> int:
    # max_exponent over the weights (j = 0) or the gradients (j = 1) of (param, grad) Tensor
    # pairs, each its whole buffer: one call for every tensor
    mask = 255
    mask = mask << 23
    e = 0
    count = int(len(params))
    for k in range(count):
        buf = params[k][j].data
        a = int(ptr32(buf))
        end = a + 4 * int(len(buf))
        while a < end:
            x = ptr32(a)[0] & mask
            if x > e:
                e = x
                if e == mask:
                    return 255
            a += 4
    return e >> 23


def _pair15(x):
    # (m, e) with x = m 2^e, m in [2^14, 2^15] and e <= -15 for 0 < x <= 1 (1.0 as 2^15 2^-15)
    m, e = _mant15(x)
    if e > -15:
        m <<= e + 15
        e = -15
    return m, e


_AMLAST = [None] * 6


def _adam_hyper(lr, beta1, beta2, weight_decay, decoupled):
    C = _AM
    m, e = _pair15(1.0 - beta1)
    C[_AM_O1] = m
    C[_AM_K1] = e + 15
    m, e = _mant15(beta1)
    C[_AM_B1] = m
    C[_AM_KB1] = e + 15
    m, e = _pair15(1.0 - beta2)
    C[_AM_O2] = m
    C[_AM_S2] = -15 - e
    C[_AM_Q2] = -126 + 15 + e
    C[_AM_DEC] = 1 if decoupled else 0
    C[_AM_WDM] = 0
    C[_AM_WDE] = 0
    if weight_decay:
        if decoupled:
            if lr * weight_decay > 1.0:
                raise ValueError("AdamW (viper): lr * weight_decay must be at most 1, got %r * %r"
                                 % (lr, weight_decay))
            m, e = _pair15(lr * weight_decay)
            C[_AM_WDE] = -15 - e
        else:
            m, e = _mant15(weight_decay)
            C[_AM_WDE] = e
        C[_AM_WDM] = m


def _adam_setup(h):
    # the hyperparameters h = [lr, beta1, beta2, eps, weight_decay, decoupled, ...] in fixed point,
    # made again (_adam_remake) only when one of them is another object than last time (a
    # schedule that sets lr makes them again; a step that changes nothing does not)
    L = _AMLAST
    if not (L[0] is h[0] and L[1] is h[1] and L[2] is h[2] and L[3] is h[3] and L[4] is h[4]
            and L[5] is h[5]):                  # (unrolled: cheaper than a loop)
        _adam_remake(h)


def _adam_remake(h):
    _adam_hyper(h[0], h[1], h[2], h[4], h[5])
    F = _AMF
    F[0], F[1], F[2], F[3] = h[0], h[1], h[2], h[3]
    L = _AMLAST
    for j in range(6):
        L[j] = h[j]


def _job(newp, news, params, olds):
    # the whole-step kernels' job into _REC (a plain function: list stores cost less than a call
    # into viper)
    R = _REC
    R[1] = newp
    R[2] = news
    R[3] = params
    R[4] = olds


_ADAM_BAD = "adam_step: a parameter or gradient does not match the optimizer's buffers (was a Tensor's data replaced?)"
_SGD_BAD = "sgd_step: a parameter or gradient does not match the optimizer's buffers (was a Tensor's data replaced?)"


def adam_step(newp, news, params, olds, hyper):
    # Adam (decoupled: AdamW) step t >= 1 of every tensor into shadow buffers; the live ones are
    # read only. params: (param, grad) Tensor pairs; olds = [m, v] (N,): their moments end to end
    # (N = the parameter count); newp, news = [newm, newv] (N,): the new weights and moments,
    # written; hyper = [lr, beta1, beta2, eps, weight_decay, decoupled, t] and optionally the
    # optimizer's record of checked buffer sizes (a list of 3 entries per pair, see opt_tensor).
    # Returns -1, or the index of the first pair whose gradient, weight or result is not finite,
    # or -3 (kernels.STEP_FROZEN) when a pair has no grad buffer. The frame stays within 11
    # words (no heap frame per call): five arguments, no locals, calls of few arguments.
    if len(news) != 2 or len(olds) != 2:
        raise ValueError("adam_step: news and olds must be [newm, newv] and [m, v]")
    _adam_setup(hyper)
    _adam_consts(_AM, _AMF, hyper[6])
    _job(newp, news, params, olds)
    if len(hyper) > 7:
        _REC[0] = hyper[7]
    return _adam_all()


_SGDLAST = [None, None, None]


def _sgd_setup(h):
    # [lr, momentum, weight_decay] in fixed point (_SGDC), made again only when one changed
    L = _SGDLAST
    if not (L[0] is h[0] and L[1] is h[1] and L[2] is h[2]):
        C = _SGDC
        C[_AM_O1] = 32768               # 1.0 = 2^15 2^-15: the gradient's weight (K1 = 0)
        m, e = _mant15(h[1])
        C[_AM_B1] = m
        C[_AM_KB1] = e + 15
        m, e = _mant15(h[0])
        C[_AM_CM] = m
        C[_AM_CE] = e + 29
        m, e = _mant15(h[2])
        C[_AM_WDM] = m
        C[_AM_WDE] = e
        L[0] = h[0]
        L[1] = h[1]
        L[2] = h[2]


def sgd_step(newp, news, params, olds, hyper):
    # SGD of every tensor into shadow buffers: newp (N,) the new weights; news = [newbuf] (N,) the
    # new momentum buffers and olds = [buf] (N,) the live ones, end to end, or both [] (no
    # momentum); hyper = [lr, momentum, weight_decay] and optionally the record of checked sizes
    # (as adam_step's). Returns -1, or the index of the first pair with a non-finite gradient,
    # weight, buffer or result, or -3 as adam_step. Frame within 11 words, as adam_step.
    if len(news) != len(olds) or len(olds) > 1:
        raise ValueError("sgd_step: news and olds must be [newbuf] and [buf], or both []")
    _sgd_setup(hyper)
    _SGDC[_AM_DEC] = len(olds)
    _job(newp, news, params, olds)
    if len(hyper) > 3:
        _REC[0] = hyper[3]
    return _sgd_all()


def params_commit(params, newp, count, seen=_NOSEEN):
    # params' weights = newp (N,), the `count` (param, grad) pairs' stretches end to end; seen:
    # the record of checked sizes (adam_step's hyper[7]) that the step just before filled, or none
    R = _REC
    R[0] = seen
    R[1] = newp
    R[2] = count
    R[3] = params
    if _commit() == -2:
        raise ValueError("params_commit: the parameters hold more values than newp")


# ---- the per-tensor updates (kernels.py's adam_update / sgd_update): the same element code -----
class _Holder:
    data = None                         # a (param, grad) pair's stand-in: .data set per call


_PAIR = [(_Holder(), _Holder())]
_AUF = array("f", [0.0] * 4)            # lr, bc1, bc2, eps of adam_update


def _one(p, g, n):
    # the one-pair list for p, g (n,): their first n values (views when n is less than a length)
    if len(p) != n:
        p = memoryview(p)[:n]
    if len(g) != n:
        g = memoryview(g)[:n]
    P = _PAIR
    P[0][0].data = p
    P[0][1].data = g
    return P


_UH = [None] * 7                        # adam_update's hyperparameters as adam_step takes them
_UMV = [None, None]


def adam_update(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2, decoupled):
    # Adam (decoupled: AdamW), bc1 = 1 - beta1^t, bc2 = 1 - beta2^t: adam_step's element code on
    # one tensor, in place (each element is read before it is written); same bound
    H = _UH
    H[0], H[1], H[2], H[3], H[4], H[5], H[6] = lr, beta1, beta2, eps, weight_decay, decoupled, 0
    _adam_setup(H)
    F = _AUF
    F[0] = lr
    F[1] = bc1
    F[2] = bc2
    F[3] = eps
    _adam_consts(_AM, F, 0)
    if len(m) != n:
        m = memoryview(m)[:n]
    if len(v) != n:
        v = memoryview(v)[:n]
    if len(p) < n or len(g) < n or len(m) < n or len(v) < n:
        raise ValueError("adam_update: p, g, m and v must hold n values")
    pair = _one(p, g, n)
    mv = _UMV
    mv[0] = m
    mv[1] = v
    _job(pair[0][0].data, mv, pair, mv)
    try:
        _adam_all()
    finally:
        mv[0] = mv[1] = None            # the module keeps no buffer between calls


def sgd_update(p, g, buf, n, lr, momentum, weight_decay):
    # p (n,) -= lr d, d = g + wd p (+ momentum buf, and buf = d); buf None: no momentum.
    # sgd_step's element code on one tensor: the new weights go through scratch, buf in place
    new = _fscratch(n)
    if buf is not None and len(buf) != n:
        buf = memoryview(buf)[:n]
    pair = _one(p, g, n)
    b = [] if buf is None else [buf]
    sgd_step(new, b, pair, b, [lr, momentum, weight_decay])
    params_commit(pair, new, 1)
