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
// Elements. Each thread visits its elements fragment column by fragment column (fn, then fm, then
// the g / g + 8 half, then the pair 2t, 2t + 1): each row's columns in increasing order and each
// column's rows in increasing order, skipping those outside M x N; M and N are
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
//     one thread per column of the tile calls write_col once per column j < N.
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

// A few floats in registers, indexed by a slot number that is a compile-time constant once the
// epilogue is unrolled. Where it is not (a conditional access: LnBackwardX's optional dres), get
// and set select among the registers instead of indexing an array, which would go to local memory.
struct RegisterSlots {
    static constexpr int kMax = 8;  // accesses of one kind per element; the programs make at most 4
    float value[kMax];
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

// What one element() call numbers as it goes: its tile accesses (the k-th is paired with the k-th
// of the other element of its pair) and its row and column vector reads (the k-th is the same
// vector for every element).
struct ElementCounters {
    int tile = 0, row = 0, col = 0;
};

namespace detail {
__device__ inline float as_word(float x) { return x; }
__device__ inline float as_word(int x) { return __int_as_float(x); }
template <class T>
__device__ T from_word(float w);
template <>
__device__ inline float from_word<float>(float w) { return w; }
template <>
__device__ inline int from_word<int>(float w) { return __float_as_int(w); }
__device__ inline int next_slot(int& counter) {
    const int k = counter++;
    if (k >= RegisterSlots::kMax) __trap();  // folded away for programs within the limit
    return k;
}
}  // namespace detail

// The GPU engine's element: columns j (even, `second` false) and j + 1 of one row, in that order.
// Tile accesses: a load by the first element reads both values and keeps the second for the
// second element (`pair`); a store by the first is held and written by the second with its own
// value as one access. A tile whose elements do not lie side by side (a transposed layout) or
// whose pairs are not aligned to their size (an odd leading dimension or base) is accessed
// element by element. Vector reads: the first element that reads row i's (column j's) values
// reads them from memory and keeps them in `row` (`col`); the later elements of that row (column)
// in this thread's tile take them from there.
struct PairedElement {
    float acc;
    int i, j;
    bool second;
    bool row_first, col_first;  // the thread's first element of row i, of column j
    ElementCounters* counters;
    RegisterSlots *pair, *row, *col;

    // Pairs of this tile lie side by side and are aligned: j is even, so every pair is when the
    // base is and a row's length in elements is even.
    template <class T>
    __device__ static bool pairable(const T* p, const Layout& layout) {
        return !layout.transposed && layout.ld % 2 == 0 && reinterpret_cast<uintptr_t>(p) % (2 * sizeof(T)) == 0;
    }
    template <class T>
    __device__ T load(const T* p, const Layout& layout) const {
        const int k = detail::next_slot(counters->tile);
        const T* at = p + layout.at(i, j);
        if (!pairable(p, layout)) return *at;
        if (second) return round_to<T>(pair->get(k));
        const typename detail::Pair<T>::type both = *reinterpret_cast<const typename detail::Pair<T>::type*>(at);
        pair->set(k, to_float(both.y));
        return both.x;
    }
    template <class T>
    __device__ void store(T* p, const Layout& layout, T value) const {
        const int k = detail::next_slot(counters->tile);
        T* at = p + layout.at(i, j);
        if (!pairable(p, layout)) *at = value;
        else if (!second) pair->set(k, to_float(value));  // exact: value is a T
        else *reinterpret_cast<typename detail::Pair<T>::type*>(at - 1) = detail::Pair<T>::make(round_to<T>(pair->get(k)), value);
    }
    template <class T>
    __device__ T row_input(const T* v) const { return cached(v + i, row, detail::next_slot(counters->row), row_first); }
    template <class T>
    __device__ T col_input(const T* v) const { return cached(v + j, col, detail::next_slot(counters->col), col_first); }

  private:
    template <class T>
    __device__ static T cached(const T* at, RegisterSlots* cache, int k, bool first) {
        if (!first) return detail::from_word<T>(cache->get(k));
        const T v = load_input(at);
        cache->set(k, detail::as_word(v));
        return v;
    }
};

// Whether a program declares kSmallElement = true (epilogue.cuh).
template <class P, class = void>
struct small_element : std::false_type {};
template <class P>
struct small_element<P, std::void_t<decltype(P::kSmallElement)>> : std::bool_constant<P::kSmallElement> {};

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
//
// The elements are visited one 8-column fragment at a time (fn outer, then fm and the g / g + 8
// half): a thread still sees each row's columns in increasing order and each column's rows in
// increasing order, but a column's state is complete once its fragment is done, so it is combined
// across the warp's row groups and parked in shared memory right away: only two column states
// are live at a time instead of 2 FN, and the column vectors of a fragment are read for its 2 FM
// rows together.
//
// Code size. The fragment loop is a run-time loop: its body is one fragment column's code (2 FM
// pairs of elements), run FN times. Fully unrolled, a program's code for all of a thread's
// elements (128 at 128 accumulators: 137 KB of SASS for GeluBackward) outgrew the SM's
// instruction cache, and the epilogue ran at the speed of fetching its instructions from L2
// (ncu on the H200: a third of the issue stalls on instruction fetch; GeluBackward 5.4x, FcForward
// 3.1x the time of the plain GEMM of their shape). A program whose element is a single store or
// accumulate (kSmallElement, epilogue.cuh) stays unrolled: its whole tile's code fits the cache,
// and the loop's copy of the accumulators through local memory would cost it more (plain GEMMs
// were measured 0.83x of cuBLASLt unrolled, 0.61x looped).
template <class P, int FM, int FN, int ROW_STRIDE, int WARPS_M, int WARPS_N>
struct TileEpilogue {
    using Row = typename P::Row;
    using Col = typename P::Col;
    static constexpr bool kRows = !std::is_same_v<Row, NoPartials>;
    static constexpr bool kCols = !std::is_same_v<Col, NoPartials>;
    static constexpr int kThreads = WARPS_M * WARPS_N * 32;
    static constexpr int kTileCols = WARPS_N * FN * 8;
    // Cross-warp states: rows of warps warp_n >= 1, [warp_n - 1][warp_m][fm][half][g];
    // columns of every warp, [warp_m][c] with c = (warp_n FN + fn) 8 + 2t + k the column in the tile.
    static constexpr int kRowSlots = kRows && WARPS_N > 1 ? (WARPS_N - 1) * WARPS_M * FM * 16 : 0;
    static constexpr int kColSlots = kCols ? WARPS_M * kTileCols : 0;
    static constexpr size_t kRowBytes = kRowSlots * sizeof(Row);
    static constexpr size_t kSmemBytes = kRowBytes + kColSlots * sizeof(Col);
    static constexpr bool kShared = kSmemBytes > 0;

