# microformer.viper_norm: LayerNorm forward and backward in integers on the raw float32 bits.
import micropython
from array import array
from .viper_common import _iscratch, _mant15

_EPS = {}                       # eps -> (15-bit mantissa, exponent)
_NAN = array("f", [float("nan")])


# ERROR BOUND (tests/mp/test_viper_range.py), per row of C values x (finite):
#   mean within 2^-23 max|x| of the exact mean; rstd within 2e-4 rstd*; each output within
#   4e-4 |xhat* w| + 2^(1-P) max|x| rstd* |w| + 2^-23 |y*| (+ 2^-126) of y* = xhat* w + b,
#   xhat* = (x - mean*) rstd*, P = min(24, 29 - clog2 C) (the second term: each x keeps P bits
#   of the row's largest |x|, which shows in rows whose spread is far below their magnitude).
#   A row holding inf or NaN gives NaN outputs, mean and rstd (as float arithmetic would).
# How: the row is quantized to P = min(24, 29 - clog2 C) bits of its largest exponent
#   (x_i = q_i 2^L; exact for C <= 32 unless the row spans more than 24 binary orders), and
#   d_i = C q_i - sum_j q_j = C (x_i - mean) 2^-L is exact, |d_i| < 2^30 [B6]. The squares use d
#   cut to 22 bits, split into 11-bit halves (h^2 + (2 h l + l^2 / 2^11) / 2^11 < 2^22 + 2^13,
#   summed over at most 2^8 rows per shift: < 2^31); var = sum / C^3 by long division; var +
#   eps (an aligned add), an integer square root (15 bits, rounded) and 2^30 / r give rstd;
#   y = d (16 bits) * rstd / C (15 bits) -> 16 bits, times w (15 bits) < 2^31, then + b.
@micropython.viper
def _ln(out, mean, rstd, inp, weight, bias, s, nan, N: int, C: int, epm: int, epe: int):
    po = ptr32(out)
    pm = ptr32(mean)
    pr = ptr32(rstd)
    pi = ptr32(inp)
    pw = ptr32(weight)
    pb = ptr32(bias)
    S = ptr32(s)
    NANB = ptr32(nan)[0]
    b30 = 30
    top = 1 << b30                      # 2^30 (a literal would be folded into a bigint)
    b31 = 31
    sx = 1 << b31
    lc = 0                              # clog2(C)
    while (1 << lc) < C:
        lc += 1
    P = 29 - lc
    if P > 24:
        P = 24
    sh3 = 0                             # the squares are summed 2^8 at a time
    if lc > 8:
        sh3 = lc - 8
    for n in range(N):
        ib = n * C
        emax = 0
        for c in range(C):
            e = (pi[ib + c] >> 23) & 0xFF
            if e > emax:
                emax = e
        if emax == 255:                 # inf or NaN in the row
            for c in range(C):
                po[ib + c] = NANB
            pm[n] = NANB
            pr[n] = NANB
            continue
        if emax == 0:
            emax = 1
        base = emax + 24 - P
        L = base - 150
        ln_sum()                        # S[c] = q_c = round(x_c 2^-L), |q_c| <= 2^P; sm their sum
        # mean = sm / C * 2^L
        v = sm
        unsign(v, sg)
        e = L
        ldiv(v, e, C, qq, rem)
        pack(pm, n, v, e, sg, t, sh, bx)
        # d_c = C q_c - sum (exact), the largest |d|
        dmax = 0
        for c in range(C):
            d = C * ((S[c] ^ sx) - sx) - sm                     #!chk d
            S[c] = d
            if d < 0:
                d = 0 - d
            if d > dmax:
                dmax = d
        ln_ssq()                        # ssq = sum d_c^2, d_c = S[c] cut to 22 bits (d 2^-ds)
        # var = ssq 2^(22 + sh3 + 2 ds + 2 L) / C^3, then + eps
        vm = ssq
        ve = 22 + sh3 + ds + ds + L + L
        if vm != 0:
            norm30(vm, ve)
            for k in range(3):
                ldiv(vm, ve, C, qq, rem)
        em = epm << 15                  # eps with 30 bits, like var (addto0 keeps the larger
        ee = epe - 15                   # one's exponent; it shifts its operands in place)
        addto0(vm, ve, em, ee, sh)
        norm30(vm, ve)
        if ve & 1:
            vm = vm >> 1
            ve += 1
        isqrt(vm, r)
        if vm - r * r > r:
            r += 1                      # sqrt(vm) rounded: r in [2^14, 2^15]
        rq = (top + (r >> 1)) // r      # 2^30 / r in [2^15, 2^16]
        re = 0 - 30 - (ve >> 1)
        v = rq
        e = re
        sg = 0
        pack(pr, n, v, e, sg, t, sh, bx)
        # f = rstd 2^L / C as 15 bits fm 2^fe
        fm = rq << 13
        fe = re + L - 13
        ldiv(fm, fe, C, qq, rem)
        fm = fm >> 15
        fe += 15
        _ln_apply(out, weight, bias, s, ib, C, fm, fe)


