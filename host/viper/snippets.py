# The code the viper kernels inline, each piece written once. A kernel uses a snippet by calling
# it as a statement, `store(pw, oi, acc, e)`, and host/viper/gen_viper.py puts the body there with the
# parameters renamed to the arguments. A snippet has no locals of its own: the caller's names it
# reads or writes by their own names are declared after its docstring (`# in:`, `# out:`), and it
# never leaves the caller's control flow (no return; break and continue only in its own loops).
# The generator checks both. Not a module: nothing imports this file.


def pack(p, i, v, e, sg, t, sh, be):
    """p[i] = (-1)^sg * v * 2^e as float32 bits, for 0 <= v < 2^31: v normalized to 24 bits and
    rounded to nearest, exponent biased; an underflow is flushed to 0, an overflow is +-inf."""
    pack_by(p, i, v, e, sg, t, sh, be, round_near, norm24)


def pack_bl(p, i, v, e, sg, t, sh, be):
    """pack, normalizing through the bit-length table bl (norm24_bl: fewer steps, the same bits)."""
    # in: bl
    pack_by(p, i, v, e, sg, t, sh, be, round_near, norm24_bl)


def pack_even(p, i, v, e, sg, t, sh, be):
    """pack, rounding ties to even as IEEE (the lowest kept bit decides): p[i] = (-1)^sg * v * 2^e; an underflow is flushed to 0, an overflow is +-inf."""
    pack_by(p, i, v, e, sg, t, sh, be, round_even, norm24)


def pack_by(p, i, v, e, sg, t, sh, be, rnd, nrm):
    """p[i] = (-1)^sg * v * 2^e as float32 bits, for 0 <= v < 2^31: v normalized to 24 bits by the
    snippet named nrm (norm24 or norm24_bl), rounded by the snippet named rnd (round_near or
    round_even), exponent biased; an underflow is flushed to 0, an overflow is +-inf."""
    if v == 0:
        p[i] = 0
    else:
        nrm(v, e, t, sh, rnd)
        be = e + 150
        if be >= 255:
            be = 255
            p[i] = (sg << 31) | (be << 23)
        elif be <= 0:
            p[i] = 0
        else:
            p[i] = (sg << 31) | (be << 23) | (v & 0x7FFFFF)


def norm24(v, e, t, sh, rnd):
    """0 < v < 2^31 brought to 2^23 <= v < 2^24 (a right shift rounded by the snippet named rnd),
    e counts the shifts: a cascade of compares."""
    if v >= 0x1000000:
        t = v >> 24                     # 1 .. 127: sh = its bit length
        sh = 1
        down(t, sh, 16, 4)
        down(t, sh, 4, 2)
        if t >= 2:
            sh += 1
        rnd(v, sh)
        e += sh
        if v >= 0x1000000:
            v = v >> 1
            e += 1
    else:
        up(v, e, 0x100, 16)
        up(v, e, 0x10000, 8)
        up(v, e, 0x100000, 4)
        up(v, e, 0x400000, 2)
        up(v, e, 0x800000, 1)


def norm24_bl(v, e, t, sh, rnd):
    """norm24 with the shift read from bl (ptr8 over viper_common._BL, bl[j] = the bit length of
    j < 256): one load in place of norm24's cascade of compares, the same v and e."""
    # in: bl
    if v >= 0x1000000:
        t = v >> 24                     # v < 2^31: t < 128, sh 1 .. 7
        sh = bl[t]
        rnd(v, sh)
        e += sh
        if v >= 0x1000000:
            v = v >> 1
            e += 1
    else:
        if v >= 0x10000:
            t = 8 - bl[v >> 16]
        elif v >= 0x100:
            t = 16 - bl[v >> 8]
        else:
            t = 24 - bl[v]
        v = v << t
        e -= t


def bitlen(v, n):
    """n = the bit length of 0 <= v < 2^31, from the bit-length table bl (two compares and a load)."""
    # in: bl
    if v >= 0x10000:
        if v >= 0x1000000:
            n = 24 + bl[v >> 24]
        else:
            n = 16 + bl[v >> 16]
    elif v >= 0x100:
        n = 8 + bl[v >> 8]
    else:
        n = bl[v]


def round_near(v, sh):
    """v shifted right by sh >= 1, rounded to nearest (ties away from zero)."""
    v = (v + (1 << (sh - 1))) >> sh


def round_even(v, sh):
    """v shifted right by sh >= 1, rounded to nearest, ties to even (the lowest kept bit decides)."""
    v = (v + (1 << (sh - 1)) - 1 + ((v >> sh) & 1)) >> sh


def unsign(v, sg):
    """sg = the sign bit of v (1 when v < 0), v = |v|."""
    sg = 0
    if v < 0:
        sg = 1
        v = 0 - v


def normto(v, e, hi, lo):
    """v > 0 brought to lo <= v < hi = 2 lo by shifts, e counts them."""
    while v >= hi:
        v = v >> 1
        e += 1
    while v < lo:
        v = v << 1
        e -= 1


def norm16(v, e):
    """v > 0 brought to 2^15 <= v < 2^16 by shifts, e counts them."""
    normto(v, e, 0x10000, 0x8000)


def norm15(v, e):
    """v > 0 brought to 2^14 <= v < 2^15 by shifts, e counts them."""
    normto(v, e, 0x8000, 0x4000)


def rowcopy(pc, i, ps, si, n, step):
    """pc[i + k step] = ps[si + k] for k < n, or 0 when si < 0 (a row in the padding); i moves on."""
    # out: k
    if si < 0:
        for k in range(n):
            pc[i] = 0
            i += step
    else:
        for k in range(n):
            pc[i] = ps[si + k]
            i += step


def store(p, i, v, e, sg, t, sh, be):
    """p[i] = v * 2^e as float32 bits, |v| < 2^31 (the body of _store)."""
    unsign(v, sg)
    pack(p, i, v, e, sg, t, sh, be)


def store_bl(p, i, v, e, sg, t, sh, be):
    """store, normalizing through the bit-length table bl (pack_bl): the same bits."""
    # in: bl
    unsign(v, sg)
    pack_bl(p, i, v, e, sg, t, sh, be)


def decode(x, m, e):
    """float32 bits x -> m * 2^(e - 150): m the signed 24-bit mantissa with its hidden bit, e the
    biased exponent; 0 (e = 0) for zeros and subnormals; +-inf and NaN read as +-FLT_MAX."""
    e = (x >> 23) & 0xFF
    m = 0
    if e != 0:
        mag(x, m, e)
        if (x >> 31) & 1:
            m = 0 - m


def mag(x, m, e):
    """The magnitude of float32 bits x with biased exponent e != 0: m the 24-bit mantissa with its
    hidden bit; inf and NaN read as FLT_MAX (m = 2^24 - 1, e = 254)."""
    m = (x & 0x7FFFFF) | 0x800000
    if e == 255:
        m = 0xFFFFFF
        e = 254


def mant30(x, m, e):
    """float32 bits x with biased exponent e != 0 -> m, its signed mantissa with 6 guard bits
    (|m| < 2^30; inf and NaN as FLT_MAX, e left at 255): x = m * 2^(e - 156)."""
    m = ((x & 0x7FFFFF) | 0x800000) << 6
    if e == 255:
        m = 0xFFFFFF
        m = m << 6
    if (x >> 31) & 1:
        m = 0 - m


def scaled(v, sh, y, lg):
    """y = v * 2^sh (v >= 0; a right shift rounds), capped at ycap = 2^lg."""
    # in: ycap
    if sh >= 0:
        if sh > lg or v > (ycap >> sh):
            y = ycap
        else:
            y = v << sh
    elif sh > 0 - 31:
        y = ((v >> (0 - sh - 1)) + 1) >> 1


