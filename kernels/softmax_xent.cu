// Softmax cross entropy over the last axis of row-major (rows, cols) logits, one block per row
// (a grid-stride loop over rows covers any row count); numpy reference: kernels/softmax_xent.py.
//
// Labels are int64 and already checked to lie in [-classes, classes) by the host; a negative
// label counts from the end. `classes` is the whole vocabulary and `start` the first class of
// these columns: (0, cols) for whole rows, (v0, V) for a rank of a vocabulary-parallel loss
// holding the column block [v0, v0 + cols) of a V-class vocabulary.
//
// The shift. Like disttensor's cross entropy the loss is log(sum(exp(x - s))) + s - x[label]
// with s the row max when that is finite, else 0 (a row with a NaN, a +inf, or only -inf).
// The forward kernel finds s and the sum in one pass with an online softmax (online.cuh):
// each thread keeps the running max m of the finite values it saw and sum(exp(x - m)),
// rescaled when m grows; states merge across the block. A NaN or +inf is only flagged: with
// one of them s is 0 and the sum is NaN (a NaN) or +inf, as numpy's sum of exp(x) would be.
#include "common.cuh"
#include "online.cuh"

// The label's column in this block of columns, or -1 when another block holds it.
__device__ __forceinline__ long long label_column(const long long* labels, long long row,
                                                  long long start, long long cols,
                                                  long long classes) {
    long long j = labels[row];
    if (j < 0) j += classes;
    j -= start;
    return (j >= 0 && j < cols) ? j : -1;
}

template <typename T>
__device__ void xent_forward(const T* logits, const long long* labels, long long rows,
                             long long cols, T* loss, T* shift, T* sum_exp) {
    __shared__ Online<T> scratch[32];
    const Online<T> empty = online_empty<T>();
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* x = logits + r * cols;
        Online<T> st = empty;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) st = online_add(st, x[j]);
        st = block_reduce(st, Merge(), empty, scratch);
        if (threadIdx.x == 0) {
            T s, sum;
            online_shift_sum(st, &s, &sum);
            const long long j = label_column(labels, r, 0, cols, cols);
            shift[r] = s;
            sum_exp[r] = sum;
            loss[r] = (Arith<T>::log(sum) + s) - x[j];
        }
    }
}

// Vocabulary-parallel forward, first pass: the max of this block of columns (numpy's: NaN
// wins; -inf for no columns) and the label's logit where this block holds the label, else 0.
template <typename T>
__device__ void xent_local_max(const T* logits, const long long* labels, long long rows,
                               long long cols, long long start, long long classes, T* local_max,
                               T* label_logit) {
    __shared__ T scratch[32];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* x = logits + r * cols;
        T m = -Arith<T>::inf();
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) m = NanMax()(m, x[j]);
        m = block_reduce(m, NanMax(), -Arith<T>::inf(), scratch);
        if (threadIdx.x == 0) {
            const long long j = label_column(labels, r, start, cols, classes);
            local_max[r] = m;
            label_logit[r] = j >= 0 ? x[j] : T(0);
        }
    }
}

// Vocabulary-parallel forward, second pass: sum(exp(x - shift)) over this block of columns,
// with the shift made from the all-reduced max.
template <typename T>
__device__ void xent_local_sum_exp(const T* logits, long long rows, long long cols,
                                   const T* shift, T* sum_exp) {
    __shared__ T scratch[32];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* x = logits + r * cols;
        const T s = shift[r];
        T acc = T(0);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) acc += Arith<T>::exp(x[j] - s);
        acc = block_reduce(acc, Sum(), T(0), scratch);
        if (threadIdx.x == 0) sum_exp[r] = acc;
    }
}

// dlogits = (exp(x - shift) / sum_exp - onehot(label)) * grad_loss, per row; with the global
// shift and sum this is also a vocabulary-parallel rank's block of the gradient.
template <typename T>
__device__ void xent_backward(const T* logits, const long long* labels, long long rows,
                              long long cols, long long start, long long classes, const T* shift,
                              const T* sum_exp, const T* grad_loss, T* dlogits) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* x = logits + r * cols;
        T* dx = dlogits + r * cols;
        const T s = shift[r], sum = sum_exp[r], g = grad_loss[r];
        const long long label = label_column(labels, r, start, cols, classes);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            const T p = Arith<T>::exp(x[j] - s) / sum;
            dx[j] = (j == label ? p - T(1) : p) * g;
        }
    }
}

#define XENT_ENTRIES(SUFFIX, T)                                                               \
    extern "C" __global__ void xent_forward_##SUFFIX(const T* logits, const long long* labels, \
                                                     long long rows, long long cols, T* loss,  \
                                                     T* shift, T* sum_exp) {                   \
        xent_forward<T>(logits, labels, rows, cols, loss, shift, sum_exp);                     \
    }                                                                                          \
    extern "C" __global__ void xent_local_max_##SUFFIX(                                        \
        const T* logits, const long long* labels, long long rows, long long cols,              \
        long long start, long long classes, T* local_max, T* label_logit) {                    \
        xent_local_max<T>(logits, labels, rows, cols, start, classes, local_max, label_logit); \
    }                                                                                          \
    extern "C" __global__ void xent_local_sum_exp_##SUFFIX(                                    \
        const T* logits, long long rows, long long cols, const T* shift, T* sum_exp) {         \
        xent_local_sum_exp<T>(logits, rows, cols, shift, sum_exp);                             \
    }                                                                                          \
    extern "C" __global__ void xent_backward_##SUFFIX(                                         \
        const T* logits, const long long* labels, long long rows, long long cols,              \
        long long start, long long classes, const T* shift, const T* sum_exp,                  \
        const T* grad_loss, T* dlogits) {                                                      \
        xent_backward<T>(logits, labels, rows, cols, start, classes, shift, sum_exp,           \
                         grad_loss, dlogits);                                                  \
    }

XENT_ENTRIES(f32, float)
XENT_ENTRIES(f64, double)
