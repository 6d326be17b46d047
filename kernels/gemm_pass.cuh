// The CODA engine's passes without a GEMM (K = 0, acc = 0): QkvGradient, CrossEntropyGradient and
// ResidualStats in the trainer, and any program run with K = 0. Such a pass streams one to three
// tiles through the program and writes one: it is bound by memory, and its row and column partials
// (per 128-column and per 128-row tile) land where a GEMM epilogue's would (gemm_epilogue.cuh), so
// the same finalize kernels merge them.
//
// One block of 256 threads (8 warps) a 128 x 128 tile. Lanes 0-15 of warp w take tile row 2w and
// lanes 16-31 row 2w + 1, 8 consecutive columns a lane (a segment: one 16-byte access of a bf16
// tile, two of fp32), so each tile access of a warp is two whole rows of 256 contiguous bytes; then
// the rows 16 further down, 8 steps in all. A thread keeps kAhead steps' tile words and row values
// in registers: the reads of step s + kAhead go out as soon as step s has used its buffer, so that
// about kAhead 16-byte reads a loaded tile are in flight per thread while it computes. Column
// vector values are read once (a thread's columns are the same in every step).
//
// Combine order (fixed; the CPU emulator models it exactly with tile_shape()'s lane splits):
//   Row: a lane adds its 8 columns in order; the 16 lanes of a row combine by xor butterfly (a
//     pairwise tree in lane order), and lane 0 of them calls write_row once per row i < M.
//   Col: a thread adds its 8 rows of a column in order (rows 16 apart); lanes l and l + 16 combine
//     (the lower first), then the 8 warps as a pairwise tree in warp order, through shared memory;
//     one thread per column calls write_col once per column j < N.
// Measured on the H200: bench/NOTES_gemm_sm90.md ("Fourteenth session").
#pragma once
#include <stdint.h>

#include <type_traits>

#include "common.cuh"
#include "gemm_emulator.hpp"
#include "gemm_epilogue.cuh"
#include "gemm_types.cuh"

namespace codagpt::coda::passes {

constexpr int kBM = 128, kBN = 128;  // the tile a block and a partial cover
constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kRowLanes = 16;                       // lanes sharing a row: kBN / 8 columns a lane
constexpr int kRowsPerStep = kThreads / kRowLanes;  // 16
constexpr int kSteps = kBM / kRowsPerStep;          // 8 segments a thread
constexpr int kAhead = 4;                           // steps whose reads are in flight
constexpr int kBlocksPerSM = 2;                     // the register budget: 128 a thread
static_assert(kBN == 8 * kRowLanes, "a lane's segment is 8 columns");

// A thread's registers (indices are compile-time constants once the steps are unrolled).
template <int AHEAD>
struct PassSlots {
    RegisterSlots loaded[AHEAD][8];  // [buffer][word]: each tile load's words of a step
    RegisterSlots row[AHEAD];        // [buffer]: each row vector read's value of a step
    RegisterSlots stored[8];          // [element]: each store's value, until element 7 writes them
    RegisterSlots col[8];             // [element]: each column vector read's value
};

// Runs a program for the reads of step `buffer`'s segment (row i, columns j ... j + 7; nothing
// where !in): its tile values and row values into the buffer's registers.
template <int AHEAD>
struct StepReadElement : LoadsOnly {
    int buffer;
    bool in;
    ElementCounters* counters;
    PassSlots<AHEAD>* slots;

    template <class T, class L>
    __device__ T load(const T* p, const L& layout) const {
        const int s = detail::next_slot(counters->load);
        if (in) {
            uint32_t w[8];
            detail::read_segment(p, layout, i, j, w);
#pragma unroll
            for (int e = 0; e < detail::kWords8<T>; e++) slots->loaded[buffer][e].set(s, __uint_as_float(w[e]));
        }
        return T{};
    }
    template <class T>
    __device__ T row_input(const T* v) const {
        const int s = detail::next_slot(counters->row);
        if (in) slots->row[buffer].set(s, detail::as_word(load_input(v + i)));
        return T{};
    }
};

// Runs a program for its column vector reads of the thread's columns j ... j + 7 (nothing where !in).
template <int AHEAD>
struct ColumnReadElement : LoadsOnly {
    bool in;
    ElementCounters* counters;
    PassSlots<AHEAD>* slots;

    template <class T, class L>
    __device__ T load(const T*, const L&) const {
        return T{};
    }
    template <class T>
    __device__ T col_input(const T* v) const {
        const int s = detail::column_vector_slot(counters->col);
        if (in)
#pragma unroll
            for (int e = 0; e < 8; e++) slots->col[e].set(s, detail::as_word(load_input(v + j + e)));
        return T{};
    }
};

// Element k (0..7) of a step's segment (row i, columns j - k ... j - k + 7), acc = 0: its values
// from the registers the reads above filled; element 7 writes each stored tile's 8 values.
template <int AHEAD>
struct PassElement {
    float acc;
    int i, j, k, buffer;
    ElementCounters* counters;
    PassSlots<AHEAD>* slots;