def key(x, v, e):
    """float32 bits x -> an int v that orders like the value (sign-magnitude; inf/NaN as
    +-FLT_MAX); e is x's biased exponent."""
    e = (x >> 23) & 0xFF
    v = (e << 23) | (x & 0x7FFFFF)
    if e == 255:                            # inf / NaN: +-FLT_MAX
        v = ((e - 1) << 23) | 0x7FFFFF
    if (x >> 31) & 1:
        v = 0 - v


def gap(x, m, e, dv, de, sh):
    """dv * 2^(de - 150) = max - s >= 0 for the float32 bits x of s and the row max mx * 2^(ex - 150)
    (mx signed, ex >= 1): the smaller exponent's mantissa shifted right (rounded), so the
    difference is exact to half an ulp of the larger; |dv| < 2^25; a 24-bit shift or more leaves 0."""
    # in: ex, mx
    decode(x, m, e)
    if e == 0:
        e = 1
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


def expq15(y, k, r, p):
    """exp(-y) = p * 2^(-15 - k) for y >= 0 in Q16, y < 2^23, p in Q15.
    k = y // ln2 (ln 2 = 45426 in Q16), r = y - k ln2 in [0, ln2): a reciprocal estimate
    ((y >> 5) * 1477 < 2^31 for y < 2^23) low by at most 1, then fixed.
    e^-r = 1 - r(1 - r/2(1 - r/3(1 - r/4(1 - r/5(1 - r/6))))), Q15 terms; (r p) >> 16 <
    45426 * 2^15 / 2^16 < 2^15, so /5 and /3 are exact reciprocal multiplies (x < 2^16:
    x // 3 = (x * 43691) >> 17, x // 5 = (x * 52429) >> 18; products < 2^31). p <= 2^15."""
    k = (y >> 5) * 1477                                 #!chk k
    k = k >> 21
    r = y - k * 45426
    if r >= 45426:
        r -= 45426
        k += 1
    p = 32768 - ((r * 5461) >> 16)          # 5461 = 2^15/6
    p = 32768 - ((((r * p) >> 16) * 52429) >> 18)   #!chk p
    p = 32768 - (((r * p) >> 16) >> 2)
    p = 32768 - ((((r * p) >> 16) * 43691) >> 17)
    p = 32768 - (((r * p) >> 16) >> 1)
    p = 32768 - ((r * p) >> 16)


def rsh(x, sh):
    """x = x * 2^-sh rounded to nearest (ties up) for sh >= 0; 0 for a shift beyond 30 bits."""
    if sh > 30:
        x = 0
    else:
        x = (x + ((1 << sh) >> 1)) >> sh


def addto(a, ae, b, be, sh):
    """a * 2^ae += b * 2^be, aligned to the larger exponent (the other operand shifted right,
    rounded to nearest, 0 beyond 30 bits); |a|, |b| < 2^30 keeps the sum below 2^31."""
    if ae >= be:
        sh = ae - be
        rsh(b, sh)
        a = a + b                                       #!chk a
    else:
        sh = be - ae
        rsh(a, sh)
        a = a + b                                       #!chk a
        ae = be


def addto0(a, ae, b, be, sh):
    """addto where either side may be 0 (a 0 takes the other's exponent)."""
    if a == 0:
        a = b
        ae = be
    elif b != 0:
        addto(a, ae, b, be, sh)


def alignsub(a, ae, b, be, v, e, sh):
    """v * 2^e = a * 2^ae - b * 2^be, aligned to the larger exponent as in addto; |a|, |b| < 2^30."""
    if ae >= be:
        sh = ae - be
        rsh(b, sh)
        v = a - b                                       #!chk v
        e = ae
    else:
        sh = be - ae
        rsh(a, sh)
        v = a - b                                       #!chk v
        e = be


def down(v, e, lim, s):
    """One step of a normalizing cascade: v >= lim is shifted right by s, e counts it."""
    if v >= lim:
        v = v >> s
        e += s


def up(v, e, lim, s):
    """One step of a normalizing cascade: v < lim is shifted left by s, e counts it."""
    if v < lim:
        v = v << s
        e -= s


def slot(m, e, s):
    """A constant of the int array C: mantissa C[s], exponent C[s + 1] (sign-extended: sx = 2^31)."""
    # in: C, sx
    m = C[s]
    e = (C[s + 1] ^ sx) - sx


def norm30(m, e):
    """m * 2^e with 0 < m < 2^31 normalized to 2^29 <= m < 2^30 (top = 2^30)."""
    # in: top
    while m >= top:
        m = m >> 1
        e += 1
    up(m, e, 0x4000, 16)
    up(m, e, 0x400000, 8)
    up(m, e, 0x4000000, 4)
    up(m, e, 0x10000000, 2)
    up(m, e, 0x20000000, 1)


def quantize(src, stride):
    """One block of KT values src[i0], src[i0 + stride], ... to qb[0 ...] (qb advances by KT): P-bit
    signed ints of the block's largest exponent emax (block float, see kernels_viper.py);
    base = emax + 24 - P, so q = round(mantissa 2^(e - base)), |q| <= lim = 2^P - 1."""
    # in: i0, KT, lim, P
    # out: base, e, elo, emax, k, q, qa, qb, sh, st4, v
    # qa walks the block (a register local of _gemm: each load has a constant offset)
    st4 = stride << 2
    emax = 0
    qa = ptr32(uint(src) + (i0 << 2))
    for k in range(KT):
        e = (qa[0] >> 23) & 0xFF
        if e > emax:
            emax = e
        qa = ptr32(uint(qa) + st4)
    if emax == 255:
        emax = 254
    base = emax + 24 - P
    # the values that quantize to nonzero: e >= elo, i.e. a normal number (e >= 1) whose shift
    # sh = base - e is at most 30 (one compare per value). +-inf and NaN (e = 255, only when the
    # block's emax is 255, read as 254) get sh = 23 - P and a q of at least 2^P: clamped to lim,
    # as FLT_MAX (the mantissa 2^24 - 1 at e = 254) would be.
    elo = base - 30
    if elo < 1:
        elo = 1
    qa = ptr32(uint(src) + (i0 << 2))
    for k in range(KT):
        v = qa[0]
        qa = ptr32(uint(qa) + st4)
        e = (v >> 23) & 0xFF
        if e >= elo:
            sh = base - e           # >= 24 - P = 10 (23 - P for inf and NaN)
            q = (((v & 0x7FFFFF) | 0x800000) + (1 << (sh - 1))) >> sh
            if q > lim:
                q = lim
            if (v >> 31) & 1:
                q = 0 - q
        else:
            q = 0
        qb[0] = q
        qb = ptr32(uint(qb) + 4)


# ---- _softmax's part (used once; kept here so _softmax reads as its outline) ----------------
def softmax_max():
    """_softmax's pass 1: the largest visible score of the row at pa[ab ...] (j <= last, not
    masked), compared as sign-magnitude ints, as a signed mantissa mx * 2^(ex - 150) (mx = 0 for
    zeros / subnormals and for a row with nothing visible, ex >= 1)."""
    # in: ab, b, hasmask, last, pa, pm, Tk
    # out: e, ex, j, mj, mk, mx, v, x
    # pass 1: the largest visible score, compared as sign-magnitude ints
    mk = 0
    mj = 0 - 1
    for j in range(Tk):
        if j > last or (hasmask and pm[b * Tk + j] != 0):
            continue
        x = pa[ab + j]
        key(x, v, e)
        if mj < 0 or v > mk:
            mk = v
            mj = j
    # the max as a signed mantissa mx * 2^(ex - 150) (0 for zeros / subnormals)
    mx = 0
    ex = 1
    if mj >= 0:
        x = pa[ab + mj]
        decode(x, mx, ex)
        if ex == 0:
            ex = 1


