// Which kernels a piece of GPU work launches, by name and in launch order, including those that
// libraries launch inside their calls (cuBLASLt, cuDNN): CUPTI's activity API records every kernel
// the process runs. For `--trace-kernels FILE` (one training step of either path) and for tests
// that check what the fused path launches.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace codagpt {

// Runs fn (after waiting for earlier GPU work) and returns the kernels it launched on any stream,
// ordered by launch, as demangled names (a library's unmangled names as they are). Waits for the
// device before returning. Throws Error when CUPTI fails (e.g. another profiler holds it).
std::vector<std::string> trace_kernels(const std::function<void()>& fn);

// The function name of a demangled kernel name: no return type, namespaces, template arguments or
// parameters ("void ns::gemm_kernel<P, true>(P)" -> "gemm_kernel").
std::string kernel_function_name(const std::string& demangled);

}  // namespace codagpt
