// Softmax, log softmax and logsumexp over the last axis of row-major (rows, cols) data, and
// the attention score path (scale, causal mask, softmax) in one kernel; numpy reference:
// kernels/softmax.py. Every entry takes (inputs..., rows, cols, output) and loops over the
// rows (grid-stride), so any grid computes the same; the loader picks the launch.
//
// Two kinds of entries (Note [Warp rows]):
// * <name>_w<PER>_f32/_f64: one warp per row, for rows of at most 32 * PER columns, the row
//   held in registers (lane l has columns l, l + 32, ...): one read of the input, max and sum
//   by warp shuffles, no barriers; PER is 4, 8, 16 or 32 (rows up to WARP_COLS);
// * <name>_f32/_f64: one block per row, any length: max and sum in one pass by an online
//   softmax (online.cuh) and block reductions, then a second pass writes the row.
// Rows with a NaN, a +inf or nothing but -inf give what numpy's composites give (Note
// [Softmax of odd rows] in kernels/softmax.py): softmax NaN throughout; logsumexp shifted by 0
// instead of the max.
//
// Note [Warp rows]
//     A block reduction per row costs two barriers and, for the online state, two exps per
//     shuffle step: for rows of a few hundred columns (attention scores, most softmax calls)
//     that is more than the row's own arithmetic. A warp per row keeps PER values per lane in
//     registers (PER a template argument, so the arrays stay in registers), finds the max
//     with a NaN-propagating warp max (numpy's: a row whose max is not finite is exactly a
//     row with a NaN, a +inf or only -inf), the sum with a warp sum, and writes the row from
//     the registers. Each PER is an entry of its own: a kernel's registers are those of its
//     largest path, and the occupancy (rows in flight, what hides the memory latency) of a
//     512-column softmax must not pay for 1024-column rows (measured on an H200: 0.21 ms
//     with all widths in one kernel, against 0.07 for a copy of the same bytes). The loader
//     launches blocks of WARP_THREADS threads, WARP_THREADS / 32 rows at a time each.
#include "common.cuh"
#include "online.cuh"

#define WARP_COLS 1024  // the longest rows a warp entry takes (PER 32); kernels/softmax.py

// -- walking the rows ---------------------------------------------------------------------------
// The rows this thread works on: the first, the stride to the next, and the thread's place
// among the row's workers (lane of the warp, or thread of the block) and their number.
struct Rows {
    long long first, stride;
    int lane, width;
};

__device__ __forceinline__ Rows warp_rows() {
    const long long warps = blockDim.x >> 5;
    return {blockIdx.x * warps + (threadIdx.x >> 5), gridDim.x * warps, (int)(threadIdx.x & 31),
            32};
}

__device__ __forceinline__ Rows block_rows() {
    return {blockIdx.x, gridDim.x, (int)threadIdx.x, (int)blockDim.x};
}

// The columns of a causal row: query r % n_q sees keys j <= r % n_q (np.tril's mask).
__device__ __forceinline__ long long seen_cols(long long r, long long cols, int causal,
                                               long long n_q) {
    return (causal && r % n_q + 1 < cols) ? r % n_q + 1 : cols;
}

// -- softmax and the attention score path ---------------------------------------------------------
// y = softmax(where(mask, x * scale, -inf)) per row, the mask causal (seen_cols) or none
// (softmax itself: scale 1, exact). The scale is an _rn product, as numpy rounds it.
template <typename T, int PER>
__device__ void softmax_forward_warp(const T* x, T scale, int causal, long long n_q,
                                     long long rows, long long cols, T* y) {
    const Rows w = warp_rows();
    for (long long r = w.first; r < rows; r += w.stride) {
        const T* xr = x + r * cols;
        const long long seen = seen_cols(r, cols, causal, n_q);
        T v[PER];
        T m = -Arith<T>::inf();
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const long long j = w.lane + 32 * i;
            v[i] = j < seen ? Arith<T>::mul(xr[j], scale) : -Arith<T>::inf();
            m = NanMax()(m, v[i]);
        }
        m = warp_reduce(m, NanMax());
        T s = T(0);
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            v[i] = Arith<T>::exp(v[i] - m);  // masked and padded: exp(-inf) = 0
            s += v[i];
        }
        // one division per row: e * (1 / s) is within an ulp of numpy's e / s, and a
        // division per element (a multi-instruction sequence) slowed the kernel by a third
        const T inv = T(1) / warp_reduce(s, Sum());
        const bool nan_row = !is_finite(m);  // x - max is NaN somewhere, and so is the sum
        T* yr = y + r * cols;
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const long long j = w.lane + 32 * i;
            if (j < cols) yr[j] = nan_row ? Arith<T>::nan() : v[i] * inv;
        }
    }
}

