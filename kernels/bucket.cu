// Gradient bucket pack and unpack: members copied into (or out of) one flat buffer at their
// offsets, optionally scaled; numpy reference: kernels/bucket.py. Member k occupies
// buffer[offsets[k], offsets[k + 1]) (the layout of disttensor/parallel/buckets.py) and its
// array's device address is addresses[k]. One launch moves every member: the grid's y index
// walks the members, its x index a grid-stride loop over the member's elements, so members of
// any sizes share the launch.
#include "common.cuh"

template <typename T>
__device__ __forceinline__ T scaled(T v, T scale) {
    return scale == T(1) ? v : v * scale;  // scale 1 copies the bits exactly
}

// Address 0 marks a member without a gradient this round: its slot is zero-filled.
template <typename T>
__device__ void bucket_pack(const unsigned long long* addresses, const long long* offsets,
                            long long members, T* buffer, T scale) {
    for (long long k = blockIdx.y; k < members; k += gridDim.y) {
        const T* src = reinterpret_cast<const T*>(addresses[k]);
        T* dst = buffer + offsets[k];
        const long long n = offsets[k + 1] - offsets[k];
        if (src) {
            GRID_STRIDE(i, n) dst[i] = scaled(src[i], scale);
        } else {
            GRID_STRIDE(i, n) dst[i] = T(0);
        }
    }
}

template <typename T>
__device__ void bucket_unpack(const T* buffer, const long long* offsets,
                              const unsigned long long* addresses, long long members, T scale) {
    for (long long k = blockIdx.y; k < members; k += gridDim.y) {
        const T* src = buffer + offsets[k];
        T* dst = reinterpret_cast<T*>(addresses[k]);
        const long long n = offsets[k + 1] - offsets[k];
        GRID_STRIDE(i, n) dst[i] = scaled(src[i], scale);
    }
}

// A scaled copy of the whole buffer (unpacking into new memory: the members are views of it).
template <typename T>
__device__ void bucket_copy(T* out, const T* buffer, long long n, T scale) {
    GRID_STRIDE(i, n) out[i] = scaled(buffer[i], scale);
}

// In place, for views into the buffer: buffer[i] *= scale.
template <typename T>
__device__ void bucket_scale(T* buffer, long long n, T scale) {
    GRID_STRIDE(i, n) buffer[i] *= scale;
}

#define BUCKET_ENTRIES(SUFFIX, T)                                                            \
    extern "C" __global__ void bucket_pack_##SUFFIX(const unsigned long long* addresses,     \
                                                    const long long* offsets,               \
                                                    long long members, T* buffer, T scale) { \
        bucket_pack<T>(addresses, offsets, members, buffer, scale);                          \
    }                                                                                        \
    extern "C" __global__ void bucket_unpack_##SUFFIX(                                       \
        const T* buffer, const long long* offsets, const unsigned long long* addresses,      \
        long long members, T scale) {                                                        \
        bucket_unpack<T>(buffer, offsets, addresses, members, scale);                        \
    }                                                                                        \
    extern "C" __global__ void bucket_scale_##SUFFIX(T* buffer, long long n, T scale) {     \
        bucket_scale<T>(buffer, n, scale);                                                   \
    }                                                                                        \
    extern "C" __global__ void bucket_copy_##SUFFIX(T* out, const T* buffer, long long n,   \
                                                    T scale) {                               \
        bucket_copy<T>(out, buffer, n, scale);                                               \
    }

BUCKET_ENTRIES(f32, float)
BUCKET_ENTRIES(f64, double)
