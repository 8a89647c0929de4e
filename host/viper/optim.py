# microformer.viper_optim: the Adam / AdamW update in soft float on the raw bits (SGD is portable).
import micropython
from array import array
from micropython import const
from math import sqrt
from .viper_common import _mant15, _store

# Values are (M, E) int pairs, x = M * 2^E, normalized to 2^29 <= |M| < 2^30 after every add;
# products use the top 15 bits of each side ([B5]: < 2^30), sums of two aligned 30-bit values
# < 2^31. The final p - step is an aligned add with 6 guard bits and round-to-nearest, so a
# step below half an ulp of p vanishes exactly as it would in float32, and no sooner.
# _C slots (ints): each constant is a pair, a 15-bit mantissa and its exponent (see _mant15)
_BETA1 = const(0)
_OBETA1 = const(2)      # 1 - beta1
_BETA2 = const(4)
_OBETA2 = const(6)      # 1 - beta2
_LR_BC1 = const(8)      # lr / bc1
_RBC2 = const(10)       # 1 / bc2
_EPS = const(12)
_WD = const(14)         # weight decay (decoupled: lr * wd)
_DECOUPLED = const(16)  # one int: 1 for AdamW
_C = array("i", [0] * 17)
_CF = array("f", [0.0, 0.0, 1.0, 0.0])  # lr, bc1, 1.0, bc2: floats handed to viper as float32 bits


@micropython.viper
def _adam(p, g, m, v, n: int, c):
    b31 = 31
    sx = 1 << b31                       # sign-extends the exponents (slot)
    pp = ptr32(p)
    pg = ptr32(g)
    pm = ptr32(m)
    pv = ptr32(v)
    C = ptr32(c)
    dec = C[_DECOUPLED]
    #@ slot(b1m, b1e, _BETA1)
    #@ slot(o1m, o1e, _OBETA1)
    #@ slot(b2m, b2e, _BETA2)
    #@ slot(o2m, o2e, _OBETA2)
    #@ slot(am, ae, _LR_BC1)
    #@ slot(rbm, rbe, _RBC2)
    #@ slot(epm, epe, _EPS)
    #@ slot(wdm, wde, _WD)
    b30 = 30
    top = 1 << b30                      # 2^30 (a literal would be folded into a bigint)
    for i in range(n):
        # ---- d = g (+ wd p) ------------------------------------------------------------
        #@ load30(pg, i, x, e, dm, de)
        #@ decay(dm, de)
        # normalize d to 2^29 <= |d| < 2^30 (or 0)
        #@ snorm(dm, de, neg)
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
        #@ addto0(mm, me, t, te, sh)
        kv = mm
        ke = me
        #@ store(pm, i, kv, ke, ks, kt, kh, kb)
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
        #@ addto0(vm, ve, t, te, sh)
        kv = vm
        ke = ve
        #@ store(pv, i, kv, ke, ks, kt, kh, kb)
        if mm == 0:
            continue
        # ---- step = (lr / bc1) m / (sqrt(v / bc2) + eps) -----------------------------------
        # s = sqrt(v * rb): v * rb normalized to [2^28, 2^30) with an even exponent, isqrt
        sm = 0
        sme = 0
        if vm > 0:
            #@ norm30(vm, ve)
            x = (vm >> 15) * rbm                                    #!chk x
            e = ve + 15 + rbe
            if e & 1:
                x = x >> 1
                e += 1
            #@ isqrt(x, r)
            sm = r                                                  # < 2^15
            sme = e >> 1
        # den = s + eps, both aligned, then 15 significant bits
        den = epm
        dne = epe
        #@ addto0(den, dne, sm, sme, sh)
        while den >= 0x8000:
            den = den >> 1
            dne += 1
        while den < 0x4000:
            den = den << 1
            dne -= 1
        # num = a m, m normalized to 30 bits
        #@ unsign(mm, neg)
        #@ norm30(mm, me)
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
            #@ store(pp, i, kv, ke, ks, kt, kh, kb)
            continue
        #@ mant30(y, pmm, e)
        pe = e - 156
        q = q << 14                                                 # < 2^30
        qe -= 14
        if neg:
            q = 0 - q
        #@ alignsub(pmm, pe, q, qe, kv, ke, sh)
        #@ store(pp, i, kv, ke, ks, kt, kh, kb)


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
        _setc(_BETA1, beta1)
        _setc(_OBETA1, 1.0 - beta1)
        _setc(_BETA2, beta2)
        _setc(_OBETA2, 1.0 - beta2)
        _setc(_EPS, eps)
        _setc(_WD, (lr * weight_decay) if decoupled else weight_decay)
        _C[_DECOUPLED] = 1 if decoupled else 0
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
        _m15div(_C, _LR_BC1, CF, 0, 1)  # lr / bc1
        _m15div(_C, _RBC2, CF, 2, 3)    # 1 / bc2
        L[5] = bc1
        L[6] = bc2
    _adam(p, g, m, v, n, _C)


