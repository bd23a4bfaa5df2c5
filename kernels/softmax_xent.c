/* Softmax cross entropy with the class axis last, row-major (rows, cols), on the host; numpy
 * reference: kernels/softmax_xent.py, CUDA version: softmax_xent.cu. Built and loaded by
 * kernels/_host.py (Note [Host kernels]); exp is host.h's (Note [Vector exp]). The labels
 * come checked and counted from the start (softmax_xent.py's check_labels): int64 in
 * [0, classes), or, for the backward, as columns of this block (label - start), which may
 * lie outside it. */
#include "host.h"

#define XENT_ENTRIES(S, T, EXP, LOG)                                                           \
    /* loss = log(sum(exp(x - shift))) + shift - x[label], shift the max where finite, else   \
       0. The max skips NaNs, so a row with one has a finite max here where the reference's \
       is NaN; its sum is NaN either way (nothing else makes it NaN with a finite max), and  \
       then its shift is the reference's 0 */                                                 \
    DT_CLONES void xent_forward_##S(const T* x, const long long* labels, long long rows,     \
                                    long long cols, T* loss, T* shift, T* sum_exp) {          \
        for (long long r = 0; r < rows; ++r) {                                                \
            const T* xr = x + r * cols;                                                       \
            const T m = dt_max_##S(xr, cols, (T)1);                                           \
            T sh = isfinite(m) ? m : (T)0;                                                    \
            const T s = dt_expsum_##S(xr, cols, (T)1, sh, (T*)0);                             \
            if (isnan(s)) sh = 0;                                                             \
            loss[r] = LOG(s) + sh - xr[labels[r]];                                            \
            shift[r] = sh;                                                                    \
            sum_exp[r] = s;                                                                   \
        }                                                                                     \
    }                                                                                         \
    DT_CLONES void xent_local_sum_exp_##S(const T* x, long long rows, long long cols,         \
                                          const T* shift, T* out) {                           \
        for (long long r = 0; r < rows; ++r)                                                  \
            out[r] = dt_expsum_##S(x + r * cols, cols, (T)1, shift[r], (T*)0);                \
    }                                                                                         \
    /* exp(x - shift) * (g / sum_exp), then g off the label's column where this block holds  \
       it */                                                                                  \
    DT_CLONES void xent_backward_##S(const T* x, const long long* column, long long rows,     \
                                     long long cols, const T* shift, const T* sum_exp,        \
                                     const T* g, T* dx) {                                     \
        for (long long r = 0; r < rows; ++r) {                                                \
            const T* xr = x + r * cols;                                                       \
            T* dr = dx + r * cols;                                                            \
            const T sh = shift[r], c = g[r] / sum_exp[r];                                     \
            _Pragma("omp simd") for (long long j = 0; j < cols; ++j) dr[j] =                  \
                EXP(xr[j] - sh) * c;                                                          \
            if (column[r] >= 0 && column[r] < cols) dr[column[r]] -= g[r];                    \
        }                                                                                     \
    }

XENT_ENTRIES(f32, float, dt_expf, logf)
XENT_ENTRIES(f64, double, dt_exp, log)