# ---- _xent's part (used once; kept here so _xent reads as its outline) --------------------------
def xent_grad():
    """_xent's dlogits of row b: (p_j - [j == y]) / B from the exponentials S[j] 2^-S[V + j] and
    their sum z (zr * 2^zre), stored inline (store_bl: a call to _store costs more)."""
    # in: bl, ibe, ibm, lb, pdl, S, V, y, z, zq, zr, zre
    # out: e, j, o, q, wbe, we, wsg, wsh, wt, wv
    for j in range(V):
        if j == y:
            # p_y - 1 = -(z - e_y) / z, from the exact integer sum of the others
            o = z - ((S[j] << (zq - 15)) >> S[V + j])
            e = 0
            while o != 0 and o < (1 << 29):
                o = o << 1
                e -= 1
            q = o // zr                                         #!chk q
            wv = 0 - q * ibm
            we = e - zre + ibe
        else:
            q = (S[j] << 15) // zr                              #!chk q
            wv = q * ibm
            we = zq - 30 - S[V + j] - zre + ibe
        store_bl(pdl, lb + j, wv, we, wsg, wt, wsh, wbe)


# ---- LayerNorm's parts (used once; kept here so _ln and _lnb read as their outlines) -----------
def ln_sum():
    """_ln's row quantized: S[c] = q_c = round(x_c 2^-L) (x_c = pi[ib + c], 2^L = 2^(base - 150)),
    |q_c| <= 2^P; sm = the sum of the q_c."""
    # in: base, C, ib, pi, S
    # out: c, e, q, sh, sm, x
    sm = 0
    for c in range(C):
        x = pi[ib + c]
        e = (x >> 23) & 0xFF
        q = 0
        if e != 0:
            q = (x & 0x7FFFFF) | 0x800000
            sh = base - e
            if sh > 30:
                q = 0
            elif sh > 0:
                q = (q + (1 << (sh - 1))) >> sh
            if (x >> 31) & 1:
                q = 0 - q
        S[c] = q
        sm += q                                             #!chk sm


def ln_ssq():
    """_ln's sum of squares: the d_c = S[c] (largest |d| dmax) cut to 22 bits, dn = d 2^-ds, each
    square in 22 bits (two 11-bit halves), ssq = their sum, shifted right by sh3 (rounded, rh)."""
    # in: C, dmax, S, sh3, sx
    # out: c, d, ds, h, lo, rh, ssq, t
    # d cut to 22 bits: dn = d 2^-ds
    ds = 0
    if dmax != 0:
        while (dmax >> ds) >= 0x400000:
            ds += 1
        if ds == 0:
            while ds > 0 - 22 and (dmax << (0 - ds)) < 0x200000:
                ds -= 1
    ssq = 0
    rh = (1 << sh3) >> 1
    for c in range(C):
        d = (S[c] ^ sx) - sx        # (ptr32 loads zero-extend on a 64-bit host)
        if d < 0:
            d = 0 - d
        if ds > 0:
            d = (d + (1 << (ds - 1))) >> ds
        elif ds < 0:
            d = d << (0 - ds)
        h = d >> 11
        lo = d & 0x7FF
        t = h * h + ((h * lo * 2 + ((lo * lo) >> 11)) >> 11)   #!chk t
        ssq += (t + rh) >> sh3                              #!chk ssq


def ln_xhat():
    """_lnb's xhat_c = (x_c - mean) rstd for x_c = pi[ib + c]: v 2^xe (v signed, 16 x 15 bits;
    0 for 0), stored at S[c], S[C + c]; mean = mmn 2^mme, rstd = rm 2^rex."""
    # in: c, C, ib, mme, mmn, pi, rex, rm, S
    # out: e, ex, mb, sg, sh, v, x, xe, xm
    x = pi[ib + c]
    ex = (x >> 23) & 0xFF
    xm = 0
    if ex != 0:
        mant30(x, xm, ex)
    if xm == 0:
        v = 0 - mmn
        e = mme
    elif mmn == 0:
        v = xm
        e = ex - 156
    else:
        xe = ex - 156
        mb = mmn                        # (alignsub shifts its operands in place)
        alignsub(xm, xe, mb, mme, v, e, sh)
    unsign(v, sg)
    xe = 0
    if v != 0:
        norm16(v, e)
        v = v * rm                                      #!chk v
        xe = e + rex
        if sg:
            v = 0 - v
    S[c] = v
    S[C + c] = xe


# ---- _gemm's parts (used once; kept here so _gemm reads as its outline) -------------------
def gemm_geometry():
    """The geometry of _gemm's product `kind` from its sizes x y z w u (see MM_FORWARD ... in
    gemm.py): M rows of A, N rows of B, KT terms; the strides of A (asm per row, ask per term),
    B (bsn, bsk) and the output (osm, osn); the batch loops nb1 x nb2 with their strides (asb1 ...
    osb2); hs the head size; mode the addend (_ADD_NONE, _ADD_OLD or _ADD_BIAS)."""
    # in: kind, x, y, z, w, u, MM_FORWARD, MM_DINP, MM_DWEIGHT, MM_DBIAS, HEAD_SCORES, HEAD_CONTEXT
    # in: HEAD_TRANSPOSED, DECODE_SCORES, DECODE_CONTEXT, _ADD_NONE, _ADD_OLD, _ADD_BIAS
    # out: M, N, KT, asm, ask, bsn, bsk, osm, osn, nb1, nb2, asb1, asb2, bsb1, bsb2, osb1, osb2
    # out: hs, mode
    nb1 = 1
    nb2 = 1
    asb1 = 0
    asb2 = 0
    bsb1 = 0
    bsb2 = 0
    osb1 = 0
    osb2 = 0
    mode = _ADD_NONE
    # the geometry of each kind, one row each (x y z w u as gemm.py's comment on the kind says)
    hs = 1
    if (kind >= HEAD_SCORES and kind <= HEAD_TRANSPOSED) or kind >= DECODE_SCORES:
        hs = w // u
        nb1 = x
        nb2 = u
    if kind == MM_FORWARD:
        M = x; N = z; KT = y; asm = y; ask = 1; bsn = y; bsk = 1; osm = z; osn = 1
        if w:
            mode = _ADD_BIAS
    elif kind == MM_DINP:
        M = x; N = y; KT = z; asm = z; ask = 1; bsn = 1; bsk = y; osm = y; osn = 1
        if w:
            mode = _ADD_OLD
    elif kind == MM_DWEIGHT:
        M = z; N = y; KT = x; asm = 1; ask = z; bsn = 1; bsk = y; osm = y; osn = 1; mode = _ADD_OLD
    elif kind == MM_DBIAS:
        M = z; N = 1; KT = x; asm = 1; ask = z; bsn = 0; bsk = 1; osm = 1; osn = 1; mode = _ADD_OLD
    elif kind == HEAD_SCORES:
        M = y; N = z; KT = hs; asm = w; ask = 1; asb1 = y * w; asb2 = hs
        bsn = w; bsk = 1; bsb1 = z * w; bsb2 = hs; osm = z; osn = 1; osb1 = u * y * z; osb2 = y * z
    elif kind == HEAD_CONTEXT:
        M = y; N = hs; KT = z; asm = z; ask = 1; asb1 = u * y * z; asb2 = y * z
        bsn = 1; bsk = w; bsb1 = z * w; bsb2 = hs; osm = w; osn = 1; osb1 = y * w; osb2 = hs
    elif kind == HEAD_TRANSPOSED:
        M = z; N = hs; KT = y; asm = 1; ask = z; asb1 = u * y * z; asb2 = y * z
        bsn = 1; bsk = w; bsb1 = y * w; bsb2 = hs; osm = w; osn = 1; osb1 = z * w; osb2 = hs
    elif kind == DECODE_SCORES:
        M = 1; N = y; KT = hs; asm = 0; ask = 1; asb1 = w; asb2 = hs
        bsn = w; bsk = 1; bsb1 = z * w; bsb2 = hs; osm = 0; osn = 1; osb1 = u * z; osb2 = z
    elif kind == DECODE_CONTEXT:
        M = 1; N = hs; KT = y; asm = 0; ask = 1; asb1 = u * z; asb2 = z
        bsn = 1; bsk = w; bsb1 = z * w; bsb2 = hs; osm = 0; osn = 1; osb1 = w; osb2 = hs
    else:   # MEAN_POOL
        nb1 = x; M = z; N = 1; KT = y; asm = 1; ask = z; asb1 = y * z
        bsn = 0; bsk = 1; osm = 1; osn = 0; osb1 = z