# ---- SGD (momentum, weight decay) -----------------------------------------------------------
# ERROR BOUND (tests/test_viper_decode_range.py): with d = g + wd p (+ momentum buf), the momentum
#   buffer within 2e-4 (|g| + wd |p| + momentum |buf|) (+ its float32 rounding) and p within
#   2e-4 lr |d| + 2^-23 |p| of the float64 update. Products keep 15 bits of each side [B5];
#   sums are aligned adds of 30-bit values (< 2^31). Inputs are finite (the step checks g).
@micropython.viper
def _sgd(p, g, buf, n: int, c):
    # c: [lr_m, lr_e, mom_m, mom_e, wd_m, wd_e, hasbuf] as in _C (15-bit mantissas, exponents)
    b31 = 31
    sx = 1 << b31
    pp = ptr32(p)
    pg = ptr32(g)
    pb = ptr32(buf)
    C = ptr32(c)
    #@ slot(lrm, lre, 0)
    #@ slot(mom, moe, 2)
    #@ slot(wdm, wde, 4)
    hasbuf = C[6]
    b30 = 30
    top = 1 << b30
    for i in range(n):
        # d = g (+ wd p)
        #@ load30(pg, i, x, e, dm, de)
        y = pp[i]
        ey = (y >> 23) & 0xFF
        if wdm != 0 and ey != 0:
            #@ addmul(dm, de, y, ey, wdm, wde, t, te, sh)
        # d += momentum buf; buf = d
        if hasbuf:
            x = pb[i]
            e = (x >> 23) & 0xFF
            if e != 0 and mom != 0:
                #@ addmul(dm, de, x, e, mom, moe, t, te, sh)
            kv = dm
            ke = de
            #@ store(pb, i, kv, ke, ks, kt, kh, kb)
        if dm == 0:
            continue
        # p -= lr d
        neg = 0
        q = dm
        if q < 0:
            neg = 1
            q = 0 - q
        #@ norm30(q, de)
        q = (q >> 15) * lrm                                                 #!chk q
        qe = de + 15 + lre
        if neg:
            q = 0 - q
        if ey == 0:
            kv = 0 - q
            ke = qe
            #@ store(pp, i, kv, ke, ks, kt, kh, kb)
            continue
        #@ mant30(y, pmm, ey)
        pe = ey - 156
        #@ alignsub(pmm, pe, q, qe, kv, ke, sh)
        #@ store(pp, i, kv, ke, ks, kt, kh, kb)


_SC = array("i", [0] * 7)
_SLAST = [None, None, None]