    template <class Sync>
    __device__ static void run(const P& p, const float (&acc)[FM][FN][4], int warp_row0, int warp_col0, int warp_m,
                               int warp_n, int tile_m, int tile_n, int /*n_tiles_m*/, int n_tiles_n, int M, int N,
                               void* smem, Sync sync) {
        const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
        Row* row_smem = static_cast<Row*>(smem);
        Col* col_smem = reinterpret_cast<Col*>(static_cast<char*>(smem) + kRowBytes);
        Row rows[FM][2] = {};
        RegisterSlots row_values[FM][2];  // the vector values of the thread's rows, read at fn = 0
        // Fragment column fn: the thread's 2 FM pairs of elements in it, accumulator (fm, q) at value(fm, q).
        auto fragment = [&](int fn, auto value) {
            const int j = warp_col0 + fn * 8 + 2 * t;
            Col cols[2] = {};
            RegisterSlots col_values[2];  // of its two columns, read at its first row
            if (j < N) {  // the same for the whole warp: a fragment's 8 columns are in or out together
#pragma unroll
                for (int fm = 0; fm < FM; fm++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int i = warp_row0 + fm * ROW_STRIDE + 8 * h + g;
                        if (i >= M) continue;
                        const bool col_first = fm == 0 && h == 0;  // rows past M are the later ones
                        RegisterSlots pair;
                        ElementCounters first, second;
                        p.element(PairedElement{value(fm, 2 * h), i, j, false, fn == 0, col_first, &first, &pair,
                                                &row_values[fm][h], &col_values[0]},
                                  rows[fm][h], cols[0]);
                        p.element(PairedElement{value(fm, 2 * h + 1), i, j + 1, true, false, col_first, &second, &pair,
                                                &row_values[fm][h], &col_values[1]},
                                  rows[fm][h], cols[1]);
                    }
            }
            if constexpr (kCols) {
#pragma unroll
                for (int k = 0; k < 2; k++)
#pragma unroll
                    for (int mask = 4; mask <= 16; mask *= 2) cols[k].combine(detail::shfl_xor(cols[k], mask));
                if (g == 0)
#pragma unroll
                    for (int k = 0; k < 2; k++) col_smem[warp_m * kTileCols + (warp_n * FN + fn) * 8 + 2 * t + k] = cols[k];
            }
        };
        if constexpr (small_element<P>::value) {
#pragma unroll
            for (int fn = 0; fn < FN; fn++) fragment(fn, [&](int fm, int q) { return acc[fm][fn][q]; });
        } else {
            // A run-time loop over the fragments (see "Code size" above) indexes the accumulators at
            // run time: it reads a copy of them in local memory (the thread's L1 lines), each
            // fragment's values loaded one iteration ahead; the accumulators themselves stay in
            // registers for the mainloop.
            float staged[FM][FN][4], now[FM][4], ahead[FM][4];
#pragma unroll
            for (int fm = 0; fm < FM; fm++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
#pragma unroll
                    for (int fn = 0; fn < FN; fn++) staged[fm][fn][q] = acc[fm][fn][q];
                    now[fm][q] = acc[fm][0][q];
                }
#pragma unroll 1
            for (int fn = 0; fn < FN; fn++) {
                const int next = min(fn + 1, FN - 1);
#pragma unroll
                for (int fm = 0; fm < FM; fm++)
#pragma unroll
                    for (int q = 0; q < 4; q++) ahead[fm][q] = staged[fm][next][q];
                fragment(fn, [&](int fm, int q) { return now[fm][q]; });
#pragma unroll
                for (int fm = 0; fm < FM; fm++)
#pragma unroll
                    for (int q = 0; q < 4; q++) now[fm][q] = ahead[fm][q];
            }
        }

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
            // Column c of the tile: the WARPS_M warps' states in warp_m order, one thread a column.
            const int tile_col0 = warp_col0 - warp_n * FN * 8;
            for (int c = (warp_m * WARPS_N + warp_n) * 32 + lane; c < kTileCols; c += kThreads) {
                if (tile_col0 + c >= N) continue;
                Col total = col_smem[c];
#pragma unroll
                for (int w = 1; w < WARPS_M; w++) total.combine(col_smem[w * kTileCols + c]);
                p.write_col(total, ColSlot{tile_col0 + c, tile_m, N});
            }
        }
        if constexpr (kShared) sync();  // shared memory free again (a persistent kernel's next tile)
    }

  private:
    __device__ static int row_slot(int warp_n, int warp_m, int fm, int h, int g) {
        return (((warp_n - 1) * WARPS_M + warp_m) * FM + fm) * 16 + h * 8 + g;
    }
};

}  // namespace codagpt::coda