def gemm_arow():
    """A's quantized row at S[ex ...] into a0..a3 (one chunk, nc == 1) or a0..a7 (two chunks): the
    inner products of mac_c1 / mac_c2 read them from locals. Longer rows (mac_long) read S."""
    # in: ex, nc, S
    # out: a0, a1, a2, a3, a4, a5, a6, a7
    if nc <= 2:
        a0 = S[ex]
        a1 = S[ex + 1]
        a2 = S[ex + 2]
        a3 = S[ex + 3]
        if nc == 2:
            a4 = S[ex + 4]
            a5 = S[ex + 5]
            a6 = S[ex + 6]
            a7 = S[ex + 7]


def mac4(acc):
    """acc = A row (a0..a7 or S[ex ...]) . B row n (at qb, which moves on to row n + 1), block
    float ints, for any number of chunks nc (mac_c1, mac_c2 or mac_long)."""
    # in: a0, a1, a2, a3, a4, a5, a6, a7, ex, nc, rh, s32, sa, sh4
    # out: c, qa, qb, t
    if nc == 1:
        mac_c1(acc)
    elif nc == 2:
        mac_c2(acc)
    else:
        mac_long(acc)


def mac_c1(acc):
    """mac4 for one chunk (KT <= 4): A's row from a0..a3. The rows are read through pointers, so
    each load has a constant offset: one load instruction instead of an index computed, scaled
    and added."""
    # in: a0, a1, a2, a3, s32
    # out: qb
    # [B1] |q| <= 2^14 - 1: a 4-term chunk t has |t| <= 2^30 - 2^17 + 4, so KT <= 4
    # needs no shift and KT <= 8 sums two chunks to |acc| <= 2^31 - 2^18 + 8; longer
    # rows shift each chunk (rounded) by sh4 = clog2(KT4/4): |acc| < 2^30
    acc = a0 * qb[0] + a1 * qb[1] + a2 * qb[2] + a3 * qb[3]
    acc = (acc << s32) >> s32                       #!chk acc
    qb = ptr32(uint(qb) + 16)


def mac_c2(acc):
    """mac4 for two chunks (4 < KT <= 8): A's row from a0..a7, no shift [B1]."""
    # in: a0, a1, a2, a3, a4, a5, a6, a7, s32
    # out: qb
    acc = (a0 * qb[0] + a1 * qb[1] + a2 * qb[2] + a3 * qb[3]
           + a4 * qb[4] + a5 * qb[5] + a6 * qb[6] + a7 * qb[7])
    acc = (acc << s32) >> s32                       #!chk acc
    qb = ptr32(uint(qb) + 32)


def mac_long(acc):
    """mac4 for more than two chunks (KT > 8): A's row read through qa at S[ex ...]."""
    # in: ex, nc, rh, s32, sa, sh4
    # out: c, qa, qb, t
    # pairs of chunks (8 products, |t| <= 2^31 - 2^18 + 8) share one shift; two pairs a
    # turn (fewer loop and pointer steps), then the odd pair and the odd chunk
    acc = 0
    qa = ptr32(sa + (ex << 2))
    for c in range(nc >> 2):
        pair8(acc, 0)
        pair8(acc, 8)
        qa = ptr32(uint(qa) + 64)
        qb = ptr32(uint(qb) + 64)
    if nc & 2:
        pair8(acc, 0)
        qa = ptr32(uint(qa) + 32)
        qb = ptr32(uint(qb) + 32)
    if nc & 1:
        t = qa[0] * qb[0] + qa[1] * qb[1] + qa[2] * qb[2] + qa[3] * qb[3]
        t = (t << s32) >> s32                       #!chk t
        acc += (t + rh) >> sh4                          #!chk acc
        qb = ptr32(uint(qb) + 16)


def pair8(acc, o):
    """One pair of chunks of mac_long: t = the 8 products qa[o ...] . qb[o ...]
    (|t| <= 2^31 - 2^18 + 8), shifted by sh4 into acc. o is a number: the parser folds o + k,
    so every load keeps a constant offset."""
    # in: qa, qb, rh, s32, sh4
    # out: t
    t = (qa[o] * qb[o] + qa[o + 1] * qb[o + 1] + qa[o + 2] * qb[o + 2] + qa[o + 3] * qb[o + 3]
         + qa[o + 4] * qb[o + 4] + qa[o + 5] * qb[o + 5] + qa[o + 6] * qb[o + 6] + qa[o + 7] * qb[o + 7])
    t = (t << s32) >> s32                       #!chk t
    acc += (t + rh) >> sh4                          #!chk acc


def gemm_outs(acc):
    """_gemm's outputs of A's row m: row m . B row n for the rows n0 <= n < n1 of B (and the ones row when
    the bias gradient rides along), into pw[oi ...]. Short rows without an addend or with a bias
    have loops of their own, without the per-output tests of the general loop. acc is _gemm's
    register local v, the accumulator."""
    # in: _ADD_BIAS, _ADD_NONE, _ADD_OLD, a0, a1, a2, a3, a4, a5, a6, a7, bd, bl, ea, ex, m, mode
    # in: N, n0, n1, nc, osn, pbias, rh, S, s32, sa, sh4, xn
    # out: be, c, e, n, oi, ov, pw, qa, qb, sg, sh, t, uu, xe, xm
    if mode == _ADD_NONE and nc <= 2:
        # short rows without an addend (the attention products, most input gradients)
        if nc == 1:
            for n in range(n0, n1):
                mac_c1(acc)
                gemm_put0(acc)
        else:
            for n in range(n0, n1):
                mac_c2(acc)
                gemm_put0(acc)
    elif mode == _ADD_BIAS and nc <= 2:
        # short rows plus a bias (the forward of Dense and of the projections)
        for n in range(n0, n1):
            if nc == 1:
                mac_c1(acc)
            else:
                mac_c2(acc)
            gemm_putb(acc)
    else:
        for n in range(n0, n1):
            if n == N:                  # the ones row: dbias[m] += sum_k A[m, k]
                pw = pbias
                oi = m
            mac4(acc)
            gemm_put(acc)


def gemm_put0(acc):
    """gemm_put without an addend (_ADD_NONE): acc * 2^e packed into pw[oi]; oi moves on."""
    # in: bl, ea, n, osn, pw, S, xn
    # out: be, e, oi, sg, sh, t
    e = ea + S[xn + n]                  # value = acc * 2^e
    store_bl(pw, oi, acc, e)
    oi += osn


