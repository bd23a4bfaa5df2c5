// Device helpers shared by the kernels of this package: IEEE arithmetic per type and block
// reductions. Header-free (no system or CUDA includes), so it compiles both under nvcc and
// under NVRTC, where cupy.RawModule builds it; the Python loaders paste this file in place of
// the #include line (kernels/__init__.py, read_source), so CuPy's compile cache sees the
// whole program text.
#ifndef DISTTENSOR_KERNELS_COMMON_CUH
#define DISTTENSOR_KERNELS_COMMON_CUH

// Arithmetic that rounds exactly where numpy rounds. The _rn intrinsics are never contracted
// into fused multiply-adds, so a*b+c stays two roundings as in numpy; the fused Adam update
// relies on it to reproduce the numpy optimizer bit for bit.
template <typename T>
struct Arith;

template <>
struct Arith<float> {
    static __device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
    static __device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
    static __device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
    static __device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
    static __device__ __forceinline__ float sqrt(float a) { return __fsqrt_rn(a); }
    static __device__ __forceinline__ float exp(float a) { return expf(a); }
    static __device__ __forceinline__ float log(float a) { return logf(a); }
    static __device__ __forceinline__ float inf() { return __int_as_float(0x7f800000); }
    static __device__ __forceinline__ float nan() { return __int_as_float(0x7fc00000); }
};

template <>
struct Arith<double> {
    static __device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
    static __device__ __forceinline__ double sub(double a, double b) { return __dsub_rn(a, b); }
    static __device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
    static __device__ __forceinline__ double div(double a, double b) { return __ddiv_rn(a, b); }
    static __device__ __forceinline__ double sqrt(double a) { return __dsqrt_rn(a); }
    static __device__ __forceinline__ double exp(double a) { return ::exp(a); }
    static __device__ __forceinline__ double log(double a) { return ::log(a); }
    static __device__ __forceinline__ double inf() {
        return __longlong_as_double(0x7ff0000000000000LL);
    }
    static __device__ __forceinline__ double nan() {
        return __longlong_as_double(0x7ff8000000000000LL);
    }
};

// x - x is 0 for finite x and NaN for an infinity or a NaN (no fast-math here, so the
// compiler keeps it); no math header is needed.
template <typename T>
__device__ __forceinline__ bool is_finite(T x) {
    return x - x == T(0);
}

// Grid-stride range over [0, n): element i of a 1-D launch, any n, any grid size.
#define GRID_STRIDE(i, n)                                                      \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (long long)blockDim.x * gridDim.x)

struct Sum {
    template <typename T>
    __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};

// numpy's max: a NaN on either side wins (fmax would drop it).
struct NanMax {
    template <typename T>
    __device__ __forceinline__ T operator()(T a, T b) const {
        return (a != a || a > b) ? a : b;
    }
};

__device__ __forceinline__ float shfl_xor(float v, int lane) {
    return __shfl_xor_sync(0xffffffffu, v, lane);
}
__device__ __forceinline__ double shfl_xor(double v, int lane) {
    return __shfl_xor_sync(0xffffffffu, v, lane);
}
__device__ __forceinline__ int shfl_xor(int v, int lane) {
    return __shfl_xor_sync(0xffffffffu, v, lane);
}

// Butterfly reduction: every lane of the warp ends with the reduction of all 32 values.
// shfl_xor is found at instantiation, so a kernel's own state type can bring an overload.
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
    for (int offset = 16; offset > 0; offset >>= 1) v = op(v, shfl_xor(v, offset));
    return v;
}

// Reduction over the whole block, returned to every thread. blockDim.x must be a multiple of
// 32 (at most 1024); `scratch` is __shared__ T[32]; `identity` fills the lanes of warp 0
// beyond the number of warps. Ends with a barrier, so scratch may be reused at once. Every
// thread of the block must call it (it holds barriers).
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity, T* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_reduce(v, op);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = warp_reduce(lane < warps ? scratch[lane] : identity, op);
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    v = scratch[0];
    __syncthreads();
    return v;
}

#endif  // DISTTENSOR_KERNELS_COMMON_CUH
