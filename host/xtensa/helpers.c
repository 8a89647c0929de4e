// The libgcc helpers GCC 13 calls for this core (the ESP32-S3 without mulsh/muluh/recip0.s):
// float division, float<->double conversions and 64-bit integer multiply/divide. Debian's libgcc
// for xtensa-lx106-elf is built for the call0 ABI and cannot be linked into windowed code, so
// these are written here in integer C (no float, no 64-bit division: nothing that would call a
// helper again). Each rounds to nearest, ties to even, as IEEE 754 and x86's SSE do, so results
// equal the 32-bit unix port's. Subnormals are handled; NaN results are the default quiet NaN.
#include <stdint.h>

typedef union {
    float f;
    uint32_t u;
} fbits_t;

typedef union {
    double d;
    uint64_t u;
} dbits_t;

#define F_NAN 0x7fc00000u

uint64_t __umulsidi3(uint32_t a, uint32_t b);
uint64_t __udivdi3(uint64_t n, uint64_t d);
uint64_t __umoddi3(uint64_t n, uint64_t d);
int64_t __divdi3(int64_t n, int64_t d);
int64_t __moddi3(int64_t n, int64_t d);
float __divsf3(float a, float b);
double __extendsfdf2(float a);
float __truncdfsf2(double a);

// 32 x 32 -> 64 from four 16 x 16 products (this core has mull but not muluh)
uint64_t __umulsidi3(uint32_t a, uint32_t b) {
    uint32_t al = a & 0xffff, ah = a >> 16, bl = b & 0xffff, bh = b >> 16;
    uint32_t ll = al * bl, lh = al * bh, hl = ah * bl, hh = ah * bh;
    uint32_t mid = (ll >> 16) + (lh & 0xffff) + (hl & 0xffff);
    uint32_t lo = (ll & 0xffff) | (mid << 16);
    uint32_t hi = hh + (lh >> 16) + (hl >> 16) + (mid >> 16);
    return ((uint64_t)hi << 32) | lo;
}

static uint64_t udivmod64(uint64_t n, uint64_t d, uint64_t *rem) {
    if (d == 0) {
        // as x86 would trap; MicroPython checks for zero before dividing
        *rem = n;
        return ~(uint64_t)0;
    }
    if ((n >> 32) == 0 && (d >> 32) == 0) {
        uint32_t n32 = (uint32_t)n, d32 = (uint32_t)d;
        *rem = n32 % d32;
        return n32 / d32;
    }
    uint64_t q = 0, r = 0;
    for (int i = 63; i >= 0; i--) {
        r = (r << 1) | ((n >> i) & 1);
        if (r >= d) {
            r -= d;
            q |= (uint64_t)1 << i;
        }
    }
    *rem = r;
    return q;
}

uint64_t __udivdi3(uint64_t n, uint64_t d) {
    uint64_t r;
    return udivmod64(n, d, &r);
}

uint64_t __umoddi3(uint64_t n, uint64_t d) {
    uint64_t r;
    udivmod64(n, d, &r);
    return r;
}

int64_t __divdi3(int64_t n, int64_t d) {
    uint64_t r;
    uint64_t un = n < 0 ? -(uint64_t)n : (uint64_t)n;
    uint64_t ud = d < 0 ? -(uint64_t)d : (uint64_t)d;
    uint64_t q = udivmod64(un, ud, &r);
    return ((n < 0) != (d < 0)) ? -(int64_t)q : (int64_t)q;
}

int64_t __moddi3(int64_t n, int64_t d) {
    uint64_t r;
    uint64_t un = n < 0 ? -(uint64_t)n : (uint64_t)n;
    uint64_t ud = d < 0 ? -(uint64_t)d : (uint64_t)d;
    udivmod64(un, ud, &r);
    return n < 0 ? -(int64_t)r : (int64_t)r;
}

