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

}  // namespace codagpt
