// Layer norm over the last axis of row-major (rows, cols) data; numpy reference:
// kernels/layer_norm.py. Forward and the row part of backward run one block per row (a
// grid-stride loop over rows covers any row count); the weight and bias gradients, sums over
// rows, run as column tiles in two deterministic stages (no atomics: the same input gives the
// same bits on every run).
//
// As in disttensor's layer norm the variance is the mean of squared deviations from the mean
// (two passes over the row, no E[x^2] - E[x]^2 cancellation) and eps is added to it before the
// square root: rstd = 1 / sqrt(var + eps).
#include "common.cuh"

// y = (x - mean) * rstd * weight + bias; weight and bias may be null (absent).
template <typename T>
__device__ void ln_forward(const T* x, const T* weight, const T* bias, long long rows,
                           long long cols, T eps, T* y, T* mean, T* rstd) {
    __shared__ T scratch[32];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * cols;
        T acc = T(0);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) acc += xr[j];
        const T mu = block_reduce(acc, Sum(), T(0), scratch) / T(cols);
        acc = T(0);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            const T d = xr[j] - mu;
            acc += d * d;
        }
        const T var = block_reduce(acc, Sum(), T(0), scratch) / T(cols);
        const T rs = T(1) / Arith<T>::sqrt(var + eps);
        T* yr = y + r * cols;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            T v = (xr[j] - mu) * rs;
            if (weight) v *= weight[j];
            if (bias) v += bias[j];
            yr[j] = v;
        }
        if (threadIdx.x == 0) {
            mean[r] = mu;
            rstd[r] = rs;
        }
    }
}

// dx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat)) with gy = dy * weight and
// xhat = (x - mean) * rstd, per row.
template <typename T>
__device__ void ln_backward_dx(const T* dy, const T* x, const T* mean, const T* rstd,
                               const T* weight, long long rows, long long cols, T* dx) {
    __shared__ T scratch[32];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *dyr = dy + r * cols, *xr = x + r * cols;
        const T mu = mean[r], rs = rstd[r];
        T sum_gy = T(0), sum_gyx = T(0);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            // Arith::mul: never contracted into a multiply-add, so gy below is this very
            // value (a single column must give dx = 0 exactly: gy - mean(gy))
            const T gy = weight ? Arith<T>::mul(dyr[j], weight[j]) : dyr[j];
            sum_gy += gy;
            sum_gyx += gy * ((xr[j] - mu) * rs);
        }
        const T mean_gy = block_reduce(sum_gy, Sum(), T(0), scratch) / T(cols);
        const T mean_gyx = block_reduce(sum_gyx, Sum(), T(0), scratch) / T(cols);
        T* dxr = dx + r * cols;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            const T gy = weight ? Arith<T>::mul(dyr[j], weight[j]) : dyr[j];
            const T xhat = (xr[j] - mu) * rs;
            dxr[j] = rs * (gy - (mean_gy + xhat * mean_gyx));
        }
    }
}

// Tile of the column sums dweight = sum(dy * xhat), dbias = sum(dy): block (32, ROWS_Y), one
// column per threadIdx.x, the rows of chunk blockIdx.y strided over threadIdx.y; writes the
// chunk's partial sums to partial_dw/db[blockIdx.y * cols + column].
#define ROWS_Y 8
template <typename T>
__device__ void ln_backward_partial(const T* dy, const T* x, const T* mean, const T* rstd,
                                    long long rows, long long cols, long long chunk_rows,
                                    T* partial_dw, T* partial_db) {
    __shared__ T tile_dw[ROWS_Y][33], tile_db[ROWS_Y][33];  // 33: no bank conflicts
    const long long col = (long long)blockIdx.x * 32 + threadIdx.x;
    const long long first = (long long)blockIdx.y * chunk_rows;
    const long long last = first + chunk_rows < rows ? first + chunk_rows : rows;
    T dw = T(0), db = T(0);
    if (col < cols) {
        for (long long r = first + threadIdx.y; r < last; r += ROWS_Y) {
            const T g = dy[r * cols + col];
            dw += g * ((x[r * cols + col] - mean[r]) * rstd[r]);
            db += g;
        }
    }
    tile_dw[threadIdx.y][threadIdx.x] = dw;
    tile_db[threadIdx.y][threadIdx.x] = db;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        for (int k = 1; k < ROWS_Y; ++k) {
            dw += tile_dw[k][threadIdx.x];
            db += tile_db[k][threadIdx.x];
        }
        partial_dw[blockIdx.y * cols + col] = dw;
        partial_db[blockIdx.y * cols + col] = db;
    }
}

// Second stage: dweight/dbias[column] = the sum of the chunks' partial sums.
template <typename T>
__device__ void ln_backward_finish(const T* partial_dw, const T* partial_db, long long chunks,
                                   long long cols, T* dweight, T* dbias) {
    GRID_STRIDE(col, cols) {
        T dw = T(0), db = T(0);
        for (long long c = 0; c < chunks; ++c) {
            dw += partial_dw[c * cols + col];
            db += partial_db[c * cols + col];
        }
        dweight[col] = dw;
        dbias[col] = db;
    }
}

#define LN_ENTRIES(SUFFIX, T)                                                                  \
    extern "C" __global__ void ln_forward_##SUFFIX(const T* x, const T* weight, const T* bias, \
                                                   long long rows, long long cols, T eps,      \
                                                   T* y, T* mean, T* rstd) {                   \
        ln_forward<T>(x, weight, bias, rows, cols, eps, y, mean, rstd);                        \
    }                                                                                          \
    extern "C" __global__ void ln_backward_dx_##SUFFIX(                                        \
        const T* dy, const T* x, const T* mean, const T* rstd, const T* weight, long long rows, \
        long long cols, T* dx) {                                                               \
        ln_backward_dx<T>(dy, x, mean, rstd, weight, rows, cols, dx);                          \
    }                                                                                          \
    extern "C" __global__ void ln_backward_partial_##SUFFIX(                                   \
        const T* dy, const T* x, const T* mean, const T* rstd, long long rows, long long cols, \
        long long chunk_rows, T* partial_dw, T* partial_db) {                                  \
        ln_backward_partial<T>(dy, x, mean, rstd, rows, cols, chunk_rows, partial_dw,          \
                               partial_db);                                                    \
    }                                                                                          \
    extern "C" __global__ void ln_backward_finish_##SUFFIX(const T* partial_dw,                \
                                                           const T* partial_db,                \
                                                           long long chunks, long long cols,   \
                                                           T* dweight, T* dbias) {             \
        ln_backward_finish<T>(partial_dw, partial_db, chunks, cols, dweight, dbias);           \
    }

LN_ENTRIES(f32, float)
LN_ENTRIES(f64, double)
