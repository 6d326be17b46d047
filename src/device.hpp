// Which backend `codagpt train` runs on.
#pragma once
#include <string>

namespace codagpt {

// Number of usable CUDA devices (0 when built without CUDA or when no driver/GPU is present).
int cuda_device_count();
// Name of device 0, or "" when there is none.
std::string cuda_device_name();
// Dense bf16 tensor-core peak (FLOP/s) of a GPU by its driver name, for MFU; 0 when unknown.
double peak_bf16_flops(const std::string& gpu_name);

}  // namespace codagpt
