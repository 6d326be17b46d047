// The device epilogue driver of the CODA GEMM engine, shared by both mainloops (gemm_sm80.cuh,
// gemm_sm90.cuh): runs an epilogue program (coda_programs.cuh, contract in epilogue.cuh) on the
// fp32 accumulator tile the mainloop's threads hold, then combines and writes the program's row and
// column partials.
//
// Accumulators of a warp, in the mma C-fragment layout: fragment (fm, fn) is float[4]; lane
// l = 4g + t holds d0, d1 at (r + g, c + 2t + {0, 1}) and d2, d3 at (r + g + 8, same columns), with
// r = warp_row0 + fm * ROW_STRIDE and c = warp_col0 + fn * 8 (global indices). mma.sync m16n8k16
// tiles stacked by 16 rows are ROW_STRIDE = 16; a wgmma m64nN accumulator is this per warp with
// FN = N/8 and warp w of the warpgroup at rows 16w, and two m64 instructions stacked give
// ROW_STRIDE = 64. The tile's warps form a WARPS_M x WARPS_N grid covering a block tile of
// WARPS_M FM 16 rows and WARPS_N FN 8 columns; warps with the same warp_m hold the same rows.
//
// The tile goes through shared memory. In the fragment layout a warp's 32 lanes touch 8 rows x 8
// columns: a tile access would be 4 bytes a lane in eight 16-byte pieces, each element with its
// own address arithmetic. Instead, 64 columns (a chunk) at a time, the warps write their
// accumulators of the chunk to shared memory (8-byte stores), then each thread reads back 8
// consecutive columns of a row (a segment: two 16-byte loads) and runs the program on them: bf16
// tile accesses are one 16-byte load or store per segment (fp32: two), a warp's access covers 8
// rows x 64 contiguous bytes, and the row and column vectors' values come from shared memory, a
// row's once per segment and a column's once per 8 columns. A chunk is taken as two halves of 32
// columns: thread T of the tile's threads takes the columns 8 (T % 4) ... + 7 of each half, in the
// rows T / 4 + p ROWS_PER_PASS (p = 0 ... PASSES - 1): its rows are the same in every chunk, so a
// row's state stays in the thread across the chunks; its columns are the same in every pass of a
// half, so their vector values are taken once. Each segment reads the next segment's tile values
// ahead (SegmentElement), across halves and chunks too: the latency of those loads hides behind
// this segment's arithmetic; the first segment's are read before the first chunk is staged, with
// the tile's row and column vector values (a row and a column a thread), which wait in shared
// memory. On the Hopper mainloop the tiles an epilogue will read are also asked of L2 a few
// k-blocks before the mainloop ends (prefetch(), PrefetchElement).
//   Staging layout: row r of the chunk is 64 floats (16 pieces of 16 bytes), piece k stored at
//   k ^ s(r), s(r) = 2 (r mod 4) + (r mod 2): the fragment stores (16 lanes of a half-warp: 4 rows
//   x 4 column pairs) and the segment loads (8 lanes of a quarter-warp: 2 rows x 4 pieces) each hit
//   32 different banks.
//   Registers and code size: the chunks are unrolled (a chunk's fragment stores need compile-time
//   accumulator indices, and once staged those registers are free for the segments' work), the
//   halves and passes are run-time loops over one segment's code (8 elements). A fully unrolled
//   epilogue (137 KB of SASS for GeluBackward at 128 accumulators a thread) outgrew the SM's
//   instruction cache (bench/NOTES_gemm_sm90.md, v3); unrolling the passes alone makes ptxas spill
//   (96 bytes for GeluBackward's sm90 kernels, nvcc 13.0), except for short programs
//   (kUnrollPasses).
//   Two segment loops: where every tile the program loads or stores is row-major with 16-byte
//   aligned segments (checked once a tile; every call of the trainer), the WHOLE loop addresses a
//   segment by a 32-bit offset from the tile's base, kept in registers, with no alignment test and
//   no element-by-element fallback; the general loop tests each access and computes its 64-bit
//   address (about 12 instructions an access more, in SASS).
//   Measured on the H200 (bench_gemm): even the plain store runs faster this way (0.89x the time of
//   storing bf16 pairs straight from the fragments), so every program takes this path. Passes
//   without a GEMM (ZERO_ACC) run the same segments and skip the staging: their accumulators are 0;
//   their tile values come from copies in shared memory (TileCopyElement) instead of read ahead, as
//   do those of a GEMM's program that declares kTileCopies (epilogue.cuh), each chunk's copied
//   while the chunk is staged.
//
// Combine order (fixed; every combine is associative up to rounding, so other orders differ only
// by rounding; the CPU emulator models it with TileShape's LaneSplits {4, 8} and {8, 1}):
//   Row: each thread accumulates its columns of a row in increasing order (chunk by chunk); the 4
//     lanes sharing the row (T % 4) combine by xor-shuffle butterfly, lane T % 4 = 0 ending with
//     ((q0 q1)(q2 q3)) and calling write_row once per row i < M.
//   Col, per half chunk: each thread accumulates its rows of a column in increasing order (pass
//     by pass); the 8 lanes of a warp sharing the columns (lane / 4 = 0..7) combine as
//     ((b0 b1)(b2 b3))((b4 b5)(b6 b7)), by a butterfly that halves the columns a lane keeps at each
//     step (xor 4: four columns, xor 8: two, xor 16: one), and park the result in shared memory;
//     after the last chunk one thread per column combines the warps in warp order and calls
//     write_col once per column j < N.
// Partials land in slot (i, tile_n) of [M, n_tiles_n] and (tile_m, j) of [n_tiles_m, N], as
// RowPartials / ColPartials lay them out. No atomics: results are bit-for-bit deterministic.
#pragma once
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "epilogue.cuh"
#include "ptx_sm80.cuh"