def sgd_update(p, g, buf, n, lr, momentum, weight_decay):
    # p (n,) -= lr * d, d = g + wd p (+ momentum buf, and buf = d); buf None: no momentum
    L = _SLAST
    if not (L[0] is lr and L[1] is momentum and L[2] is weight_decay):
        for slot, v in ((0, lr), (2, momentum), (4, weight_decay)):
            m, e = _mant15(v)
            _SC[slot] = m
            _SC[slot + 1] = e
        L[0] = lr
        L[1] = momentum
        L[2] = weight_decay
    _SC[6] = 0 if buf is None else 1
    _sgd(p, g, p if buf is None else buf, n, _SC)


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
#        added when it is not below 2^-16 of it; step = ((m'24 >> 8) cm) // den (< 2^31 / 2^14);
#   p' = p - step: p's mantissa with 6 guard bits (< 2^30) and the step aligned to it (< 2^30),
#        then the same rounding; a step larger than p, a zero p and overflow take a general path.
# c = lr sqrt(bc2) / bc1 and eps' = eps sqrt(bc2) (so that step = c m' / (sqrt(v') + eps')), with
# bc = 1 - beta^t, are computed per step by _adam_consts from float32 bits and t: no float is boxed.
# ERROR BOUND (tests/test_optim_fast.py): m' and v' within 2^-13 of |m'| + |old| + |d| (resp.
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
_JOB = [None] * 8                       # newp, newm, newv, params, m, v, count, status


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
        _TAB[0] = bytearray([_bitlen(t) - 2 if t >= 2 else 255 for t in range(256)] + [255] * 256)
        _TAB[1] = array("i", [int(16384 * sqrt(2.0 + j / 64.0 if j <= 128 else 4.0 + (j - 128) / 32.0) + 0.5)
                              for j in range(257)])
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
    # [0, 1)) with no float boxed: beta^t in Q30 by squaring and multiplying, each product
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
    # the Adam step of every tensor (see the top of this section); returns -1, the index of the
    # first tensor with a non-finite gradient, weight or result, or -2 for a size mismatch
    a = 0                               # the first three locals live in registers: the hot ones
    x = 0
    s = 0
    b31 = 31
    sx = 1 << b31                       # (a variable: a literal 1 << 31 would be a bigint)
    infb = 255
    infb = infb << 23                   # +inf's bits
    J = _JOB
    T = _tables()
    BL = ptr8(T[0])
    SQ = ptr32(T[1])
    params = J[3]
    count = int(J[6])
    m0 = int(ptr32(J[4]))
    total = int(len(J[4]))
    dpn = int(ptr32(J[0])) - m0
    dmn = int(ptr32(J[1])) - m0
    dvn = int(ptr32(J[2])) - m0
    dv = int(ptr32(J[5])) - m0
    if int(len(J[0])) < total or int(len(J[1])) < total or int(len(J[2])) < total or int(len(J[5])) < total:
        return -2
    #@ adam_load()
    D1 = K1 - KB1
    o = 0
    for k in range(count):
        pair = params[k]
        pd = pair[0].data
        gd = pair[1].data
        n = int(len(pd))
        if int(len(gd)) != n or o + n > total:
            return -2
        dp = int(ptr32(pd)) - m0 - 4 * o
        dg = int(ptr32(gd)) - m0 - 4 * o
        a = m0 + 4 * o
        end = a + 4 * n
        o += n
        bad = 0
        while a < end:
            x = ptr32(a + dg)[0]
            if wdm != 0 and dec == 0:
                #@ adam_coupled()
            eg = (x >> 23) & 0xFF
            t = ptr32(a)[0]
            em = (t >> 23) & 0xFF
            # ---- m' = beta1 m + (1 - beta1) d ----
            #@ adam_m()
            # ---- v' = v - (1 - beta2) v + (1 - beta2) d^2 ----
            #@ adam_v()
            # ---- p' = p (- lr wd p) - c m' / (sqrt(v') + eps') ----
            x = ptr32(a + dp)[0]
            if wdm != 0 and dec != 0:
                #@ adam_decoupled()
            if s == 0:
                ptr32(a + dpn)[0] = x
                if ((x >> 23) & 0xFF) == 255:
                    bad = 1
                a += 4
                continue
            h = xv2 >> 24
            j = (xv2 >> 16) & 0xFF
            t = SQ[j]
            den = t + (((SQ[j + 1] - t) * ((xv2 >> 8) & 0xFF)) >> 8)      #!chk den
            if h < E0:
                #@ adam_den()
            q = (s >> 8) * cm                                           #!chk q
            q = q // den
            X = bm - h + CE                     # step = q 2^(X - 156)
            #@ adam_pfast()
            #@ adam_general()
            a += 4
        if bad:
            return k
    return -1


