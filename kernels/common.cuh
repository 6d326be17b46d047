// Basics shared by every kernel family: error checks that name the failing call, the bf16 type,
// 16-byte packed vectors for memory-bound kernels, and the timer of the benchmarks.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "common.hpp"

namespace codagpt {

using bf16 = __nv_bfloat16;

[[noreturn]] inline void cuda_fail(cudaError_t err, const char* call, const char* file, int line) {
    throw Error(std::string("CUDA error in ") + call + " (" + file + ":" + std::to_string(line) +
                "): " + cudaGetErrorString(err));
}

// Wraps every CUDA runtime call: CUDA_CHECK(cudaMalloc(&p, n)).
#define CUDA_CHECK(call)                                                                  \
    do {                                                                                  \
        cudaError_t err_ = (call);                                                        \
        if (err_ != cudaSuccess) ::codagpt::cuda_fail(err_, #call, __FILE__, __LINE__); \
    } while (0)

// After a kernel launch: reports launch errors (bad configuration, too much shared memory) with
// the kernel's name: CUDA_CHECK_LAUNCH(layernorm_forward_kernel).
#define CUDA_CHECK_LAUNCH(kernel)                                                              \
    do {                                                                                       \
        cudaError_t err_ = cudaGetLastError();                                                 \
        if (err_ != cudaSuccess) ::codagpt::cuda_fail(err_, "launch of " #kernel, __FILE__, __LINE__); \
    } while (0)

inline int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }

#ifdef __CUDACC__
// Eight bf16 (or four float) values moved as one 16-byte access.
template <typename T>
struct alignas(16) Packed128 {
    static constexpr int size = 16 / sizeof(T);
    T v[size];
    __device__ T& operator[](int i) { return v[i]; }
    __device__ const T& operator[](int i) const { return v[i]; }
};
template <typename T>
__device__ inline Packed128<T> load128(const T* p) { return *reinterpret_cast<const Packed128<T>*>(p); }
// Streaming load: data read once, do not keep it in L1/L2 longer than needed.
template <typename T>
__device__ inline Packed128<T> load128cs(const T* p) {
    Packed128<T> r;
    *reinterpret_cast<int4*>(r.v) = __ldcs(reinterpret_cast<const int4*>(p));
    return r;
}
template <typename T>
__device__ inline void store128(T* p, const Packed128<T>& v) { *reinterpret_cast<Packed128<T>*>(p) = v; }

// A hash of (i, seed) to a float in [-1, 1): benchmark inputs filled on the device, never zeros.
__device__ inline float hash_uniform(unsigned long i, unsigned seed) {
    unsigned x = (unsigned)(i * 2654435761ul) ^ (seed * 0x9E3779B9u) ^ (unsigned)(i >> 32);
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return (float)(x >> 8) * (2.f / 16777216.f) - 1.f;
}
#endif

namespace detail {
// f(r) (or f() where f takes no index), between two CUDA events on the default stream: its ms.
template <class F>
float timed_call_ms(F& f, int r, cudaEvent_t start, cudaEvent_t stop) {
    CUDA_CHECK(cudaEventRecord(start));
    if constexpr (std::is_invocable_v<F&, int>) f(r);
    else f();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms;
}
inline double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}
}  // namespace detail

// The median time in ms of `runs` calls of f (f(r) with the call's index r = 0, 1, ... when f takes
// one), each between two CUDA events on the default stream, after `warmup` calls that are not
// timed: for benchmarks and bandwidth tests.
template <class F>
double median_ms(F&& f, int runs = 20, int warmup = 3) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int r = 0; r < warmup; r++) detail::timed_call_ms(f, r, start, stop);
    std::vector<double> ms(runs);
    for (int r = 0; r < runs; r++) ms[r] = detail::timed_call_ms(f, r, start, stop);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return detail::median_of(ms);
}

// Two workloads timed in alternation: in each of `runs` rounds (after `warmup` untimed ones) a
// reference call, then the call measured against it, each between its own CUDA events. The medians
// of each, and the median of the rounds' ratios (measured / reference time): the two calls of a
// round share the GPU's clock and thermal state, so that ratio moves less between runs than the
// ratio of two medians taken one after the other (bench_gemm on the H200: our plain GEMM's median
// moved by up to 10% between two runs in one process).
struct PairedTimes {
    double ref_ms, ms, ratio;
};
template <class Ref, class F>
PairedTimes paired_median_ms(Ref&& ref, F&& f, int runs = 20, int warmup = 3) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int r = 0; r < warmup; r++) {
        detail::timed_call_ms(ref, r, start, stop);
        detail::timed_call_ms(f, r, start, stop);
    }
    std::vector<double> ref_ms(runs), ms(runs), ratio(runs);
    for (int r = 0; r < runs; r++) {
        ref_ms[r] = detail::timed_call_ms(ref, r, start, stop);
        ms[r] = detail::timed_call_ms(f, r, start, stop);
        ratio[r] = ms[r] / ref_ms[r];
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return {detail::median_of(ref_ms), detail::median_of(ms), detail::median_of(ratio)};
}

}  // namespace codagpt