namespace codagpt::coda {

// ---------------------------------------------------------------- register slots
// A few floats in registers, indexed by a slot number that is a compile-time constant once the
// epilogue is unrolled. Where it is not, get and set select among the registers instead of
// indexing an array, which would go to local memory.
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

// What one element() call numbers as it goes: its tile loads and tile stores (the k-th of each is
// the same tile for every element: epilogue.cuh's rule), and its row and column vector reads.
struct ElementCounters {
    int load = 0, store = 0, row = 0, col = 0;
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

// 8 consecutive values of a T tile as raw 32-bit words: 4 for bf16 (one 16-byte access), 8 for
// float (two). Value e of the words, and the words of 8 values (bf16 values: exact).
template <class T>
constexpr int kWords8 = 8 * (int)sizeof(T) / 4;
template <class T>
__device__ inline void read8(const T* p, uint32_t (&w)[8]) {
    const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int h = 0; h < kWords8<T> / 4; h++) {
        const uint4 v = q[h];
        w[4 * h] = v.x, w[4 * h + 1] = v.y, w[4 * h + 2] = v.z, w[4 * h + 3] = v.w;
    }
}
template <class T>
__device__ inline void write8(T* p, const uint32_t (&w)[8]) {
    uint4* q = reinterpret_cast<uint4*>(p);
#pragma unroll
    for (int h = 0; h < kWords8<T> / 4; h++) q[h] = make_uint4(w[4 * h], w[4 * h + 1], w[4 * h + 2], w[4 * h + 3]);
}
// Value e as stored, from its bits: no conversion instruction (a round_to of the value as a float
// would be one: exact, but the compiler cannot know it).
__device__ inline bf16 value8(const uint32_t* w, int e, bf16*) {
    return __ushort_as_bfloat16((unsigned short)(e % 2 ? w[e / 2] >> 16 : w[e / 2] & 0xffffu));
}
__device__ inline float value8(const uint32_t* w, int e, float*) { return __uint_as_float(w[e]); }
// Rounds and packs: one cvt.rn.bf16x2 a pair (the same bits as rounding each value alone).
__device__ inline void words8(const float (&v)[8], uint32_t (&w)[8], bf16*) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
        memcpy(&w[k], &pair, 4);
    }
}
__device__ inline void words8(const float (&v)[8], uint32_t (&w)[8], float*) {
#pragma unroll
    for (int k = 0; k < 8; k++) w[k] = __float_as_uint(v[k]);
}
}  // namespace detail

// ---------------------------------------------------------------- the element
// What one thread's segments keep in registers: the current segment's tile words, row values and
// column values, and the tile words of the next segment, read ahead. Row and
// column vectors are read once a tile, a value a thread, into shared memory (TileEpilogue), where
// a segment takes its row's values and one that starts a half chunk its 8 columns' values.
//   So the segment loop's only global loads are reads ahead (the tile's first segments and the
// vectors are read by PreloadElements before the loop). Measured (Nsight Compute on the
// H200, GeluBackward and QkvGradient at 1.5B shapes): where a segment also read its own values
// (its first of a tile, or column values at a half chunk's start), most stall samples of the
// epilogue sat at their first use (17% and 45% of the kernels' samples), the loads of the
// segment ahead having just been issued. Where a segment's arithmetic is short beside its tile
// loads, one segment does not cover their latency either (ResidualForward: 11.5% of the 1.5B
// proj forward's stall samples on the first use of the words read ahead, twenty-seventh session;
// two segments ahead did not either at K = 1024): such a program copies its tiles into shared
// memory a chunk at a time instead (kTileCopies).
struct SegmentSlots {
    RegisterSlots loaded[8], stored[8];  // [w]: word w of each tile load / the value of each store's element w
    RegisterSlots ahead_loaded[8];       // [w]: the same words of the next segment
    RegisterSlots row;                   // this segment's row vector values
    RegisterSlots col[8];                // [e]: column j0 + e's vector values
    RegisterSlots tile_row, tile_col;    // this thread's row and column of the tile, before they go to shared memory
    // WHOLE (every tile access of the program has whole segments): where each tile load and store
    // has the tile's first element, set once a tile (PreloadElement); the segments add 32-bit
    // offsets within the tile.
    uintptr_t load_base[RegisterSlots::kMax], store_base[RegisterSlots::kMax];
};