def gemm_put(acc):
    """_gemm's output n of row m: acc * 2^e (e = ea + B row n's exponent) plus the addend, packed
    into pw[oi] as float32 bits; oi moves to the next output. acc is _gemm's register local v."""
    # in: _ADD_NONE, _ADD_OLD, bd, bl, ea, mode, n, nc, osn, pw, S, s32, xn
    # out: be, e, oi, ov, sg, sh, t, uu, xe, xm
    e = ea + S[xn + n]                  # value = acc * 2^e
    addend(acc, e)
    store_bl(pw, oi, acc, e)
    oi += osn


def kept(same):
    """same = 1 when the weight pb (N rows of KT) is bit for bit its copy at S[cp ...], so the
    quantized rows in S are its own (MM_FORWARD with u = 1); else the copy is renewed, same = 0."""
    # in: cp, KT, kind, MM_FORWARD, N, pb, S, u
    # out: k
    same = 0
    if kind == MM_FORWARD and u:
        same = 1
        for k in range(N * KT):
            if pb[k] != S[cp + k]:
                same = 0
                break
        if same == 0:
            for k in range(N * KT):
                S[cp + k] = pb[k]


def addend(acc, e):
    """acc * 2^e += the old output pw[oi] (_ADD_OLD) or bias[n] (_ADD_BIAS, decoded in S[bd ...])."""
    # in: _ADD_NONE, _ADD_OLD, bd, mode, n, nc, oi, pw, S, s32
    # out: ov, sh, uu, xe, xm
    # addend: the old output (_ADD_OLD) or bias[n] (_ADD_BIAS)  [B2]
    if mode != _ADD_NONE:
        if mode == _ADD_OLD:
            halve2(acc, e)
            ov = pw[oi]
            decode(ov, xm, xe)
            xe = xe - 150
            addto_acc(acc, e, xm, xe)
        else:
            add_bias(acc, e)


def halve2(acc, e):
    """Two chunks (nc == 2, |acc| < 2^31) are halved (rounded) to |acc| < 2^30 before an addend [B2]."""
    # in: nc
    if nc == 2:
        acc = (acc + 1) >> 1
        e += 1


def add_bias(acc, e):
    """acc * 2^e += bias[n], decoded in S[bd + 2n] (mantissa) and S[bd + 2n + 1] (exponent)."""
    # in: bd, n, nc, S, s32
    # out: sh, uu, xe, xm
    halve2(acc, e)
    xm = (S[bd + n + n] << s32) >> s32
    xe = (S[bd + n + n + 1] << s32) >> s32
    addto_acc(acc, e, xm, xe)


def addto_acc(acc, e, xm, xe):
    """acc * 2^e += xm * 2^xe (|acc| < 2^30, |xm| < 2^25): the smaller aligned to the larger
    exponent, rounded; the larger shifted up by at most 6 bits first [B2]."""
    # out: sh, uu
    if xm != 0:
        if acc == 0:
            acc = xm
            e = xe
        elif xe <= e:
            sh = e - xe
            rsh(xm, sh)
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


def gemm_putb(acc):
    """gemm_put with the bias as the addend (_ADD_BIAS): acc * 2^e + bias[n] packed into pw[oi];
    oi moves on."""
    # in: bd, bl, ea, n, nc, osn, pw, S, s32, xn
    # out: be, e, oi, sg, sh, t, uu, xe, xm
    e = ea + S[xn + n]                  # value = acc * 2^e
    add_bias(acc, e)
    store_bl(pw, oi, acc, e)
    oi += osn


# ---- _adam's parts (used once; kept here so _adam reads as its outline) ------------------------
def decay(dm, de):
    """Weight decay of p = pp[i]: AdamW (dec) p -= lr wd p, in place; Adam d += wd p, with
    d = dm * 2^de (wdm, wde: the 15-bit mantissa and exponent of lr wd, resp. wd)."""
    # in: _store, dec, i, p, pp, wde, wdm
    # out: e, pmm, sh, t, te, y
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
                addto0(dm, de, t, te, sh)


def isqrt(x, r):
    """r = floor(sqrt(x)), x in [2^27, 2^30): a chord of sqrt over x's octave (low by < 3 %), two
    Newton steps (then within +-1) and an exact fix-up; r*r <= 2^30."""
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


def fadd(po, oi, xa, xb, ea, eb, ma, mb, d, v, e, sg):
    """po[oi] = xa + xb for float32 bits xa, xb: the mantissas with 6 guard bits, the smaller
    shifted into alignment with a sticky bit (any bit shifted out sets the lowest), added, then
    rounded to nearest, ties to even: the float32 sum, bit for bit (IEEE), but that subnormal
    inputs count as 0 and a subnormal result is flushed to 0; inf and NaN as IEEE (inf - inf and NaN give NaN)."""
    # out: be, sh, t
    ea = (xa >> 23) & 0xFF
    eb = (xb >> 23) & 0xFF
    if ea == 255 or eb == 255:
        if ea == 255 and (xa & 0x7FFFFF) != 0:
            po[oi] = xa | 0x400000
        elif eb == 255 and (xb & 0x7FFFFF) != 0:
            po[oi] = xb | 0x400000
        elif ea == 255 and eb == 255 and xa != xb:
            d = 0x3FE00000                  # NaN for inf - inf: 0x7FC00000 (a literal >= 2^30,
            po[oi] = d << 1                 # or one folded from constants, is an object)
        elif ea == 255:
            po[oi] = xa
        else:
            po[oi] = xb
    elif ea == 0:
        if eb == 0:
            po[oi] = ((xa & xb) >> 31) << 31   # -0 + -0 = -0, else +0
        else:
            po[oi] = xb
    elif eb == 0:
        po[oi] = xa
    elif ea - eb > 26:
        po[oi] = xa                         # |b| below half the ulp below a: a is the sum
    elif eb - ea > 26:
        po[oi] = xb
    else:
        ma = ((xa & 0x7FFFFF) | 0x800000) << 6
        mb = ((xb & 0x7FFFFF) | 0x800000) << 6
        if ea >= eb:
            d = ea - eb
            if d > 0:
                if mb & ((1 << d) - 1):
                    mb = (mb >> d) | 1
                else:
                    mb = mb >> d
            e = ea - 156
        else:
            d = eb - ea
            if ma & ((1 << d) - 1):
                ma = (ma >> d) | 1
            else:
                ma = ma >> d
            e = eb - 156
        if (xa >> 31) & 1:
            ma = 0 - ma
        if (xb >> 31) & 1:
            mb = 0 - mb
        v = ma + mb                                     #!chk v
        unsign(v, sg)
        pack_even(po, oi, v, e, sg)


def sdiv(m, e, dv, sg, q, rem):
    """m * 2^e /= dv for signed m (|m| < 2^31) and 0 < dv <= 2^30: ldiv on |m|, the sign put back."""
    unsign(m, sg)
    ldiv(m, e, dv, q, rem)
    if sg:
        m = 0 - m


def ldiv(v, e, dv, q, rem):
    """v * 2^e /= dv for 0 <= v < 2^31 and 0 < dv <= 2^30 (the remainder doubled stays below
    2^31), by long division: v becomes the quotient, truncated, with 29 significant bits or more
    and below 2^31 (29 or 30 bits when v < 2^30), e its exponent (v = 0 stays 0)."""
    q = v // dv
    rem = v - q * dv
    while q < 0x20000000 and v != 0:
        rem = rem << 1
        q = q << 1
        e -= 1
        if rem >= dv:
            rem -= dv
            q += 1
    v = q


