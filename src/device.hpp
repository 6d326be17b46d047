// Which backend `codagpt train` runs on.
#pragma once
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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
    // The SM clock (MHz) every 20 ms since the last call, as nvidia-smi -lms samples it: the first
    // call starts a thread that reads it (nvmlDeviceGetClockInfo) until this object goes. (The
    // driver's own sample buffer, nvmlDeviceGetSamples, keeps none for the clock on an H100 with
    // driver 580.) Empty where NVML cannot read the clock.
    std::vector<double> new_sm_clock_samples();

private:
    struct Nvml;
    explicit GpuEnergy(std::unique_ptr<Nvml> nvml);
    std::unique_ptr<Nvml> nvml_;
    std::mutex clock_mutex_;  // guards the two below
    std::vector<double> clock_mhz_;
    bool clock_stop_ = false;
    std::condition_variable clock_wake_;
    std::thread clock_thread_;
};

// The energy of training steps from a cumulative counter (GpuEnergy::joules), read between steps,
// outside the step clock: one NVML reading takes ~3 ms on the H200, the GPU idle. Back-to-back
// steps share the reading between them (the call's lag cancels in the differences); other work
// since the last reading (an evaluation, a sample, a checkpoint, a skipped step) is left out by
// interrupt(): the next step reads afresh. A step's energy runs from the reading before it to the
// one after it, so it includes one reading's idle time. With a clock source, each reading also
// takes the SM clock samples taken since the last one; a step keeps those of the reading after it
// (those of a fresh reading, after other work, are dropped), so that the summary says at what
// clock the power limit left the steps.
class StepEnergy {
public:
    using Clock = std::chrono::steady_clock;
    // joules: the counter (< 0 when a read fails); now: the clock (replaceable for tests);
    // sm_clock: the SM clock samples (MHz) since its last call (GpuEnergy::new_sm_clock_samples), or null.
    explicit StepEnergy(std::function<double()> joules, std::function<Clock::time_point()> now = Clock::now,
                        std::function<std::vector<double>()> sm_clock = nullptr);
    void before_step();  // a reading, unless the one after the previous step still stands
    void after_step();   // a reading: the step's joules, and the seconds since the reading before it
    void interrupt();    // work other than steps since the last reading
    size_t steps() const { return joules_.size(); }
    // Over the steps from `first` on: joules a step, and the mean power (their joules over the time
    // between their readings); NaN where a read failed or no step is left. sm_clock_mhz: the upper
    // median of their clock samples (NaN without any), clock_samples: how many there were.
    struct Summary {
        double joules_per_step = NAN, watts = NAN, sm_clock_mhz = NAN;
        size_t clock_samples = 0;
    };
    Summary summary(size_t first) const;

private:
    struct Reading {
        Clock::time_point at;  // the call's start
        double joules;
        std::vector<double> mhz;  // the clock samples since the reading before
    };
    Reading read() const;
    std::function<double()> counter_;
    std::function<Clock::time_point()> now_;
    std::function<std::vector<double>()> sm_clock_;
    bool have_reading_ = false;  // the reading after the last step, still standing
    Reading last_{};
    std::vector<double> joules_, seconds_;  // a step each
    std::vector<std::vector<double>> mhz_;  // a step each
};

}  // namespace codagpt
