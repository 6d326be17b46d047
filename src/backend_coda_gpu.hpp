// The fused (CODA) GPU trainer as a TrainBackend (backend.hpp): GPT2CodaGPU behind the same
// interface, data, AdamW and checkpoint state as the unfused GPU backend, so runs and `--resume`
// work the same on either path.
#pragma once
#include <memory>
#include <string>

#include "backend.hpp"

namespace codagpt {

// Throws Error when the build has no CUDA or no GPU is visible. opt.recompute_gelu changes nothing:
// the fused path never keeps GELU outputs (the dG GEMM's epilogue recomputes them).
std::unique_ptr<TrainBackend> make_coda_gpu_backend(const TrainConfig& c, const GPUBackendOptions& opt);

// Whether `--fusion` selects the fused path on this machine's GPU: "coda", or "auto" on a GPU of
// compute capability 8.0 or newer (the GEMM engine's portable mainloop needs sm_80); "unfused"
// never. Error for any other value, and for "coda" on an older GPU.
bool use_coda(const std::string& fusion);

}  // namespace codagpt