template <typename T>
__device__ void softmax_forward_block(const T* x, T scale, int causal, long long n_q,
                                      long long rows, long long cols, T* y) {
    __shared__ Online<T> scratch[32];
    const Online<T> empty = online_empty<T>();
    const Rows w = block_rows();
    for (long long r = w.first; r < rows; r += w.stride) {
        const T* xr = x + r * cols;
        T* yr = y + r * cols;
        const long long seen = seen_cols(r, cols, causal, n_q);
        Online<T> st = empty;
        for (long long j = w.lane; j < seen; j += w.width)
            st = online_add(st, Arith<T>::mul(xr[j], scale));
        st = block_reduce(st, Merge(), empty, scratch);
        // online.cuh keeps NaN and +inf out of the max: flagged, they make the row NaN too
        const bool nan_row = st.odd || !is_finite(st.max);
        const T inv = T(1) / st.sum;  // as in the warp entries
        for (long long j = w.lane; j < cols; j += w.width) {
            T v = T(0);
            if (nan_row)
                v = Arith<T>::nan();
            else if (j < seen)
                v = Arith<T>::exp(Arith<T>::mul(xr[j], scale) - st.max) * inv;
            yr[j] = v;
        }
    }
}


// dx = scale * y * (g - sum(g * y)) per row, from softmax's output y (masked entries: y = 0).
template <typename T, int PER>
__device__ void softmax_backward_warp(const T* g, const T* y, T scale, long long rows,
                                      long long cols, T* dx) {
    const Rows w = warp_rows();
    for (long long r = w.first; r < rows; r += w.stride) {
        const T *gr = g + r * cols, *yr = y + r * cols;
        T gv[PER], yv[PER];
        T acc = T(0);
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const long long j = w.lane + 32 * i;
            gv[i] = j < cols ? gr[j] : T(0);
            yv[i] = j < cols ? yr[j] : T(0);
            acc += gv[i] * yv[i];
        }
        const T dot = warp_reduce(acc, Sum());
        T* dxr = dx + r * cols;
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const long long j = w.lane + 32 * i;
            if (j < cols) dxr[j] = (gv[i] - dot) * yv[i] * scale;
        }
    }
}

template <typename T>
__device__ void softmax_backward_block(const T* g, const T* y, T scale, long long rows,
                                       long long cols, T* dx) {
    __shared__ T scratch[32];
    const Rows w = block_rows();
    for (long long r = w.first; r < rows; r += w.stride) {
        const T *gr = g + r * cols, *yr = y + r * cols;
        T acc = T(0);
        for (long long j = w.lane; j < cols; j += w.width) acc += gr[j] * yr[j];
        const T dot = block_reduce(acc, Sum(), T(0), scratch);
        T* dxr = dx + r * cols;
        for (long long j = w.lane; j < cols; j += w.width)
            dxr[j] = (gr[j] - dot) * yr[j] * scale;
    }
}


// -- log softmax and logsumexp ------------------------------------------------------------------
// The row's logsumexp, log(sum(exp(x - shift))) + shift, shift the max where finite else 0,
// from a warp holding the row (its lanes' values, -inf past the row).
template <typename T, int PER>
__device__ __forceinline__ T warp_logsumexp(const T (&v)[PER]) {
    T m = -Arith<T>::inf();
#pragma unroll
    for (int i = 0; i < PER; ++i) m = NanMax()(m, v[i]);
    m = warp_reduce(m, NanMax());
    const T shift = is_finite(m) ? m : T(0);  // NaN: exp(NaN) makes the sum NaN, as numpy's
    T s = T(0);
#pragma unroll
    for (int i = 0; i < PER; ++i) s += Arith<T>::exp(v[i] - shift);
    return Arith<T>::log(warp_reduce(s, Sum())) + shift;
}