@micropython.viper
def _ln_apply(out, weight, bias, s, ib: int, C: int, fm: int, fe: int):
    # row ib of the output: y_c = d_c f w_c + b_c, d_c = S[c] (_ln), f = fm 2^fe (15 bits)
    po = ptr32(out)
    pw = ptr32(weight)
    pb = ptr32(bias)
    S = ptr32(s)
    b31 = 31
    sx = 1 << b31
    for c in range(C):
        d = (S[c] ^ sx) - sx
        load30(pb, c, x, eb, bm, be)
        y = pw[c]
        ew = (y >> 23) & 0xFF
        v = 0
        e = 0
        if d != 0 and ew != 0:
            sg = (y >> 31) & 1
            if d < 0:
                sg = sg ^ 1
                d = 0 - d
            e = 0
            norm16(d, e)
            v = (d * fm) >> 15                              #!chk v
            wm = ((y & 0x7FFFFF) | 0x800000) >> 9
            if ew == 255:
                wm = 0x7FFF
                ew = 254
            v = (v * wm + 1) >> 1                           #!chk v
            e = e + fe + 15 + ew - 150 + 9 + 1
            if sg:
                v = 0 - v
        addto0(v, e, bm, be, sh)
        store(po, ib + c, v, e)


# The two entry points are viper functions: as bytecode their frames (24 and 25 words) came from
# the GC heap on every call (see viper_gemm._mm). They take the layer's arrays as one list `ln`
# (norm.LayerNorm keeps it), so that the layer's own call stays within 11 words of frame.
_NONE = None                    # viper compares objects with a global, not the literal


@micropython.viper
def layernorm_backward(dinp, dout, inp, ln, N: int, C: int):
    # ln = [weight, bias, mean, rstd, dweight, dbias] (the layer's arrays; bias unused here)
    # dinp (N, C) = rstd (dnorm - mean_c(dnorm) - xhat mean_c(dnorm xhat)), dnorm = dout weight;
    # dweight (C,) += sum_n dout xhat; dbias (C,) += sum_n dout (each skipped when None)
    dweight = ln[4]
    dbias = ln[5]
    flags = 3
    if dweight is _NONE:
        dweight = dinp
        flags = 2
    if dbias is _NONE:
        dbias = dinp
        flags = flags & 1
    _lnb(dinp, dweight, dbias, dout, inp, ln[0], ln[2], ln[3], _iscratch(4 * C), _NAN, N, C, flags)


def _eps(eps):
    # eps as (15-bit mantissa, exponent), computed once per value
    ep = _EPS.get(eps)
    if ep is None:
        ep = _EPS[eps] = _mant15(eps)
    return ep


