// The GPU CODA GEMM engine's problem description, shared by its two mainloops
// (gemm_sm90.cuh: TMA + wgmma, Hopper; gemm_sm80.cuh: cp.async + mma.sync, A100 and newer) and
// by the dispatcher (gemm.cuh) that picks one at run time by compute capability.
//
// out[M, N] = program(A[M, K] B[K, N]): bf16 operands, fp32 accumulation, the epilogue program
// (coda_programs.cuh, contract in epilogue.cuh) run on the fp32 accumulator tile.
#pragma once
#include "epilogue.cuh"

namespace codagpt::coda {

// A bf16 operand in device memory: logical element (r, c) lives at p[layout.at(r, c)].
// A is logically [M, K]: row-major (activations) or stored transposed as [K, M] (x^T of a dW GEMM).
// B is logically [K, N]: row-major (weights [in, out], dz of a dW GEMM) or stored transposed as
// [N, K] (W^T of a dX GEMM, wte^T of the LM head).
// The engine needs p 16-byte aligned and ld a multiple of 8 elements (TMA and 16-byte loads);
// it checks and throws codagpt::Error naming the operand otherwise.
struct DeviceOperand {
    const bf16* p = nullptr;
    Layout layout;
};

struct GemmProblem {
    int M = 0, N = 0, K = 0;
    DeviceOperand a, b;
};

}  // namespace codagpt::coda
