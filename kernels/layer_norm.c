/* Layer norm over the last axis of row-major (rows, cols) data on the host; numpy reference:
 * kernels/layer_norm.py, CUDA version: layer_norm.cu. Built and loaded by kernels/_host.py
 * (Note [Host kernels]): one pass over a row for its mean, one for its variance (the mean of
 * squared deviations: no E[x^2] - E[x]^2 cancellation) and one to write it, the row staying
 * in the cache between them; the backward two passes per row. Sums run in LANES partial sums
 * combined in a fixed order, so the bits do not depend on the vector width. */
#include "host.h"

#define LN_ENTRIES(SUFFIX, T)                                                                  \
    DT_CLONES void ln_forward_##SUFFIX(const T* x, const T* weight, const T* bias,           \
                                       long long rows, long long cols, double eps, T* y,     \
                                       T* mean, T* rstd) {                                   \
        const T n = (T)cols;                                                                 \
        for (long long r = 0; r < rows; ++r) {                                               \
            const T* xr = x + r * cols;                                                      \
            T* yr = y + r * cols;                                                            \
            T acc[DT_LANES] = {0};                                                           \
            long long j = 0, full = cols - cols % DT_LANES;                                  \
            for (; j < full; j += DT_LANES) {                                                \
                _Pragma("omp simd") for (int k = 0; k < DT_LANES; ++k) acc[k] += xr[j + k]; \
            }                                                                                \
            T tail = 0;                                                                      \
            for (; j < cols; ++j) tail += xr[j];                                             \
            const T mu = (dt_combine_##T(acc) + tail) / n;                                   \
            T sq[DT_LANES] = {0};                                                            \
            for (j = 0; j < full; j += DT_LANES) {                                           \
                _Pragma("omp simd") for (int k = 0; k < DT_LANES; ++k) {                     \
                    const T d = xr[j + k] - mu;                                              \
                    sq[k] += d * d;                                                          \
                }                                                                            \
            }                                                                                \
            tail = 0;                                                                        \
            for (; j < cols; ++j) {                                                          \
                const T d = xr[j] - mu;                                                      \
                tail += d * d;                                                               \
            }                                                                                \
            const T rs = (T)1 / (T)sqrt((double)((dt_combine_##T(sq) + tail) / n + (T)eps)); \
            if (weight && bias) {                                                            \
                _Pragma("omp simd") for (j = 0; j < cols; ++j) yr[j] =                       \
                    (xr[j] - mu) * rs * weight[j] + bias[j];                                 \
            } else if (weight) {                                                             \
                _Pragma("omp simd") for (j = 0; j < cols; ++j) yr[j] =                       \
                    (xr[j] - mu) * rs * weight[j];                                           \
            } else if (bias) {                                                               \
                _Pragma("omp simd") for (j = 0; j < cols; ++j) yr[j] =                       \
                    (xr[j] - mu) * rs + bias[j];                                             \
            } else {                                                                         \
                _Pragma("omp simd") for (j = 0; j < cols; ++j) yr[j] = (xr[j] - mu) * rs;   \
            }                                                                                \
            mean[r] = mu;                                                                    \
            rstd[r] = rs;                                                                    \
        }                                                                                    \
    }                                                                                        \
    /* dx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat)), gy = dy * weight; dweight and   \
       dbias, sums over the rows, added row after row (a fixed order too) */                 \
    DT_CLONES void ln_backward_##SUFFIX(const T* dy, const T* x, const T* mean,               \
                                        const T* rstd, const T* weight, long long rows,       \
                                        long long cols, T* dx, T* dweight, T* dbias) {        \
        const T n = (T)cols;                                                                 \
        for (long long j = 0; j < cols; ++j) dweight[j] = dbias[j] = 0;                      \
        for (long long r = 0; r < rows; ++r) {                                               \
            const T *dyr = dy + r * cols, *xr = x + r * cols;                                \
            T* dxr = dx + r * cols;                                                          \
            const T mu = mean[r], rs = rstd[r];                                              \
            T sg[DT_LANES] = {0}, sgx[DT_LANES] = {0};                                       \
            long long j = 0, full = cols - cols % DT_LANES;                                  \
            for (; j < full; j += DT_LANES) {                                                \
                _Pragma("omp simd") for (int k = 0; k < DT_LANES; ++k) {                     \
                    const T g = weight ? dyr[j + k] * weight[j + k] : dyr[j + k];            \
                    sg[k] += g;                                                              \
                    sgx[k] += g * ((xr[j + k] - mu) * rs);                                   \
                }                                                                            \
            }                                                                                \
            T tg = 0, tgx = 0;                                                               \
            for (; j < cols; ++j) {                                                          \
                const T g = weight ? dyr[j] * weight[j] : dyr[j];                            \
                tg += g;                                                                     \
                tgx += g * ((xr[j] - mu) * rs);                                              \
            }                                                                                \
            const T mean_g = (dt_combine_##T(sg) + tg) / n;                                  \
            const T mean_gx = (dt_combine_##T(sgx) + tgx) / n;                               \
            _Pragma("omp simd") for (j = 0; j < cols; ++j) {                                 \
                const T xh = (xr[j] - mu) * rs;                                              \
                const T g = weight ? dyr[j] * weight[j] : dyr[j];                            \
                dxr[j] = rs * (g - (mean_g + xh * mean_gx));                                 \
                dweight[j] += dyr[j] * xh;                                                   \
                dbias[j] += dyr[j];                                                          \
            }                                                                                \
        }                                                                                    \
    }

LN_ENTRIES(f32, float)
LN_ENTRIES(f64, double)
