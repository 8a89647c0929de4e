// mf_native: the hot kernels of lib/microformer/kernels.py in C, as a MicroPython dynamic native
// module (natmod). Same names, same arguments (outputs first, inputs, sizes last) as the portable
// kernels; lib/microformer/kernels_native.py binds them as the 'native' backend and lists the
// kernels that stay portable.
//
// NUMBERS. Plain float32 arithmetic (the FPU where the target has one), no fused multiply-add
// (-ffp-contract=off), no reassociation by the compiler: every sum is added in the order written
// here, so the x64 and x86 builds give the same bits, and xtensawin too except where it divides
// (no divide instruction the compiler uses there: div_, within 2 ulp). Sums of products (dot) keep four
// partial sums (lane l takes the terms i = l mod 4), added as (s0 + s1) + (s2 + s3) at the end,
// then the tail in order; on x86 / x64 the four lanes are one SSE register.
//
// ERROR BOUNDS against exact arithmetic on the float32 inputs (u = 2^-24, the unit roundoff):
//   sums and dot products of K terms (GEMM, attention scores, A.V, pooling, LayerNorm's
//   statistics, the weight and bias gradients): |err| <= (K/4 + 3) * 2u * sum |a_i b_i| (the
//   partial sums have K/4 terms); the portable backend's sequential float32 sums have
//   K 2u sum |a_i b_i|, so the two agree within (5K/4 + 3) 2u sum |a_i b_i|: 1e-5 of sum |a_i b_i|
//   for K <= 60, 4e-5 for K = 256.
//   exp_ (softmax, cross-entropy, GELU's erfc, sigmoid, tanh): 4u relative (Cody-Waite reduction,
//   degree-7 Taylor on |r| <= ln2/2, 2^n by bits); log_ (cross-entropy): 4u relative for z >= 1.
//   softmax weights: (2 |s - max| + 8) 2u w relative to the weight w itself.
//   cross-entropy: loss within (2 |logit| max + 8) 2u B of the float64 value; dlogits 8u / B.
//   GELU: erfc by Numerical Recipes' Chebyshev fit (relative error 1.2e-7 for every z >= 0) times
//   exp_(-z^2) (whose argument carries 2u z^2): relative 2e-7 + 2u x^2 / 2 per element (1e-6 at
//   |x| = 4); GELU-tanh, sigmoid: 8u relative; tanh: 8u relative.
//   Adam: m, v, p within 4u of each term; sqrt and / are correctly rounded (x86: sqrtss, divss).
//   LayerNorm: mean and variance as sums above, then elementwise 4u.
// Each bound is checked against tests/oracles/reference.py (float64 math) and the portable kernels in
// tests/mp/test_native.py on both unix ports.
//
// NATMOD RULES (docs/develop/natmod.rst; the ESP32-S3 runs a module's code and read-only data
// from IRAM): no initialised .data (nothing but constants and the function objects, which the
// firmware reads as words), no byte or halfword loads from the module's own memory (error
// messages are interned strings, built by kernels_native._err from names), no libgcc or libm:
// exp, log, erfc, tanh and sqrt are written here. host/native/check_elf.py checks the sections and
// the undefined symbols of every build.
#include "py/dynruntime.h"

typedef unsigned int u32;

// ------------------------------------------------------------------ errors and arguments
// A bad buffer or size calls kernels_native._err(kernel, argument, needed, got) (stored in this
// module's globals as _err), which raises a ValueError naming both; without it ValueError(kernel).

static void bad(mp_obj_fun_bc_t *self, qstr kern, qstr arg, mp_int_t need, mp_int_t got) {
    mp_obj_t g = MP_OBJ_FROM_PTR(self->context->module.globals);
    mp_obj_t dest[2];
    mp_obj_t key = MP_OBJ_NEW_QSTR(MP_QSTR__err);
    mp_obj_t hook = mp_const_none;
    mp_load_method_maybe(g, MP_QSTR_get, dest);
    if (dest[0] != MP_OBJ_NULL) {
        mp_obj_t a[2] = {dest[1], key};
        hook = mp_call_function_n_kw(dest[0], 2, 0, a);
    }
    if (hook != mp_const_none) {
        mp_obj_t a[4] = {MP_OBJ_NEW_QSTR(kern), MP_OBJ_NEW_QSTR(arg), mp_obj_new_int(need), mp_obj_new_int(got)};
        mp_call_function_n_kw(hook, 4, 0, a);
    }
    mp_raise_type_arg(&mp_type_ValueError, MP_OBJ_NEW_QSTR(kern));
}

// a float32 buffer (array('f') or a memoryview of one) holding at least `need` floats
static float *fbuf(mp_obj_fun_bc_t *self, mp_obj_t o, mp_int_t need, qstr kern, qstr arg) {
    mp_buffer_info_t bi;
    if (!mp_get_buffer(o, &bi, MP_BUFFER_RW) || bi.typecode != 'f') {
        bad(self, kern, arg, need, -1);
    }
    if ((mp_int_t)(bi.len / 4) < need) {
        bad(self, kern, arg, need, bi.len / 4);
    }
    return (float *)bi.buf;
}

// the same, or NULL for None
static float *fbuf_opt(mp_obj_fun_bc_t *self, mp_obj_t o, mp_int_t need, qstr kern, qstr arg) {
    return o == mp_const_none ? NULL : fbuf(self, o, need, kern, arg);
}

// a byte buffer (bytes, bytearray) of at least `need` bytes, or NULL for None
static const unsigned char *bbuf_opt(mp_obj_fun_bc_t *self, mp_obj_t o, mp_int_t need, qstr kern, qstr arg) {
    mp_buffer_info_t bi;
    if (o == mp_const_none) {
        return NULL;
    }
    if (!mp_get_buffer(o, &bi, MP_BUFFER_READ)) {
        bad(self, kern, arg, need, -1);
    }
    if ((mp_int_t)bi.len < need) {
        bad(self, kern, arg, need, bi.len);
    }
    return (const unsigned char *)bi.buf;
}

static mp_int_t size_arg(mp_obj_fun_bc_t *self, mp_obj_t o, qstr kern, qstr arg) {
    mp_int_t v = mp_obj_get_int(o);
    if (v < 0) {
        bad(self, kern, arg, -2, v);
    }
    return v;
}

static void nargs(mp_obj_fun_bc_t *self, size_t n_args, size_t n_kw, size_t want, qstr kern) {
    if (n_args != want || n_kw) {
        bad(self, kern, MP_QSTR_arguments, want, n_args + n_kw);
    }
}

static mp_obj_t item(mp_obj_t seq, mp_int_t i) {
    return mp_obj_subscr(seq, MP_OBJ_NEW_SMALL_INT(i), MP_OBJ_SENTINEL);
}

#define F(i, need, q) fbuf(self, args[i], (need), KN, q)
#define FO(i, need, q) fbuf_opt(self, args[i], (need), KN, q)
#define SZ(i, q) size_arg(self, args[i], KN, q)
#define KERNEL(fn) static mp_obj_t fn(mp_obj_fun_bc_t *self, size_t n_args, size_t n_kw, mp_obj_t *args)

// ------------------------------------------------------------------ float helpers

static inline u32 bits(float x) {
    union { float f; u32 u; } c;
    c.f = x;
    return c.u;
}

static inline float from_bits(u32 u) {
    union { float f; u32 u; } c;
    c.u = u;
    return c.f;
}

static inline int finite(float x) {
    return (bits(x) & 0x7f800000u) != 0x7f800000u;
}

static inline float fabs_(float x) {
    return from_bits(bits(x) & 0x7fffffffu);
}

#if (defined(__i386__) || defined(__x86_64__)) && !defined(MF_SCALAR)
#define HAVE_SSE 1
typedef float v4 __attribute__((vector_size(16), aligned(4)));
static inline float sqrt_(float x) {
    return __builtin_sqrtf(x);          // sqrtss (-fno-math-errno): correctly rounded
}
#else
#define HAVE_SSE 0
// correctly rounded square root of a float32, in integers (no FPU square root needed)
static float sqrt_(float x) {
    u32 u = bits(x);
    if (u >= 0x7f800000u) {             // negative (sign set), inf or NaN
        return (u == 0x7f800000u) ? x : (u == 0x80000000u ? x : from_bits(0x7fc00000u));
    }
    if (u == 0) {
        return x;
    }
    int e = (int)(u >> 23);
    u32 m = u & 0x7fffffu;
    if (e == 0) {                       // subnormal: normalise
        while (!(m & 0x800000u)) {
            m <<= 1;
            e -= 1;
        }
        e += 1;
        m &= 0x7fffffu;
    }
    m |= 0x800000u;
    e -= 127;
    if (e & 1) {                        // x = m 2^(e - 23): make the exponent even
        m <<= 1;
    }
    e >>= 1;
    // q = floor(sqrt(m 2^25)), 25 bits (m 2^25 in [2^48, 2^50)), bit by bit on pairs of the radicand
    u32 q = 0, r = 0;
    unsigned long long rad = (unsigned long long)m << 25;
    for (int i = 49; i >= 1; i -= 2) {
        r = (r << 2) | (u32)((rad >> (i - 1)) & 3u);
        u32 t = (q << 2) | 1u;
        q <<= 1;
        if (r >= t) {
            r -= t;
            q |= 1u;
        }
    }
    // round the 25 bits to 24 (a tie would need an exact root of 25 odd bits: no float has one)
    q = (q + 1u) >> 1;
    if (q & 0x1000000u) {
        q >>= 1;
        e += 1;
    }
    return from_bits(((u32)(e + 127) << 23) | (q & 0x7fffffu));
}
#endif