namespace detail {
// The 8 values of row r at columns c ... c + 7 of a tile (their raw words, kWords8<T> of them):
// one 16-byte access for bf16, two for fp32, or element by element where the tile is stored
// transposed or its segments are not 16-byte aligned.
template <class T>
__device__ inline bool whole_segments(const T* p, const Layout& layout) {
    return !layout.transposed && layout.ld % 8 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}
// Where a whole segment (row r, columns c ...) starts: whole_segments implies row-major.
template <class T>
__device__ inline T* segment_at(T* p, const Layout& layout, int r, int c) {
    return p + (long)r * layout.ld + c;
}
template <class T>
__device__ inline void read_segment(const T* p, const Layout& layout, int r, int c, uint32_t (&w)[8]) {
    if (whole_segments(p, layout)) return read8(segment_at(p, layout, r, c), w);
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = to_float(p[layout.at(r, c + e)]);
    words8(v, w, (T*)nullptr);
}
// bf16 tiles are read ahead; fp32 tiles (the weight gradients' read-modify-write, of long-K GEMMs)
// are read when used: their 8 words more a tile do not fit beside the accumulators.
template <class T>
constexpr bool kReadAhead = sizeof(T) == 2;
// Element (r, c) of a row-major tile whose element (0, 0) is at `base` (WHOLE): a 32-bit offset
// on a base kept in registers, where segment_at's 64-bit product and the alignment test cost ~12
// instructions an access (bench/NOTES_gemm_sm90.md, forty-sixth session).
constexpr long kMaxInTileLd = 1L << 22;  // offsets within a tile of up to 512 rows fit 31 bits
template <class T>
__device__ inline T* in_tile(uintptr_t base, const Layout& layout, int r, int c) {
    return reinterpret_cast<T*>(base) + (r * (int)layout.ld + c);
}
}  // namespace detail

// Whether every tile an element() call of the program loads or stores has whole segments
// (detail::whole_segments): then the engine runs the epilogue's WHOLE variant, with no per-access
// alignment test and no fallback code in its segment loop. Checked once a tile; true for every
// call of the trainer.
struct WholeSegmentsElement : LoadsOnly {
    bool* whole;
    template <class T>
    __device__ static bool whole_tile(const T* p, const Layout& layout) {
        return detail::whole_segments(p, layout) && layout.ld <= detail::kMaxInTileLd;
    }
    template <class T, class L>
    __device__ T load(const T* p, const L& layout) const {
        *whole = *whole && whole_tile(p, layout);
        return T{};
    }
    template <class T, class L>
    __device__ float store(T* p, const L& layout, float) const {
        *whole = *whole && whole_tile(p, layout);
        return 0.f;
    }
};

// Element k (0..7, a compile-time constant once unrolled) of the segment of columns j - k ... j - k + 7
// of row i. Tile accesses: element 0's load takes all 8 values, element 7's store writes all 8
// (the others hand their values over in `slots`); SHARED_TILES (a pass, or a program's kTileCopies):
// element 0 takes each loaded 16-bit tile's values from the copy of the tile's chunk in shared
// memory (tile s's at tiles + s tile_stride) instead of a read ahead. Element 0 also reads the
// bf16 tile values of the next segment (row ahead_i, columns from ahead_j; ahead_i = -1 where there
// is none), and its row's values of each row vector from the tile's in shared memory (row_vectors).
// new_cols: this segment starts a half chunk, and takes its 8 columns' values of each column vector
// from the tile's in shared memory (col_vectors). Stores hand over the values unrounded: element 7
// rounds and packs them in pairs (the value store() returns is rounded on its own, and costs
// nothing where the program does not use it). Reading ahead keeps each element's
// read before its write, so an output may alias an input (ResidualForward's x_out and residual).
// WHOLE: every tile the program accesses has whole segments (WholeSegmentsElement): no alignment
// test and no fallback; the segment's accesses add offsets within the tile (row, col; the next
// segment's ahead_row, ahead_col) to the tile's bases in `slots`.
template <bool SHARED_TILES, bool WHOLE>
struct SegmentElement {
    float acc;
    int i, j, k;
    bool new_cols;
    int ahead_i, ahead_j;
    int row, col, ahead_row, ahead_col;  // WHOLE: in the tile: this segment's row and first column, the next one's
    uint32_t col_vectors;  // shared address of column vector 0 at this segment's first column (+ slot * col_stride)
    uint32_t col_stride;
    uint32_t row_vectors;  // shared address of row vector 0 at this segment's row (+ slot * row_stride)
    uint32_t row_stride;
    ElementCounters* counters;
    SegmentSlots* slots;
    uint32_t tiles, tile_stride;  // SHARED_TILES: shared address of tile 0's copy of this segment (+ slot * tile_stride)

