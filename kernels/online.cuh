// Online softmax statistics of a row: the running max of its finite values and the sum of
// exp(x - max), rescaled whenever the max grows, so one pass over the row finds both; the
// states of a block's threads merge with block_reduce(state, Merge(), ...). A NaN or a +inf
// is only flagged: the callers decide what such a row gives (Note [Softmax of odd rows] in
// kernels/softmax.py; kernels/softmax_xent.cu). Used by softmax_xent.cu and softmax.cu.
#ifndef DISTTENSOR_KERNELS_ONLINE_CUH
#define DISTTENSOR_KERNELS_ONLINE_CUH

#include "common.cuh"

template <typename T>
struct Online {
    T max;    // of the finite values seen; -inf before any
    T sum;    // of exp(x - max) over them
    int odd;  // bit 1: a NaN seen, bit 2: a +inf seen
};

template <typename T>
__device__ __forceinline__ Online<T> online_empty() {
    return {-Arith<T>::inf(), T(0), 0};
}

template <typename T>
__device__ __forceinline__ Online<T> shfl_xor(Online<T> s, int lane) {
    return {shfl_xor(s.max, lane), shfl_xor(s.sum, lane), shfl_xor(s.odd, lane)};
}

struct Merge {
    template <typename T>
    __device__ __forceinline__ Online<T> operator()(Online<T> a, Online<T> b) const {
        const T m = a.max > b.max ? a.max : b.max;
        // both empty: m is -inf and exp(-inf - -inf) would be NaN
        const T s = m == -Arith<T>::inf()
                        ? T(0)
                        : a.sum * Arith<T>::exp(a.max - m) + b.sum * Arith<T>::exp(b.max - m);
        return {m, s, a.odd | b.odd};
    }
};

template <typename T>
__device__ __forceinline__ Online<T> online_add(Online<T> a, T x) {
    if (x != x) {
        a.odd |= 1;
    } else if (x == Arith<T>::inf()) {
        a.odd |= 2;
    } else if (x != -Arith<T>::inf()) {  // -inf adds exp(-inf) = 0: skipped
        if (x > a.max) {
            a.sum = a.sum * Arith<T>::exp(a.max - x) + T(1);
            a.max = x;
        } else {
            a.sum += Arith<T>::exp(x - a.max);
        }
    }
    return a;
}

// The shift and sum of a whole row's merged state, as numpy computes sum(exp(x - shift))
// with shift the row max where finite, else 0: a row with a NaN sums to NaN, one with a
// +inf to +inf, one of only -inf (or no columns) to 0.
template <typename T>
__device__ __forceinline__ void online_shift_sum(Online<T> st, T* shift, T* sum) {
    *shift = st.max;
    *sum = st.sum;
    if (st.odd || !is_finite(st.max)) {
        *shift = T(0);
        *sum = (st.odd & 1) ? Arith<T>::nan() : (st.odd & 2) ? Arith<T>::inf() : T(0);
    }
}

#endif  // DISTTENSOR_KERNELS_ONLINE_CUH