// The same from a block walking the row (online.cuh).
template <typename T>
__device__ __forceinline__ T block_logsumexp(const T* xr, long long cols, Rows w,
                                             Online<T>* scratch) {
    const Online<T> empty = online_empty<T>();
    Online<T> st = empty;
    for (long long j = w.lane; j < cols; j += w.width) st = online_add(st, xr[j]);
    st = block_reduce(st, Merge(), empty, scratch);
    T shift, sum;
    online_shift_sum(st, &shift, &sum);
    return Arith<T>::log(sum) + shift;
}

template <int PER, typename T>
__device__ __forceinline__ void load_row(const T* xr, long long cols, int lane, T (&v)[PER]) {
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const long long j = lane + 32 * i;
        v[i] = j < cols ? xr[j] : -Arith<T>::inf();
    }
}

// y = x - logsumexp(x) per row.
template <typename T, int PER>
__device__ void log_softmax_forward_warp(const T* x, long long rows, long long cols, T* y) {
    const Rows w = warp_rows();
    for (long long r = w.first; r < rows; r += w.stride) {
        T v[PER];
        load_row(x + r * cols, cols, w.lane, v);
        const T lse = warp_logsumexp(v);
        T* yr = y + r * cols;
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const long long j = w.lane + 32 * i;
            if (j < cols) yr[j] = v[i] - lse;
        }
    }
}

template <typename T>
__device__ void log_softmax_forward_block(const T* x, long long rows, long long cols, T* y) {
    __shared__ Online<T> scratch[32];
    const Rows w = block_rows();
    for (long long r = w.first; r < rows; r += w.stride) {
        const T* xr = x + r * cols;
        const T lse = block_logsumexp(xr, cols, w, scratch);
        T* yr = y + r * cols;
        for (long long j = w.lane; j < cols; j += w.width) yr[j] = xr[j] - lse;
    }
}

template <typename T, int PER>
__device__ void logsumexp_forward_warp(const T* x, long long rows, long long cols, T* out) {
    const Rows w = warp_rows();
    for (long long r = w.first; r < rows; r += w.stride) {
        T v[PER];
        load_row(x + r * cols, cols, w.lane, v);
        const T lse = warp_logsumexp(v);
        if (w.lane == 0) out[r] = lse;
    }
}

template <typename T>
__device__ void logsumexp_forward_block(const T* x, long long rows, long long cols, T* out) {
    __shared__ Online<T> scratch[32];
    const Rows w = block_rows();
    for (long long r = w.first; r < rows; r += w.stride) {
        const T lse = block_logsumexp(x + r * cols, cols, w, scratch);
        if (w.lane == 0) out[r] = lse;
    }
}

// dx = g - exp(y) * sum(g) per row, from log softmax's output y.
template <typename T, int PER>
__device__ void log_softmax_backward_warp(const T* g, const T* y, long long rows,
                                          long long cols, T* dx) {
    const Rows w = warp_rows();
    for (long long r = w.first; r < rows; r += w.stride) {
        const T *gr = g + r * cols, *yr = y + r * cols;
        T gv[PER];
        T acc = T(0);
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const long long j = w.lane + 32 * i;
            gv[i] = j < cols ? gr[j] : T(0);
            acc += gv[i];
        }
        const T total = warp_reduce(acc, Sum());
        T* dxr = dx + r * cols;
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const long long j = w.lane + 32 * i;
            if (j < cols) dxr[j] = gv[i] - Arith<T>::mul(Arith<T>::exp(yr[j]), total);
        }
    }
}

template <typename T>
__device__ void log_softmax_backward_block(const T* g, const T* y, long long rows,
                                           long long cols, T* dx) {
    __shared__ T scratch[32];
    const Rows w = block_rows();
    for (long long r = w.first; r < rows; r += w.stride) {
        const T *gr = g + r * cols, *yr = y + r * cols;
        T acc = T(0);
        for (long long j = w.lane; j < cols; j += w.width) acc += gr[j];
        const T total = block_reduce(acc, Sum(), T(0), scratch);
        T* dxr = dx + r * cols;
        for (long long j = w.lane; j < cols; j += w.width)
            dxr[j] = gr[j] - Arith<T>::mul(Arith<T>::exp(yr[j]), total);
    }
}

