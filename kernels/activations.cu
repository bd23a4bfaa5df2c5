// Activations and their gradients, elementwise in one grid-stride launch; numpy
// reference: kernels/activations.py (Note [Fused activations]). Forwards read x and write y;
// backwards read the output's gradient g and x (gelu, silu, relu) or the forward's output y
// (sigmoid, tanh) and write g * f'. Flat C-contiguous arrays of n elements.
//
// The kernels with tanh or exp agree with the references to float rounding, not bit for bit:
// tanhf/expf are CUDA's (a couple of ulps), not numpy's, and their plain arithmetic may be
// contracted into fused multiply-adds. tanh and sigmoid's gradients are arithmetic only: with
// Arith's never-contracted operations they round where numpy rounds and give the references'
// bits (1 - y * y contracted would differ from numpy's in the last bits of a small result);
// relu's is a select, exact anyway.
#include "common.cuh"

template <typename T>
struct Fn;

template <>
struct Fn<float> {
    static __device__ __forceinline__ float tanh(float x) { return tanhf(x); }
    static __device__ __forceinline__ float exp(float x) { return expf(x); }
};

template <>
struct Fn<double> {
    static __device__ __forceinline__ double tanh(double x) { return ::tanh(x); }
    static __device__ __forceinline__ double exp(double x) { return ::exp(x); }
};

#define GELU_C 0.7978845608028654  // sqrt(2 / pi)
#define GELU_A 0.044715

// 1 / (1 + exp(-x)): exp(-x) is inf for very negative x and the quotient the correct 0.
template <typename T>
__device__ __forceinline__ T sigmoid(T x) {
    return T(1) / (T(1) + Fn<T>::exp(-x));
}

struct GeluForward {
    template <typename T>
    __device__ __forceinline__ T operator()(T x) const {
        const T u = x * (T(GELU_C) + T(GELU_A * GELU_C) * (x * x));
        return T(0.5) * x * (T(1) + Fn<T>::tanh(u));
    }
};

struct SiluForward {
    template <typename T>
    __device__ __forceinline__ T operator()(T x) const {
        return x / (T(1) + Fn<T>::exp(-x));
    }
};

struct SigmoidForward {
    template <typename T>
    __device__ __forceinline__ T operator()(T x) const {
        return sigmoid(x);
    }
};

// gelu'(x) = (1 + t) (0.5 + x (1 - t) q), t = tanh(c (x + a x^3)), q = 0.5 c (1 + 3 a x^2):
// x (1 - t) is taken first, so it is 0 (not inf * 0) where t is 1.
struct GeluBackward {
    template <typename T>
    __device__ __forceinline__ T operator()(T g, T x) const {
        const T x2 = x * x;
        const T t = Fn<T>::tanh(x * (T(GELU_C) + T(GELU_A * GELU_C) * x2));
        const T q = T(0.5 * GELU_C) + T(1.5 * GELU_A * GELU_C) * x2;
        return g * ((T(1) + t) * (T(0.5) + x * (T(1) - t) * q));
    }
};

struct SiluBackward {
    template <typename T>
    __device__ __forceinline__ T operator()(T g, T x) const {
        const T s = sigmoid(x);
        return g * (s * (T(1) + x * (T(1) - s)));
    }
};

struct SigmoidBackward {  // g * (y * (1 - y)) from y = sigmoid(x)
    template <typename T>
    __device__ __forceinline__ T operator()(T g, T y) const {
        typedef Arith<T> A;
        return A::mul(g, A::mul(y, A::sub(T(1), y)));
    }
};

struct TanhBackward {  // g * (1 - y * y) from y = tanh(x)
    template <typename T>
    __device__ __forceinline__ T operator()(T g, T y) const {
        typedef Arith<T> A;
        return A::mul(g, A::sub(T(1), A::mul(y, y)));
    }
};