// 2^n * x for an int n (x normal, 2^n * x in range or flushing to 0 / inf as float32 does)
static inline float scale2(float x, int n) {
    if (n > 127) {
        x *= from_bits(0x7f000000u);    // 2^127
        n -= 127;
        if (n > 127) {
            n = 127;
        }
    } else if (n < -126) {
        x *= from_bits(0x00800000u);    // 2^-126
        n += 126;
        if (n < -126) {
            n = -126;
        }
    }
    return x * from_bits((u32)(n + 127) << 23);
}

#if HAVE_SSE
#define DIV(a, b) ((a) / (b))           // divss: correctly rounded
#else
// a / b on a core whose compiler calls a library routine for float division (GCC 13 for the
// ESP32-S3 calls __divsf3, which a natmod cannot link): the reciprocal of b's mantissa m in [1, 2)
// from a linear estimate (24/17 - 8/17 m, error <= 1/17) and three Newton steps (1/17 -> 3.5e-3 -> 1.2e-5
// ->
// 1.5e-10), the quotient corrected once with its residual, then scaled by the exponents: within 2
// units in the last place (2e7 random pairs against divss; x86 and x64 divide correctly rounded).
// inf, NaN and 0 as IEEE division.
static float div_(float a, float b) {
    u32 ub = bits(b);
    u32 sign = ub & 0x80000000u;
    int e = (int)((ub >> 23) & 0xff);
    if (e == 0xff || (ub & 0x7fffffffu) == 0 || !finite(a)) {
        // b inf or NaN, b zero, a inf or NaN: the FPU's own answers need no divide
        if (!(a == a) || !(b == b)) {
            return from_bits(0x7fc00000u);
        }
        if (e == 0xff) {                                 // x / inf
            return finite(a) ? from_bits((bits(a) ^ sign) & 0x80000000u) : from_bits(0x7fc00000u);
        }
        if ((ub & 0x7fffffffu) == 0) {                   // x / 0
            return a == 0.0f ? from_bits(0x7fc00000u) : from_bits(((bits(a) ^ sign) & 0x80000000u) | 0x7f800000u);
        }
        return from_bits(bits(a) ^ sign);                 // inf / finite
    }
    int k = 0;
    if (e == 0) {                                        // subnormal b: scale it into the normal range
        ub = bits(b * from_bits(0x4b800000u));           // 2^24
        e = (int)((ub >> 23) & 0xff);
        k = 24;
    }
    if ((bits(a) & 0x7f800000u) == 0) {                  // subnormal (or zero) a: likewise
        a *= from_bits(0x4b800000u);
        k -= 24;
    }
    // in the normalized space: bn = +-m in [1, 2), a normal
    float m = from_bits((ub & 0x007fffffu) | 0x3f800000u);     // |b| = m 2^(e - 127)
    float x = 1.41176471f - 0.47058824f * m;                     // 24/17 - 8/17 m
    x = x * (2.0f - m * x);
    x = x * (2.0f - m * x);
    x = x * (2.0f - m * x);
    float bn = sign ? -m : m;
    float r = sign ? -x : x;
    float q = a * r;
    q += (a - q * bn) * r;
    return scale2(q, k - (e - 127));
}
#define DIV(a, b) div_((a), (b))
#endif

// e^x, 4u relative; e^-inf = 0, e^inf = inf, NaN stays NaN
static float exp_(float x) {
    if (!(x == x)) {
        return x;
    }
    if (x > 88.8f) {
        return from_bits(0x7f800000u);
    }
    if (x < -104.0f) {
        return 0.0f;
    }
    float t = x * 1.44269504f;
    int n = (int)(t + (t < 0.0f ? -0.5f : 0.5f));
    float fn = (float)n;
    float r = (x - fn * 0.693145752f) - fn * 1.42860677e-6f;     // ln2 = hi + lo, hi has 16 bits
    float p = 1.98412698e-4f;                                       // 1/5040
    p = p * r + 1.38888889e-3f;
    p = p * r + 8.33333333e-3f;
    p = p * r + 4.16666667e-2f;
    p = p * r + 1.66666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return scale2(p, n);
}

// e^x - 1 without cancellation near 0 (tanh)
static float expm1_(float x) {
    if (fabs_(x) < 0.35f) {
        float p = 2.48015873e-5f;                                   // 1/8!
        p = p * x + 1.98412698e-4f;
        p = p * x + 1.38888889e-3f;
        p = p * x + 8.33333333e-3f;
        p = p * x + 4.16666667e-2f;
        p = p * x + 1.66666667e-1f;
        p = p * x + 0.5f;
        return (p * x) * x + x;
    }
    return exp_(x) - 1.0f;
}

// ln z for z > 0 (cross-entropy: z >= 1)
static float log_(float z) {
    u32 u = bits(z);
    int e = (int)(u >> 23) - 127;
    float m = from_bits((u & 0x7fffffu) | 0x3f800000u);           // [1, 2)
    if (m > 1.41421356f) {
        m *= 0.5f;
        e += 1;
    }
    float f = m - 1.0f;
    float s = DIV(f, 2.0f + f);
    float s2 = s * s;
    float p = 0.111111111f;                                         // 1/9
    p = p * s2 + 0.142857143f;
    p = p * s2 + 0.2f;
    p = p * s2 + 0.333333333f;
    float lm = 2.0f * s + 2.0f * s * s2 * p;
    float fe = (float)e;
    return fe * 0.693145752f + (fe * 1.42860677e-6f + lm);
}

// erfc(z), relative error 1.2e-7 for z >= 0 (Numerical Recipes' erfcc), 2 - erfc(-z) below 0
static float erfc_(float z) {
    float a = fabs_(z);
    float t = DIV(1.0f, 1.0f + 0.5f * a);
    float p = 0.17087277f;
    p = p * t - 0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t - 1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t - 0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t - 1.26551223f;
    float r = t * exp_(p - a * a);
    return z >= 0.0f ? r : 2.0f - r;
}

// sum_i a[i] b[i], i < n: four partial sums (module header)
static inline float dot(const float *a, const float *b, mp_int_t n) {
    mp_int_t i = 0;
    float s;
    #if HAVE_SSE
    v4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
    for (; i + 4 <= n; i += 4) {
        acc += *(const v4 *)(a + i) * *(const v4 *)(b + i);
    }
    s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    #else
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    s = (s0 + s1) + (s2 + s3);
    #endif
    for (; i < n; i++) {
        s += a[i] * b[i];
    }
    return s;
}

// y[i] += a x[i], i < n
static inline void axpy(float *y, float a, const float *x, mp_int_t n) {
    mp_int_t i = 0;
    #if HAVE_SSE
    v4 va = {a, a, a, a};
    for (; i + 4 <= n; i += 4) {
        *(v4 *)(y + i) += va * *(const v4 *)(x + i);
    }
    #endif
    for (; i < n; i++) {
        y[i] += a * x[i];
    }
}

// ------------------------------------------------------------------ guards, copies, adds

static void zero_n(float *p, mp_int_t n) {
    u32 *q = (u32 *)p;
    for (mp_int_t i = 0; i < n; i++) {
        q[i] = 0;
    }
}

static void copy_n(float *dst, const float *src, mp_int_t n) {
    u32 *d = (u32 *)dst;
    const u32 *s = (const u32 *)src;
    mp_int_t i = 0;
    #if HAVE_SSE
    typedef u32 v4w __attribute__((vector_size(16), aligned(4)));
    for (; i + 4 <= n; i += 4) {
        *(v4w *)(d + i) = *(const v4w *)(s + i);
    }
    #endif
    for (; i < n; i++) {
        d[i] = s[i];
    }
}

static mp_int_t first_bad(const float *p, mp_int_t n) {
    const u32 *q = (const u32 *)p;
    for (mp_int_t i = 0; i < n; i++) {
        if ((q[i] & 0x7f800000u) == 0x7f800000u) {
            return i;
        }
    }
    return -1;
}

