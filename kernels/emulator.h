// CUDA's execution model on one CPU thread, to run this package's .cu programs where there is
// no GPU (kernels/emulate.py compiles a program with g++ and this header forced in first).
//
// A block runs as one fiber (ucontext) per CUDA thread, switched cooperatively: a fiber runs
// until it waits at a barrier (__syncthreads, or the warp exchange of __shfl_xor_sync) and
// the scheduler resumes the others round-robin; blocks of a grid run one after another. So
// shared memory is a static variable, and a barrier that some thread never reaches is
// detected (a scheduling round with no progress) instead of hanging. The arithmetic
// intrinsics are the plain IEEE operations (compiled with -ffp-contract=off, so never fused),
// which is what the _rn intrinsics are on the GPU.
#ifndef DISTTENSOR_KERNELS_EMULATOR_H
#define DISTTENSOR_KERNELS_EMULATOR_H

#include <ucontext.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
// what a CUDA thread reads: set by the scheduler before it resumes a fiber
static dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__ __attribute__((used))  // marks the entry points for the wrapper generator
#define __device__
#define __forceinline__ inline
#define __shared__ static

namespace emu {

struct Barrier {
    int arrived = 0;
    long long generation = 0;
};

struct Block {
    int threads = 0;
    int current = 0;  // the fiber running
    long long progress = 0;  // barrier arrivals and finished fibers, for deadlock detection
    bool failed = false;
    ucontext_t main;
    std::vector<ucontext_t> fibers;
    std::vector<std::vector<char>> stacks;
    std::vector<dim3> index;
    std::vector<char> done;
    Barrier block;
    std::vector<Barrier> warps;
    std::vector<unsigned long long> lanes;  // one exchange slot per thread
    std::function<void()> body;
};

inline Block* running = nullptr;

inline void yield() { swapcontext(&running->fibers[running->current], &running->main); }

// Wait until `expected` threads have arrived at `b` (a generation counter makes it reusable).
inline void arrive(Barrier& b, int expected) {
    const long long generation = b.generation;
    running->progress++;
    if (++b.arrived == expected) {
        b.arrived = 0;
        b.generation++;
        return;
    }
    while (b.generation == generation) yield();
}

inline int warp_threads(int warp) {
    const int left = running->threads - warp * 32;
    return left < 32 ? left : 32;
}

inline void fiber_main() {
    running->body();
    running->done[running->current] = 1;
    running->progress++;
}  // returns to uc_link, the scheduler

// Runs one block to completion; false on a deadlock or a bad warp exchange.
inline bool run_block(Block& b) {
    const int n = b.threads;
    for (int t = 0; t < n; ++t) {
        getcontext(&b.fibers[t]);
        b.fibers[t].uc_stack.ss_sp = b.stacks[t].data();
        b.fibers[t].uc_stack.ss_size = b.stacks[t].size();
        b.fibers[t].uc_link = &b.main;
        makecontext(&b.fibers[t], fiber_main, 0);
        b.done[t] = 0;
    }
    int live = n;
    while (live > 0 && !b.failed) {
        const long long before = b.progress;
        for (int t = 0; t < n; ++t) {
            if (b.done[t]) continue;
            b.current = t;
            threadIdx = b.index[t];
            swapcontext(&b.main, &b.fibers[t]);
            if (b.done[t]) --live;
        }
        if (live > 0 && b.progress == before) b.failed = true;  // everyone waits: deadlock
    }
    return !b.failed;
}

template <typename... A, std::size_t... I>
void call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<A*>(args[I])...);
}

// kernel<<<grid, block>>>(*args[0], *args[1], ...): 0 on success, 1 on a deadlock.
template <typename... A>
int launch(void (*kernel)(A...), const unsigned* grid, const unsigned* block, void** args) {
    Block b;
    b.threads = int(block[0] * block[1] * block[2]);
    b.fibers.resize(b.threads);
    b.stacks.assign(b.threads, std::vector<char>(1 << 16));
    b.done.resize(b.threads);
    b.warps.resize((b.threads + 31) / 32);
    b.lanes.resize(b.threads);
    for (int t = 0; t < b.threads; ++t) {
        b.index.push_back({unsigned(t) % block[0], unsigned(t) / block[0] % block[1],
                           unsigned(t) / (block[0] * block[1])});
    }
    b.body = [&] { call(kernel, args, std::index_sequence_for<A...>{}); };
    running = &b;
    blockDim = {block[0], block[1], block[2]};
    gridDim = {grid[0], grid[1], grid[2]};
    int status = 0;
    for (unsigned z = 0; z < grid[2] && !status; ++z)
        for (unsigned y = 0; y < grid[1] && !status; ++y)
            for (unsigned x = 0; x < grid[0] && !status; ++x) {
                blockIdx = {x, y, z};
                status = run_block(b) ? 0 : 1;
            }
    running = nullptr;
    return status;
}

// The kernel's parameter types, one letter each: p pointer, f float, d double, i int,
// q long long, Q unsigned long long (the launcher checks its arguments against them).
template <typename T>
constexpr char type_code() {
    if constexpr (std::is_pointer_v<T>) return 'p';
    else if constexpr (std::is_same_v<T, float>) return 'f';
    else if constexpr (std::is_same_v<T, double>) return 'd';
    else if constexpr (std::is_same_v<T, int>) return 'i';
    else if constexpr (std::is_same_v<T, long long>) return 'q';
    else if constexpr (std::is_same_v<T, unsigned long long>) return 'Q';
    else return '?';
}

template <typename... A>
const char* signature(void (*)(A...)) {
    static const char codes[] = {type_code<A>()..., 0};
    return codes;
}

}  // namespace emu

inline void __syncthreads() { emu::arrive(emu::running->block, emu::running->threads); }

// Lane exchange within a warp: each lane posts its value, the warp meets, each reads its
// partner's, the warp meets again before a slot may be overwritten.
template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
    static_assert(sizeof(T) <= sizeof(unsigned long long), "one slot per lane");
    emu::Block& b = *emu::running;
    const int t = b.current, warp = t / 32, partner = t ^ lane_mask;
    std::memcpy(&b.lanes[t], &v, sizeof(T));
    emu::arrive(b.warps[warp], emu::warp_threads(warp));
    if (partner >= b.threads) b.failed = true;  // a partial warp: CUDA leaves this undefined
    T out = v;
    if (!b.failed) std::memcpy(&out, &b.lanes[partner], sizeof(T));
    emu::arrive(b.warps[warp], emu::warp_threads(warp));
    return out;
}

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, sizeof f);
    return f;
}
inline double __longlong_as_double(long long i) {
    double d;
    std::memcpy(&d, &i, sizeof d);
    return d;
}

#endif  // DISTTENSOR_KERNELS_EMULATOR_H