def lookup(x, T, ex, tq, k, f, dl, ph):
    """ph = the table T at |x| (float32 bits x, exponent ex < 255) in Q29, linearly interpolated
    on its grid of step 1/64 over [0, 6] (385 entries); 2^29 (that is 1) beyond. The index in Q16
    is tq = |x| 2^22 < 2^26; the step difference dl < 2^23 times the fraction's two bytes < 2^31."""
    tq = 0
    if ex >= 130:
        tq = 384 << 16                  # |x| >= 8: beyond the table
    elif ex != 0:
        tq = (x & 0x7FFFFF) | 0x800000
        if ex >= 128:
            tq = tq << (ex - 128)
        elif 128 - ex > 30:
            tq = 0
        else:
            tq = tq >> (128 - ex)
    k = tq >> 16
    if k >= 384:
        ph = 1 << 29
    else:
        f = tq & 0xFFFF
        dl = T[k + 1] - T[k]                            #!chk dl
        ph = T[k] + ((dl * (f >> 8) + ((dl * (f & 0xFF)) >> 8)) >> 8)   #!chk ph


def load30(p, i, x, eb, m, me):
    """x = p[i] (float32 bits) as m * 2^me, m signed with |m| < 2^30 (0 for a zero or subnormal x);
    eb is its biased exponent."""
    x = p[i]
    eb = (x >> 23) & 0xFF
    m = 0
    me = 0
    if eb != 0:
        mant30(x, m, eb)
        me = eb - 156


def addmul(dm, de, y, ey, f, fe, t, te, sh):
    """dm 2^de += y * f 2^fe, then normalized as snorm does: y float32 bits with biased exponent
    ey != 0, f a 15-bit mantissa (|f| < 2^15: the product t 2^te has |t| < 2^30)."""
    # in: top
    # out: sg
    t = (((y & 0x7FFFFF) | 0x800000) >> 9) * f                     #!chk t
    if (y >> 31) & 1:
        t = 0 - t
    te = ey - 141 + fe
    addto0(dm, de, t, te, sh)
    snorm(dm, de)


def snorm(m, e, sg):
    """Signed m * 2^e (|m| < 2^31) normalized to 2^29 <= |m| < 2^30 (or 0), for the next aligned
    add (uses top = 2^30)."""
    # in: top
    if m != 0:
        unsign(m, sg)
        norm30(m, e)
        if sg:
            m = 0 - m

def adam_coupled():
    """Adam's coupled decay (in _adam_all): x = the float32 bits of d = g + wd p, a soft add of
    g (x) and wd p (y = p, wdm 2^wde) with 6 guard bits; a non-finite g or p is passed on."""
    # in: a, BL, dp, infb, sx, wde, wdm
    # out: eg, ey, kk, te, tt, uu, x, y
    # Adam's coupled decay: d = g + wd p, as float32 bits (a soft add)
    y = ptr32(a + dp)[0]
    ey = (y >> 23) & 0xFF
    if ey != 0 and ((x >> 23) & 0xFF) != 255:
        if ey == 255:
            x = y
        else:
            tt = (((y >> 9) & 0x3FFF) | 0x4000) * wdm                       #!chk tt
            if (y >> 31) & 1:
                tt = 0 - tt
            te = ey + wde + 15                                 # tt 2^(te - 156)
            eg = (x >> 23) & 0xFF
            uu = 0
            if eg != 0:
                uu = ((x & 0x7FFFFF) | 0x800000) << 6
                if (x >> 31) & 1:
                    uu = 0 - uu
            align2(uu, eg, tt, te)
            uu = uu + tt                                                    #!chk uu
            x = 0
            if uu < 0:
                x = sx
                uu = 0 - uu
            if uu != 0:
                round24(uu, te)
                if te >= 255:
                    x = x | infb
                elif te >= 1:
                    x = x | (((te - 1) << 23) + uu)
                else:
                    x = 0
            else:
                x = 0


def adam_m():
    """m' = beta1 m + (1 - beta1) d (in _adam_all): two 15 x 15-bit products, aligned and added
    (|s| < 2^31), rounded to 24 bits through the bit-length table BL; stored at a + dmn; s, bm:
    the magnitude and biased exponent of m' (s = 0 for m' = 0), xm2 its bits."""
    # in: a, b1m, BL, D1, dmn, eg, em, infb, K1, KB1, o1m, sx, t, x
    # out: bad, bm, d, gm, kk, s, sb, tg, tm, X, xm2
    gm = ((x >> 9) & 0x3FFF) | 0x4000
    if uint(eg - 1) >= uint(254):
        gm = 0
        if eg == 255:
            bad = 1
    tg = gm * o1m                                                           #!chk tg
    tm = (((t >> 9) & 0x3FFF) | 0x4000) * b1m                               #!chk tm
    if em == 0:
        tm = 0
    d = eg - em + D1
    align_by(d, X, eg + K1, em + KB1, tg, tm)
    if (x ^ t) & sx:
        s = tm - tg                                                         #!chk s
    else:
        s = tm + tg                                                         #!chk s
    sb = t & sx
    if s < 0:
        s = 0 - s
        sb = sb ^ sx
    bl_round(s, X, bm, xm2, sb)
    ptr32(a + dmn)[0] = xm2


def adam_v():
    """v' = v - (1 - beta2) v + (1 - beta2) d^2 (in _adam_all): v with 24 bits less its share
    (shift S2), plus the d^2 term aligned (< 2^31), rounded as adam_m; xv2: the bits, stored at a + dvn."""
    # in: a, BL, dv, dvn, eg, gm, infb, o2m, Q2, S2
    # out: bad, bv, d, ev, kk, t, tq, tv, X, xv2
    t = ptr32(a + dv)[0]
    ev = t >> 23
    tv = ((t & 0x7FFFFF) | 0x800000) << 6
    tv = tv - (((tv >> 15) * o2m) >> S2)                                    #!chk tv
    if ev == 0:
        tv = 0
    tq = ((gm * gm) >> 15) * o2m                                            #!chk tq
    d = eg + eg + Q2 - ev
    align_by(d, X, ev + d, ev, tq, tv)
    t = tv + tq                                                             #!chk t
    bl_round(t, X, bv, xv2, 0)
    ptr32(a + dvn)[0] = xv2


def adam_decoupled():
    """AdamW's decay (in _adam_all): x = the float32 bits of p - (lr wd) p, p's mantissa with 6
    guard bits less its (lr wd) share (shift wde), normalized and rounded."""
    # in: BL, sx, wde, wdm
    # out: ey, kk, uu, x
    # AdamW: p -= (lr wd) p first, rounded to float32 as the portable update does
    ey = (x >> 23) & 0xFF
    if uint(ey - 1) < uint(254):
        uu = ((x & 0x7FFFFF) | 0x800000) << 6
        uu = uu - (((uu >> 15) * wdm) >> wde)                               #!chk uu
        if uu <= 0:
            uu = 0
            ey = 0
        else:
            round24(uu, ey)
        if ey >= 1:
            x = (x & sx) | (((ey - 1) << 23) + uu)
        else:
            x = 0


def adam_den():
    """den = sqrt(v') + eps' (in _adam_all) when eps' is not below 2^-16 of sqrt(v'): aligned
    and cut to 16 bits; h = the half-exponent it is taken at (den 2^(h - 78))."""
    # in: epse, epsm, xv2
    # out: De, den, h
    # eps' is not below 2^-16 of sqrt(v'): den 2^(h - 78) + eps', 16 bits
    De = h - 78
    if xv2 == 0:
        den = epsm
        De = epse
    elif De >= epse:
        if De - epse <= 30:
            den = den + (epsm >> (De - epse))
    else:
        if epse - De > 30:
            den = epsm
        else:
            den = epsm + (den >> (epse - De))
        De = epse
    while den >= 0x10000:
        den = den >> 1
        De += 1
    h = De + 78


