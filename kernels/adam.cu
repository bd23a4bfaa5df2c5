// Fused Adam / AdamW step: one pass over parameter, gradient and both moments, in place.
// The numpy reference is kernels/adam.py (adam_update); it and this kernel perform the same
// roundings in the same order, so their results agree bit for bit.
//
// The host computes every coefficient in double from Python floats and rounds it once to T
// (as numpy does with a Python scalar next to a T array): beta1, 1 - beta1, beta2, 1 - beta2,
// the step size lr / (1 - beta1^t), the second bias correction 1 - beta2^t, eps, the L2
// weight decay and the decoupled decay factor 1 - lr * weight_decay.
#include "common.cuh"

enum DecayMode { NO_DECAY = 0, L2_DECAY = 1, DECOUPLED_DECAY = 2 };

template <typename T>
__device__ __forceinline__ void adam_update(T* param, const T* grad, T* exp_avg, T* exp_avg_sq,
                                            long long n, T beta1, T one_minus_beta1, T beta2,
                                            T one_minus_beta2, T step_size, T bias_correction2,
                                            T eps, T weight_decay, T decay, int mode) {
    typedef Arith<T> A;
    GRID_STRIDE(i, n) {
        T w = param[i];
        T g = grad[i];
        if (mode == L2_DECAY) g = A::add(g, A::mul(weight_decay, w));
        const T m = A::add(A::mul(exp_avg[i], beta1), A::mul(one_minus_beta1, g));
        const T v = A::add(A::mul(exp_avg_sq[i], beta2), A::mul(one_minus_beta2, A::mul(g, g)));
        if (mode == DECOUPLED_DECAY) w = A::mul(w, decay);
        const T denom = A::add(A::sqrt(A::div(v, bias_correction2)), eps);
        param[i] = A::sub(w, A::div(A::mul(step_size, m), denom));
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}

#define ADAM_ENTRY(NAME, T)                                                                  \
    extern "C" __global__ void NAME(T* param, const T* grad, T* exp_avg, T* exp_avg_sq,     \
                                    long long n, T beta1, T one_minus_beta1, T beta2,        \
                                    T one_minus_beta2, T step_size, T bias_correction2,     \
                                    T eps, T weight_decay, T decay, int mode) {              \
        adam_update<T>(param, grad, exp_avg, exp_avg_sq, n, beta1, one_minus_beta1, beta2, \
                       one_minus_beta2, step_size, bias_correction2, eps, weight_decay,      \
                       decay, mode);                                                         \
    }

ADAM_ENTRY(adam_update_f32, float)
ADAM_ENTRY(adam_update_f64, double)