    template <class T>
    __device__ T load(const T* p, const Layout& layout) const {
        const int s = detail::next_slot(counters->load);
        constexpr int kWords = detail::kWords8<T>;
        // Only element 0 branches (on the tile's layout, on the next segment): the other elements'
        // code is straight-line, so the compiler interleaves the 8 elements' arithmetic.
        if (k == 0) {
            uint32_t w[8];
            if constexpr (SHARED_TILES && sizeof(T) == 2) {
                const float4 v = ptx::ld_shared_v4(tiles + s * tile_stride);
                slots->loaded[0].set(s, v.x), slots->loaded[1].set(s, v.y);
                slots->loaded[2].set(s, v.z), slots->loaded[3].set(s, v.w);
            } else if constexpr (detail::kReadAhead<T>) {
#pragma unroll
                for (int e = 0; e < kWords; e++) slots->loaded[e].set(s, slots->ahead_loaded[e].get(s));
                if (ahead_i >= 0) {
                    if constexpr (WHOLE)
                        detail::read8(detail::in_tile<const T>(slots->load_base[s], layout, ahead_row, ahead_col), w);
                    else
                        detail::read_segment(p, layout, ahead_i, ahead_j, w);
#pragma unroll
                    for (int e = 0; e < kWords; e++) slots->ahead_loaded[e].set(s, __uint_as_float(w[e]));
                }
            } else {
                if constexpr (WHOLE)
                    detail::read8(detail::in_tile<const T>(slots->load_base[s], layout, row, col), w);
                else
                    detail::read_segment(p, layout, i, j, w);
#pragma unroll
                for (int e = 0; e < kWords; e++) slots->loaded[e].set(s, __uint_as_float(w[e]));
            }
        }
        uint32_t w[8];
#pragma unroll
        for (int e = 0; e < kWords; e++) w[e] = __float_as_uint(slots->loaded[e].get(s));
        return detail::value8(w, k, (T*)nullptr);
    }
    template <class T>
    __device__ float store(T* p, const Layout& layout, float x) const {
        const int s = detail::next_slot(counters->store);
        slots->stored[k].set(s, x);
        if (k == 7) {
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = slots->stored[e].get(s);
            if (WHOLE || detail::whole_segments(p, layout)) {
                uint32_t w[8];
                detail::words8(v, w, (T*)nullptr);
                detail::write8(WHOLE ? detail::in_tile<T>(slots->store_base[s], layout, row, col)
                                     : detail::segment_at(p, layout, i, j - 7),
                               w);
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) p[layout.at(i, j - 7 + e)] = round_to<T>(v[e]);
            }
        }
        return to_float(round_to<T>(x));
    }
    __device__ void row_output(float* out, float x) const { out[i] = x; }
    template <class T>
    __device__ T row_input(const T*) const {
        const int s = detail::next_slot(counters->row);
        if (k == 0) slots->row.set(s, ptx::ld_shared(row_vectors + s * row_stride));
        return detail::from_word<T>(slots->row.get(s));
    }
    template <class T>
    __device__ T col_input(const T*) const {
        const int s = detail::next_slot(counters->col);
        if (k == 0 && new_cols) {
            const uint32_t at = col_vectors + s * col_stride;
            const float4 a = ptx::ld_shared_v4(at), b = ptx::ld_shared_v4(at + 16);
            const float w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int e = 0; e < 8; e++) slots->col[e].set(s, w[e]);
        }
        return detail::from_word<T>(slots->col[k].get(s));
    }
};

// Reads what a thread's first segment of a tile (row i, columns j ... j + 7; i = -1 where it has
// none) would have had read ahead for it (no tile values with SHARED_TILES: they are copied into
// shared memory), its row `row` of the tile's row vectors and its column `col` of the tile's column
// vectors (-1: none), before the segment loop: run through a program's element() like the others,
// so its slots are numbered the same way. Nothing else it does or returns is anything (zeros).
// WHOLE: it also sets the bases of the tile accesses (the tile's element (0, 0) at tile_row0,
// tile_col0).
template <bool SHARED_TILES, bool WHOLE>
struct PreloadElement {
    float acc = 0.f;
    int i, j, row, col;
    int tile_row0, tile_col0;
    ElementCounters* counters;
    SegmentSlots* slots;

    template <class T, class L>
    __device__ T load(const T* p, const L& layout) const {
        const int s = detail::next_slot(counters->load);
        if constexpr (WHOLE)
            slots->load_base[s] = reinterpret_cast<uintptr_t>(detail::segment_at(p, layout, tile_row0, tile_col0));
        if (i < 0) return T{};
        if constexpr (!SHARED_TILES && detail::kReadAhead<T>) {
            uint32_t w[8];
            detail::read_segment(p, layout, i, j, w);
#pragma unroll
            for (int e = 0; e < detail::kWords8<T>; e++) slots->ahead_loaded[e].set(s, __uint_as_float(w[e]));
        }
        return T{};
    }
    template <class T, class L>
    __device__ float store(T* p, const L& layout, float) const {
        const int s = detail::next_slot(counters->store);
        if constexpr (WHOLE)
            slots->store_base[s] = reinterpret_cast<uintptr_t>(detail::segment_at(p, layout, tile_row0, tile_col0));
        return 0.f;
    }
    __device__ void row_output(float*, float) const {}
    template <class T>
    __device__ T row_input(const T* v) const {
        const int s = detail::next_slot(counters->row);
        if (row >= 0) slots->tile_row.set(s, detail::as_word(load_input(v + row)));
        return T{};
    }
    template <class T>
    __device__ T col_input(const T* v) const {
        const int s = detail::next_slot(counters->col);
        if (col >= 0) slots->tile_col.set(s, detail::as_word(load_input(v + col)));
        return T{};
    }
};

// The element TileEpilogue::prefetch runs a program with, once per row of a tile: its loads ask
// the L2 cache for the row's bytes of the tile (columns j ... j + cols - 1).
struct PrefetchElement : LoadsOnly {
    int cols;

    template <class T, class L>
    __device__ T load(const T* p, const L& layout) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        const T* at = p + layout.at(i, j);
        if (!layout.transposed && reinterpret_cast<uintptr_t>(at) % 16 == 0)
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at), "r"((uint32_t)(cols * sizeof(T)))
                         : "memory");
#endif
        return T{};
    }
};

