// Helpers for GPU tests: skip without a GPU, move data between host and device, bf16 rounding,
// poisoned outputs, and relative errors against fp32/fp64 references.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "master_weights.cuh"
#include "rng.hpp"

namespace codagpt::test {

// Skips the test when no usable CUDA device exists (CI machines have the toolkit but no GPU).
#define REQUIRE_GPU()                                                   \
    do {                                                                \
        int n_ = 0;                                                     \
        if (cudaGetDeviceCount(&n_) != cudaSuccess || n_ == 0) {        \
            cudaGetLastError();                                         \
            GTEST_SKIP() << "no CUDA GPU on this machine";              \
        }                                                               \
    } while (0)

inline float bf16_round(float x) { return __bfloat162float(__float2bfloat16(x)); }

// Device buffer that frees itself.
template <typename T>
struct DeviceBuffer {
    T* ptr = nullptr;
    size_t n = 0;
    explicit DeviceBuffer(size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&ptr, count * sizeof(T) + 16)); }
    ~DeviceBuffer() { cudaFree(ptr); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    operator T*() const { return ptr; }
    void upload(const std::vector<T>& h) { CUDA_CHECK(cudaMemcpy(ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice)); }
    std::vector<T> download() const {
        std::vector<T> h(n);
        CUDA_CHECK(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
        return h;
    }
    // Fill with a NaN bit pattern so that any element a kernel fails to write shows up.
    void poison() { CUDA_CHECK(cudaMemset(ptr, 0xFF, n * sizeof(T))); }
};

// Random values rounded to bf16, as floats (the CPU reference consumes exactly what the GPU sees).
inline std::vector<float> random_bf16_values(size_t n, uint64_t seed, float scale = 1.0f, float offset = 0.0f) {
    Rng rng(seed);
    std::vector<float> v(n);
    for (auto& x : v) x = bf16_round(offset + scale * (float)rng.normal());
    return v;
}
inline std::vector<bf16> to_bf16(const std::vector<float>& v) {
    std::vector<bf16> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = __float2bfloat16(v[i]);
    return o;
}
inline std::vector<float> to_float(const std::vector<bf16>& v) {
    std::vector<float> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = __bfloat162float(v[i]);
    return o;
}

// fp32 master weights as the trainer keeps them (master_weights.cuh): the bf16 weights and the
// low halves, and back.
inline std::vector<bf16> master_his(const std::vector<float>& w) {
    std::vector<uint16_t> hi(w.size());
    for (size_t i = 0; i < w.size(); i++) hi[i] = master_hi(w[i]);
    std::vector<bf16> o(w.size());
    std::memcpy(static_cast<void*>(o.data()), hi.data(), hi.size() * 2);
    return o;
}
inline std::vector<uint16_t> master_los(const std::vector<float>& w) {
    std::vector<uint16_t> lo(w.size());
    for (size_t i = 0; i < w.size(); i++) lo[i] = master_lo(w[i]);
    return lo;
}
inline std::vector<float> master_joined(const std::vector<bf16>& hi, const std::vector<uint16_t>& lo) {
    std::vector<float> w(lo.size());
    for (size_t i = 0; i < lo.size(); i++) {
        uint16_t h;
        std::memcpy(&h, &hi[i], 2);
        w[i] = master_join(h, lo[i]);
    }
    return w;
}

// ||out - ref|| / ||ref||; NaN anywhere gives +inf so that it never passes.
template <typename A, typename B>
double rel_error(const std::vector<A>& out, const std::vector<B>& ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double o = (double)out[i], r = (double)ref[i];
        if (!std::isfinite(o)) return INFINITY;
        num += (o - r) * (o - r);
        den += r * r;
    }
    return std::sqrt(num / (den > 0 ? den : 1));
}

}  // namespace codagpt::test
