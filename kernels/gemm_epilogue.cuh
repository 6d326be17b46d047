// The device epilogue driver of the CODA GEMM engine, shared by both mainloops (gemm_sm80.cuh,
// gemm_sm90.cuh): runs an epilogue program (coda_programs.cuh, contract in epilogue.cuh) on the
// fp32 accumulators a warp holds, then combines and writes the program's row and column partials.
//
// Accumulators of a warp, in the mma C-fragment layout: fragment (fm, fn) is float[4]; lane
// l = 4g + t holds d0, d1 at (r + g, c + 2t + {0, 1}) and d2, d3 at (r + g + 8, same columns), with
// r = warp_row0 + fm * ROW_STRIDE and c = warp_col0 + fn * 8 (global indices). mma.sync m16n8k16
// tiles stacked by 16 rows are ROW_STRIDE = 16; a wgmma m64nN accumulator is this per warp with
// FN = N/8 and warp w of the warpgroup at rows 16w, and two m64 instructions stacked give
// ROW_STRIDE = 64. The tile's warps form a WARPS_M x WARPS_N grid; warps with the same warp_m hold
// the same rows, warps with the same warp_n the same columns.
//
// Elements. Each thread visits its elements row by row (fm, then the g / g + 8 half), each row in
// increasing column order (fn, then the pair 2t, 2t + 1), skipping those outside M x N; M and N are
// multiples of 8, so a fragment's 8 columns, and the two columns of a thread, are in or out together.
// The two columns of a pair run as two element() calls through a PairedElement that makes each
// tile access of the pair one 4- or 8-byte access (see below).
//
// Combine order (fixed; every combine is associative up to rounding, so other orders differ only
// by rounding; the CPU emulator models it with TileShape's LaneSplits {4, 2} and {8, 1}):
//   Row, within a warp: each thread accumulates its columns of a row in increasing order; the 4
//     lanes of a quad (t = 0..3, same row) combine by xor-shuffle butterfly, lane t = 0 ending
//     with ((t0 t1)(t2 t3)).
//   Row, across warps: the WARPS_N warps sharing a row, in warp_n order (((w0 w1) w2) ...),
//     through shared memory; warp_n = 0, lane t = 0 calls write_row once per row i < M.
//   Col, within a warp: each thread accumulates its rows of a column in increasing order; the 8
//     row groups (g = 0..7, xor 4, 8, 16 of the lane) combine as ((g0 g1)(g2 g3))((g4 g5)(g6 g7)).
//   Col, across warps: the WARPS_M warps sharing a column, in warp_m order, through shared memory;
//     warp_m = 0, lanes g = 0 call write_col once per column j < N.
// Partials land in slot (i, tile_n) of [M, n_tiles_n] and (tile_m, j) of [n_tiles_m, N], as
// RowPartials / ColPartials lay them out. No atomics: results are bit-for-bit deterministic.
// Programs without partials (NoPartials) compile to the element loop alone: no shuffles, no shared
// memory, no barriers.
#pragma once
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "epilogue.cuh"

namespace codagpt::coda {

// ---------------------------------------------------------------- paired tile accesses
namespace detail {
template <class T>
struct Pair;
template <>
struct Pair<bf16> {
    using type = __nv_bfloat162;
    __device__ static type make(bf16 a, bf16 b) { return {a, b}; }
};
template <>
struct Pair<float> {
    using type = float2;
    __device__ static type make(float a, float b) { return make_float2(a, b); }
};
}  // namespace detail

// Values carried from the first element of a pair to the second: the k-th tile access of the
// first element's element() call is paired with the k-th of the second's (the contract in
// epilogue.cuh keeps these sequences equal). Fully inlined, the slot index is a compile-time
// constant and the slots are registers. Where an access is conditional (LnBackwardX's optional
// dres) the index is not, and get/set select among the registers instead of indexing an array,
// which would go to local memory.
struct PairSlots {
    static constexpr int kMax = 8;  // tile accesses per element; the programs make at most 3
    float value[kMax];
    int next = 0;
    __device__ float get(int k) const {
        float v = 0.f;
#pragma unroll
        for (int s = 0; s < kMax; s++) v = s == k ? value[s] : v;
        return v;
    }
    __device__ void set(int k, float v) {
#pragma unroll
        for (int s = 0; s < kMax; s++) value[s] = s == k ? v : value[s];
    }
};

// The GPU engine's element: columns j (even, `second` false) and j + 1 of one row, in that order.
// A load by the first element reads both values and keeps the second for the second element; a
// store by the first is held and written by the second with its own value as one access. Where
// the two do not lie side by side (a transposed layout) or the pair is not aligned to its size,
// each element makes its own access.
struct PairedElement {
    float acc;
    int i, j;
    bool second;
    PairSlots* slots;

