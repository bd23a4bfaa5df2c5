/* What the host (C) kernels share (Note [Host kernels] in kernels/_host.py): fixed-lane sums,
 * so a result does not depend on the vector width, and one clone of each entry per x86-64
 * vector extension, picked when the library loads; an exp the vectorizer can inline (dt_expf,
 * dt_exp). Header-free C11 apart from math.h and stdint.h. */
#ifndef DISTTENSOR_KERNELS_HOST_H
#define DISTTENSOR_KERNELS_HOST_H
#include <math.h>
#include <stdint.h>

#define DT_LANES 16
#if defined(__x86_64__) && defined(__GNUC__)
#define DT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DT_CLONES
#endif
/* helpers inlined into every clone, so each runs at its clone's vector width (a call would
   run the default one) */
#if defined(__GNUC__)
#define DT_INLINE static inline __attribute__((always_inline))
#else
#define DT_INLINE static inline
#endif

/* acc[0] + ... + acc[DT_LANES - 1], pairwise in a fixed order */
#define DT_COMBINE(T)                                                    \
    static inline T dt_combine_##T(T* acc) {                             \
        for (int w = DT_LANES / 2; w > 0; w /= 2)                        \
            for (int k = 0; k < w; ++k) acc[k] += acc[k + w];            \
        return acc[0];                                                   \
    }
DT_COMBINE(float)
DT_COMBINE(double)

/* Note [Vector exp]
 * numpy's exp is SIMD code; a loop calling libm's scalar expf would be slower than numpy's
 * passes, so the softmax kernels use these: branch-free inline functions that gcc vectorizes
 * inside `omp simd` loops, in the SSE2 clone too (no rint, no float-to-int conversion, no
 * 64-bit compares). exp(x) = 2^k exp(r) with x = k ln2 + r, |r| <= ln2 / 2 (a little more:
 * k comes from a rounded product):
 *   - k = round(x / ln2) by adding 1.5 * 2^23 (2^52 for double): the sum's last bits hold
 *     the integer k, read back by subtracting the bit patterns;
 *   - r by Cody-Waite: ln2 in two parts, the first short enough that k * part and x - k *
 *     part are exact;
 *   - exp(r) = 1 + r + r^2 q(r): Cephes' minimax q for float (exp's degree 7), Taylor's to
 *     degree 13 for double (the first term left out is under 1e-17 of the result); q in
 *     Estrin's order (pairs c + c' r, then in powers of r^2), whose short dependency chains
 *     ran 15% faster than Horner's in double, 5% in float (AVX-512, one core);
 *   - 2^k as two factors 2^k1 2^k2 made from bits (k1 + k2 = k, both normal), so p 2^k1 is
 *     exact and the one rounding is the last product, down to the denormals.
 * x is clamped first to where exp has overflowed or underflowed (+inf and -inf come out of
 * the arithmetic as inf and 0); a NaN passes the clamp (its comparisons are false) and the
 * arithmetic keeps it. With contraction off (-ffp-contract=off) every clone runs the same
 * operations in the same order: the same bits whatever the vector width. Accuracy: within
 * 1 ulp of the correctly rounded exp for every float32 in [-104, 89] (all 2.2e9 checked once;
 * tests/test_host_kernels.py checks every 331st) and on samples of float64 down to its
 * denormal results; numpy's own float32 exp is up to 2 ulp off. */
typedef union { float f; uint32_t u; } dt_bits32;
typedef union { double f; uint64_t u; } dt_bits64;

DT_INLINE float dt_expf(float x) {
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    float xc = x < -104.0f ? -104.0f : x; /* below: exp(x) < 2^-150, 0 */
    xc = xc > 89.0f ? 89.0f : xc;         /* above: exp(x) > FLT_MAX, inf */
    const float t = xc * 1.44269504088896341f + magic;
    const float kf = t - magic;
    float r = xc - kf * 0.693359375f; /* 355 / 512: exact */
    r = r - kf * -2.12194440e-4f;
    const float z = r * r;
    const float a0 = 5.0000001201e-1f + r * 1.6666665459e-1f;
    const float a1 = 4.1665795894e-2f + r * 8.3334519073e-3f;
    const float a2 = 1.3981999507e-3f + r * 1.9875691500e-4f;
    const float p = (a0 + z * (a1 + z * a2)) * z + r + 1.0f;
    /* ku = k + 256 > 0 (k in [-151, 129]): unsigned arithmetic, logical shifts */
    const dt_bits32 tb = {t}, mb = {magic};
    const uint32_t ku = tb.u - mb.u + 256u, half = ku >> 1;
    const dt_bits32 s1 = {.u = (half - 1u) << 23}, s2 = {.u = (ku - half - 1u) << 23};
    return p * s1.f * s2.f;
}

DT_INLINE double dt_exp(double x) {
    const double magic = 6755399441055744.0; /* 1.5 * 2^52 */
    double xc = x < -746.0 ? -746.0 : x; /* below: exp(x) < 2^-1075, 0 */
    xc = xc > 710.0 ? 710.0 : xc;        /* above: exp(x) > DBL_MAX, inf */
    const double t = xc * 1.4426950408889634074 + magic;
    const double kf = t - magic;
    double r = xc - kf * 6.93145751953125e-1; /* 22713 / 2^15: exact */
    r = r - kf * 1.42860682030941723212e-6;
    const double z = r * r, z2 = z * z;
    /* q = 1/2! + r/3! + ... + r^11/13! */
    const double a0 = 1.0 / 2 + r * (1.0 / 6), a1 = 1.0 / 24 + r * (1.0 / 120);
    const double a2 = 1.0 / 720 + r * (1.0 / 5040), a3 = 1.0 / 40320 + r * (1.0 / 362880);
    const double a4 = 1.0 / 3628800 + r * (1.0 / 39916800);
    const double a5 = 1.0 / 479001600 + r * (1.0 / 6227020800);
    const double q = (a0 + z * a1) + z2 * ((a2 + z * a3) + z2 * (a4 + z * a5));
    const double p = q * z + r + 1.0;
    /* ku = k + 2048 > 0 (k in [-1077, 1025]) */
    const dt_bits64 tb = {t}, mb = {magic};
    const uint64_t ku = tb.u - mb.u + 2048u, half = ku >> 1;
    const dt_bits64 s1 = {.u = (half - 1u) << 52}, s2 = {.u = (ku - half - 1u) << 52};
    return p * s1.f * s2.f;
}

