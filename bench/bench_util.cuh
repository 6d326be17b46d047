// What the GPU benchmarks share (bench_gemm.cu, bench_step_energy.cu, bench_attention.cu): inputs
// filled on the device, and a workload run back to back with the GPU's energy counter read around it.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "common.cuh"
#include "device.hpp"

namespace codagpt::bench {

template <class T>
__global__ void fill_kernel(T* p, long n, unsigned seed, float scale, float offset) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        p[i] = (T)(offset + scale * hash_uniform(i, seed));
}
// p[0, n) = offset + scale * (hashed values in [-1, 1)): never zeros, the same for the same seed.
template <class T>
void fill(T* p, long n, unsigned seed, float scale = 1.f, float offset = 0.f) {
    fill_kernel<<<1024, 256>>>(p, n, seed, scale, offset);
    CUDA_CHECK_LAUNCH(fill_kernel);
}

// Device buffers, filled with hashed values in [-scale, scale) (never zeros: the tensor cores'
// power depends on the bits they multiply; scale 0: zeros), each with its own seed, freed at the end.
struct Buffers {
    std::vector<void*> owned;
    unsigned seed = 1;
    template <class T>
    T* make(long n, float scale) {
        T* p = nullptr;
        CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
        owned.push_back(p);
        fill(p, n, seed++, scale);
        return p;
    }
    Buffers() = default;
    Buffers(const Buffers&) = delete;
    Buffers& operator=(const Buffers&) = delete;
    ~Buffers() {
        for (void* p : owned) cudaFree(p);
    }
};

// The value of a numeric option: the whole text a finite number >= min (and a whole number where
// `integer`), else an Error naming the option (main() prints it as the benchmark's one error line).
inline double number_option(const std::string& opt, const std::string& text, double min, bool integer = false) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    const bool ok = end != text.c_str() && *end == '\0' && std::isfinite(v) && v >= min &&
                    (!integer || (v == std::floor(v) && v <= INT_MAX));
    if (!ok)
        throw Error(opt + " needs " + (integer ? "a whole number" : "a number") +
                    " >= " + std::to_string((long long)min) + ", got '" + one_line(text) + "'");
    return v;
}

// A workload run back to back: ms a call, joules a call, mean watts (NaN where a counter read
// failed), and how many calls were timed.
struct Sustained {
    double ms = NAN, j = NAN, w = NAN;
    int calls = 0;
};
// f(i) called back to back for about `seconds` (est_ms: a call's time, from a shorter
// measurement), after a quarter of that untimed; the energy counter read with the GPU idle before
// and after. At least 8 calls.
template <class F>
Sustained sustained(F&& f, double est_ms, double seconds, const GpuEnergy& meter) {
    const int n = std::max(8, (int)(seconds * 1e3 / std::max(est_ms, 1e-3)));
    for (int i = 0; i < n / 4; i++) f(i);
    CUDA_CHECK(cudaDeviceSynchronize());
    const double j0 = meter.joules();
    // One timed run of the n calls (median_ms synchronizes on its stop event).
    const double ms = median_ms([&] { for (int i = 0; i < n; i++) f(i); }, /*runs=*/1, /*warmup=*/0);
    const double j1 = meter.joules();
    Sustained r;
    r.ms = ms / n;
    r.calls = n;
    if (j0 >= 0 && j1 >= 0) {
        r.j = (j1 - j0) / n;
        r.w = (j1 - j0) / (ms * 1e-3);
    }
    return r;
}

}  // namespace codagpt::bench