    template <class T>
    __device__ T load(const T*, const Layout&) const {
        const int s = detail::next_slot(counters->load);
        uint32_t w[8];
#pragma unroll
        for (int e = 0; e < detail::kWords8<T>; e++) w[e] = __float_as_uint(slots->loaded[buffer][e].get(s));
        return detail::value8(w, k, (T*)nullptr);
    }
    template <class T>
    __device__ float store(T* p, const Layout& layout, float x) const {
        return detail::store_segment(slots->stored, detail::next_slot(counters->store), p, layout, i, j, k, x);
    }
    __device__ void row_output(float* out, float x) const { out[i] = x; }
    template <class T>
    __device__ T row_input(const T*) const {
        return detail::from_word<T>(slots->row[buffer].get(detail::next_slot(counters->row)));
    }
    template <class T>
    __device__ T col_input(const T*) const {
        return detail::from_word<T>(slots->col[k].get(detail::column_vector_slot(counters->col)));
    }
};

template <class P, int AHEAD, int BLOCKS>
__global__ void __launch_bounds__(kThreads, BLOCKS) pass_kernel(const P program, const int M, const int N) {
    using Row = typename P::Row;
    using Col = typename P::Col;
    constexpr bool kRows = !std::is_same_v<Row, NoPartials>, kCols = !std::is_same_v<Col, NoPartials>;
    __shared__ Col col_states[kCols ? kWarps : 1][kCols ? kBN : 1];

    const int tiles_n = (N + kBN - 1) / kBN;
    const int tile_m = blockIdx.x / tiles_n, tile_n = blockIdx.x % tiles_n;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, q = lane % kRowLanes, half = lane / kRowLanes;
    const int i0 = tile_m * kBM + 2 * warp + half, j0 = tile_n * kBN + 8 * q;  // step s: row i0 + 16 s
    const bool cols_in = j0 < N;  // N is a multiple of 8: a segment is all in or all out

    PassSlots<AHEAD> slots;
    {
        ElementCounters counters;
        Row row{};
        Col col{};
        program.element(ColumnReadElement<AHEAD>{{0.f, i0, j0}, cols_in, &counters, &slots}, row, col);
    }
    auto read_step = [&](int s) {
        ElementCounters counters;
        Row row{};
        Col col{};
        const int i = i0 + s * kRowsPerStep;
        program.element(StepReadElement<AHEAD>{{0.f, i, j0}, s % AHEAD, cols_in && i < M, &counters, &slots}, row, col);
    };
#pragma unroll
    for (int s = 0; s < AHEAD; s++) read_step(s);

    Col cols[8] = {};
#pragma unroll
    for (int s = 0; s < kSteps; s++) {
        const int i = i0 + s * kRowsPerStep;
        Row row{};
        if (cols_in && i < M) {
#pragma unroll
            for (int k = 0; k < 8; k++) {
                ElementCounters counters;
                program.element(PassElement<AHEAD>{0.f, i, j0 + k, k, s % AHEAD, &counters, &slots}, row, cols[k]);
            }
        }
        if (s + AHEAD < kSteps) read_step(s + AHEAD);
        if constexpr (kRows) {
#pragma unroll
            for (int mask = 1; mask < kRowLanes; mask *= 2) row.combine(detail::shfl_xor(row, mask));
            if (q == 0 && i < M) program.write_row(row, RowSlot{i, tile_n, tiles_n});
        }
    }

    if constexpr (kCols) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const Col upper = detail::shfl_xor(cols[k], kRowLanes);
            if (half == 0) {
                cols[k].combine(upper);
                col_states[warp][8 * q + k] = cols[k];
            }
        }
        __syncthreads();
        const int c = threadIdx.x, j = tile_n * kBN + c;
        if (c < kBN && j < N) {
            Col w[kWarps];
#pragma unroll
            for (int x = 0; x < kWarps; x++) w[x] = col_states[x][c];
#pragma unroll
            for (int stride = 1; stride < kWarps; stride *= 2)
#pragma unroll
                for (int x = 0; x + stride < kWarps; x += 2 * stride) w[x].combine(w[x + stride]);
            program.write_col(w[0], ColSlot{j, tile_m, N});
        }
    }
}

// The tile and lane splits of a pass: what sizes its partials, and the emulator's model of its order.
inline TileShape tile_shape() { return TileShape{kBM, kBN, {kRowLanes, 8}, {kRowsPerStep, 1}}; }

// out = program(0) over an M x N output (a validated problem with K = 0: gemm.cuh).
template <class P, int AHEAD = kAhead, int BLOCKS = kBlocksPerSM>
void pass(const P& program, const GemmProblem& prob, cudaStream_t stream) {
    static_assert(AHEAD >= 1 && AHEAD <= kSteps, "steps in flight");
    const long blocks = (long)n_tiles(prob.M, kBM) * n_tiles(prob.N, kBN);
    pass_kernel<P, AHEAD, BLOCKS><<<(unsigned)blocks, kThreads, 0, stream>>>(program, prob.M, prob.N);
    CUDA_CHECK_LAUNCH(passes::pass_kernel);
}

}  // namespace codagpt::coda::passes
