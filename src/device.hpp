// Which backend `codagpt train` runs on.
#pragma once
#include <memory>
#include <string>

namespace codagpt {

// Number of usable CUDA devices (0 when built without CUDA or when no driver/GPU is present).
int cuda_device_count();
// Name of device 0, or "" when there is none.
std::string cuda_device_name();
// Dense bf16 tensor-core peak (FLOP/s) of a GPU by its driver name, for MFU; 0 when unknown.
double peak_bf16_flops(const std::string& gpu_name);

// The energy the current CUDA device has drawn and its power limit, from NVML (the driver's
// libnvidia-ml, loaded at run time: nothing to build against, nothing required where it is absent).
// A GPU that sits at its power limit through training runs at the clock that limit allows, so
// its step time follows the step's energy: the train records carry both.
class GpuEnergy {
public:
    // Null without a CUDA device, NVML, or an energy counter (GPUs before Volta).
    static std::unique_ptr<GpuEnergy> open();
    ~GpuEnergy();
    GpuEnergy(const GpuEnergy&) = delete;
    GpuEnergy& operator=(const GpuEnergy&) = delete;
    // Joules drawn since the driver loaded (a millijoule counter), or -1 when a read fails.
    double joules() const;
    // The enforced power limit in watts, or -1 when unknown.
    double power_limit_w() const;

private:
    struct Nvml;
    explicit GpuEnergy(std::unique_ptr<Nvml> nvml);
    std::unique_ptr<Nvml> nvml_;
};

}  // namespace codagpt