#define KN MP_QSTR_zero
KERNEL(k_zero) {
    // zero(buf, n)
    nargs(self, n_args, n_kw, 2, KN);
    mp_int_t n = SZ(1, MP_QSTR_n);
    zero_n(F(0, n, MP_QSTR_buf), n);
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_copy
KERNEL(k_copy) {
    // copy(dst, src, n): bit for bit
    nargs(self, n_args, n_kw, 3, KN);
    mp_int_t n = SZ(2, MP_QSTR_n);
    copy_n(F(0, n, MP_QSTR_dst), F(1, n, MP_QSTR_src), n);
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_first_nonfinite
KERNEL(k_first_nonfinite) {
    // first_nonfinite(buf, n): index of the first NaN or inf, or -1
    nargs(self, n_args, n_kw, 2, KN);
    mp_int_t n = SZ(1, MP_QSTR_n);
    return mp_obj_new_int(first_bad(F(0, n, MP_QSTR_buf), n));
}
#undef KN

// the largest exponent field (0 .. 255) of p[0 .. n): every |x| is below 2^(e - 126); 255 as soon
// as one value is NaN or inf (the optimizer's bound, lib/microformer/optim.py). A subnormal's field
// is 0, as kernels.max_exponent's frexp gives it.
static mp_int_t max_field(const float *p, mp_int_t n, mp_int_t e) {
    const u32 *q = (const u32 *)p;
    for (mp_int_t i = 0; i < n; i++) {
        mp_int_t f = (mp_int_t)((q[i] >> 23) & 0xffu);
        if (f == 255) {
            return 255;
        }
        if (f > e) {
            e = f;
        }
    }
    return e;
}

#define KN MP_QSTR_max_exponent
KERNEL(k_max_exponent) {
    // max_exponent(buf, n): the largest exponent field of buf[0 .. n); 255 for a NaN or inf
    nargs(self, n_args, n_kw, 2, KN);
    mp_int_t n = SZ(1, MP_QSTR_n);
    return mp_obj_new_int(max_field(F(0, n, MP_QSTR_buf), n, 0));
}
#undef KN

#define KN MP_QSTR_max_exponent_pairs
KERNEL(k_max_exponent_pairs) {
    // max_exponent_pairs(params, j): max_exponent over the .data of element j (0: the weights, 1:
    // the gradients) of each (param, grad) pair of Tensors, over .size floats each
    nargs(self, n_args, n_kw, 2, KN);
    mp_int_t j = SZ(1, MP_QSTR_j);
    size_t len;
    mp_obj_t *pairs;
    mp_obj_get_array(args[0], &len, &pairs);
    mp_int_t e = 0;
    for (size_t i = 0; i < len && e < 255; i++) {
        mp_obj_t t = item(pairs[i], j);
        mp_int_t n = size_arg(self, mp_load_attr(t, MP_QSTR_size), KN, MP_QSTR_size);
        e = max_field(fbuf(self, mp_load_attr(t, MP_QSTR_data), n, KN, MP_QSTR_params), n, e);
    }
    return mp_obj_new_int(e);
}
#undef KN

#define KN MP_QSTR_add_forward
KERNEL(k_add_forward) {
    // add_forward(out, a, b, n): out = a + b (out may be a or b)
    nargs(self, n_args, n_kw, 4, KN);
    mp_int_t n = SZ(3, MP_QSTR_n);
    float *out = F(0, n, MP_QSTR_out);
    const float *a = F(1, n, MP_QSTR_a);
    const float *b = F(2, n, MP_QSTR_b);
    for (mp_int_t i = 0; i < n; i++) {
        out[i] = a[i] + b[i];
    }
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_argmax
KERNEL(k_argmax) {
    // argmax(buf, off, n): index i < n of the largest buf[off + i], the first on ties; NaN is never
    // larger (a NaN first element stays the answer, as with `>` comparisons)
    nargs(self, n_args, n_kw, 3, KN);
    mp_int_t off = SZ(1, MP_QSTR_off), n = SZ(2, MP_QSTR_n);
    const float *b = F(0, off + n, MP_QSTR_buf) + off;
    mp_int_t best = 0;
    for (mp_int_t i = 1; i < n; i++) {
        if (b[i] > b[best]) {
            best = i;
        }
    }
    return mp_obj_new_int(best);
}
#undef KN

#define KN MP_QSTR_gather_rows
KERNEL(k_gather_rows) {
    // gather_rows(dst, src, idx, start, B, F): dst row k = src row idx[start + k] (idx: ints)
    nargs(self, n_args, n_kw, 6, KN);
    mp_int_t start = SZ(3, MP_QSTR_start), B = SZ(4, MP_QSTR_B), Fn = SZ(5, MP_QSTR_F);
    mp_buffer_info_t bi;
    float *dst = F(0, B * Fn, MP_QSTR_dst);
    const float *src = F(1, 0, MP_QSTR_src);
    mp_get_buffer_raise(args[1], &bi, MP_BUFFER_READ);
    mp_int_t rows = Fn ? (mp_int_t)(bi.len / 4) / Fn : 0;
    for (mp_int_t k = 0; k < B; k++) {
        mp_int_t i = mp_obj_get_int(item(args[2], start + k));
        if (i < 0 || i >= rows) {
            bad(self, KN, MP_QSTR_idx, rows, i);
        }
        copy_n(dst + k * Fn, src + i * Fn, Fn);
    }
    return mp_const_none;
}
#undef KN

// ------------------------------------------------------------------ GEMM

// out (N, OC) = inp (N, C) . weight (OC, C)^T + bias (OC,) (bias may be NULL)
static void gemm_fwd(float *out, const float *inp, const float *w, const float *bias, mp_int_t N, mp_int_t C, mp_int_t OC) {
    for (mp_int_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float *o = out + n * OC;
        const float *wr = w;
        for (mp_int_t j = 0; j < OC; j++) {
            float s = dot(x, wr, C);
            o[j] = bias ? bias[j] + s : s;
            wr += C;
        }
    }
}

// dinp (N, C) (+)= dout (N, OC) . weight (OC, C); written when acc is 0
static void gemm_dinp(float *dinp, const float *dout, const float *w, mp_int_t N, mp_int_t C, mp_int_t OC, int acc) {
    for (mp_int_t n = 0; n < N; n++) {
        float *d = dinp + n * C;
        const float *g = dout + n * OC;
        if (!acc) {
            zero_n(d, C);
        }
        for (mp_int_t j = 0; j < OC; j++) {
            axpy(d, g[j], w + j * C, C);
        }
    }
}

// dweight (OC, C) += dout^T . inp; dbias (OC,) += sum_n dout (either may be NULL)
static void gemm_dw(float *dw, float *db, const float *dout, const float *inp, mp_int_t N, mp_int_t C, mp_int_t OC) {
    for (mp_int_t n = 0; n < N; n++) {
        const float *g = dout + n * OC;
        if (dw) {
            const float *x = inp + n * C;
            for (mp_int_t j = 0; j < OC; j++) {
                axpy(dw + j * C, g[j], x, C);
            }
        }
        if (db) {
            for (mp_int_t j = 0; j < OC; j++) {
                db[j] += g[j];
            }
        }
    }
}

#define KN MP_QSTR_matmul_forward
KERNEL(k_matmul_forward) {
    // matmul_forward(out, inp, weight, bias, N, C, OC)
    nargs(self, n_args, n_kw, 7, KN);
    mp_int_t N = SZ(4, MP_QSTR_N), C = SZ(5, MP_QSTR_C), OC = SZ(6, MP_QSTR_OC);
    gemm_fwd(F(0, N * OC, MP_QSTR_out), F(1, N * C, MP_QSTR_inp), F(2, OC * C, MP_QSTR_weight), FO(3, OC, MP_QSTR_bias), N, C, OC);
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_matmul_forward_kept
KERNEL(k_matmul_forward_kept) {
    // matmul_forward_kept(out, inp, weight, bias, N, C, OC, keep): keep is unused (nothing to prepare)
    nargs(self, n_args, n_kw, 8, KN);
    mp_int_t N = SZ(4, MP_QSTR_N), C = SZ(5, MP_QSTR_C), OC = SZ(6, MP_QSTR_OC);
    gemm_fwd(F(0, N * OC, MP_QSTR_out), F(1, N * C, MP_QSTR_inp), F(2, OC * C, MP_QSTR_weight), FO(3, OC, MP_QSTR_bias), N, C, OC);
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_matmul_backward
KERNEL(k_matmul_backward) {
    // matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC); None outputs are skipped
    nargs(self, n_args, n_kw, 9, KN);
    mp_int_t N = SZ(6, MP_QSTR_N), C = SZ(7, MP_QSTR_C), OC = SZ(8, MP_QSTR_OC);
    float *dinp = FO(0, N * C, MP_QSTR_dinp);
    float *dw = FO(1, OC * C, MP_QSTR_dweight);
    float *db = FO(2, OC, MP_QSTR_dbias);
    const float *dout = F(3, N * OC, MP_QSTR_dout);
    if (dinp) {
        gemm_dinp(dinp, dout, F(5, OC * C, MP_QSTR_weight), N, C, OC, 0);
    }
    if (dw || db) {
        gemm_dw(dw, db, dout, dw ? F(4, N * C, MP_QSTR_inp) : NULL, N, C, OC);
    }
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_matmul_backward_input
KERNEL(k_matmul_backward_input) {
    // matmul_backward_input(dinp, dout, weight, N, C, OC): dinp written
    nargs(self, n_args, n_kw, 6, KN);
    mp_int_t N = SZ(3, MP_QSTR_N), C = SZ(4, MP_QSTR_C), OC = SZ(5, MP_QSTR_OC);
    gemm_dinp(F(0, N * C, MP_QSTR_dinp), F(1, N * OC, MP_QSTR_dout), F(2, OC * C, MP_QSTR_weight), N, C, OC, 0);
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_matmul_backward_input_acc
KERNEL(k_matmul_backward_input_acc) {
    // matmul_backward_input_acc(dinp, dout, weight, N, C, OC): dinp accumulated
    nargs(self, n_args, n_kw, 6, KN);
    mp_int_t N = SZ(3, MP_QSTR_N), C = SZ(4, MP_QSTR_C), OC = SZ(5, MP_QSTR_OC);
    gemm_dinp(F(0, N * C, MP_QSTR_dinp), F(1, N * OC, MP_QSTR_dout), F(2, OC * C, MP_QSTR_weight), N, C, OC, 1);
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_matmul_backward_weight
KERNEL(k_matmul_backward_weight) {
    // matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC): accumulated; None skipped
    nargs(self, n_args, n_kw, 7, KN);
    mp_int_t N = SZ(4, MP_QSTR_N), C = SZ(5, MP_QSTR_C), OC = SZ(6, MP_QSTR_OC);
    float *dw = FO(0, OC * C, MP_QSTR_dweight);
    float *db = FO(1, OC, MP_QSTR_dbias);
    const float *dout = F(2, N * OC, MP_QSTR_dout);
    if (dw || db) {
        gemm_dw(dw, db, dout, dw ? F(3, N * C, MP_QSTR_inp) : NULL, N, C, OC);
    }
    return mp_const_none;
}
#undef KN

// ------------------------------------------------------------------ attention

// one query row of one head: a[0..Tk-1] = the softmax weights over keys 0..last not masked (mb[j]
// nonzero: masked; mb may be NULL), 0 elsewhere; o[0..hs-1] = their sum of the value rows (kh, vh:
// key and value j at j C); a row with no visible key gets weights and output 0
static void attend_row(float *a, float *o, const float *qh, const float *kh, const float *vh,
    const unsigned char *mb, mp_int_t Tk, mp_int_t last, mp_int_t C, mp_int_t hs, float scale) {
    float m = 0.0f;
    int seen = 0, over = 0;
    for (mp_int_t j = 0; j < Tk; j++) {
        if (j > last || (mb && mb[j])) {
            a[j] = 0.0f;
            continue;
        }
        float s = dot(qh, kh + j * C, hs) * scale;
        a[j] = s;
        if (!finite(s)) {
            over = 1;
        }
        if (!seen || s > m) {
            m = s;
        }
        seen = 1;
    }
    zero_n(o, hs);
    if (!seen) {
        return;
    }
    if (over) {
        // scores beyond float32 (inputs ~1e20): again from q and k scaled by 2^-64
        // (q.k by 2^-128), then exp((s - max) 2^128): such scores give weights 1 and 0
        const float tiny = from_bits(0x1f800000u);      // 2^-64
        seen = 0;
        for (mp_int_t j = 0; j <= last; j++) {
            if (mb && mb[j]) {
                continue;
            }
            float s = 0.0f;
            for (mp_int_t i = 0; i < hs; i++) {
                s += (qh[i] * tiny) * (kh[j * C + i] * tiny);
            }
            s *= scale;
            a[j] = s;
            if (!seen || s > m) {
                m = s;
            }
            seen = 1;
        }
    }
    float total = 0.0f;
    for (mp_int_t j = 0; j <= last; j++) {
        if (mb && mb[j]) {
            continue;
        }
        float e = over ? exp_(((a[j] - m) * from_bits(0x5f800000u)) * from_bits(0x5f800000u))
                       : exp_(a[j] - m);        // (s - max) 2^128 after the rescoring above
        a[j] = e;
        total += e;
    }
    float inv = DIV(1.0f, total);
    for (mp_int_t j = 0; j <= last; j++) {
        a[j] *= inv;
        axpy(o, a[j], vh + j * C, hs);
    }
}

#define KN MP_QSTR_attention_forward
KERNEL(k_attention_forward) {
    // attention_forward(out, att, q, k, v, mask, B, Tq, Tk, C, NH, causal): kernels.py's contract:
    // masked and future keys weigh exactly 0, a row with no visible key gets weights and output 0
    nargs(self, n_args, n_kw, 12, KN);
    mp_int_t B = SZ(6, MP_QSTR_B), Tq = SZ(7, MP_QSTR_Tq), Tk = SZ(8, MP_QSTR_Tk), C = SZ(9, MP_QSTR_C), NH = SZ(10, MP_QSTR_NH);
    int causal = mp_obj_is_true(args[11]);
    if (NH < 1 || C % NH) {
        bad(self, KN, MP_QSTR_NH, C, NH);
    }
    float *out = F(0, B * Tq * C, MP_QSTR_out);
    float *att = F(1, B * NH * Tq * Tk, MP_QSTR_att);
    const float *q = F(2, B * Tq * C, MP_QSTR_q);
    const float *k = F(3, B * Tk * C, MP_QSTR_k);
    const float *v = F(4, B * Tk * C, MP_QSTR_v);
    const unsigned char *mask = bbuf_opt(self, args[5], B * Tk, KN, MP_QSTR_mask);
    mp_int_t hs = C / NH;
    float scale = DIV(1.0f, sqrt_((float)hs));
    mp_int_t shift = Tk - Tq;
    for (mp_int_t b = 0; b < B; b++) {
        const unsigned char *mb = mask ? mask + b * Tk : NULL;
        for (mp_int_t t = 0; t < Tq; t++) {
            mp_int_t last = (causal && t + shift < Tk - 1) ? t + shift : Tk - 1;
            for (mp_int_t h = 0; h < NH; h++) {
                float *a = att + ((b * NH + h) * Tq + t) * Tk;
                const float *qh = q + (b * Tq + t) * C + h * hs;
                const float *kh = k + b * Tk * C + h * hs;
                const float *vh = v + b * Tk * C + h * hs;
                float *o = out + (b * Tq + t) * C + h * hs;
                attend_row(a, o, qh, kh, vh, mb, Tk, last, C, hs, scale);
            }
        }
    }
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_attention_decode
KERNEL(k_attention_decode) {
    // attention_decode(out, att, q, kc, vc, B, T, L, C, NH): one causal query per sequence against
    // the first T cached keys (itself included); att (B, NH, L): columns 0..T-1 written; out (B, C)
    nargs(self, n_args, n_kw, 10, KN);
    mp_int_t B = SZ(5, MP_QSTR_B), T = SZ(6, MP_QSTR_T), L = SZ(7, MP_QSTR_L), C = SZ(8, MP_QSTR_C);
    mp_int_t NH = SZ(9, MP_QSTR_NH);
    if (NH < 1 || C % NH) {
        bad(self, KN, MP_QSTR_NH, C, NH);
    }
    if (T > L || T < 1) {
        bad(self, KN, MP_QSTR_T, L, T);
    }
    float *out = F(0, B * C, MP_QSTR_out);
    float *att = F(1, B * NH * L, MP_QSTR_att);
    const float *q = F(2, B * C, MP_QSTR_q);
    const float *kc = F(3, B * L * C, MP_QSTR_kc);
    const float *vc = F(4, B * L * C, MP_QSTR_vc);
    mp_int_t hs = C / NH;
    float scale = DIV(1.0f, sqrt_((float)hs));
    for (mp_int_t b = 0; b < B; b++) {
        for (mp_int_t h = 0; h < NH; h++) {
            attend_row(att + (b * NH + h) * L, out + b * C + h * hs, q + b * C + h * hs,
                kc + b * L * C + h * hs, vc + b * L * C + h * hs, NULL, T, T - 1, C, hs, scale);
        }
    }
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_attention_backward
KERNEL(k_attention_backward) {
    // attention_backward(dq, dk, dv, scratch, dout, att, q, k, v, B, Tq, Tk, C, NH): dq dk dv written
    nargs(self, n_args, n_kw, 14, KN);
    mp_int_t B = SZ(9, MP_QSTR_B), Tq = SZ(10, MP_QSTR_Tq), Tk = SZ(11, MP_QSTR_Tk), C = SZ(12, MP_QSTR_C), NH = SZ(13, MP_QSTR_NH);
    if (NH < 1 || C % NH) {
        bad(self, KN, MP_QSTR_NH, C, NH);
    }
    float *dq = F(0, B * Tq * C, MP_QSTR_dq);
    float *dk = F(1, B * Tk * C, MP_QSTR_dk);
    float *dv = F(2, B * Tk * C, MP_QSTR_dv);
    float *da = F(3, Tk, MP_QSTR_scratch);
    const float *dout = F(4, B * Tq * C, MP_QSTR_dout);
    const float *att = F(5, B * NH * Tq * Tk, MP_QSTR_att);
    const float *q = F(6, B * Tq * C, MP_QSTR_q);
    const float *k = F(7, B * Tk * C, MP_QSTR_k);
    const float *v = F(8, B * Tk * C, MP_QSTR_v);
    mp_int_t hs = C / NH;
    float scale = DIV(1.0f, sqrt_((float)hs));
    zero_n(dq, B * Tq * C);
    zero_n(dk, B * Tk * C);
    zero_n(dv, B * Tk * C);
    for (mp_int_t b = 0; b < B; b++) {
        for (mp_int_t t = 0; t < Tq; t++) {
            for (mp_int_t h = 0; h < NH; h++) {
                const float *a = att + ((b * NH + h) * Tq + t) * Tk;
                const float *g = dout + (b * Tq + t) * C + h * hs;
                const float *qh = q + (b * Tq + t) * C + h * hs;
                float *dqh = dq + (b * Tq + t) * C + h * hs;
                mp_int_t kb = b * Tk * C + h * hs;
                float sum = 0.0f;
                for (mp_int_t j = 0; j < Tk; j++) {
                    float aj = a[j];
                    float s = dot(g, v + kb + j * C, hs);
                    da[j] = s;
                    sum += s * aj;
                    if (aj != 0.0f) {
                        axpy(dv + kb + j * C, aj, g, hs);
                    }
                }
                for (mp_int_t j = 0; j < Tk; j++) {
                    float aj = a[j];
                    if (aj == 0.0f) {
                        continue;
                    }
                    float ds = aj * (da[j] - sum) * scale;
                    axpy(dqh, ds, k + kb + j * C, hs);
                    axpy(dk + kb + j * C, ds, qh, hs);
                }
            }
        }
    }
    return mp_const_none;
}
#undef KN

// ------------------------------------------------------------------ sequence kernels

#define KN MP_QSTR_embedding_forward
KERNEL(k_embedding_forward) {
    // embedding_forward(out, ids, table, N, C, V): out = table[ids]; -1, or the index of the first
    // id that is not an int in [0, V) (that row is not written)
    nargs(self, n_args, n_kw, 6, KN);
    mp_int_t N = SZ(3, MP_QSTR_N), C = SZ(4, MP_QSTR_C), V = SZ(5, MP_QSTR_V);
    float *out = F(0, N * C, MP_QSTR_out);
    const float *ids = F(1, N, MP_QSTR_ids);
    const float *table = F(2, V * C, MP_QSTR_table);
    for (mp_int_t n = 0; n < N; n++) {
        float v = ids[n];
        if (!(v >= 0.0f && v < (float)V)) {
            return mp_obj_new_int(n);
        }
        mp_int_t t = (mp_int_t)v;
        if ((float)t != v) {
            return mp_obj_new_int(n);
        }
        copy_n(out + n * C, table + t * C, C);
    }
    return mp_obj_new_int(-1);
}
#undef KN

#define KN MP_QSTR_embedding_backward
KERNEL(k_embedding_backward) {
    // embedding_backward(dtable, dout, ids, N, C): dtable rows ids += dout rows (an id outside the
    // table raises: the forward refused it already)
    nargs(self, n_args, n_kw, 5, KN);
    mp_int_t N = SZ(3, MP_QSTR_N), C = SZ(4, MP_QSTR_C);
    mp_buffer_info_t bi;
    mp_get_buffer_raise(args[0], &bi, MP_BUFFER_RW);
    float *dt = F(0, 0, MP_QSTR_dtable);
    mp_int_t V = C ? (mp_int_t)(bi.len / 4) / C : 0;
    const float *dout = F(1, N * C, MP_QSTR_dout);
    const float *ids = F(2, N, MP_QSTR_ids);
    for (mp_int_t n = 0; n < N; n++) {
        mp_int_t t = (mp_int_t)ids[n];
        if (!(ids[n] >= 0.0f) || t >= V) {
            bad(self, KN, MP_QSTR_ids, V, t);
        }
        float *row = dt + t * C;
        const float *g = dout + n * C;
        for (mp_int_t c = 0; c < C; c++) {
            row[c] += g[c];
        }
    }
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_posenc_forward
KERNEL(k_posenc_forward) {
    // posenc_forward(out, inp, pe, B, S, C, start): out = inp + pe[start + s] (out may be inp)
    nargs(self, n_args, n_kw, 7, KN);
    mp_int_t B = SZ(3, MP_QSTR_B), S = SZ(4, MP_QSTR_S), C = SZ(5, MP_QSTR_C), start = SZ(6, MP_QSTR_start);
    float *out = F(0, B * S * C, MP_QSTR_out);
    const float *inp = F(1, B * S * C, MP_QSTR_inp);
    const float *pe = F(2, (start + S) * C, MP_QSTR_pe);
    for (mp_int_t b = 0; b < B; b++) {
        for (mp_int_t s = 0; s < S; s++) {
            mp_int_t ib = (b * S + s) * C;
            const float *pr = pe + (start + s) * C;
            for (mp_int_t c = 0; c < C; c++) {
                out[ib + c] = inp[ib + c] + pr[c];
            }
        }
    }
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_posembed_backward
KERNEL(k_posembed_backward) {
    // posembed_backward(dtable, dout, B, S, C, start): dtable rows start.. += sum over B of dout
    nargs(self, n_args, n_kw, 6, KN);
    mp_int_t B = SZ(2, MP_QSTR_B), S = SZ(3, MP_QSTR_S), C = SZ(4, MP_QSTR_C), start = SZ(5, MP_QSTR_start);
    float *dt = F(0, (start + S) * C, MP_QSTR_dtable);
    const float *dout = F(1, B * S * C, MP_QSTR_dout);
    for (mp_int_t b = 0; b < B; b++) {
        for (mp_int_t s = 0; s < S; s++) {
            float *row = dt + (start + s) * C;
            const float *g = dout + (b * S + s) * C;
            for (mp_int_t c = 0; c < C; c++) {
                row[c] += g[c];
            }
        }
    }
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_kv_store
KERNEL(k_kv_store) {
    // kv_store(cache, src, B, S, L, C, pos): cache (B, L, C)[:, pos:pos+S, :] = src (B, S, C)
    nargs(self, n_args, n_kw, 7, KN);
    mp_int_t B = SZ(2, MP_QSTR_B), S = SZ(3, MP_QSTR_S), L = SZ(4, MP_QSTR_L), C = SZ(5, MP_QSTR_C);
    mp_int_t pos = SZ(6, MP_QSTR_pos);
    if (pos + S > L) {
        bad(self, KN, MP_QSTR_pos, L - S, pos);
    }
    float *cache = F(0, B * L * C, MP_QSTR_cache);
    const float *src = F(1, B * S * C, MP_QSTR_src);
    for (mp_int_t b = 0; b < B; b++) {
        copy_n(cache + (b * L + pos) * C, src + b * S * C, S * C);
    }
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_dropout_apply
KERNEL(k_dropout_apply) {
    // dropout_apply(out, inp, keep, n, scale): out = inp scale where keep[i], else 0
    nargs(self, n_args, n_kw, 5, KN);
    mp_int_t n = SZ(3, MP_QSTR_n);
    float *out = F(0, n, MP_QSTR_out);
    const float *inp = F(1, n, MP_QSTR_inp);
    const unsigned char *keep = bbuf_opt(self, args[2], n, KN, MP_QSTR_keep);
    float scale = mp_obj_get_float_to_f(args[4]);
    for (mp_int_t i = 0; i < n; i++) {
        out[i] = (keep && keep[i]) ? inp[i] * scale : 0.0f;
    }
    return mp_const_none;
}
#undef KN

// ------------------------------------------------------------------ Conv1D

// kernels.py's _conv_walk: every output (b, t, o), every tap j whose input position p = t stride +
// j dil - pad lies in 0..L-1, the Cg channels of o's group. out not NULL: the forward (written);
// else the backward (dout read; dinp, dweight, dbias accumulated where not NULL)
static void conv_walk(float *out, float *dinp, float *dw, float *db, const float *dout, const float *inp,
    const float *w, const float *bias, mp_int_t B, mp_int_t L, mp_int_t C, mp_int_t Lout, mp_int_t OC,
    mp_int_t KS, mp_int_t stride, mp_int_t pad, mp_int_t dil, mp_int_t groups) {
    mp_int_t Cg = C / groups, OCg = OC / groups;
    for (mp_int_t b = 0; b < B; b++) {
        for (mp_int_t t = 0; t < Lout; t++) {
            mp_int_t ob = (b * Lout + t) * OC, p0 = t * stride - pad;
            for (mp_int_t o = 0; o < OC; o++) {
                mp_int_t ib = b * L * C + (o / OCg) * Cg, wb = o * Cg * KS;
                float s = 0.0f, g = 0.0f;
                if (out) {
                    s = bias ? bias[o] : 0.0f;
                } else {
                    g = dout[ob + o];
                    if (db) {
                        db[o] += g;
                    }
                }
                for (mp_int_t j = 0; j < KS; j++) {
                    mp_int_t p = p0 + j * dil;
                    if (p < 0 || p >= L) {
                        continue;
                    }
                    const float *x = inp + ib + p * C;
                    const float *wj = w + wb + j;
                    if (out) {
                        for (mp_int_t c = 0; c < Cg; c++) {
                            s += wj[c * KS] * x[c];
                        }
                        continue;
                    }
                    if (dinp) {
                        float *dx = dinp + ib + p * C;
                        for (mp_int_t c = 0; c < Cg; c++) {
                            dx[c] += g * wj[c * KS];
                        }
                    }
                    if (dw) {
                        float *dwj = dw + wb + j;
                        for (mp_int_t c = 0; c < Cg; c++) {
                            dwj[c * KS] += g * x[c];
                        }
                    }
                }
                if (out) {
                    out[ob + o] = s;
                }
            }
        }
    }
}

// the sizes of a convolution, checked: (stride, dil, groups >= 1; groups divides C and OC)
static void conv_sizes(mp_obj_fun_bc_t *self, mp_obj_t *a, qstr kern, mp_int_t *sz) {
    for (int i = 0; i < 10; i++) {
        sz[i] = mp_obj_get_int(a[i]);
        if (sz[i] < 0) {
            bad(self, kern, MP_QSTR_sizes, -2, sz[i]);
        }
    }
    // B L C Lout OC KS stride pad dil groups
    if (sz[6] < 1 || sz[8] < 1 || sz[9] < 1 || sz[2] % sz[9] || sz[4] % sz[9]) {
        bad(self, kern, MP_QSTR_groups, sz[2], sz[9]);
    }
}

#define KN MP_QSTR_conv1d_forward
KERNEL(k_conv1d_forward) {
    // conv1d_forward(out, inp, weight, bias, B, L, C, Lout, OC, KS, stride, pad, dil, groups)
    nargs(self, n_args, n_kw, 14, KN);
    mp_int_t z[10];
    conv_sizes(self, args + 4, KN, z);
    mp_int_t B = z[0], L = z[1], C = z[2], Lout = z[3], OC = z[4], KS = z[5];
    float *out = F(0, B * Lout * OC, MP_QSTR_out);
    const float *inp = F(1, B * L * C, MP_QSTR_inp);
    const float *w = F(2, OC * (C / z[9]) * KS, MP_QSTR_weight);
    const float *bias = FO(3, OC, MP_QSTR_bias);
    conv_walk(out, NULL, NULL, NULL, NULL, inp, w, bias, B, L, C, Lout, OC, KS, z[6], z[7], z[8], z[9]);
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_conv1d_backward
KERNEL(k_conv1d_backward) {
    // conv1d_backward(dinp, dweight, dbias, dout, inp, weight, B, L, C, Lout, OC, KS, stride, pad, dil, groups)
    nargs(self, n_args, n_kw, 16, KN);
    mp_int_t z[10];
    conv_sizes(self, args + 6, KN, z);
    mp_int_t B = z[0], L = z[1], C = z[2], Lout = z[3], OC = z[4], KS = z[5];
    float *dinp = FO(0, B * L * C, MP_QSTR_dinp);
    float *dw = FO(1, OC * (C / z[9]) * KS, MP_QSTR_dweight);
    float *db = FO(2, OC, MP_QSTR_dbias);
    const float *dout = F(3, B * Lout * OC, MP_QSTR_dout);
    const float *inp = F(4, B * L * C, MP_QSTR_inp);
    const float *w = F(5, OC * (C / z[9]) * KS, MP_QSTR_weight);
    if (dinp) {
        zero_n(dinp, B * L * C);
    }
    conv_walk(NULL, dinp, dw, db, dout, inp, w, NULL, B, L, C, Lout, OC, KS, z[6], z[7], z[8], z[9]);
    return mp_const_none;
}
#undef KN

// ------------------------------------------------------------------ activations and pooling

#define RELU 0
#define LEAKY_RELU 1
#define GELU 2
#define TANH 3
#define SIGMOID 4
#define GELU_TANH 5
#define GELU_C 0.797884561f         // sqrt(2 / pi)
#define RSQRT2 0.707106781f
#define RSQRT2PI 0.398942280f

static inline float sigmoid_(float x) {
    if (x >= 0.0f) {
        return DIV(1.0f, 1.0f + exp_(-x));
    }
    float e = exp_(x);
    return DIV(e, 1.0f + e);
}

static inline float tanh_(float x) {
    if (fabs_(x) > 9.1f) {              // tanh is 1 in float32
        return x > 0.0f ? 1.0f : -1.0f;
    }
    float e = expm1_(2.0f * x);
    return DIV(e, e + 2.0f);
}

#define KN MP_QSTR_act_forward
KERNEL(k_act_forward) {
    // act_forward(out, inp, N, kind); NaN propagates as in torch
    nargs(self, n_args, n_kw, 4, KN);
    mp_int_t N = SZ(2, MP_QSTR_N), kind = mp_obj_get_int(args[3]);
    float *out = F(0, N, MP_QSTR_out);
    const float *inp = F(1, N, MP_QSTR_inp);
    switch (kind) {
        case RELU:
            for (mp_int_t i = 0; i < N; i++) {
                float x = inp[i];
                out[i] = x <= 0.0f ? 0.0f : x;
            }
            break;
        case LEAKY_RELU:
            for (mp_int_t i = 0; i < N; i++) {
                float x = inp[i];
                out[i] = x > 0.0f ? x : 0.01f * x;
            }
            break;
        case GELU:
            // 0.5 x (1 + erf(x / sqrt 2)) = 0.5 x erfc(-x / sqrt 2)
            for (mp_int_t i = 0; i < N; i++) {
                float x = inp[i];
                out[i] = 0.5f * x * erfc_(-x * RSQRT2);
            }
            break;
        case GELU_TANH:
            // 0.5 x (1 + tanh u) = x sigmoid(2 u), u = sqrt(2/pi) (x + 0.044715 x^3)
            for (mp_int_t i = 0; i < N; i++) {
                float x = inp[i];
                out[i] = x * sigmoid_(2.0f * GELU_C * (x + 0.044715f * x * x * x));
            }
            break;
        case TANH:
            for (mp_int_t i = 0; i < N; i++) {
                out[i] = tanh_(inp[i]);
            }
            break;
        case SIGMOID:
            for (mp_int_t i = 0; i < N; i++) {
                out[i] = sigmoid_(inp[i]);
            }
            break;
        default:
            bad(self, KN, MP_QSTR_kind, 5, kind);
    }
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_act_backward
KERNEL(k_act_backward) {
    // act_backward(dinp, dout, inp, out, N, kind): dinp = f'(inp) dout (written)
    nargs(self, n_args, n_kw, 6, KN);
    mp_int_t N = SZ(4, MP_QSTR_N), kind = mp_obj_get_int(args[5]);
    float *dinp = F(0, N, MP_QSTR_dinp);
    const float *dout = F(1, N, MP_QSTR_dout);
    const float *inp = (kind == TANH || kind == SIGMOID) ? NULL : F(2, N, MP_QSTR_inp);
    const float *out = (kind == TANH || kind == SIGMOID) ? F(3, N, MP_QSTR_out) : NULL;
    switch (kind) {
        case RELU:
            for (mp_int_t i = 0; i < N; i++) {
                dinp[i] = inp[i] <= 0.0f ? 0.0f : dout[i];
            }
            break;
        case LEAKY_RELU:
            for (mp_int_t i = 0; i < N; i++) {
                dinp[i] = inp[i] > 0.0f ? dout[i] : 0.01f * dout[i];
            }
            break;
        case GELU:
            // Phi(x) + x phi(x)
            for (mp_int_t i = 0; i < N; i++) {
                float x = inp[i];
                dinp[i] = dout[i] * (0.5f * erfc_(-x * RSQRT2) + x * RSQRT2PI * exp_(-0.5f * x * x));
            }
            break;
        case GELU_TANH:
            // s = sigmoid(2u) = (1 + tanh u) / 2; 1 - tanh^2 = 4 s (1 - s)
            for (mp_int_t i = 0; i < N; i++) {
                float x = inp[i];
                float s = sigmoid_(2.0f * GELU_C * (x + 0.044715f * x * x * x));
                float dth = 4.0f * s * (1.0f - s) * GELU_C * (1.0f + 3.0f * 0.044715f * x * x);
                dinp[i] = dout[i] * (s + 0.5f * x * dth);
            }
            break;
        case TANH:
            for (mp_int_t i = 0; i < N; i++) {
                float y = out[i];
                dinp[i] = dout[i] * (1.0f - y * y);
            }
            break;
        case SIGMOID:
            for (mp_int_t i = 0; i < N; i++) {
                float y = out[i];
                dinp[i] = dout[i] * y * (1.0f - y);
            }
            break;
        default:
            bad(self, KN, MP_QSTR_kind, 5, kind);
    }
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_avgpool_forward
KERNEL(k_avgpool_forward) {
    // avgpool_forward(out, inp, B, T, C): out (B, C) = mean over T of inp (B, T, C)
    nargs(self, n_args, n_kw, 5, KN);
    mp_int_t B = SZ(2, MP_QSTR_B), T = SZ(3, MP_QSTR_T), C = SZ(4, MP_QSTR_C);
    float *out = F(0, B * C, MP_QSTR_out);
    const float *inp = F(1, B * T * C, MP_QSTR_inp);
    float inv = DIV(1.0f, (float)T);
    for (mp_int_t b = 0; b < B; b++) {
        float *o = out + b * C;
        zero_n(o, C);
        for (mp_int_t t = 0; t < T; t++) {
            const float *x = inp + (b * T + t) * C;
            for (mp_int_t c = 0; c < C; c++) {
                o[c] += x[c];
            }
        }
        for (mp_int_t c = 0; c < C; c++) {
            o[c] *= inv;
        }
    }
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_avgpool_backward
KERNEL(k_avgpool_backward) {
    // avgpool_backward(dinp, dout, B, T, C): dinp (B, T, C) = dout (B, C) / T (written)
    nargs(self, n_args, n_kw, 5, KN);
    mp_int_t B = SZ(2, MP_QSTR_B), T = SZ(3, MP_QSTR_T), C = SZ(4, MP_QSTR_C);
    float *dinp = F(0, B * T * C, MP_QSTR_dinp);
    const float *dout = F(1, B * C, MP_QSTR_dout);
    float inv = DIV(1.0f, (float)T);
    for (mp_int_t b = 0; b < B; b++) {
        for (mp_int_t t = 0; t < T; t++) {
            float *d = dinp + (b * T + t) * C;
            for (mp_int_t c = 0; c < C; c++) {
                d[c] = dout[b * C + c] * inv;
            }
        }
    }
    return mp_const_none;
}
#undef KN

// ------------------------------------------------------------------ loss

#define KN MP_QSTR_crossentropy_softmax
KERNEL(k_crossentropy_softmax) {
    // crossentropy_softmax(dlogits, logits, labels, B, V): the mean of -log softmax[label];
    // dlogits = (softmax - onehot) / B. labels: B ints in [0, V) (a list, or any sequence of ints)
    nargs(self, n_args, n_kw, 5, KN);
    mp_int_t B = SZ(3, MP_QSTR_B), V = SZ(4, MP_QSTR_V);
    float *dl = F(0, B * V, MP_QSTR_dlogits);
    const float *lg = F(1, B * V, MP_QSTR_logits);
    mp_obj_t labels = args[2];
    if (B < 1 || V < 1) {
        bad(self, KN, MP_QSTR_B, 1, B < 1 ? B : V);
    }
    float total = 0.0f;
    float invb = DIV(1.0f, (float)B);
    for (mp_int_t b = 0; b < B; b++) {
        mp_int_t y = mp_obj_get_int(item(labels, b));
        if (y < 0 || y >= V) {
            bad(self, KN, MP_QSTR_labels, V, y);
        }
        const float *l = lg + b * V;
        float *d = dl + b * V;
        float m = l[0];
        for (mp_int_t i = 1; i < V; i++) {
            if (l[i] > m) {
                m = l[i];
            }
        }
        float z = 0.0f;
        for (mp_int_t i = 0; i < V; i++) {
            float e = exp_(l[i] - m);
            d[i] = e;
            z += e;
        }
        total += (m - l[y]) + log_(z);
        float f = DIV(invb, z);
        for (mp_int_t i = 0; i < V; i++) {
            d[i] *= f;
        }
        d[y] -= invb;
    }
    return mp_obj_new_float_from_f(total * invb);
}
#undef KN

// ------------------------------------------------------------------ LayerNorm

#define KN MP_QSTR_layernorm_forward
KERNEL(k_layernorm_forward) {
    // layernorm_forward(out, inp, ln, N, C, eps), ln = [weight, bias, mean, rstd, ...]
    nargs(self, n_args, n_kw, 6, KN);
    mp_int_t N = SZ(3, MP_QSTR_N), C = SZ(4, MP_QSTR_C);
    float eps = mp_obj_get_float_to_f(args[5]);
    mp_obj_t ln = args[2];
    float *out = F(0, N * C, MP_QSTR_out);
    const float *inp = F(1, N * C, MP_QSTR_inp);
    const float *w = fbuf(self, item(ln, 0), C, KN, MP_QSTR_weight);
    const float *bias = fbuf_opt(self, item(ln, 1), C, KN, MP_QSTR_bias);
    float *mean = fbuf(self, item(ln, 2), N, KN, MP_QSTR_mean);
    float *rstd = fbuf(self, item(ln, 3), N, KN, MP_QSTR_rstd);
    float invc = DIV(1.0f, (float)C);
    for (mp_int_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float *o = out + n * C;
        float m = 0.0f;
        for (mp_int_t c = 0; c < C; c++) {
            m += x[c];
        }
        m *= invc;
        float v = 0.0f;
        for (mp_int_t c = 0; c < C; c++) {
            float d = x[c] - m;
            v += d * d;
        }
        float ia = 1.0f, ms = m;
        if (!finite(v)) {
            // the squares overflowed: the statistics of the row divided by its largest |x|
            float a = 0.0f;
            for (mp_int_t c = 0; c < C; c++) {
                float t = fabs_(x[c]);
                if (t > a) {
                    a = t;
                }
            }
            if (a > 0.0f && finite(a)) {
                ia = DIV(1.0f, a);
                ms = 0.0f;
                for (mp_int_t c = 0; c < C; c++) {
                    ms += x[c] * ia;
                }
                ms *= invc;
                v = 0.0f;
                for (mp_int_t c = 0; c < C; c++) {
                    float d = x[c] * ia - ms;
                    v += d * d;
                }
                float rs = DIV(1.0f, sqrt_(v * invc + eps * ia * ia));
                mean[n] = ms * a;
                rstd[n] = rs * ia;
                for (mp_int_t c = 0; c < C; c++) {
                    float y = (x[c] * ia - ms) * rs * w[c];
                    o[c] = bias ? y + bias[c] : y;
                }
                continue;
            }
        }
        float s = DIV(1.0f, sqrt_(v * invc + eps));
        mean[n] = m;
        rstd[n] = s;
        for (mp_int_t c = 0; c < C; c++) {
            float y = (x[c] - m) * s * w[c];
            o[c] = bias ? y + bias[c] : y;
        }
    }
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_layernorm_backward
KERNEL(k_layernorm_backward) {
    // layernorm_backward(dinp, dout, inp, ln, N, C), ln = [weight, bias, mean, rstd, dweight, dbias]
    nargs(self, n_args, n_kw, 6, KN);
    mp_int_t N = SZ(4, MP_QSTR_N), C = SZ(5, MP_QSTR_C);
    mp_obj_t ln = args[3];
    float *dinp = F(0, N * C, MP_QSTR_dinp);
    const float *dout = F(1, N * C, MP_QSTR_dout);
    const float *inp = F(2, N * C, MP_QSTR_inp);
    const float *w = fbuf(self, item(ln, 0), C, KN, MP_QSTR_weight);
    const float *mean = fbuf(self, item(ln, 2), N, KN, MP_QSTR_mean);
    const float *rstd = fbuf(self, item(ln, 3), N, KN, MP_QSTR_rstd);
    float *dw = fbuf_opt(self, item(ln, 4), C, KN, MP_QSTR_dweight);
    float *db = fbuf_opt(self, item(ln, 5), C, KN, MP_QSTR_dbias);
    float invc = DIV(1.0f, (float)C);
    for (mp_int_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        const float *g = dout + n * C;
        float *d = dinp + n * C;
        float m = mean[n], s = rstd[n];
        float a = 0.0f, bs = 0.0f;
        for (mp_int_t c = 0; c < C; c++) {
            float xh = (x[c] - m) * s;
            float dn = g[c] * w[c];
            a += dn;
            bs += dn * xh;
        }
        a *= invc;
        bs *= invc;
        for (mp_int_t c = 0; c < C; c++) {
            float xh = (x[c] - m) * s;
            if (dw) {
                dw[c] += g[c] * xh;
            }
            if (db) {
                db[c] += g[c];
            }
            d[c] = s * (g[c] * w[c] - a - xh * bs);
        }
    }
    return mp_const_none;
}
#undef KN

// ------------------------------------------------------------------ optimizers

typedef struct {
    float lr, beta1, beta2, eps, wd, a, rb2;
    int decoupled;
} adam_hyper_t;

// a value's exponent bits plus one exponent step: bit 31 is set exactly for inf and NaN
#define NONFINITE_BIT(u) (((u) & 0x7f800000u) + 0x00800000u)

// Adam on n elements: P, M, V = the new weight and moments from p, g, m, v (P may be p, M m, V v).
// Returns a word whose bit 31 is set when g or a new value is inf or NaN.
static u32 adam_n(float *P, float *M, float *V, const float *p, const float *g, const float *m,
    const float *v, mp_int_t n, const adam_hyper_t *h) {
    float b1 = h->beta1, b2 = h->beta2, c1 = 1.0f - h->beta1, c2 = 1.0f - h->beta2;
    float a = h->a, rb2 = h->rb2, eps = h->eps;
    int mode = h->wd == 0.0f ? 0 : h->decoupled ? 2 : 1;    // 1: L2 into the gradient, 2: AdamW's shrink
    float wd = h->wd, shrink = h->lr * h->wd;
    u32 bad = 0;
    mp_int_t i = 0;
    #if HAVE_SSE
    typedef u32 v4u __attribute__((vector_size(16)));
    v4 vb1 = {b1, b1, b1, b1}, vb2 = {b2, b2, b2, b2}, vc1 = {c1, c1, c1, c1}, vc2 = {c2, c2, c2, c2};
    v4 va = {a, a, a, a}, vrb2 = {rb2, rb2, rb2, rb2}, veps = {eps, eps, eps, eps};
    v4 vwd = {wd, wd, wd, wd}, vsh = {shrink, shrink, shrink, shrink};
    v4u E = {0x7f800000u, 0x7f800000u, 0x7f800000u, 0x7f800000u};
    v4u ONE = {0x00800000u, 0x00800000u, 0x00800000u, 0x00800000u};
    v4u acc = {0, 0, 0, 0};
    for (; i + 4 <= n; i += 4) {
        v4 gi = *(const v4 *)(g + i), pi = *(const v4 *)(p + i), d = gi;
        if (mode == 1) {
            d = gi + vwd * pi;
        } else if (mode == 2) {
            pi = pi - vsh * pi;
        }
        v4 mi = vb1 * *(const v4 *)(m + i) + vc1 * d;
        v4 vi = vb2 * *(const v4 *)(v + i) + vc2 * d * d;
        v4 np = pi - va * mi / (__builtin_ia32_sqrtps(vi * vrb2) + veps);
        *(v4 *)(M + i) = mi;
        *(v4 *)(V + i) = vi;
        *(v4 *)(P + i) = np;
        acc |= ((((v4u)gi) & E) + ONE) | ((((v4u)np) & E) + ONE) | ((((v4u)mi) & E) + ONE) | ((((v4u)vi) & E) + ONE);
    }
    bad = acc[0] | acc[1] | acc[2] | acc[3];
    #endif
    for (; i < n; i++) {
        float gi = g[i], pi = p[i], d = gi;
        if (mode == 1) {
            d = gi + wd * pi;
        } else if (mode == 2) {
            pi = pi - shrink * pi;
        }
        float mi = b1 * m[i] + c1 * d;
        float vi = b2 * v[i] + c2 * d * d;
        float np = pi - DIV(a * mi, sqrt_(vi * rb2) + eps);
        M[i] = mi;
        V[i] = vi;
        P[i] = np;
        bad |= NONFINITE_BIT(bits(gi)) | NONFINITE_BIT(bits(np)) | NONFINITE_BIT(bits(mi)) | NONFINITE_BIT(bits(vi));
    }
    return bad & 0x80000000u;
}

// SGD on n elements: P, Bn = the new weight and momentum buffer from p, g, b (b NULL: no
// momentum; P may be p, Bn b). Returns bit 31 set when g or a new value is inf or NaN.
static u32 sgd_n(float *P, float *Bn, const float *p, const float *g, const float *b, mp_int_t n,
    float lr, float mom, float wd) {
    u32 bad = 0;
    for (mp_int_t i = 0; i < n; i++) {
        float pi = p[i], d = g[i];
        bad |= NONFINITE_BIT(bits(d));
        if (wd != 0.0f) {
            d += wd * pi;
        }
        if (b) {
            d += mom * b[i];
            Bn[i] = d;
            bad |= NONFINITE_BIT(bits(d));
        }
        float np = pi - lr * d;
        P[i] = np;
        bad |= NONFINITE_BIT(bits(np));
    }
    return bad & 0x80000000u;
}

// 1 - beta^t for an int t >= 1 (by squaring)
static float one_minus_pow(float beta, mp_int_t t) {
    float r = 1.0f, b = beta;
    while (t > 0) {
        if (t & 1) {
            r *= b;
        }
        b *= b;
        t >>= 1;
    }
    return 1.0f - r;
}

static float fget(mp_obj_t seq, mp_int_t i) {
    return mp_obj_get_float_to_f(item(seq, i));
}

#define KN MP_QSTR_adam_update
KERNEL(k_adam_update) {
    // adam_update(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2, decoupled)
    nargs(self, n_args, n_kw, 13, KN);
    mp_int_t n = SZ(4, MP_QSTR_n);
    adam_hyper_t h;
    h.lr = mp_obj_get_float_to_f(args[5]);
    h.beta1 = mp_obj_get_float_to_f(args[6]);
    h.beta2 = mp_obj_get_float_to_f(args[7]);
    h.eps = mp_obj_get_float_to_f(args[8]);
    h.wd = mp_obj_get_float_to_f(args[9]);
    h.a = DIV(h.lr, mp_obj_get_float_to_f(args[10]));
    h.rb2 = DIV(1.0f, mp_obj_get_float_to_f(args[11]));
    h.decoupled = mp_obj_is_true(args[12]);
    float *p = F(0, n, MP_QSTR_p), *m = F(2, n, MP_QSTR_m), *v = F(3, n, MP_QSTR_v);
    adam_n(p, m, v, p, F(1, n, MP_QSTR_g), m, v, n, &h);
    return mp_const_none;
}
#undef KN

#define KN MP_QSTR_sgd_update
KERNEL(k_sgd_update) {
    // sgd_update(p, g, buf, n, lr, momentum, weight_decay); buf None: no momentum
    nargs(self, n_args, n_kw, 7, KN);
    mp_int_t n = SZ(3, MP_QSTR_n);
    float *p = F(0, n, MP_QSTR_p), *buf = FO(2, n, MP_QSTR_buf);
    sgd_n(p, buf, p, F(1, n, MP_QSTR_g), buf, n, mp_obj_get_float_to_f(args[4]),
        mp_obj_get_float_to_f(args[5]), mp_obj_get_float_to_f(args[6]));
    return mp_const_none;
}
#undef KN

#define STEP_FROZEN (-3)

// the (param, grad) pair k's weight and grad buffers (grad NULL: frozen)
static mp_int_t pair_bufs(mp_obj_fun_bc_t *self, mp_obj_t params, mp_int_t k, float **p, float **g, qstr kern) {
    mp_obj_t pair = item(params, k);
    mp_obj_t pd = mp_load_attr(item(pair, 0), MP_QSTR_data);
    mp_obj_t gd = mp_load_attr(item(pair, 1), MP_QSTR_data);
    mp_buffer_info_t bi;
    if (!mp_get_buffer(pd, &bi, MP_BUFFER_RW) || bi.typecode != 'f') {
        bad(self, kern, MP_QSTR_params, k, -1);
    }
    *p = (float *)bi.buf;
    mp_int_t n = bi.len / 4;
    if (gd == mp_const_none) {
        *g = NULL;
        return n;
    }
    *g = fbuf(self, gd, n, kern, MP_QSTR_params);
    return n;
}

// the whole step's walk (kernels.py _whole_step): pair k's weight and states copied into its
// stretch of the shadows, updated there, then checked; -1, the first non-finite pair, or STEP_FROZEN
static mp_obj_t whole_step(mp_obj_fun_bc_t *self, mp_obj_t *args, qstr kern, const adam_hyper_t *ah,
    float lr, float mom, float wd) {
    mp_obj_t params = args[2];
    mp_int_t count = mp_obj_get_int(mp_obj_len(params));
    mp_obj_t news = args[1], olds = args[3];
    mp_int_t ns = mp_obj_get_int(mp_obj_len(news));
    mp_int_t total = 0;
    for (mp_int_t k = 0; k < count; k++) {
        float *p, *g;
        total += pair_bufs(self, params, k, &p, &g, kern);
        if (!g) {
            return mp_obj_new_int(STEP_FROZEN);
        }
    }
    if (ns != mp_obj_get_int(mp_obj_len(olds)) || ns != (ah ? 2 : ns) || ns > 2) {
        bad(self, kern, MP_QSTR_news, ah ? 2 : 1, ns);
    }
    float *np = fbuf(self, args[0], total, kern, MP_QSTR_newp);
    float *nst[2] = {NULL, NULL}, *ost[2] = {NULL, NULL};
    for (mp_int_t i = 0; i < ns; i++) {
        nst[i] = fbuf(self, item(news, i), total, kern, MP_QSTR_news);
        ost[i] = fbuf(self, item(olds, i), total, kern, MP_QSTR_olds);
    }
    mp_int_t o = 0, badk = -1;
    for (mp_int_t k = 0; k < count; k++) {
        float *p, *g;
        mp_int_t n = pair_bufs(self, params, k, &p, &g, kern);
        u32 flag = ah ? adam_n(np + o, nst[0] + o, nst[1] + o, p, g, ost[0] + o, ost[1] + o, n, ah)
                      : sgd_n(np + o, ns ? nst[0] + o : NULL, p, g, ns ? ost[0] + o : NULL, n, lr, mom, wd);
        if (badk < 0 && flag) {
            badk = k;
        }
        o += n;
    }
    return mp_obj_new_int(badk);
}

#define KN MP_QSTR_adam_step
KERNEL(k_adam_step) {
    // adam_step(newp, news, params, olds, hyper), hyper = [lr, beta1, beta2, eps, weight_decay, decoupled, t, ...]
    nargs(self, n_args, n_kw, 5, KN);
    mp_obj_t hy = args[4];
    adam_hyper_t h;
    h.lr = fget(hy, 0);
    h.beta1 = fget(hy, 1);
    h.beta2 = fget(hy, 2);
    h.eps = fget(hy, 3);
    h.wd = fget(hy, 4);
    h.decoupled = mp_obj_is_true(item(hy, 5));
    mp_int_t t = mp_obj_get_int(item(hy, 6));
    if (t < 1) {
        bad(self, KN, MP_QSTR_t, 1, t);
    }
    h.a = DIV(h.lr, one_minus_pow(h.beta1, t));
    h.rb2 = DIV(1.0f, one_minus_pow(h.beta2, t));
    return whole_step(self, args, KN, &h, 0.0f, 0.0f, 0.0f);
}
#undef KN

#define KN MP_QSTR_sgd_step
KERNEL(k_sgd_step) {
    // sgd_step(newp, news, params, olds, hyper), hyper = [lr, momentum, weight_decay, ...];
    // news = olds = [] without momentum
    nargs(self, n_args, n_kw, 5, KN);
    mp_obj_t hy = args[4];
    return whole_step(self, args, KN, NULL, fget(hy, 0), fget(hy, 1), fget(hy, 2));
}
#undef KN

#define KN MP_QSTR_params_commit
KERNEL(k_params_commit) {
    // params_commit(params, newp, count, seen): each weight = its stretch of newp, bit for bit
    if (n_args < 3 || n_args > 4 || n_kw) {
        bad(self, KN, MP_QSTR_arguments, 4, n_args + n_kw);
    }
    mp_obj_t params = args[0];
    mp_int_t count = SZ(2, MP_QSTR_count);
    mp_int_t total = 0;
    for (mp_int_t k = 0; k < count; k++) {
        float *p, *g;
        total += pair_bufs(self, params, k, &p, &g, KN);
    }
    const float *np = F(1, total, MP_QSTR_newp);
    mp_int_t o = 0;
    for (mp_int_t k = 0; k < count; k++) {
        float *p, *g;
        mp_int_t n = pair_bufs(self, params, k, &p, &g, KN);
        copy_n(p, np + o, n);
        o += n;
    }
    return mp_const_none;
}
#undef KN

// ------------------------------------------------------------------ the module

#define REG(q, fn) mp_store_global(q, MP_DYNRUNTIME_MAKE_FUNCTION(fn))

mp_obj_t mpy_init(mp_obj_fun_bc_t *self, size_t n_args, size_t n_kw, mp_obj_t *args) {
    MP_DYNRUNTIME_INIT_ENTRY
    REG(MP_QSTR_zero, k_zero);
    REG(MP_QSTR_copy, k_copy);
    REG(MP_QSTR_first_nonfinite, k_first_nonfinite);
    REG(MP_QSTR_max_exponent, k_max_exponent);
    REG(MP_QSTR_max_exponent_pairs, k_max_exponent_pairs);
    REG(MP_QSTR_add_forward, k_add_forward);
    REG(MP_QSTR_argmax, k_argmax);
    REG(MP_QSTR_gather_rows, k_gather_rows);
    REG(MP_QSTR_matmul_forward, k_matmul_forward);
    REG(MP_QSTR_matmul_forward_kept, k_matmul_forward_kept);
    REG(MP_QSTR_matmul_backward, k_matmul_backward);
    REG(MP_QSTR_matmul_backward_input, k_matmul_backward_input);
    REG(MP_QSTR_matmul_backward_input_acc, k_matmul_backward_input_acc);
    REG(MP_QSTR_matmul_backward_weight, k_matmul_backward_weight);
    REG(MP_QSTR_embedding_forward, k_embedding_forward);
    REG(MP_QSTR_embedding_backward, k_embedding_backward);
    REG(MP_QSTR_posenc_forward, k_posenc_forward);
    REG(MP_QSTR_posembed_backward, k_posembed_backward);
    REG(MP_QSTR_kv_store, k_kv_store);
    REG(MP_QSTR_dropout_apply, k_dropout_apply);
    REG(MP_QSTR_conv1d_forward, k_conv1d_forward);
    REG(MP_QSTR_conv1d_backward, k_conv1d_backward);
    REG(MP_QSTR_attention_forward, k_attention_forward);
    REG(MP_QSTR_attention_backward, k_attention_backward);
    REG(MP_QSTR_attention_decode, k_attention_decode);
    REG(MP_QSTR_act_forward, k_act_forward);
    REG(MP_QSTR_act_backward, k_act_backward);
    REG(MP_QSTR_avgpool_forward, k_avgpool_forward);
    REG(MP_QSTR_avgpool_backward, k_avgpool_backward);
    REG(MP_QSTR_crossentropy_softmax, k_crossentropy_softmax);
    REG(MP_QSTR_layernorm_forward, k_layernorm_forward);
    REG(MP_QSTR_layernorm_backward, k_layernorm_backward);
    REG(MP_QSTR_adam_update, k_adam_update);
    REG(MP_QSTR_sgd_update, k_sgd_update);
    REG(MP_QSTR_adam_step, k_adam_step);
    REG(MP_QSTR_sgd_step, k_sgd_step);
    REG(MP_QSTR_params_commit, k_params_commit);
    mp_store_global(MP_QSTR_ABI, MP_OBJ_NEW_SMALL_INT(1));
    MP_DYNRUNTIME_INIT_EXIT
}