// dx = g * exp(x - out) per row, g and out (the forward's logsumexp) one value per row; no
// reduction, so a row's workers only split its columns: one entry, a warp per row of at most
// WARP_COLS columns (the loader's launch for those), else a block.
template <typename T>
__device__ void logsumexp_backward(const T* g, const T* x, const T* out, long long rows,
                                   long long cols, T* dx) {
    const Rows w = cols <= WARP_COLS ? warp_rows() : block_rows();
    for (long long r = w.first; r < rows; r += w.stride) {
        const T* xr = x + r * cols;
        const T gr = g[r], lse = out[r];
        T* dxr = dx + r * cols;
        for (long long j = w.lane; j < cols; j += w.width) dxr[j] = Arith<T>::exp(xr[j] - lse) * gr;
    }
}

// -- entry points ---------------------------------------------------------------------------------
#define BLOCK_ENTRIES(SUFFIX, T)                                                              \
    extern "C" __global__ void softmax_forward_##SUFFIX(const T* x, T scale, int causal,      \
                                                        long long n_q, long long rows,        \
                                                        long long cols, T* y) {               \
        softmax_forward_block<T>(x, scale, causal, n_q, rows, cols, y);                       \
    }                                                                                         \
    extern "C" __global__ void softmax_backward_##SUFFIX(const T* g, const T* y, T scale,     \
                                                         long long rows, long long cols,      \
                                                         T* dx) {                             \
        softmax_backward_block<T>(g, y, scale, rows, cols, dx);                               \
    }                                                                                         \
    extern "C" __global__ void log_softmax_forward_##SUFFIX(const T* x, long long rows,       \
                                                            long long cols, T* y) {           \
        log_softmax_forward_block<T>(x, rows, cols, y);                                       \
    }                                                                                         \
    extern "C" __global__ void log_softmax_backward_##SUFFIX(                                 \
        const T* g, const T* y, long long rows, long long cols, T* dx) {                      \
        log_softmax_backward_block<T>(g, y, rows, cols, dx);                                  \
    }                                                                                         \
    extern "C" __global__ void logsumexp_forward_##SUFFIX(const T* x, long long rows,         \
                                                          long long cols, T* out) {           \
        logsumexp_forward_block<T>(x, rows, cols, out);                                       \
    }                                                                                         \
    extern "C" __global__ void logsumexp_backward_##SUFFIX(                                   \
        const T* g, const T* x, const T* out, long long rows, long long cols, T* dx) {        \
        logsumexp_backward<T>(g, x, out, rows, cols, dx);                                     \
    }

// The warp entries of rows of at most 32 * PER columns (Note [Warp rows]).
#define WARP_ENTRIES(PER, SUFFIX, T)                                                          \
    extern "C" __global__ void softmax_forward_w##PER##_##SUFFIX(                             \
        const T* x, T scale, int causal, long long n_q, long long rows, long long cols,       \
        T* y) {                                                                               \
        softmax_forward_warp<T, PER>(x, scale, causal, n_q, rows, cols, y);                   \
    }                                                                                         \
    extern "C" __global__ void softmax_backward_w##PER##_##SUFFIX(                            \
        const T* g, const T* y, T scale, long long rows, long long cols, T* dx) {             \
        softmax_backward_warp<T, PER>(g, y, scale, rows, cols, dx);                           \
    }                                                                                         \
    extern "C" __global__ void log_softmax_forward_w##PER##_##SUFFIX(                         \
        const T* x, long long rows, long long cols, T* y) {                                   \
        log_softmax_forward_warp<T, PER>(x, rows, cols, y);                                   \
    }                                                                                         \
    extern "C" __global__ void log_softmax_backward_w##PER##_##SUFFIX(                        \
        const T* g, const T* y, long long rows, long long cols, T* dx) {                      \
        log_softmax_backward_warp<T, PER>(g, y, rows, cols, dx);                              \
    }                                                                                         \
    extern "C" __global__ void logsumexp_forward_w##PER##_##SUFFIX(                           \
        const T* x, long long rows, long long cols, T* out) {                                 \
        logsumexp_forward_warp<T, PER>(x, rows, cols, out);                                   \
    }

BLOCK_ENTRIES(f32, float)
BLOCK_ENTRIES(f64, double)
WARP_ENTRIES(4, f32, float)
WARP_ENTRIES(8, f32, float)
WARP_ENTRIES(16, f32, float)
WARP_ENTRIES(32, f32, float)
WARP_ENTRIES(4, f64, double)
WARP_ENTRIES(8, f64, double)
WARP_ENTRIES(16, f64, double)
WARP_ENTRIES(32, f64, double)
