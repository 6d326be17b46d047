// Basics shared by every kernel family: error checks that name the failing call, the bf16 type,
// and 16-byte packed vectors for memory-bound kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

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
#endif

}  // namespace codagpt