    template <class T>
    __device__ static bool pairable(const T* first, const Layout& layout) {
        return !layout.transposed && reinterpret_cast<uintptr_t>(first) % (2 * sizeof(T)) == 0;
    }
    __device__ int slot() const {
        const int k = slots->next++;
        if (k >= PairSlots::kMax) __trap();  // folded away for programs within the limit
        return k;
    }
    template <class T>
    __device__ T load(const T* p, const Layout& layout) const {
        const int k = slot();
        const T* at = p + layout.at(i, j);
        if (second) return pairable(at - 1, layout) ? round_to<T>(slots->get(k)) : *at;
        if (!pairable(at, layout)) return *at;
        const typename detail::Pair<T>::type both = *reinterpret_cast<const typename detail::Pair<T>::type*>(at);
        slots->set(k, to_float(both.y));
        return both.x;
    }
    template <class T>
    __device__ void store(T* p, const Layout& layout, T value) const {
        const int k = slot();
        T* at = p + layout.at(i, j);
        if (!second) {
            if (pairable(at, layout)) slots->set(k, to_float(value));  // exact: value is a T
            else *at = value;
        } else if (pairable(at - 1, layout)) {
            *reinterpret_cast<typename detail::Pair<T>::type*>(at - 1) =
                detail::Pair<T>::make(round_to<T>(slots->get(k)), value);
        } else {
            *at = value;
        }
    }
};

// ---------------------------------------------------------------- reduction states across lanes
namespace detail {
// A reduction state (a struct of floats) from the lane `mask` away, word by word.
template <class S>
__device__ S shfl_xor(const S& s, int mask) {
    static_assert(std::is_trivially_copyable_v<S> && sizeof(S) % sizeof(float) == 0,
                  "reduction states are structs of floats");
    constexpr int kWords = sizeof(S) / sizeof(float);
    float w[kWords];
    memcpy(w, &s, sizeof(S));
#pragma unroll
    for (int k = 0; k < kWords; k++) w[k] = __shfl_xor_sync(0xffffffffu, w[k], mask);
    S o;
    memcpy(&o, w, sizeof(S));
    return o;
}
}  // namespace detail

// The epilogue of one output tile. Every thread of the WARPS_M x WARPS_N warps calls run() with
// its accumulators; smem: kSmemBytes of shared memory (none for programs without partials), free
// for other use again when run() returns; sync(): a barrier of exactly these threads.
template <class P, int FM, int FN, int ROW_STRIDE, int WARPS_M, int WARPS_N>
struct TileEpilogue {
    using Row = typename P::Row;
    using Col = typename P::Col;
    static constexpr bool kRows = !std::is_same_v<Row, NoPartials>;
    static constexpr bool kCols = !std::is_same_v<Col, NoPartials>;
    // Cross-warp states: rows of warps warp_n >= 1, [warp_n - 1][warp_m][fm][half][g];
    // columns of warps warp_m >= 1, [warp_m - 1][warp_n][fn][t][pair].
    static constexpr int kRowSlots = kRows && WARPS_N > 1 ? (WARPS_N - 1) * WARPS_M * FM * 16 : 0;
    static constexpr int kColSlots = kCols && WARPS_M > 1 ? (WARPS_M - 1) * WARPS_N * FN * 8 : 0;
    static constexpr size_t kRowBytes = kRowSlots * sizeof(Row);
    static constexpr size_t kSmemBytes = kRowBytes + kColSlots * sizeof(Col);
    static constexpr bool kShared = kSmemBytes > 0;

