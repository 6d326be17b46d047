#include "device.hpp"

#include <utility>

#include "step_phases.hpp"  // median

#ifdef CODAGPT_HAVE_CUDA
#include <cuda_runtime.h>
#include <dlfcn.h>
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

// ---------------------------------------------------------------- GpuEnergy
// The few NVML entry points used, declared as nvml.h declares them (a stable C ABI).
struct GpuEnergy::Nvml {
    using Device = struct nvmlDevice_st*;
    using Return = int;  // nvmlReturn_t; 0 is NVML_SUCCESS
    void* lib = nullptr;
    Device device = nullptr;
    Return (*shutdown)() = nullptr;
    Return (*total_energy)(Device, unsigned long long*) = nullptr;  // millijoules
    Return (*power_limit)(Device, unsigned int*) = nullptr;          // milliwatts
    Return (*clock_info)(Device, int, unsigned int*) = nullptr;      // MHz; optional
    ~Nvml() {
#ifdef CODAGPT_HAVE_CUDA
        if (shutdown) shutdown();
        if (lib) dlclose(lib);
#endif
    }
};

GpuEnergy::GpuEnergy(std::unique_ptr<Nvml> nvml) : nvml_(std::move(nvml)) {}
GpuEnergy::~GpuEnergy() {
    {
        std::lock_guard<std::mutex> lock(clock_mutex_);
        clock_stop_ = true;
    }
    clock_wake_.notify_all();
    if (clock_thread_.joinable()) clock_thread_.join();  // before NVML shuts down
}

std::unique_ptr<GpuEnergy> GpuEnergy::open() {
#ifdef CODAGPT_HAVE_CUDA
    int dev = 0;
    char bus_id[32] = {};
    if (cuda_device_count() == 0 || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, dev) != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
    }
    auto nvml = std::make_unique<Nvml>();
    nvml->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!nvml->lib) return nullptr;
    auto sym = [&](const char* name) { return dlsym(nvml->lib, name); };
    auto init = reinterpret_cast<Nvml::Return (*)()>(sym("nvmlInit_v2"));
    auto by_bus = reinterpret_cast<Nvml::Return (*)(const char*, Nvml::Device*)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
    nvml->total_energy = reinterpret_cast<decltype(nvml->total_energy)>(sym("nvmlDeviceGetTotalEnergyConsumption"));
    nvml->power_limit = reinterpret_cast<decltype(nvml->power_limit)>(sym("nvmlDeviceGetEnforcedPowerLimit"));
    nvml->clock_info = reinterpret_cast<decltype(nvml->clock_info)>(sym("nvmlDeviceGetClockInfo"));
    auto shutdown = reinterpret_cast<Nvml::Return (*)()>(sym("nvmlShutdown"));
    if (!init || !by_bus || !nvml->total_energy || !nvml->power_limit || !shutdown || init() != 0) return nullptr;
    nvml->shutdown = shutdown;  // initialised: shut down with the object
    unsigned long long mj = 0;
    if (by_bus(bus_id, &nvml->device) != 0 || nvml->total_energy(nvml->device, &mj) != 0) return nullptr;
    return std::unique_ptr<GpuEnergy>(new GpuEnergy(std::move(nvml)));
#else
    return nullptr;
#endif
}

double GpuEnergy::joules() const {
    unsigned long long mj = 0;
    return nvml_->total_energy(nvml_->device, &mj) == 0 ? mj * 1e-3 : -1;
}

double GpuEnergy::power_limit_w() const {
    unsigned int mw = 0;
    return nvml_->power_limit(nvml_->device, &mw) == 0 ? mw * 1e-3 : -1;
}

namespace {
constexpr int kNvmlSmClock = 1;  // NVML_CLOCK_SM
constexpr std::chrono::milliseconds kClockPeriod{20};
}  // namespace

std::vector<double> GpuEnergy::new_sm_clock_samples() {
    std::unique_lock<std::mutex> lock(clock_mutex_);
    if (!clock_thread_.joinable() && nvml_->clock_info) {
        clock_thread_ = std::thread([this] {
            std::unique_lock<std::mutex> lk(clock_mutex_);
            while (!clock_stop_) {
                lk.unlock();
                unsigned int mhz = 0;
                const bool ok = nvml_->clock_info(nvml_->device, kNvmlSmClock, &mhz) == 0;
                lk.lock();
                if (ok) clock_mhz_.push_back(mhz);
                clock_wake_.wait_for(lk, kClockPeriod, [this] { return clock_stop_; });
            }
        });
    }
    return std::exchange(clock_mhz_, {});
}

// ---------------------------------------------------------------- StepEnergy
StepEnergy::StepEnergy(std::function<double()> joules, std::function<Clock::time_point()> now,
                       std::function<std::vector<double>()> sm_clock)
    : counter_(std::move(joules)), now_(std::move(now)), sm_clock_(std::move(sm_clock)) {}

StepEnergy::Reading StepEnergy::read() const {
    const Clock::time_point at = now_();
    const double joules = counter_();
    return {at, joules, sm_clock_ ? sm_clock_() : std::vector<double>{}};
}

void StepEnergy::before_step() {
    if (have_reading_) return;
    last_ = read();
    have_reading_ = true;
}

void StepEnergy::after_step() {
    Reading r = read();
    joules_.push_back(have_reading_ && last_.joules >= 0 && r.joules >= 0 ? r.joules - last_.joules : NAN);
    seconds_.push_back(have_reading_ ? std::chrono::duration<double>(r.at - last_.at).count() : NAN);
    mhz_.push_back(have_reading_ ? std::move(r.mhz) : std::vector<double>{});  // the step's; none kept in last_
    last_ = std::move(r);
    have_reading_ = true;
}

void StepEnergy::interrupt() { have_reading_ = false; }

StepEnergy::Summary StepEnergy::summary(size_t first) const {
    if (first >= joules_.size()) return {};
    double joules = 0, seconds = 0;
    std::vector<double> mhz;
    for (size_t i = first; i < joules_.size(); i++) {
        joules += joules_[i], seconds += seconds_[i];
        mhz.insert(mhz.end(), mhz_[i].begin(), mhz_[i].end());
    }
    const size_t samples = mhz.size();
    return {joules / (double)(joules_.size() - first), joules / seconds, samples ? median(std::move(mhz)) : NAN,
            samples};
}

}  // namespace codagpt