def adam_general():
    """p' = p - step (in _adam_all) when the step is not small against p (or p is 0): both as
    signed 30-bit values aligned to the larger exponent, the difference normalized by loops,
    overflow to inf (bad = 1), underflow to 0; stored at a + dpn. ep: p's biased exponent."""
    # in: a, BL, dpn, ep, infb, q, sx, x, xm2
    # out: bad, kk, sb, t, tt, uu, X
    uu = 0
    if ep != 0:
        uu = ((x & 0x7FFFFF) | 0x800000) << 6
        if (x >> 31) & 1:
            uu = 0 - uu
    tt = q << 13                                                            #!chk tt
    if (xm2 >> 31) & 1:
        tt = 0 - tt
    X = X - 13
    align2(uu, ep, tt, X)
    t = uu - tt                                                             #!chk t
    sb = 0
    if t < 0:
        sb = sx
        t = 0 - t
    if t == 0:
        ptr32(a + dpn)[0] = 0
    else:
        round24(t, X)
        if X >= 255:
            bad = 1
            ptr32(a + dpn)[0] = sb | infb
        elif X <= 0:
            ptr32(a + dpn)[0] = 0
        else:
            ptr32(a + dpn)[0] = sb | (((X - 1) << 23) + t)



def adam_load():
    """The step's constants from the int array _AM (in _adam_all): exponents sign-extended (sx)."""
    # in: _AM, _AM_B1, _AM_CE, _AM_CM, _AM_DEC, _AM_E0, _AM_EPE, _AM_EPM, _AM_K1, _AM_KB1, _AM_O1
    # in: _AM_O2, _AM_Q2, _AM_S2, _AM_WDE, _AM_WDM, sx
    # out: b1m, C, CE, cm, dec, E0, epse, epsm, K1, KB1, o1m, o2m, Q2, S2, wde, wdm
    C = ptr32(_AM)
    am_common(C)
    K1 = (C[_AM_K1] ^ sx) - sx
    o2m = C[_AM_O2]
    S2 = C[_AM_S2]
    Q2 = (C[_AM_Q2] ^ sx) - sx
    cm = C[_AM_CM]
    CE = (C[_AM_CE] ^ sx) - sx
    epsm = C[_AM_EPM]
    epse = (C[_AM_EPE] ^ sx) - sx
    E0 = (C[_AM_E0] ^ sx) - sx
    dec = C[_AM_DEC]



def adam_pfast():
    """p' = p - step (in _adam_all, _sgd_all), step = q 2^(X - 156) with the sign of xm2, when
    the step is small against p: p's mantissa with 6 guard bits, the step aligned to it (< 2^30),
    rounded through BL and stored at a + dpn, done = 1; a non-finite p is passed on, flags the
    tensor, done = 1; else done = 0: p' is adam_general's. ep: p's biased exponent."""
    # in: a, BL, dpn, q, sx, x, X, xm2
    # out: bad, done, en, ep, kk, sh, t
    done = 0
    ep = (x >> 23) & 0xFF
    sh = X - ep
    if uint(ep - 1) < uint(254) and sh <= 14:
        if sh >= 0:
            t = q << sh                                         #!chk t
        elif sh < -30:
            t = 0
        else:
            t = q >> (0 - sh)
        if (x ^ xm2) & sx:
            t = (((x & 0x7FFFFF) | 0x800000) << 6) + t          #!chk t
        else:
            t = (((x & 0x7FFFFF) | 0x800000) << 6) - t
        kk = BL[(t >> 23) & 0x1FF]
        if kk <= 6:
            t = ((t >> kk) + 1) >> 1
            en = ep + kk - 5                # the new exponent (ep stays p's)
            if uint(en - 1) < uint(253):
                ptr32(a + dpn)[0] = (x & sx) | (((en - 1) << 23) + t)
                done = 1
    elif ep == 255:
        bad = 1
        ptr32(a + dpn)[0] = x
        done = 1


def round24(v, e, kk):
    """v 2^(e - 156), 0 < v < 2^31, rounded once to nearest (ties up) to v 2^(e - 150) with
    2^23 <= v <= 2^24 (2^24 when the rounding carries: pack as ((e - 1) << 23) + v); the bit length
    from the table BL (one rounding, not one per shift)."""
    # in: BL
    kk = BL[v >> 23]
    if kk <= 6:
        v = ((v >> kk) + 1) >> 1
        e = e + kk - 5
    else:
        e = e - 6
        while v < 0x800000:
            v = v << 1
            e -= 1


def copy4(a, off, end, n):
    """n words from address a to a + off, four per turn through a moving address (constant
    offsets index it: a quarter of an indexed loop's instructions), then the rest one by one."""
    end = a + 4 * (n - (n & 3))
    while a < end:
        ptr32(a + off)[0] = ptr32(a)[0]
        ptr32(a + off)[1] = ptr32(a)[1]
        ptr32(a + off)[2] = ptr32(a)[2]
        ptr32(a + off)[3] = ptr32(a)[3]
        a += 16
    end = end + 4 * (n & 3)
    while a < end:
        ptr32(a + off)[0] = ptr32(a)[0]
        a += 4


def opt_tensor():
    """The whole-step kernels' walk to tensor k of params: weight pd and gradient gd sized (fits as
    opt_sizes, 0 past the shadow's room), offsets dp, dg from m0, addresses a .. end; bad = 0."""
    # in: k, m0, NONE, params, SEEN, total, useseen
    # out: a, bad, dg, dp, end, fits, gd, kk, n, o, pair, pd
    pair = params[k]
    pd = pair[0].data
    gd = pair[1].data
    opt_sizes()
    if o + n > total:
        fits = 0
    dp = int(ptr32(pd)) - m0 - 4 * o
    dg = dp
    if fits == 1:                       # (gd None: the kernel stops, STEP_FROZEN)
        dg = int(ptr32(gd)) - m0 - 4 * o
    a = m0 + 4 * o
    end = a + 4 * n
    o += n
    bad = 0


def opt_unchanged():
    """p' = p (x), bit for bit, for a step of 0; a non-finite p flags the tensor."""
    # in: a, dpn, x
    # out: bad
    ptr32(a + dpn)[0] = x
    if ((x >> 23) & 0xFF) == 255:
        bad = 1


def align2(a, ea, b, eb):
    """a 2^ea and b 2^eb brought to the larger exponent, held in eb: the smaller one shifted right
    (to 0 past 30 places)."""
    if ea >= eb:
        if ea - eb > 30:
            b = 0
        else:
            b = b >> (ea - eb)
        eb = ea
    elif eb - ea > 30:
        a = 0
    else:
        a = a >> (eb - ea)


def am_common(C):
    """The constants Adam's and SGD's elements share, from their int array C (exponents
    sign-extended with sx): beta1 (o1m, b1m, KB1) and the weight decay (wdm, wde)."""
    # in: _AM_B1, _AM_KB1, _AM_O1, _AM_WDE, _AM_WDM, sx
    # out: b1m, KB1, o1m, wde, wdm
    o1m = C[_AM_O1]
    b1m = C[_AM_B1]
    KB1 = (C[_AM_KB1] ^ sx) - sx
    wdm = C[_AM_WDM]
    wde = (C[_AM_WDE] ^ sx) - sx


