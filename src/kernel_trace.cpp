#include "kernel_trace.hpp"

#include "common.hpp"
#ifdef CODAGPT_HAVE_CUDA
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "common.cuh"
#endif

namespace codagpt {

#ifdef CODAGPT_HAVE_CUDA
namespace {

constexpr size_t kBufferBytes = 8 << 20;

struct KernelRecord {
    uint32_t correlation;  // CUPTI numbers API calls in call order: the launch order
    std::string name;
};

// CUPTI hands completed buffers to a plain function with no user pointer, on a thread of its own:
// the records of the trace under way go here, under the mutex.
std::mutex g_mutex;
std::vector<KernelRecord>* g_records = nullptr;

std::string demangle(const char* name) {
    int status = 0;
    char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::string s = status == 0 && out ? out : name;
    std::free(out);
    return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *size = *buffer ? kBufferBytes : 0;
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    std::lock_guard<std::mutex> lock(g_mutex);
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS)
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && g_records) {
            const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
            g_records->push_back({k->correlationId, demangle(k->name)});
        }
    std::free(buffer);
}

void cupti_check(CUptiResult r, const char* call) {
    if (r == CUPTI_SUCCESS) return;
    const char* what = "unknown error";
    cuptiGetResultString(r, &what);
    throw Error(std::string("CUPTI error in ") + call + ": " + what);
}

}  // namespace

std::vector<std::string> trace_kernels(const std::function<void()>& fn) {
    std::vector<KernelRecord> records;
    CUDA_CHECK(cudaDeviceSynchronize());  // earlier work is not part of the trace
    cupti_check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        g_records = &records;
    }
    auto stop = [&] {
        cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
        cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        std::lock_guard<std::mutex> lock(g_mutex);
        g_records = nullptr;
    };
    try {
        cupti_check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
        fn();
        CUDA_CHECK(cudaDeviceSynchronize());
    } catch (...) {
        stop();
        throw;
    }
    stop();
    std::stable_sort(records.begin(), records.end(),
                     [](const KernelRecord& a, const KernelRecord& b) { return a.correlation < b.correlation; });
    std::vector<std::string> names;
    for (KernelRecord& r : records) names.push_back(std::move(r.name));
    return names;
}
#else
std::vector<std::string> trace_kernels(const std::function<void()>&) {
    throw Error("--trace-kernels needs a build with CUDA");
}
#endif

std::string kernel_function_name(const std::string& demangled) {
    // Cut at the first '<' or '(' outside "(anonymous namespace)", then keep what follows the last
    // "::" or space (the return type of a template function comes first).
    std::string s = demangled;
    const std::string anon = "(anonymous namespace)";
    for (size_t at; (at = s.find(anon)) != std::string::npos;) s.erase(at, anon.size());
    s = s.substr(0, s.find_first_of("<("));
    const size_t colon = s.rfind("::"), space = s.rfind(' ');
    size_t from = 0;
    if (colon != std::string::npos) from = colon + 2;
    if (space != std::string::npos && space + 1 > from) from = space + 1;
    return s.substr(from);
}

}  // namespace codagpt