# SGD ELEMENT: d = g (+ wd p) + momentum buf is adam_m with 1 for (1 - beta1) and the momentum
# for beta1 (15 x 15-bit products, aligned, rounded through _BL: the new buffer), then
# p' = p - lr d as Adam's p' with the step q = ((d24 >> 8) lrm) >> 15 (< 2^16); non-finite inputs
# and results flag the tensor. ERROR BOUND as _sgd above (tests/test_optim_fast.py).
_SGDC = array("i", [0] * 15)            # slots of _AM: lr in _AM_CM/_AM_CE, 1 in _AM_DEC for momentum


@micropython.viper
def _sgd_all() -> int:
    # returns -1, the index of the first tensor with a non-finite gradient, weight, buffer or
    # result, or -2 for a size mismatch
    a = 0
    x = 0
    s = 0
    b31 = 31
    sx = 1 << b31
    infb = 255
    infb = infb << 23
    J = _JOB
    T = _tables()
    BL = ptr8(T[0])
    params = J[3]
    count = int(J[6])
    total = int(len(J[0]))
    hasbuf = int(ptr32(_SGDC)[_AM_DEC])    # 1: momentum buffers
    m0 = int(ptr32(J[0]))               # the base: newp (or the buffers, with momentum)
    dpn = 0
    dmn = 0
    if hasbuf:
        m0 = int(ptr32(J[4]))
        dpn = int(ptr32(J[0])) - m0
        dmn = int(ptr32(J[1])) - m0
        if int(len(J[4])) < total or int(len(J[1])) < total:
            return -2
    C = ptr32(_SGDC)
    o1m = C[_AM_O1]
    b1m = C[_AM_B1]
    KB1 = (C[_AM_KB1] ^ sx) - sx
    lrm = C[_AM_CM]
    LRE = (C[_AM_CE] ^ sx) - sx
    wdm = C[_AM_WDM]
    wde = (C[_AM_WDE] ^ sx) - sx
    K1 = 0
    D1 = 0 - KB1
    o = 0
    for k in range(count):
        pair = params[k]
        pd = pair[0].data
        gd = pair[1].data
        n = int(len(pd))
        if int(len(gd)) != n or o + n > total:
            return -2
        dp = int(ptr32(pd)) - m0 - 4 * o
        dg = int(ptr32(gd)) - m0 - 4 * o
        a = m0 + 4 * o
        end = a + 4 * n
        o += n
        bad = 0
        while a < end:
            x = ptr32(a + dg)[0]
            if wdm != 0:
                #@ adam_coupled()
            eg = (x >> 23) & 0xFF
            t = 0
            if hasbuf:
                t = ptr32(a)[0]
                if ((t >> 23) & 0xFF) == 255:
                    bad = 1
            em = (t >> 23) & 0xFF
            # ---- d = g + momentum buf: the new buffer (written at a + dmn, then p' over it) ----
            #@ adam_m()
            # ---- p' = p - lr d ----
            x = ptr32(a + dp)[0]
            if s == 0:
                ptr32(a + dpn)[0] = x
                if ((x >> 23) & 0xFF) == 255:
                    bad = 1
                a += 4
                continue
            q = (s >> 8) * lrm                                          #!chk q
            q = q >> 15
            X = bm + LRE                        # step = q 2^(X - 156)
            #@ adam_pfast()
            #@ adam_general()
            a += 4
        if bad:
            return k
    return -1