def align_by(d, X, XA, XB, a, b):
    """Two terms a, b whose exponents differ by d (a's minus b's, as the caller defines it): for
    d >= 0 the exponent X = XA and b shifted right by d, else X = XB and a by -d (to 0 past 30)."""
    if d >= 0:
        X = XA
        if d > 30:
            b = 0
        else:
            b = b >> d
    else:
        X = XB
        if d < -30:
            a = 0
        else:
            a = a >> (0 - d)


def bl_round(s, X, bm, out, sg):
    """out = the float32 bits of sg | s 2^(X - ...), s >= 0 rounded to 24 bits through the
    bit-length table BL (s shifted right: one rounding; shifted left: exact); bm its biased
    exponent (0: zero or flushed, s = 0 then); an overflow is +-inf and flags the tensor (bad)."""
    # in: BL, infb
    # out: bad, kk
    kk = BL[s >> 23]
    if kk <= 6:                         # (out and bm set on every path, none twice: it is hot)
        s = ((s >> kk) + 1) >> 1
        bm = X + kk - 5
        if uint(bm - 1) < uint(253):
            out = sg | (((bm - 1) << 23) + s)
        elif bm > 0:
            out = sg | infb
            bad = 1
        else:
            s = 0
            out = 0
    elif s != 0:
        bm = X - 6
        while s < 0x800000:
            s = s << 1
            bm -= 1
        out = sg | (((bm - 1) << 23) + s)
        if bm < 1:
            s = 0
            out = 0
    else:
        out = 0
        bm = 0


# ---- _q8's parts (the int8-weight GEMM, gemm.py) ----------------------------------------------
def q8_drow():
    """_q8's Q8_DINP row m: g_n = dout[m, n] scale[n] from 15-bit mantissas (<= 2^30, [B6]),
    normalized to [2^29, 2^30], then cut to 14 bits of the row's largest: S[n] (signed), so that
    g_n ~= S[n] 2^(pm + 16); S[KT + n] holds the exponents meanwhile."""
    # in: KT, m, OC, pa, psc, S, sgn, top
    # out: g, ge, n, pm, sg, sh, x, xe, xm, y, ye, ym
    pm = 0 - 100000
    for n in range(KT):
        x = pa[m * OC + n]
        decode(x, xm, xe)
        y = psc[n]
        ye = (y >> 23) & 0xFF
        g = 0
        ge = 0
        if xe != 0 and ye != 0:
            sg = 0
            if xm < 0:
                sg = 1
                xm = 0 - xm
            ym = (y & 0x7FFFFF) | 0x800000
            if ye == 255:
                ym = 0xFFFFFF
                ye = 254
            g = ((xm + 256) >> 9) * ((ym + 256) >> 9)           #!chk g
            ge = xe - 141 + ye - 141
            norm30(g, ge)
            if ge > pm:
                pm = ge
            if sg:
                g = 0 - g
        S[n] = g
        S[KT + n] = ge
    for n in range(KT):
        g = (S[n] ^ sgn) - sgn
        if g != 0:
            sh = pm - ((S[KT + n] ^ sgn) - sgn) + 16
            sg = 0
            if g < 0:
                sg = 1
                g = 0 - g
            rsh(g, sh)
            if sg:
                g = 0 - g
            S[n] = g


def q8_dot(acc):
    """acc = S[0 : KT] . the int8 weight terms of output r (pw from r * wr, step wk; ptr8 loads
    zero-extend: sign-extended here), in chunks of 8 products (|t| < 2^24) shifted right by sh8
    (rounded, rh) [B6]."""
    # in: KT, pw, r, rh, S, sgn, sh8, wk, wr
    # out: k, kend, t, wi, x
    acc = 0
    wi = r * wr
    k = 0
    while k < KT:
        kend = k + 8
        if kend > KT:
            kend = KT
        t = 0
        while k < kend:
            x = pw[wi]
            t += ((S[k] ^ sgn) - sgn) * ((x ^ 0x80) - 0x80)
            wi += wk
            k += 1
        acc += (t + rh) >> sh8                                  #!chk acc


def q8_scale(acc, e):
    """acc * 2^e times scale[r] (float32 bits at psc[r]): acc rounded to 15 bits, the scale's
    24-bit mantissa to 15 bits, so |acc| <= 2^30 after [B6]; a zero scale gives 0."""
    # in: psc, r
    # out: d, sg, y, ye, ym
    y = psc[r]
    ye = (y >> 23) & 0xFF
    if ye == 0:
        acc = 0
    else:
        ym = (y & 0x7FFFFF) | 0x800000
        if ye == 255:
            ym = 0xFFFFFF
            ye = 254
        sg = 0
        if acc < 0:
            sg = 1
            acc = 0 - acc
        d = 0
        while (acc >> d) >= 0x8000:
            d += 1
        if d > 0:
            acc = (acc + (1 << (d - 1))) >> d
        acc = acc * ((ym + 256) >> 9)                       #!chk acc
        e = e + d + ye - 141
        if sg:
            acc = 0 - acc


def opt_sizes():
    """n = the size of tensor k's weight pd and gradient gd (fits = 0 when they differ, -1 when gd is
    None, else 1).
    SEEN is the optimizer's record [weight data, grad data, n] per tensor of the buffers an
    earlier step checked (used when useseen != 0, else every size is checked): the same objects
    skip the two len() calls (an array cannot shrink), others are checked and recorded."""
    # in: gd, k, NONE, pd, SEEN, useseen
    # out: fits, kk, n
    fits = 1
    kk = k + k + k
    if useseen and pd is SEEN[kk] and gd is SEEN[kk + 1]:
        n = int(SEEN[kk + 2])
    elif gd is NONE:                    # a frozen parameter (fits -1: STEP_FROZEN)
        n = 0
        fits = -1
    else:
        n = int(len(pd))
        if int(len(gd)) != n:
            fits = 0
        elif useseen:
            SEEN[kk] = pd
            SEEN[kk + 1] = gd
            SEEN[kk + 2] = n


# ---- _gemm's pieces of B rows (after the others: their line numbers stay) -----------------------
def gemm_piece():
    """rp, the B rows per piece (PIECES in gemm.py): all NB rows when they fit in the scratch s
    (taken as the larger of _PIECE ints and A's M rows of KT4 when smaller) or when they are kept
    (MM_FORWARD with u = 1: the caller's own scratch holds them whole), else as many as fit, at
    least one."""
    # in: _PIECE, KT4, kind, M, MM_FORWARD, N, NB, s, u
    # out: room, rp
    rp = NB
    if kind != MM_FORWARD or u == 0:
        room = int(len(s))
        if room < _PIECE:
            room = _PIECE
        if room < M * KT4:
            room = M * KT4
        if NB * (KT4 + 1) + KT4 + N + N > room:
            rp = (room - KT4 - N - N) // (KT4 + 1)
            if rp < 1:
                rp = 1


def gemm_bpiece():
    """The B rows n0 <= n < n1 quantized into S[(n - n0) * KT4 ...] (block = row n, KT values; see
    kernels_viper.py), their exponents at S[xn + n], unless kept (same); row N is the ones row of
    a fused bias gradient (1.0 quantized: 2^23 >> 10 with exponent 127)."""
    # in: bb, bsk, bsn, KT, KT4, lim, N, n0, n1, P, pb, S, sa, same, xn
    # out: base, e, elo, emax, i0, k, n, q, qa, qb, sh, st4, v
    qb = ptr32(sa)
    for n in range(n0, n1):
        if same:
            break
        if n == N:
            for k in range(KT):
                qb[0] = 8192
                qb = ptr32(uint(qb) + 4)
            emax = 127
        else:
            i0 = bb + n * bsn
            quantize(pb, bsk)
        for k in range(KT, KT4):
            qb[0] = 0
            qb = ptr32(uint(qb) + 4)
        S[xn + n] = emax
