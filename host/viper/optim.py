# microformer.viper_optim: the Adam / AdamW update in soft float on the raw bits (SGD is portable).
import micropython
from array import array
from micropython import const
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