@micropython.viper
def _commit(params, newp, count: int) -> int:
    # p.data of each (param, grad) pair = its stretch of newp, bit for bit; -2 on a size mismatch
    S = ptr32(newp)
    total = int(len(newp))
    o = 0
    for k in range(count):
        pd = params[k][0].data
        n = int(len(pd))
        if o + n > total:
            return -2
        d = ptr32(pd)
        for i in range(n):
            d[i] = S[o + i]
        o += n
    return 0


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


def adam_step(newp, newm, newv, params, m, v, count, lr, beta1, beta2, eps, weight_decay, t, decoupled):
    # Adam (decoupled: AdamW) step t >= 1 of every tensor into shadow buffers; the live ones are
    # read only. params: `count` (param, grad) Tensor pairs; m, v (N,): their moments end to end
    # (N = the parameter count); newp, newm, newv (N,): the new weights and moments, written.
    # Returns -1, or the index of the first pair whose gradient, weight or result is not finite.
    L = _AMLAST
    if not (L[0] is lr and L[1] is beta1 and L[2] is beta2 and L[3] is weight_decay
            and L[4] is decoupled and L[5] is eps):
        _adam_hyper(lr, beta1, beta2, weight_decay, decoupled)
        F = _AMF
        F[0] = lr
        F[1] = beta1
        F[2] = beta2
        F[3] = eps
        L[0] = lr
        L[1] = beta1
        L[2] = beta2
        L[3] = weight_decay
        L[4] = decoupled
        L[5] = eps
    _adam_consts(_AM, _AMF, t)
    return _run(_adam_all, newp, newm, newv, params, m, v, count, "adam_step")


_SGDLAST = [None, None, None]


def sgd_step(newp, newbuf, params, buf, count, lr, momentum, weight_decay):
    # SGD of every tensor into shadow buffers: newp (N,) the new weights, newbuf (N,) the new
    # momentum buffers (buf (N,) the live ones, end to end); buf None: no momentum (newbuf None).
    # Returns -1, or the index of the first pair with a non-finite gradient, weight, buffer or result.
    L = _SGDLAST
    if not (L[0] is lr and L[1] is momentum and L[2] is weight_decay):
        C = _SGDC
        C[_AM_O1] = 32768               # 1.0 = 2^15 2^-15: the gradient's weight (K1 = 0)
        m, e = _mant15(momentum)
        C[_AM_B1] = m
        C[_AM_KB1] = e + 15
        m, e = _mant15(lr)
        C[_AM_CM] = m
        C[_AM_CE] = e + 29
        m, e = _mant15(weight_decay)
        C[_AM_WDM] = m
        C[_AM_WDE] = e
        L[0] = lr
        L[1] = momentum
        L[2] = weight_decay
    if (buf is None) != (newbuf is None):
        raise ValueError("sgd_step: buf and newbuf must both be buffers or both None")
    _SGDC[_AM_DEC] = 0 if buf is None else 1
    return _run(_sgd_all, newp, newbuf if buf is not None else newp, None, params, buf, None, count,
                "sgd_step")


def _run(kernel, a, b, c, params, d, e, count, who):
    J = _JOB
    J[0] = a
    J[1] = b
    J[2] = c
    J[3] = params
    J[4] = d
    J[5] = e
    J[6] = count
    try:
        r = kernel()
    finally:
        for i in range(7):
            J[i] = None
    if r == -2:
        raise ValueError("%s: a parameter or gradient does not match the optimizer's buffers "
                         "(was a Tensor's data replaced?)" % who)
    return r


def params_commit(params, newp, count):
    # params' weights = newp (N,), the `count` (param, grad) pairs' stretches end to end
    if _commit(params, newp, count) == -2:
        raise ValueError("params_commit: the parameters hold more values than newp")
