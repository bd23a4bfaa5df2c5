/* What the host (C) kernels share (Note [Host kernels] in kernels/_host.py): fixed-lane sums,
 * so a result does not depend on the vector width, and one clone of each entry per x86-64
 * vector extension, picked when the library loads. Header-free C11 apart from math.h. */
#ifndef DISTTENSOR_KERNELS_HOST_H
#define DISTTENSOR_KERNELS_HOST_H
#include <math.h>

#define DT_LANES 16
#if defined(__x86_64__) && defined(__GNUC__)
#define DT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DT_CLONES
#endif

/* acc[0] + ... + acc[DT_LANES - 1], pairwise in a fixed order */
#define DT_COMBINE(T)                                                    \
    static inline T dt_combine_##T(T* acc) {                             \
        for (int w = DT_LANES / 2; w > 0; w /= 2)                        \
            for (int k = 0; k < w; ++k) acc[k] += acc[k + w];            \
        return acc[0];                                                   \
    }
DT_COMBINE(float)
DT_COMBINE(double)

#endif /* DISTTENSOR_KERNELS_HOST_H */