// A pass (ZERO_ACC), or a GEMM's program that declares kTileCopies, copies the tiles it loads into
// shared memory, 64 columns (a chunk) at a time: run through the program once a chunk, this
// element's k-th load copies this thread's share of chunk rows of tile k (16-byte pieces: thread
// t takes piece t % 8 of rows t / 8, + threads / 8, ...; a warp copies 4 whole rows of 128 bytes),
// by cp.async where the tile's rows are 16-byte aligned and element by element otherwise; fp32
// tiles (a GEMM's program run with K = 0, the tests' fp32 activations) are read from global
// memory where used, their slots left unused.
// The copy of tile k's chunk starts at `chunk` + k slot_bytes (shared address); piece p of
// row r lies at tile_piece_at(r, p): odd rows with their halves swapped, so that the two rows a
// quarter-warp's segment loads touch (rows r and r + 1, the same 64 bytes of each) hit 32 different
// banks.
struct TileCopyElement : LoadsOnly {
    static constexpr int kRowBytes = 128, kPieces = kRowBytes / 16;  // a chunk row: 64 16-bit values
    int row0, col0, M, N;  // the tile's first row, the chunk's first column
    int t, threads, rows;  // this thread of `threads`; the tile's rows
    uint32_t chunk, slot_bytes;
    ElementCounters* counters;

    __device__ static uint32_t tile_piece_at(int row, int piece) {
        return kRowBytes * row + 16 * (piece ^ ((row & 1) * kPieces / 2));
    }

    template <class T, class L>
    __device__ T load(const T* p, const L& layout) const {
        const int s = detail::next_slot(counters->load);
        if constexpr (sizeof(T) == 2) {  // fp32 tiles (a GEMM's program run with K = 0) are read where used
            const bool whole = detail::whole_segments(p, layout);
            for (int x = t; x < rows * kPieces; x += threads) {
                const int row = x / kPieces, piece = x % kPieces, r = row0 + row, c = col0 + 8 * piece;
                if (r >= M || c >= N) continue;  // N is a multiple of 8: a piece is all in or all out
                const uint32_t at = chunk + s * slot_bytes + tile_piece_at(row, piece);
                if (whole) {
                    ptx::cp_async16(at, p + layout.at(r, c));
                } else {
                    uint32_t w[8];
                    detail::read_segment(p, layout, r, c, w);
                    ptx::st_shared_v4(at, w[0], w[1], w[2], w[3]);
                }
            }
        }
        return T{};
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
// c ? a : b for reduction states, word by word (a conditional on two struct lvalues would select
// between their addresses and put the states in local memory).
template <class S>
__device__ S pick(bool c, const S& a, const S& b) {
    constexpr int kWords = sizeof(S) / sizeof(float);
    float wa[kWords], wb[kWords];
    memcpy(wa, &a, sizeof(S));
    memcpy(wb, &b, sizeof(S));
#pragma unroll
    for (int k = 0; k < kWords; k++) wa[k] = c ? wa[k] : wb[k];
    S o;
    memcpy(&o, wa, sizeof(S));
    return o;
}
// a[k] for a run-time k without indexing the array (which would put it in local memory).
template <class S, int N>
__device__ S select(const S (&a)[N], int k) {
    S v = a[0];
#pragma unroll
    for (int s = 1; s < N; s++)
        if (s == k) v = a[s];
    return v;
}
template <class S, int N>
__device__ void select_set(S (&a)[N], int k, const S& v) {
#pragma unroll
    for (int s = 0; s < N; s++)
        if (s == k) a[s] = v;
}
}  // namespace detail

// The epilogue of one output tile. Every thread of the WARPS_M x WARPS_N warps calls run() with
// its accumulators; smem: kSmemBytes of shared memory, free for other use again once every thread
// has returned from run() (the next run() starts with a barrier); sync(): a barrier of exactly
// these threads.
// ZERO_ACC: a pass without a GEMM (K = 0; QkvGradient, CrossEntropyGradient, ResidualStats), one
// tile a block: the accumulators are zero and nothing is staged; instead, chunk by chunk, the
// block copies the chunk of each tile its program loads into shared memory (TileCopyElement: all
// of it in flight at once) and its segments read their tile values there. Its shared memory:
// pass_smem_bytes(tile_loads(program)), 16 KB a loaded tile beside the column states, so several
// blocks share an SM and one block's copies overlap another's segments. Measured on the H200
// (1.5B step, QkvGradient, 48 launches): one segment read ahead from global memory after an L2
// prefetch of the tile, 10.4 ms; both chunks copied at once (32 KB a tile, 3 blocks an SM), 9.4 ms;
// chunk by chunk, 8.0 ms (bench/NOTES_gemm_sm90.md, tenth session).
template <class P, int FM, int FN, int ROW_STRIDE, int WARPS_M, int WARPS_N, bool ZERO_ACC = false>
struct TileEpilogue {
    using Row = typename P::Row;
    using Col = typename P::Col;
    static constexpr bool kRows = !std::is_same_v<Row, NoPartials>;
    static constexpr bool kCols = !std::is_same_v<Col, NoPartials>;
    static constexpr int kWarps = WARPS_M * WARPS_N, kThreads = kWarps * 32;
    static constexpr int kTileRows = WARPS_M * FM * 16, kTileCols = WARPS_N * FN * 8;
    // The staging buffer holds 64 columns of the tile (a chunk); its threads take them as two
    // halves of 32 (4 segments of a row each).
    static constexpr int kChunkCols = 64, kHalfCols = 32, kChunks = kTileCols / kChunkCols;
    static constexpr int kWarpChunks = FN * 8 / kChunkCols;
    static constexpr int kRowsPerPass = kThreads / 4, kPasses = kTileRows / kRowsPerPass;
    // A GEMM's loaded tiles copied into shared memory a chunk at a time (tile_copies), as a
    // pass's are: kSharedTiles, the segments read them there.
    static constexpr int kCopiedTiles = !ZERO_ACC && FM * FN * 4 <= 128 ? tile_copies<P> : 0;
    static constexpr bool kSharedTiles = ZERO_ACC || kCopiedTiles > 0;
    static_assert(FN * 8 % kChunkCols == 0 && kTileRows % kRowsPerPass == 0, "tile of whole chunks and passes");
    // A thread's rows in the passes differ by multiples of 4: the same swizzle (staged_at) and
    // the same half order (tile_piece_at), so a pass's shared addresses are the first pass's plus
    // a constant stride.
    static_assert(kRowsPerPass % 4 == 0, "passes of whole swizzle periods");
    static constexpr size_t kStageBytes = ZERO_ACC ? 0 : (size_t)kTileRows * kChunkCols * sizeof(float);
    static constexpr size_t kColStateBytes = kCols ? (size_t)kWarps * kTileCols * sizeof(Col) : 0;
    // The tile's columns of the column vectors and rows of the row vectors the program reads.
    static constexpr int kColVectors = column_vector_count<P>, kRowVectors = row_vector_count<P>;
    static_assert(kColVectors <= kMaxColumnVectors && kRowVectors <= kMaxRowVectors, "vectors a program reads");
    static constexpr size_t kColVectorBytes = (size_t)kColVectors * kTileCols * sizeof(float);
    static constexpr size_t kRowVectorBytes = (size_t)kRowVectors * kTileRows * sizeof(float);
    static constexpr size_t kCopiesAt = kStageBytes + kColStateBytes + kColVectorBytes + kRowVectorBytes;
    // The copy of the chunk of each tile copied (16-bit values), after the above: rows of 128 bytes.
    static constexpr size_t kTileCopyBytes = kSharedTiles ? (size_t)kTileRows * kChunkCols * 2 : 0;
    static constexpr size_t kSmemBytes = kCopiesAt + kCopiedTiles * kTileCopyBytes;
    static_assert(kCopiesAt % 16 == 0 && kChunkCols * 2 == TileCopyElement::kRowBytes, "16-byte aligned tile copies of chunk rows");
    // A pass copies every tile it loads (tile_loads(program)).
    static constexpr size_t pass_smem_bytes(int tile_loads) { return kCopiesAt + tile_loads * kTileCopyBytes; }