/* Row reductions of the softmax kernels (softmax.c, softmax_xent.c):
 *   dt_max_S(x, n, scale)            the max of x * scale, NaNs skipped (-inf for n = 0; a
 *                                    caller finds a NaN by the NaN it puts in the row sum)
 *   dt_expsum_S(x, n, scale, shift, y)   the sum of e = exp(x * scale - shift), each e written
 *                                    to y unless y is NULL (a constant: the test folds away)
 *   dt_sum_S(x, n), dt_dot_S(a, b, n)
 * A scale of 1 (a constant in the callers that have none) folds away: x * 1 is x. The max
 * runs in DT_LANES lanes (in any order: it is exact). The sums run in DT_LANES lanes over
 * chunks of DT_CHUNK columns, each chunk's lanes then added to the row's lanes, combined in a
 * fixed order, plus a scalar tail: a lane adds at most DT_CHUNK / DT_LANES terms before they
 * move up, so a float32 sum over 50257 columns (a vocabulary) errs as numpy's pairwise one
 * does, not 3141 terms' worth. */
#define DT_CHUNK 1024
/* result = sum of the `term` that TERM computes from the column `i`, as described above */
#define DT_LANE_SUM(T, n, TERM, result)                                                        \
    do {                                                                                       \
        T row_[DT_LANES] = {0}, tail_ = 0;                                                     \
        long long j_ = 0;                                                                      \
        const long long full_ = (n) - (n) % DT_LANES;                                          \
        while (j_ < full_) {                                                                   \
            const long long end_ = full_ - j_ > DT_CHUNK ? j_ + DT_CHUNK : full_;              \
            T acc_[DT_LANES] = {0};                                                            \
            for (; j_ < end_; j_ += DT_LANES) {                                                \
                _Pragma("omp simd") for (int k_ = 0; k_ < DT_LANES; ++k_) {                    \
                    const long long i = j_ + k_;                                               \
                    T term;                                                                    \
                    TERM;                                                                      \
                    acc_[k_] += term;                                                          \
                }                                                                              \
            }                                                                                  \
            _Pragma("omp simd") for (int k_ = 0; k_ < DT_LANES; ++k_) row_[k_] += acc_[k_];    \
        }                                                                                      \
        for (; j_ < (n); ++j_) {                                                               \
            const long long i = j_;                                                            \
            T term;                                                                            \
            TERM;                                                                              \
            tail_ += term;                                                                     \
        }                                                                                      \
        result = dt_combine_##T(row_) + tail_;                                                 \
    } while (0)

#define DT_ROWS(S, T, EXP)                                                                     \
    DT_INLINE T dt_max_##S(const T* x, long long n, T scale) {                                 \
        T acc[DT_LANES];                                                                       \
        for (int k = 0; k < DT_LANES; ++k) acc[k] = -(T)INFINITY;                              \
        long long j = 0;                                                                       \
        const long long full = n - n % DT_LANES;                                               \
        for (; j < full; j += DT_LANES) {                                                      \
            _Pragma("omp simd") for (int k = 0; k < DT_LANES; ++k) {                           \
                const T v = x[j + k] * scale;                                                  \
                acc[k] = v > acc[k] ? v : acc[k];                                              \
            }                                                                                  \
        }                                                                                      \
        T m = -(T)INFINITY;                                                                    \
        for (int k = 0; k < DT_LANES; ++k) m = acc[k] > m ? acc[k] : m;                        \
        for (; j < n; ++j) {                                                                   \
            const T v = x[j] * scale;                                                          \
            m = v > m ? v : m;                                                                 \
        }                                                                                      \
        return m;                                                                              \
    }                                                                                          \
    DT_INLINE T dt_expsum_##S(const T* x, long long n, T scale, T shift, T* y) {               \
        T s;                                                                                   \
        if (y)                                                                                 \
            DT_LANE_SUM(T, n, (term = EXP(x[i] * scale - shift), y[i] = term), s);             \
        else                                                                                   \
            DT_LANE_SUM(T, n, term = EXP(x[i] * scale - shift), s);                            \
        return s;                                                                              \
    }                                                                                          \
    DT_INLINE T dt_sum_##S(const T* x, long long n) {                                          \
        T s;                                                                                   \
        DT_LANE_SUM(T, n, term = x[i], s);                                                     \
        return s;                                                                              \
    }                                                                                          \
    DT_INLINE T dt_dot_##S(const T* a, const T* b, long long n) {                              \
        T s;                                                                                   \
        DT_LANE_SUM(T, n, term = a[i] * b[i], s);                                              \
        return s;                                                                              \
    }
DT_ROWS(f32, float, dt_expf)
DT_ROWS(f64, double, dt_exp)

#endif /* DISTTENSOR_KERNELS_HOST_H */