@micropython.viper
def layernorm_forward(out, inp, ln, N: int, C: int, eps):
    # ln = [weight, bias, mean, rstd, ...] (the layer's arrays); inp (N, C): rows normalised over
    # C; weight bias (C,): gamma, beta; out (N, C) = (inp - mean) * rstd * weight + bias;
    # mean rstd (N,) saved for the backward
    ep = _EPS.get(eps)
    if ep is _NONE:
        ep = _eps(eps)
    _ln(out, ln[2], ln[3], inp, ln[0], ln[1], _iscratch(C), _NAN, N, C, ep[0], ep[1])


# ---- LayerNorm backward ---------------------------------------------------------------------
# ERROR BOUND (tests/mp/test_viper_decode_range.py), per row (finite values): with dn = dout w and
#   xhat = (x - mean) rstd from the saved mean and rstd, dinp within 1e-3 rstd max_c |dn_c| (the
#   terms dn - mean(dn) - xhat mean(dn xhat) cancel: the bound is relative to the row's largest);
#   dweight += dout xhat within 2e-4 |dout xhat| + 2^-23 |dweight| (its rounding); dbias += dout
#   exactly as the float32 sum (snippet fadd). A row whose dout, x, mean or rstd holds inf or NaN
#   gives NaN in dinp (and the weight gradients it feeds), so the step's guard refuses it.
# How: xhat_c and dn_c as 31-bit ints with their own exponents (16 x 15-bit products), kept in
#   the int scratch S (4 C); the two means as block sums with log2(C) + 1 bits of headroom
#   (< 2^30) divided by C (long division); dn - a - xhat b aligned to the largest exponent after
#   each term is cut below 2^29 (< 2^31), then times rstd (15 bits) [B7].
@micropython.viper
def _lnb(dinp, dweight, dbias, dout, inp, weight, mean, rstd, s, nan, N: int, C: int, flags: int):
    pd = ptr32(dinp)
    pdw = ptr32(dweight)
    pdb = ptr32(dbias)
    pg = ptr32(dout)
    pi = ptr32(inp)
    pw = ptr32(weight)
    pm = ptr32(mean)
    pr = ptr32(rstd)
    S = ptr32(s)
    NANB = ptr32(nan)[0]
    b31 = 31
    sx = 1 << b31
    b30 = 30
    top = 1 << b30
    lc = 0
    while (1 << lc) < C:
        lc += 1
    for n in range(N):
        ib = n * C
        y = pm[n]
        emn = (y >> 23) & 0xFF
        z = pr[n]
        er = (z >> 23) & 0xFF
        bad = 0
        if emn == 255 or er == 255 or er == 0:
            bad = 1
        for c in range(C):
            if ((pg[ib + c] >> 23) & 0xFF) == 255 or ((pi[ib + c] >> 23) & 0xFF) == 255:
                bad = 1
        if bad:
            for c in range(C):
                pd[ib + c] = NANB
                if flags & 1:
                    pdw[c] = NANB
            continue
        mmn = 0
        mme = 0
        if emn != 0:
            mant30(y, mmn, emn)
            mme = emn - 156
        rm = ((z & 0x7FFFFF) | 0x800000) >> 9
        rex = er - 141                          # rstd = rm 2^rex
        # pass 1: xhat_c = xm 2^xe (S[c], S[C + c]); dn_c = dm 2^de (S[2C + c], S[3C + c])
        emd = 0 - 100000
        emp = 0 - 100000
        for c in range(C):
            ln_xhat()                       # S[c], S[C + c] = xhat_c as v 2^xe
            g = pg[ib + c]
            w = pw[c]
            eg = (g >> 23) & 0xFF
            ew = (w >> 23) & 0xFF
            dm = 0
            de = 0
            if eg != 0 and ew != 0:
                dm = (((g & 0x7FFFFF) | 0x800000) >> 8) * (((w & 0x7FFFFF) | 0x800000) >> 9)   #!chk dm
                de = eg - 142 + ew - 141
                if de > emd:
                    emd = de
                if v != 0 and de + xe > emp:
                    emp = de + xe
                if ((g ^ w) >> 31) & 1:
                    dm = 0 - dm
            S[C + C + c] = dm
            S[3 * C + c] = de
        # pass 2: A = sum dn, B = sum dn xhat (block sums, headroom lc + 2: < 2^29)
        ha = lc + 2
        acca = 0
        accb = 0
        for c in range(C):
            dm = (S[C + C + c] ^ sx) - sx
            if dm == 0:
                continue
            de = (S[3 * C + c] ^ sx) - sx
            sh = emd - de + ha
            t = dm
            rsh(t, sh)
            acca += t                                           #!chk acca
            xm = (S[c] ^ sx) - sx
            if xm != 0:
                xe = (S[C + c] ^ sx) - sx
                t = (dm >> 16) * (xm >> 16)                     #!chk t
                sh = emp - de - xe + ha
                rsh(t, sh)
                accb += t                                       #!chk accb
        # a = A / C = am 2^ae, b = B / C = bm 2^be (30 bits, signed)
        am = acca
        ae = emd + ha
        sdiv(am, ae, C, asg, qq, rem)
        bm = accb
        be = emp + 32 + ha
        sdiv(bm, be, C, bsg, qq, rem)
        _lnb_apply(dinp, dweight, dbias, dout, s, ib, C, flags, am >> 1, ae + 1, bm, be, rm, rex)