    template <class Sync>
    __device__ static void run(const P& p, const float (&acc)[FM][FN][4], int warp_row0, int warp_col0, int warp_m,
                               int warp_n, int tile_m, int tile_n, int /*n_tiles_m*/, int n_tiles_n, int M, int N,
                               void* smem, Sync sync) {
        const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
        Row rows[FM][2] = {};
        Col cols[FN][2] = {};
#pragma unroll
        for (int fm = 0; fm < FM; fm++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int i = warp_row0 + fm * ROW_STRIDE + 8 * h + g;
                if (i >= M) continue;
#pragma unroll
                for (int fn = 0; fn < FN; fn++) {
                    const int j = warp_col0 + fn * 8 + 2 * t;
                    if (j >= N) continue;
                    PairSlots slots;
                    p.element(PairedElement{acc[fm][fn][2 * h], i, j, false, &slots}, rows[fm][h], cols[fn][0]);
                    slots.next = 0;
                    p.element(PairedElement{acc[fm][fn][2 * h + 1], i, j + 1, true, &slots}, rows[fm][h], cols[fn][1]);
                }
            }

        Row* row_smem = static_cast<Row*>(smem);
        Col* col_smem = reinterpret_cast<Col*>(static_cast<char*>(smem) + kRowBytes);
        if constexpr (kRows) {
#pragma unroll
            for (int fm = 0; fm < FM; fm++)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int mask = 1; mask <= 2; mask *= 2) rows[fm][h].combine(detail::shfl_xor(rows[fm][h], mask));
            if (WARPS_N > 1 && warp_n > 0 && t == 0)
#pragma unroll
                for (int fm = 0; fm < FM; fm++)
#pragma unroll
                    for (int h = 0; h < 2; h++) row_smem[row_slot(warp_n, warp_m, fm, h, g)] = rows[fm][h];
        }
        if constexpr (kCols) {
#pragma unroll
            for (int fn = 0; fn < FN; fn++)
#pragma unroll
                for (int k = 0; k < 2; k++)
#pragma unroll
                    for (int mask = 4; mask <= 16; mask *= 2) cols[fn][k].combine(detail::shfl_xor(cols[fn][k], mask));
            if (WARPS_M > 1 && warp_m > 0 && g == 0)
#pragma unroll
                for (int fn = 0; fn < FN; fn++)
#pragma unroll
                    for (int k = 0; k < 2; k++) col_smem[col_slot(warp_m, warp_n, fn, t, k)] = cols[fn][k];
        }
        if constexpr (kShared) sync();
        if constexpr (kRows) {
            if (warp_n == 0 && t == 0)
#pragma unroll
                for (int fm = 0; fm < FM; fm++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int i = warp_row0 + fm * ROW_STRIDE + 8 * h + g;
                        if (i >= M) continue;
                        Row total = rows[fm][h];
#pragma unroll
                        for (int w = 1; w < WARPS_N; w++) total.combine(row_smem[row_slot(w, warp_m, fm, h, g)]);
                        p.write_row(total, RowSlot{i, tile_n, n_tiles_n});
                    }
        }
        if constexpr (kCols) {
            if (warp_m == 0 && g == 0)
#pragma unroll
                for (int fn = 0; fn < FN; fn++)
#pragma unroll
                    for (int k = 0; k < 2; k++) {
                        const int j = warp_col0 + fn * 8 + 2 * t + k;
                        if (j >= N) continue;
                        Col total = cols[fn][k];
#pragma unroll
                        for (int w = 1; w < WARPS_M; w++) total.combine(col_smem[col_slot(w, warp_n, fn, t, k)]);
                        p.write_col(total, ColSlot{j, tile_m, N});
                    }
        }
        if constexpr (kShared) sync();  // shared memory free again (a persistent kernel's next tile)
    }

  private:
    __device__ static int row_slot(int warp_n, int warp_m, int fm, int h, int g) {
        return (((warp_n - 1) * WARPS_M + warp_m) * FM + fm) * 16 + h * 8 + g;
    }
    __device__ static int col_slot(int warp_m, int warp_n, int fn, int t, int k) {
        return (((warp_m - 1) * WARPS_N + warp_n) * FN + fn) * 8 + t * 2 + k;
    }
};

}  // namespace codagpt::coda
