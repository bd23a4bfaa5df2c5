/* Softmax, log softmax, logsumexp and the attention score path over the last axis of row-major
 * (rows, cols) data on the host; numpy reference: kernels/softmax.py, CUDA version:
 * softmax.cu. Built and loaded by kernels/_host.py (Note [Host kernels]). A row stays in the
 * cache across its passes: a forward is a max pass, one pass that takes exp(x - max) into the
 * output (or only into the sum) and one that writes the result; a backward a row sum or dot
 * product and one pass. exp is host.h's dt_expf / dt_exp (Note [Vector exp]).
 *
 * Rows with a NaN, a +inf or only -inf (Note [Softmax of odd rows] in softmax.py) come out as
 * the reference's without a test of their own. The max skips NaNs, but a NaN in the row still
 * reaches the sum through its exp and makes it NaN, where the reference's NaN max would; a
 * softmax max of +inf or -inf makes x - max NaN, so the sum too; and a NaN sum spreads to the
 * row's entries as the reference's does. logsumexp and log softmax shift by the max where it
 * is finite, else 0, as the reference does. Every entry takes the reference's operations in
 * its order, but for the sums, which add in lanes, and softmax's normalization, a product with
 * 1 / sum. */
#include "host.h"

#define SM_ENTRIES(S, T, EXP, LOG)                                                            \
    /* y = exp(x * scale - max) * (1 / sum) over the first `seen` columns (a product, not  \
       the reference's quotient: a division per entry costs softmax's forward an eighth),    \
       0 / sum past them (the reference's exp(-inf - max) / sum: 0, or NaN in a NaN row) */  \
    DT_INLINE void sm_row_##S(const T* x, long long seen, long long cols, T scale, T* y) {    \
        const T m = dt_max_##S(x, seen, scale);                                               \
        const T sum = dt_expsum_##S(x, seen, scale, m, y), inv = (T)1 / sum;                  \
        _Pragma("omp simd") for (long long j = 0; j < seen; ++j) y[j] = y[j] * inv;           \
        const T masked = (T)0 / sum;                                                          \
        for (long long j = seen; j < cols; ++j) y[j] = masked;                                \
    }                                                                                         \
    /* ((g - sum(g * y)) * y) * scale: softmax's gradient, scaled for the attention path */    \
    DT_INLINE void sm_grad_##S(const T* g, const T* y, long long rows, long long cols,        \
                               T scale, T* dx) {                                              \
        for (long long r = 0; r < rows; ++r) {                                                \
            const T *gr = g + r * cols, *yr = y + r * cols;                                   \
            T* dr = dx + r * cols;                                                            \
            const T d = dt_dot_##S(gr, yr, cols);                                             \
            _Pragma("omp simd") for (long long j = 0; j < cols; ++j) dr[j] =                  \
                (gr[j] - d) * yr[j] * scale;                                                  \
        }                                                                                     \
    }                                                                                         \
    /* the shift of logsumexp and log softmax: the max where finite, else 0 */                \
    DT_INLINE T sm_shift_##S(const T* x, long long cols) {                                    \
        const T m = dt_max_##S(x, cols, (T)1);                                                \
        return isfinite(m) ? m : (T)0;                                                        \
    }                                                                                         \
    DT_CLONES void softmax_forward_##S(const T* x, long long rows, long long cols, T* y) {    \
        for (long long r = 0; r < rows; ++r)                                                  \
            sm_row_##S(x + r * cols, cols, cols, (T)1, y + r * cols);                         \
    }                                                                                         \
    DT_CLONES void softmax_backward_##S(const T* g, const T* y, long long rows,               \
                                        long long cols, T* dx) {                              \
        sm_grad_##S(g, y, rows, cols, (T)1, dx);                                              \
    }                                                                                         \
    /* x - (log(sum(exp(x - shift))) + shift) */                                              \
    DT_CLONES void log_softmax_forward_##S(const T* x, long long rows, long long cols, T* y) { \
        for (long long r = 0; r < rows; ++r) {                                                \
            const T* xr = x + r * cols;                                                       \
            T* yr = y + r * cols;                                                             \
            const T shift = sm_shift_##S(xr, cols);                                           \
            const T lse = LOG(dt_expsum_##S(xr, cols, (T)1, shift, (T*)0)) + shift;           \
            _Pragma("omp simd") for (long long j = 0; j < cols; ++j) yr[j] = xr[j] - lse;     \
        }                                                                                     \
    }                                                                                         \
    /* g - exp(y) * sum(g) */                                                                 \
    DT_CLONES void log_softmax_backward_##S(const T* g, const T* y, long long rows,           \
                                            long long cols, T* dx) {                          \
        for (long long r = 0; r < rows; ++r) {                                                \
            const T *gr = g + r * cols, *yr = y + r * cols;                                   \
            T* dr = dx + r * cols;                                                            \
            const T s = dt_sum_##S(gr, cols);                                                 \
            _Pragma("omp simd") for (long long j = 0; j < cols; ++j) dr[j] =                  \
                gr[j] - EXP(yr[j]) * s;                                                       \
        }                                                                                     \
    }                                                                                         \
    DT_CLONES void logsumexp_forward_##S(const T* x, long long rows, long long cols, T* out) { \
        for (long long r = 0; r < rows; ++r) {                                                \
            const T* xr = x + r * cols;                                                       \
            const T shift = sm_shift_##S(xr, cols);                                           \
            out[r] = LOG(dt_expsum_##S(xr, cols, (T)1, shift, (T*)0)) + shift;                \
        }                                                                                     \
    }                                                                                         \
    /* exp(x - out) * g, with the forward's out and the gradient g per row */                 \
    DT_CLONES void logsumexp_backward_##S(const T* g, const T* x, const T* out, long long rows, \
                                          long long cols, T* dx) {                            \
        for (long long r = 0; r < rows; ++r) {                                                \
            const T *xr = x + r * cols, o = out[r], gr = g[r];                                \
            T* dr = dx + r * cols;                                                            \
            _Pragma("omp simd") for (long long j = 0; j < cols; ++j) dr[j] =                  \
                EXP(xr[j] - o) * gr;                                                          \
        }                                                                                     \
    }                                                                                         \
    /* softmax(where(mask, s * scale, -inf)); the causal mask hides column j > i of query i,  \
       the row's index modulo n_q (the queries axis' length): those columns are not read */   \
    DT_CLONES void attention_softmax_forward_##S(const T* s, long long rows, long long cols,  \
                                                 double scale, int causal, long long n_q,     \
                                                 T* y) {                                      \
        const T sc = (T)scale;                                                                \
        for (long long r = 0; r < rows; ++r) {                                                \
            const long long q = r % n_q, seen = causal && q + 1 < cols ? q + 1 : cols;        \
            sm_row_##S(s + r * cols, seen, cols, sc, y + r * cols);                           \
        }                                                                                     \
    }                                                                                         \
    DT_CLONES void attention_softmax_backward_##S(const T* g, const T* y, long long rows,     \
                                                  long long cols, double scale, T* dx) {      \
        sm_grad_##S(g, y, rows, cols, (T)scale, dx);                                          \
    }

SM_ENTRIES(f32, float, dt_expf, logf)
SM_ENTRIES(f64, double, dt_exp, log)

/* The exp functions themselves, for tests/test_host_kernels.py's accuracy checks */
DT_CLONES void dt_host_exp_f32(const float* x, float* y, long long n) {
    _Pragma("omp simd") for (long long i = 0; i < n; ++i) y[i] = dt_expf(x[i]);
}
DT_CLONES void dt_host_exp_f64(const double* x, double* y, long long n) {
    _Pragma("omp simd") for (long long i = 0; i < n; ++i) y[i] = dt_exp(x[i]);
}
