#include "device.hpp"

#ifdef CODAGPT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace codagpt {

int cuda_device_count() {
#ifdef CODAGPT_HAVE_CUDA
    int n = 0;
    // No driver or no GPU is a normal situation here (CI, laptops): it means "zero devices".
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

std::string cuda_device_name() {
#ifdef CODAGPT_HAVE_CUDA
    cudaDeviceProp prop;
    if (cuda_device_count() > 0 && cudaGetDeviceProperties(&prop, 0) == cudaSuccess) return prop.name;
#endif
    return "";
}

double peak_bf16_flops(const std::string& name) {
    // Datasheet dense bf16 rates; MFU is reported against these, as llm.c and nanoGPT do.
    struct Peak { const char* match; double flops; };
    static const Peak table[] = {
        {"H200", 989.4e12},    {"H100 PCIe", 756.0e12}, {"H100", 989.4e12}, {"GH200", 989.4e12},
        {"A100", 312.0e12},    {"L40S", 362.1e12},      {"A10", 125.0e12},
    };
    for (const Peak& p : table)
        if (name.find(p.match) != std::string::npos) return p.flops;
    return 0;
}

}  // namespace codagpt