// Round the significand q (with 2 extra low bits) and a sticky flag to a float of biased exponent
// e (the exponent of q's leading bit at bit 25); handles overflow and subnormal results.
static uint32_t round_pack(uint32_t sign, int e, uint32_t q, uint32_t sticky) {
    int s = 2;
    int enc_e = e;
    if (e < 1) {
        s = 2 + 1 - e;
        enc_e = 0;
    }
    uint32_t mant, rb, st;
    if (s > 27) {
        mant = 0;
        rb = 0;
        st = 1;
    } else {
        mant = q >> s;
        rb = (q >> (s - 1)) & 1;
        st = ((q & ((1u << (s - 1)) - 1)) != 0) | sticky;
    }
    if (rb && (st || (mant & 1))) {
        mant++;
    }
    uint32_t enc = enc_e ? ((uint32_t)(enc_e - 1) << 23) + mant : mant;
    if (enc >= 0x7f800000u || enc_e >= 255) {
        return sign | 0x7f800000u;
    }
    return sign | enc;
}

float __divsf3(float a, float b) {
    fbits_t x = { .f = a }, y = { .f = b }, r;
    uint32_t sign = (x.u ^ y.u) & 0x80000000u;
    int ea = (x.u >> 23) & 0xff, eb = (y.u >> 23) & 0xff;
    uint32_t ma = x.u & 0x7fffff, mb = y.u & 0x7fffff;
    if (ea == 255) {
        r.u = (ma || eb == 255) ? F_NAN : sign | 0x7f800000u;
        return r.f;
    }
    if (eb == 255) {
        r.u = mb ? F_NAN : sign;
        return r.f;
    }
    if (eb == 0 && mb == 0) {
        r.u = (ea == 0 && ma == 0) ? F_NAN : sign | 0x7f800000u;
        return r.f;
    }
    if (ea == 0 && ma == 0) {
        r.u = sign;
        return r.f;
    }
    if (ea == 0) {
        ea = 1;
        while (!(ma & 0x800000)) {
            ma <<= 1;
            ea--;
        }
    } else {
        ma |= 0x800000;
    }
    if (eb == 0) {
        eb = 1;
        while (!(mb & 0x800000)) {
            mb <<= 1;
            eb--;
        }
    } else {
        mb |= 0x800000;
    }
    int e = ea - eb + 127;
    if (ma < mb) {
        ma <<= 1;
        e--;
    }
    uint32_t q = 0, rem = ma;
    for (int i = 0; i < 26; i++) {
        q <<= 1;
        if (rem >= mb) {
            rem -= mb;
            q |= 1;
        }
        rem <<= 1;
    }
    r.u = round_pack(sign, e, q, rem != 0);
    return r.f;
}

double __extendsfdf2(float a) {
    fbits_t x = { .f = a };
    dbits_t r;
    uint64_t sign = (uint64_t)(x.u >> 31) << 63;
    int e = (x.u >> 23) & 0xff;
    uint32_t m = x.u & 0x7fffff;
    if (e == 255) {
        r.u = sign | 0x7ff0000000000000ull | ((uint64_t)m << 29) | (m ? 0x0008000000000000ull : 0);
    } else if (e == 0) {
        if (m == 0) {
            r.u = sign;
        } else {
            int de = 1;
            while (!(m & 0x800000)) {
                m <<= 1;
                de--;
            }
            m &= 0x7fffff;
            r.u = sign | ((uint64_t)(de - 127 + 1023) << 52) | ((uint64_t)m << 29);
        }
    } else {
        r.u = sign | ((uint64_t)(e - 127 + 1023) << 52) | ((uint64_t)m << 29);
    }
    return r.d;
}

float __truncdfsf2(double a) {
    dbits_t x = { .d = a };
    fbits_t r;
    uint32_t sign = (uint32_t)(x.u >> 32) & 0x80000000u;
    int e = (int)((x.u >> 52) & 0x7ff);
    uint64_t m = x.u & 0xfffffffffffffull;
    if (e == 0x7ff) {
        r.u = m ? F_NAN : sign | 0x7f800000u;
        return r.f;
    }
    if (e == 0) {
        // double subnormals are far below float's range: +-0
        r.u = sign | (m != 0 ? 0 : 0);
        if (m != 0) {
            // rounds to zero (never to the smallest float subnormal)
        }
        return r.f;
    }
    int fe = e - 1023 + 127;
    // q: implicit bit + 52 fraction bits -> keep 26 bits (leading bit at 25), rest sticky
    uint64_t full = m | (1ull << 52);
    uint32_t q = (uint32_t)(full >> 27);
    uint32_t sticky = (full & ((1ull << 27) - 1)) != 0;
    if (fe > 254 + 1) {
        r.u = sign | 0x7f800000u;
        return r.f;
    }
    if (fe < -30) {
        r.u = sign;
        return r.f;
    }
    r.u = round_pack(sign, fe, q, sticky);
    return r.f;
}

