// Which backend `codagpt train` runs on.
#pragma once
#include <string>

namespace codagpt {

// Number of usable CUDA devices (0 when built without CUDA or when no driver/GPU is present).
int cuda_device_count();
// Name of device 0, or "" when there is none.
std::string cuda_device_name();

}  // namespace codagpt
