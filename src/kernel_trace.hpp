// Which kernels a piece of GPU work launches, by name and in launch order, including those that
// libraries launch inside their calls (cuBLASLt, cuDNN): CUPTI's activity API records every kernel
// the process runs. For `--trace-kernels FILE` (one training step of either path) and for tests
// that check what the fused path launches.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace codagpt {

struct TracedKernel {
    std::string name;  // demangled (a library's unmangled names as they are)
    double ms;         // its run time on the GPU, end minus start as CUPTI records them
    double idle_ms = 0;  // the GPU's idle time just before it: its start minus the latest end of the
                         // kernels, memsets and copies launched before it in the same trace, when positive
    bool memory_op = false;  // a memset or copy, not a kernel ("[memset 5.80 GiB]", "[memcpy HtoD 64 KiB]")
};

// Runs fn (after waiting for earlier GPU work) and returns the kernels it launched on any stream,
// and its memsets and copies (memory_op), ordered by launch. Waits for the device before
// returning. Throws Error when CUPTI fails (e.g. another profiler holds it). Kernel activity
// records serialize concurrent kernels a little; the times are for finding where a step's time
// goes, not for benchmarks.
std::vector<TracedKernel> trace_kernels(const std::function<void()>& fn);

// A table of where the time of `kernels` goes: one line per distinct kernel (full demangled name,
// shortened to its function name and, for the GEMM engine's kernels, its epilogue program), with
// launches, total ms and share, largest total first; then the sum, the memsets' and copies' time
// where there are any, and the GPU's idle time between all of them (launch gaps, waits for the
// host, and CUPTI's start-up: a few ms before the second kernel of each trace_kernels call,
// measured on the H200).
std::string kernel_time_table(const std::vector<TracedKernel>& kernels);

// The function name of a demangled kernel name: no return type, namespaces, template arguments or
// parameters ("void ns::gemm_kernel<P, true>(P)" -> "gemm_kernel").
std::string kernel_function_name(const std::string& demangled);

}  // namespace codagpt