// 64-bit shifts, byte swaps, population count. Built without optimisation: GCC recognises these
// idioms and would compile them into calls to the very helper being defined.
#define NO_IDIOM __attribute__((optimize("O0")))
uint64_t __ashldi3(uint64_t a, int n);
uint64_t __lshrdi3(uint64_t a, int n);
int64_t __ashrdi3(int64_t a, int n);
uint32_t __bswapsi2(uint32_t a);
uint64_t __bswapdi2(uint64_t a);
int __popcountsi2(uint32_t a);

typedef union {
    uint64_t u;
    struct {
        uint32_t lo, hi;
    } w;
} dw_t;

NO_IDIOM uint64_t __ashldi3(uint64_t a, int n) {
    dw_t x = { .u = a }, r;
    if (n == 0) {
        return a;
    }
    if (n >= 32) {
        r.w.lo = 0;
        r.w.hi = x.w.lo << (n - 32);
    } else {
        r.w.lo = x.w.lo << n;
        r.w.hi = (x.w.hi << n) | (x.w.lo >> (32 - n));
    }
    return r.u;
}

NO_IDIOM uint64_t __lshrdi3(uint64_t a, int n) {
    dw_t x = { .u = a }, r;
    if (n == 0) {
        return a;
    }
    if (n >= 32) {
        r.w.hi = 0;
        r.w.lo = x.w.hi >> (n - 32);
    } else {
        r.w.hi = x.w.hi >> n;
        r.w.lo = (x.w.lo >> n) | (x.w.hi << (32 - n));
    }
    return r.u;
}

NO_IDIOM int64_t __ashrdi3(int64_t a, int n) {
    dw_t x = { .u = (uint64_t)a }, r;
    if (n == 0) {
        return a;
    }
    if (n >= 32) {
        r.w.hi = (uint32_t)((int32_t)x.w.hi >> 31);
        r.w.lo = (uint32_t)((int32_t)x.w.hi >> (n - 32));
    } else {
        r.w.hi = (uint32_t)((int32_t)x.w.hi >> n);
        r.w.lo = (x.w.lo >> n) | (x.w.hi << (32 - n));
    }
    return (int64_t)r.u;
}

NO_IDIOM uint32_t __bswapsi2(uint32_t a) {
    return (a >> 24) | ((a >> 8) & 0xff00) | ((a << 8) & 0xff0000) | (a << 24);
}

NO_IDIOM uint64_t __bswapdi2(uint64_t a) {
    dw_t x = { .u = a }, r;
    r.w.lo = __bswapsi2(x.w.hi);
    r.w.hi = __bswapsi2(x.w.lo);
    return r.u;
}

NO_IDIOM int __popcountsi2(uint32_t a) {
    a = a - ((a >> 1) & 0x55555555u);
    a = (a & 0x33333333u) + ((a >> 2) & 0x33333333u);
    a = (a + (a >> 4)) & 0x0f0f0f0fu;
    return (int)((a * 0x01010101u) >> 24);
}

// the few libm functions lib/libm leaves to the C library
float fabsf(float x);
float copysignf(float x, float y);
float nanf(const char *tag);

float fabsf(float x) {
    fbits_t b = { .f = x };
    b.u &= 0x7fffffffu;
    return b.f;
}

float copysignf(float x, float y) {
    fbits_t a = { .f = x }, b = { .f = y };
    a.u = (a.u & 0x7fffffffu) | (b.u & 0x80000000u);
    return a.f;
}

float nanf(const char *tag) {
    (void)tag;
    fbits_t b = { .u = F_NAN };
    return b.f;
}