@micropython.viper
def _lnb_apply(dinp, dweight, dbias, dout, s, ib: int, C: int, flags: int, am: int, ae: int, bm: int,
               bex: int, rm: int, rex: int):
    # row ib: dinp_c = rstd (dn_c - a - xhat_c b), a = am 2^ae (< 2^29), b = bm 2^bex (30 bits);
    # (bex: the snippets pack and fadd use `be` for themselves)
    # dweight_c += dout_c xhat_c; dbias_c += dout_c. xhat, dn from _lnb's scratch S.
    pd = ptr32(dinp)
    pdw = ptr32(dweight)
    pdb = ptr32(dbias)
    pg = ptr32(dout)
    S = ptr32(s)
    b31 = 31
    sx = 1 << b31
    for c in range(C):
        dm = ((S[C + C + c] ^ sx) - sx) >> 2
        de = ((S[3 * C + c] ^ sx) - sx) + 2
        xm = (S[c] ^ sx) - sx
        xe = (S[C + c] ^ sx) - sx
        t = ((xm >> 16) * (bm >> 15)) >> 1                      #!chk t
        te = xe + 16 + bex + 15 + 1
        # the largest exponent of the nonzero terms
        M = 0 - 100000
        if dm != 0:
            M = de
        if am != 0 and ae > M:
            M = ae
        if t != 0 and te > M:
            M = te
        if dm != 0:
            sh = M - de
            rsh(dm, sh)
        a = am
        if a != 0:
            sh = M - ae
            rsh(a, sh)
        if t != 0:
            sh = M - te
            rsh(t, sh)
        v = dm - a - t                                          #!chk v
        e = M
        unsign(v, sg)
        if v != 0:
            norm16(v, e)
            v = v * rm                                          #!chk v
            e = e + rex
        pack(pd, ib + c, v, e, sg)
        g = pg[ib + c]
        eg = (g >> 23) & 0xFF
        if (flags & 1) and eg != 0 and xm != 0:
            xs = xm
            if xs < 0:
                xs = 0 - xs
            p = ((((g & 0x7FFFFF) | 0x800000) >> 8) * (xs >> 16) + 1) >> 1   #!chk p
            pe = eg - 142 + xe + 16 + 1
            sg = (g >> 31) & 1
            if xm < 0:
                sg = sg ^ 1
            if sg:
                p = 0 - p
            load30(pdw, c, y, ey, om, oe)
            addto0(p, pe, om, oe, sh)
            store(pdw, c, p, pe)
        if flags & 2:
            xa = pdb[c]
            fadd(pdb, c, xa, g)