    template <class Sync>
    __device__ static void run(const P& p, const float (&acc)[FM][FN][4], int warp_row0, int warp_col0, int warp_m,
                               int warp_n, int tile_m, int tile_n, int /*n_tiles_m*/, int n_tiles_n, int M, int N,
                               void* smem, Sync sync) {
        if constexpr (!whole_variant_refused<P>) {
            bool whole = true;
            Row row{};
            Col col{};
            p.element(WholeSegmentsElement{{}, &whole}, row, col);
            if (whole)
                return staged<true>(p, acc, warp_row0, warp_m, warp_n, tile_m, tile_n, n_tiles_n, M, N, smem, sync);
        }
        staged<false>(p, acc, warp_row0, warp_m, warp_n, tile_m, tile_n, n_tiles_n, M, N, smem, sync);
    }

    // Asks the L2 cache for the parts of tiles the program will load in the epilogue of output
    // tile (tile_m, tile_n), a while before it runs (sm90: during the tile's last k-blocks): of the
    // tile's rows row_begin ... row_end - 1, thread t of `threads` takes row_begin + t, + threads,
    // ..., one bulk prefetch per row and loaded tile (PrefetchElement). A few instructions a row;
    // programs that load no tile compile to nothing.
    __device__ static void prefetch(const P& p, int tile_m, int tile_n, int M, int N, int row_begin, int row_end, int t,
                                    int threads) {
        const int j0 = tile_n * kTileCols, cols = min(kTileCols, N - j0);
        for (int r = row_begin + t; r < row_end; r += threads) {
            const int i = tile_m * kTileRows + r;
            if (i >= M) break;
            Row row{};
            Col col{};
            p.element(PrefetchElement{{0.f, i, j0}, cols}, row, col);
        }
    }

  private:
    // Where the staging buffer keeps column `col` (0..63) of tile row `row`, in floats from its
    // start: 16-byte piece col / 4 of the row at piece (col / 4) ^ s(row).
    __device__ static int staged_at(int row, int col) {
        const int swizzle = 2 * (row & 3) + (row & 1);
        return row * kChunkCols + (((col >> 2) ^ swizzle) << 2) + (col & 3);
    }

    // This warp's accumulators of chunk c (its chunk c - warp_n kWarpChunks, if it has one) into the
    // staging buffer; frag_row0: the warp's first accumulator row in the tile. Inlined into the
    // unrolled chunk loop, so the accumulator indices are compile-time constants.
    __device__ __forceinline__ static void stage_chunk(const float (&acc)[FM][FN][4], int c, int warp_n, int frag_row0,
                                                       uint32_t stage) {
        const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
        for (int lc = 0; lc < kWarpChunks; lc++) {
            if (warp_n * kWarpChunks + lc != c) continue;
#pragma unroll
            for (int fm = 0; fm < FM; fm++)
#pragma unroll
                for (int f = 0; f < kChunkCols / 8; f++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int fn = lc * kChunkCols / 8 + f;
                        const int row = frag_row0 + fm * ROW_STRIDE + 8 * h + g, col = f * 8 + 2 * t;
                        ptx::st_shared_v2(stage + 4 * staged_at(row, col), acc[fm][fn][2 * h], acc[fm][fn][2 * h + 1]);
                    }
        }
    }