// A select, as np.where(x > 0, g, 0): a NaN or infinite g of an inactive unit gives 0.
struct ReluBackward {
    template <typename T>
    __device__ __forceinline__ T operator()(T g, T x) const {
        return x > T(0) ? g : T(0);
    }
};

// 16-byte accesses (float4, double2) where every array is 16-byte aligned (a fresh CuPy
// allocation is; a contiguous view at an odd offset is not, and takes the element loop): a
// thread then has V independent tanh/exp in flight and the loads are a quarter as many, which
// is what gets an elementwise kernel near the memory bandwidth. The element loop does the
// tail (fewer than V elements), or everything when an array is not aligned.
template <typename T>
struct alignas(16) Pack {
    T v[16 / sizeof(T)];
};

__device__ __forceinline__ bool aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15) == 0;
}

template <typename T, typename Op>
__device__ __forceinline__ void map1(const T* x, long long n, T* y, Op op) {
    constexpr int V = 16 / sizeof(T);
    long long done = 0;
    if (aligned16(x) && aligned16(y)) {
        const long long packs = n / V;
        const Pack<T>* xs = reinterpret_cast<const Pack<T>*>(x);
        Pack<T>* ys = reinterpret_cast<Pack<T>*>(y);
        GRID_STRIDE(i, packs) {
            Pack<T> a = xs[i];
            for (int k = 0; k < V; ++k) a.v[k] = op(a.v[k]);
            ys[i] = a;
        }
        done = packs * V;
    }
    GRID_STRIDE(i, n - done) { y[done + i] = op(x[done + i]); }
}

template <typename T, typename Op>
__device__ __forceinline__ void map2(const T* g, const T* x, long long n, T* out, Op op) {
    constexpr int V = 16 / sizeof(T);
    long long done = 0;
    if (aligned16(g) && aligned16(x) && aligned16(out)) {
        const long long packs = n / V;
        const Pack<T>* gs = reinterpret_cast<const Pack<T>*>(g);
        const Pack<T>* xs = reinterpret_cast<const Pack<T>*>(x);
        Pack<T>* outs = reinterpret_cast<Pack<T>*>(out);
        GRID_STRIDE(i, packs) {
            const Pack<T> a = gs[i], b = xs[i];
            Pack<T> c;
            for (int k = 0; k < V; ++k) c.v[k] = op(a.v[k], b.v[k]);
            outs[i] = c;
        }
        done = packs * V;
    }
    GRID_STRIDE(i, n - done) { out[done + i] = op(g[done + i], x[done + i]); }
}

#define ACT_FORWARD(NAME, OP, SUFFIX, T)                                                   \
    extern "C" __global__ void NAME##_##SUFFIX(const T* x, long long n, T* y) {            \
        map1<T>(x, n, y, OP());                                                            \
    }
#define ACT_BACKWARD(NAME, OP, SUFFIX, T)                                                  \
    extern "C" __global__ void NAME##_##SUFFIX(const T* g, const T* x, long long n, T* out) { \
        map2<T>(g, x, n, out, OP());                                                       \
    }
#define ACT_ENTRIES(SUFFIX, T)                                   \
    ACT_FORWARD(gelu_forward, GeluForward, SUFFIX, T)            \
    ACT_FORWARD(silu_forward, SiluForward, SUFFIX, T)            \
    ACT_FORWARD(sigmoid_forward, SigmoidForward, SUFFIX, T)      \
    ACT_BACKWARD(gelu_backward, GeluBackward, SUFFIX, T)         \
    ACT_BACKWARD(silu_backward, SiluBackward, SUFFIX, T)         \
    ACT_BACKWARD(sigmoid_backward, SigmoidBackward, SUFFIX, T)   \
    ACT_BACKWARD(tanh_backward, TanhBackward, SUFFIX, T)         \
    ACT_BACKWARD(relu_backward, ReluBackward, SUFFIX, T)

ACT_ENTRIES(f32, float)
ACT_ENTRIES(f64, double)
