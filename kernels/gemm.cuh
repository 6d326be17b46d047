// The CODA GEMM engine's public API: out[M, N] = program(A[M, K] B[K, N]) on the GPU, bf16
// operands, fp32 accumulators, an epilogue program of coda_programs.cuh run on the accumulator
// tile (contract in epilogue.cuh, the device driver and its combine order in gemm_epilogue.cuh).
//
//   gemm(program, problem, stream)            runs it on the mainloop chosen below
//   gemm_tile_shape<P>(problem)               the tile shape gemm() uses for program type P: size row partials
//                                             [M, n_tiles(N, bn)] and column partials
//                                             [n_tiles(M, bm), N] with it, and hand it to the CPU
//                                             emulator to model the same combine order
//   gemm_plan_cost<P>(problem)                what gemm() costs P on problem by the chosen mainloop's
//                                             plan: to compare ways of cutting one GEMM into several
// Mainloops: Hopper's (gemm_sm90.cuh, TMA + wgmma) when the device is compute capability 9.x and
// the binary holds sm_90a code (sm90::available() says so), else the portable one (gemm_sm80.cuh,
// cp.async + mma.sync). Passes without a GEMM (K = 0: acc = 0, e.g. QkvGradient) always run on
// the portable kernel: there is no mainloop to choose. Tests force one with the Mainloop argument.
// A program declaring kPass (epilogue.cuh) runs only so: K > 0 throws, and no GEMM kernel is built
// for it.
//
// Problems: M, N, K multiples of 8 (16-byte operand chunks, paired epilogue accesses); operands
// (for K > 0) non-null, 16-byte aligned, ld a multiple of 8 and at least the stored row length.
// Anything else throws codagpt::Error naming the operand. Every matrix a program reads or writes
// is the program's to size; the engine never touches elements outside M x N.
#pragma once
#include <string>

#include "common.cuh"
#include "gemm_sm80.cuh"
#include "gemm_types.cuh"
#if __has_include("gemm_sm90.cuh")
#include "gemm_sm90.cuh"
#define CODAGPT_GEMM_SM90 1
#endif

namespace codagpt::coda {

enum class Mainloop { Auto, Sm90, Sm80 };

namespace detail {

// Operand `name`, logically [rows, cols]: stored row-major with rows of `cols`, or transposed.
inline void validate_operand(const char* name, const DeviceOperand& op, int rows, int cols) {
    const std::string what = std::string("CODA GEMM: operand ") + name + ": ";
    const long row_length = op.layout.transposed ? rows : cols;
    if (op.p == nullptr) throw Error(what + "null pointer");
    if (reinterpret_cast<uintptr_t>(op.p) % 16 != 0) throw Error(what + "pointer not 16-byte aligned");
    if (op.layout.ld % 8 != 0)
        throw Error(what + "leading dimension " + std::to_string(op.layout.ld) + " is not a multiple of 8");
    if (op.layout.ld < row_length)
        throw Error(what + "leading dimension " + std::to_string(op.layout.ld) + " is less than its stored row length " +
                    std::to_string(row_length));
}

inline void validate(const GemmProblem& prob) {
    if (prob.M < 0 || prob.N < 0 || prob.K < 0 || prob.M % 8 || prob.N % 8 || prob.K % 8)
        throw Error("CODA GEMM: M, N, K must be non-negative multiples of 8, got M=" + std::to_string(prob.M) +
                    " N=" + std::to_string(prob.N) + " K=" + std::to_string(prob.K));
    if (prob.K == 0) return;  // a pass: the operands are not read
    validate_operand("A", prob.a, prob.M, prob.K);
    validate_operand("B", prob.b, prob.K, prob.N);
}

inline bool sm90_available() {
#ifdef CODAGPT_GEMM_SM90
    return sm90::available();
#else
    return false;
#endif
}

inline Mainloop choose(const GemmProblem& prob, Mainloop requested) {
    if (prob.K == 0) return Mainloop::Sm80;
    if (requested == Mainloop::Sm80) return Mainloop::Sm80;
    if (sm90_available()) return Mainloop::Sm90;
    if (requested == Mainloop::Sm90)
        throw Error("CODA GEMM: the sm90 mainloop was asked for, but it needs a compute capability 9.x device and a "
                    "binary built for sm_90a");
    return Mainloop::Sm80;
}

}  // namespace detail

template <class P = void>
TileShape gemm_tile_shape(const GemmProblem& prob, Mainloop mainloop = Mainloop::Auto) {
    switch (detail::choose(prob, mainloop)) {
#ifdef CODAGPT_GEMM_SM90
        case Mainloop::Sm90: return sm90::tile_shape<P>(prob);
#endif
        default: return sm80::tile_shape(prob);
    }
}

// Relative units, comparable between problems on one mainloop and device only (the Hopper plan's
// cost model: the busiest CTA's tiles, sm90::detail::choose_plan; the portable one: all tiles).
template <class P = void>
double gemm_plan_cost(const GemmProblem& prob, Mainloop mainloop = Mainloop::Auto) {
    switch (detail::choose(prob, mainloop)) {
#ifdef CODAGPT_GEMM_SM90
        case Mainloop::Sm90: return sm90::plan<P>(prob).cost;
#endif
        default: return sm80::plan_cost(prob);
    }
}

template <class P>
void gemm(const P& program, const GemmProblem& prob, cudaStream_t stream, Mainloop mainloop = Mainloop::Auto) {
    if (is_pass<P> && prob.K != 0)  // before the operands: a pass has none to check
        throw Error("CODA GEMM: the program is a pass without a GEMM (K = 0), got K=" + std::to_string(prob.K));
    detail::validate(prob);
    if (prob.M == 0 || prob.N == 0) return;
    if constexpr (is_pass<P>) {
        return sm80::pass(program, prob, stream);
    } else {
        switch (detail::choose(prob, mainloop)) {
#ifdef CODAGPT_GEMM_SM90
            case Mainloop::Sm90: return sm90::gemm(program, prob, stream);
#endif
            default: return sm80::gemm(program, prob, stream);
        }
    }
}

}  // namespace codagpt::coda