    template <bool WHOLE, class Sync>
    __device__ static void staged(const P& p, const float (&acc)[FM][FN][4], int warp_row0, int warp_m, int warp_n,
                                  int tile_m, int tile_n, int n_tiles_n, int M, int N, void* smem, Sync sync) {
        const int lane = threadIdx.x % 32;
        const int warp = warp_m * WARPS_N + warp_n, T = warp * 32 + lane, q = T % 4, row0 = T / 4;
        const int tile_row0 = tile_m * kTileRows, tile_col0 = tile_n * kTileCols;
        const uint32_t stage = ptx::smem_addr(smem);  // 32-bit shared addresses: fewer registers
        Col* col_smem = reinterpret_cast<Col*>(static_cast<char*>(smem) + kStageBytes);
        const uint32_t col_vectors = stage + (uint32_t)(kStageBytes + kColStateBytes);
        const uint32_t row_vectors = col_vectors + (uint32_t)kColVectorBytes;
        constexpr uint32_t kColStride = kTileCols * sizeof(float), kRowStride = kTileRows * sizeof(float);
        const uint32_t copies = stage + (uint32_t)kCopiesAt;  // the tile copies' shared memory
        auto copy_chunk = [&](int c) {
            ElementCounters counters;
            Row row{};
            Col cols{};
            p.element(TileCopyElement{{}, tile_row0, tile_col0 + c * kChunkCols, M, N, T, kThreads, kTileRows,
                                      copies, (uint32_t)kTileCopyBytes, &counters},
                      row, cols);
            if (!ZERO_ACC && counters.load > kCopiedTiles) __trap();  // more tiles than kTileCopies: folded away
            ptx::cp_async_commit();
        };
        if constexpr (ZERO_ACC) copy_chunk(0);  // in flight with the first segment's reads below
        Row rows[kPasses] = {};
        // A thread's segments, in order: chunk, half, pass (those inside the matrix). Each reads
        // the tile values of the next one ahead; the first segment's are read here, with thread
        // T's row T of the tile's row vectors and column T of its column vectors, which go to
        // shared memory while (or once) the first chunk is staged: the segments read their row
        // and column values there. A tile wider or taller than its
        // threads (128 x 320 on 256) also takes column (row) T + kThreads, in slots_hi.
        //   Row values read ahead from global memory instead, a segment before their use, left
        // that segment stalled on them where its arithmetic was short: at K = 1024 the LayerNorm
        // fold and one stored tile took 1.10x the plain GEMM (bench/NOTES_gemm_sm90.md,
        // forty-fourth session).
        static_assert(kTileCols <= 2 * kThreads && kTileRows <= 2 * kThreads,
                      "two columns and two rows of the vectors a thread at most");
        constexpr bool kSecondVectors = kTileCols > kThreads || kTileRows > kThreads;
        SegmentSlots slots, slots_hi;
        // Reads into s the values of the thread's first segment (where `first`) and the tile's
        // row r of the row vectors and column c of the column vectors (none past the tile or the
        // matrix); returns how many vectors of each kind the program reads.
        auto preload = [&](bool first, int r, int c, SegmentSlots& s) {
            const int first_row = tile_row0 + row0, j = tile_col0 + 8 * q;
            const int i = first && first_row < M && j < N ? first_row : -1;
            ElementCounters counters;
            Row row{};
            Col cols{};
            const int vrow = r < kTileRows && tile_row0 + r < M ? tile_row0 + r : -1;
            const int vcol = c < kTileCols && tile_col0 + c < N ? tile_col0 + c : -1;
            p.element(PreloadElement<kSharedTiles, WHOLE>{0.f, i, j, vrow, vcol, tile_row0, tile_col0, &counters, &s},
                      row, cols);
            return counters;
        };
        // the vectors the program reads (compile-time constants once inlined)
        const ElementCounters vectors = preload(true, T, T, slots);
        // more than the program declares (kRowVectors <= kMaxRowVectors ...): folded away within it
        if (vectors.row > kRowVectors || vectors.col > kColVectors) __trap();
        if constexpr (kSecondVectors) preload(false, T + kThreads, T + kThreads, slots_hi);
        // The values of row r and column c (in s) to shared memory, where the segments read them.
        auto park = [&](const SegmentSlots& s, int r, int c) {
            if (r < kTileRows) {
#pragma unroll
                for (int v = 0; v < kRowVectors; v++)
                    if (v < vectors.row) ptx::st_shared(row_vectors + v * kRowStride + 4 * r, s.tile_row.value[v]);
            }
            if (c < kTileCols) {
#pragma unroll
                for (int v = 0; v < kColVectors; v++)
                    if (v < vectors.col) ptx::st_shared(col_vectors + v * kColStride + 4 * c, s.tile_col.value[v]);
            }
        };
        auto park_vectors = [&] {
            park(slots, T, T);
            if constexpr (kSecondVectors) park(slots_hi, T + kThreads, T + kThreads);
        };

        // Unrolled over the chunks, so that the compiler sees each chunk's accumulators die once
        // they are staged (with WARPS_N = 1: Hopper's mainloop): the segments of the first chunk
        // run with the registers of half a tile's accumulators free.
#pragma unroll
        for (int c = 0; c < kChunks; c++) {
            if constexpr (!ZERO_ACC) {
                sync();  // the previous chunk's (tile's) segments are read
                if constexpr (kCopiedTiles > 0) copy_chunk(c);  // in flight while the chunk is staged
                stage_chunk(acc, c, warp_n, warp_row0 - tile_row0, stage);
                if (c == 0) park_vectors();
                if constexpr (kCopiedTiles > 0) ptx::cp_async_wait<0>();
                sync();
            } else {
                if (c > 0) {
                    sync();  // the previous chunk's segments are done with the copies
                    copy_chunk(c);
                }
                if (c == 0) park_vectors();
                ptx::cp_async_wait<0>();  // this thread's copies of chunk c have landed ...
                sync();                   // ... and everyone's
            }

#pragma unroll 1
            for (int half = 0; half < kChunkCols / kHalfCols; half++) {
                const int col0 = half * kHalfCols + 8 * q;  // of the segment, in the chunk
                const int col = c * kChunkCols + col0, j0 = tile_col0 + col;  // in the tile, in the matrix
                const uint32_t staged_lo = stage + 4 * staged_at(row0, col0), staged_hi = stage + 4 * staged_at(row0, col0 + 4);
                const uint32_t segment_cols = col_vectors + 4 * (c * kChunkCols + col0);
                const uint32_t segment_tiles = copies + TileCopyElement::tile_piece_at(row0, col0 / 8);
                Col cols[8] = {};
                constexpr int kUnroll = unroll_passes<P> ? kPasses : 1;
#pragma unroll kUnroll
                for (int pass = 0; pass < kPasses; pass++) {
                    const int row = row0 + pass * kRowsPerPass, i = tile_row0 + row;
                    if (i >= M || j0 >= N) break;  // and so are the later passes' rows
                    // The next segment: the next pass, else (no more passes, or no more rows) the
                    // first pass of the next half chunk: the next 32 columns, in this chunk or the
                    // next; none past the tile's columns or the matrix's. By selects: a branch in a
                    // segment's code keeps the compiler from interleaving its elements' arithmetic.
                    const bool half_done = pass + 1 == kPasses || i + kRowsPerPass >= M;
                    const bool last = half_done && half + 1 == kChunkCols / kHalfCols && c + 1 == kChunks;
                    const int ahead_row = half_done ? row0 : row + kRowsPerPass;  // in the tile
                    const int ahead_col = half_done ? col + kHalfCols : col;
                    const int ahead_j = tile_col0 + ahead_col;
                    const int ahead_i = !last && ahead_j < N ? tile_row0 + ahead_row : -1;
                    float v[8] = {};
                    if constexpr (!ZERO_ACC) {
                        constexpr uint32_t kPassStageBytes = kRowsPerPass * kChunkCols * sizeof(float);
                        const float4 lo = ptx::ld_shared_v4(staged_lo + pass * kPassStageBytes);
                        const float4 hi = ptx::ld_shared_v4(staged_hi + pass * kPassStageBytes);
                        v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
                    }
                    Row row_state = detail::select(rows, pass);
                    constexpr uint32_t kPassTileCopyBytes = kRowsPerPass * TileCopyElement::kRowBytes;
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        ElementCounters counters;
                        p.element(SegmentElement<kSharedTiles, WHOLE>{v[k], i, j0 + k, k, pass == 0, ahead_i, ahead_j,
                                                                  row, col, ahead_row, ahead_col,
                                                                  segment_cols, kColStride,
                                                                  row_vectors + 4 * row, kRowStride,
                                                                  &counters, &slots,
                                                                  segment_tiles + pass * kPassTileCopyBytes,
                                                                  (uint32_t)kTileCopyBytes},
                                  row_state, cols[k]);
                    }
                    detail::select_set(rows, pass, row_state);
                }

                if constexpr (kCols) {
                    // Across the 8 lanes b = lane / 4 holding these columns: at each step the lower
                    // lane of a pair keeps the lower half of its columns, the upper the upper half,
                    // each combining its partner's state after (lower lane) or before (upper) its own.
                    int first = 0;  // of the 8 columns, the first this lane still holds
#pragma unroll
                    for (int step = 0; step < 3; step++) {
                        const int kept = 4 >> step, mask = 4 << step;  // columns kept: half of those held
                        const bool upper = lane & mask;
#pragma unroll
                        for (int k = 0; k < 4; k++) {
                            if (k >= kept) continue;
                            const Col mine = detail::pick(upper, cols[k + kept], cols[k]);
                            const Col other = detail::shfl_xor(detail::pick(upper, cols[k], cols[k + kept]), mask);
                            Col total = detail::pick(upper, other, mine);
                            total.combine(detail::pick(upper, mine, other));
                            cols[k] = total;
                        }
                        if (upper) first += kept;
                    }
                    col_smem[warp * kTileCols + c * kChunkCols + col0 + first] = cols[0];
                }
            }
        }

        if constexpr (kRows) {
#pragma unroll
            for (int pass = 0; pass < kPasses; pass++) {
#pragma unroll
                for (int mask = 1; mask <= 2; mask *= 2) rows[pass].combine(detail::shfl_xor(rows[pass], mask));
                const int i = tile_row0 + row0 + pass * kRowsPerPass;
                if (q == 0 && i < M) p.write_row(rows[pass], RowSlot{i, tile_n, n_tiles_n});
            }
        }
        if constexpr (kCols) {
            sync();
            for (int c = T; c < kTileCols; c += kThreads) {
                if (tile_col0 + c >= N) continue;
                Col total = col_smem[c];
#pragma unroll
                for (int w = 1; w < kWarps; w++) total.combine(col_smem[w * kTileCols + c]);
                p.write_col(total, ColSlot{tile_col0 + c, tile_m, N});
            }
        }
    }

};

}  // namespace codagpt::coda
