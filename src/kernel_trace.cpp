#include "kernel_trace.hpp"

#include "common.hpp"

#include <algorithm>
#include <cstdio>
#ifdef CODAGPT_HAVE_CUDA
#include <cupti.h>
#include <cxxabi.h>

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
    uint64_t start, end;  // ns
    bool memory_op = false;
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

// "[memset 5.80 GiB]", "[memcpy HtoD 64 KiB]", "[memset 16 B]": a memory operation's name in a trace.
std::string memory_op_name(const char* what, uint64_t bytes) {
    char buf[64];
    const double kib = bytes / 1024.0;
    if (bytes < 1024)
        std::snprintf(buf, sizeof buf, "[%s %llu B]", what, (unsigned long long)bytes);
    else if (kib < 1024)
        std::snprintf(buf, sizeof buf, "[%s %.0f KiB]", what, kib);
    else if (kib < 1024 * 1024)
        std::snprintf(buf, sizeof buf, "[%s %.1f MiB]", what, kib / 1024);
    else
        std::snprintf(buf, sizeof buf, "[%s %.2f GiB]", what, kib / (1024 * 1024));
    return buf;
}
const char* copy_kind(uint8_t kind) {
    switch (kind) {
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
        default: return "memcpy";
    }
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    std::lock_guard<std::mutex> lock(g_mutex);
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (!g_records) continue;
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
            g_records->push_back({k->correlationId, demangle(k->name), k->start, k->end});
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
            g_records->push_back({m->correlationId, memory_op_name("memset", m->bytes), m->start, m->end, true});
        } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
            g_records->push_back(
                {m->correlationId, memory_op_name(copy_kind(m->copyKind), m->bytes), m->start, m->end, true});
        }
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

std::vector<TracedKernel> trace_kernels(const std::function<void()>& fn) {
    std::vector<KernelRecord> records;
    CUDA_CHECK(cudaDeviceSynchronize());  // earlier work is not part of the trace
    cupti_check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        g_records = &records;
    }
    constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET,
                                             CUPTI_ACTIVITY_KIND_MEMCPY};
    auto stop = [&] {
        for (CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
        cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        std::lock_guard<std::mutex> lock(g_mutex);
        g_records = nullptr;
    };
    try {
        for (CUpti_ActivityKind kind : kKinds) cupti_check(cuptiActivityEnable(kind), "cuptiActivityEnable");
        fn();
        CUDA_CHECK(cudaDeviceSynchronize());
    } catch (...) {
        stop();
        throw;
    }
    stop();
    std::stable_sort(records.begin(), records.end(),
                     [](const KernelRecord& a, const KernelRecord& b) { return a.correlation < b.correlation; });
    std::vector<TracedKernel> kernels;
    uint64_t latest_end = records.empty() ? 0 : records.front().start;
    for (KernelRecord& r : records) {
        const double idle = r.start > latest_end ? (r.start - latest_end) * 1e-6 : 0.0;
        kernels.push_back({std::move(r.name), (r.end - r.start) * 1e-6, idle, r.memory_op});
        latest_end = std::max(latest_end, r.end);
    }
    return kernels;
}
#else
std::vector<TracedKernel> trace_kernels(const std::function<void()>&) {
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

namespace {
// "gemm_kernel<Config<...>, false, true, codagpt::coda::QkvForward<__nv_bfloat16> >(...)" (sm90) or
// "gemm_kernel<codagpt::coda::QkvGradient<__nv_bfloat16>, true, true, true>(...)" (sm80): the
// program is the template argument of namespace codagpt::coda that is not a Config; its name
// without namespaces and template arguments.
std::string gemm_program(const std::string& demangled) {
    const size_t open = demangled.find('<'), close = demangled.find(">(");
    if (open == std::string::npos || close == std::string::npos) return "";
    int depth = 0;
    size_t arg = open + 1;
    for (size_t i = open + 1; i <= close; i++) {
        if (demangled[i] == '<') depth++;
        if (i < close && demangled[i] == '>') depth--;
        if ((demangled[i] == ',' && depth == 0) || i == close) {
            const std::string a = demangled.substr(arg, i - arg);
            if (a.find("coda::") != std::string::npos && a.find("Config<") == std::string::npos)
                return kernel_function_name(a);
            arg = i + 1;
        }
    }
    return "";
}
}  // namespace

std::string kernel_time_table(const std::vector<TracedKernel>& kernels) {
    struct Row {
        std::string label;
        int launches = 0;
        double ms = 0;
    };
    std::vector<Row> rows;
    std::vector<std::string> names;  // rows[i]'s full name
    double total = 0, idle = 0, memory_ms = 0;
    int memory_ops = 0;
    for (const TracedKernel& k : kernels) {
        idle += k.idle_ms;
        if (k.memory_op) {
            memory_ops++;
            memory_ms += k.ms;
            continue;
        }
        const size_t i = std::find(names.begin(), names.end(), k.name) - names.begin();
        if (i == names.size()) {
            names.push_back(k.name);
            std::string label = kernel_function_name(k.name);
            if (label == "gemm_kernel") {
                const std::string arch = k.name.find("::sm90::") != std::string::npos ? "sm90" : "sm80";
                label += " " + arch + " " + gemm_program(k.name);
            }
            rows.push_back({label.substr(0, 90)});
        }
        rows[i].launches++;
        rows[i].ms += k.ms;
        total += k.ms;
    }
    std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
    std::string out;
    char line[160];
    std::snprintf(line, sizeof line, "%10s %8s %6s  %s\n", "ms", "launches", "share", "kernel");
    out += line;
    for (const Row& r : rows) {
        std::snprintf(line, sizeof line, "%10.3f %8d %5.1f%%  %s\n", r.ms, r.launches, total > 0 ? 100 * r.ms / total : 0.0,
                      r.label.c_str());
        out += line;
    }
    std::snprintf(line, sizeof line, "%10.3f %8zu %5.1f%%  all kernels\n", total, kernels.size() - memory_ops, 100.0);
    out += line;
    if (memory_ops > 0) {
        std::snprintf(line, sizeof line, "%10.3f %8d %6s  memsets and copies\n", memory_ms, memory_ops, "");
        out += line;
    }
    std::snprintf(line, sizeof line, "%10.3f %8s %6s  GPU idle between kernels\n", idle, "", "");
    return out + line;
}

}  // namespace codagpt
