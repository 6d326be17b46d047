// Epilogue primitives of the CODA GEMM engine: small host+device structs that a fused GEMM
// composes into a program run on its fp32 accumulator tile before the tile is written
// (CODA_GPT2.md, "Epilogue primitives this needs"). The GPU engine and the CPU emulator
// (src/gemm_emulator.hpp) run the same programs.
//
// A program is a struct of primitives (the pointers it reads and writes) with
//   using Row = ...;  using Col = ...;   // per-row and per-column reduction states (NoPartials if none)
//   template <class E> CODA_HD void element(const E& e, Row& row, Col& col) const;
//   CODA_HD void write_row(const Row& row, RowSlot slot) const;
//   CODA_HD void write_col(const Col& col, ColSlot slot) const;
// element() is the fused op's formula on one output element: e.acc is the fp32 accumulator of
// output (e.i, e.j) (global indices); it stores elementwise outputs itself and feeds the row and
// column reduction states it is handed. Row and Col are plain structs of reduction states (only
// floats, so the engine may move them with warp shuffles word by word) with a member
// combine(const Row&) that combines each state.
//
// What the engine does for each output tile (tm, tn) of the M x N output, in this order:
//   1. every thread value-initialises one Row per output row and one Col per output column it holds;
//   2. calls element() once per output element inside M x N (elements of an edge tile outside
//      the matrix are never visited), each thread visiting its own elements in increasing column,
//      then row, order, with the Row of that element's row and the Col of its column;
//   3. combines the Row states of threads sharing a row with Row::combine, in a fixed order,
//      and calls write_row(row, {i, tn, nTilesN}) once per row (likewise write_col(col, {j, tm, N})).
// So a row partial covers the columns of one N-tile and a column partial the rows of one M-tile;
// they land in fp32 buffers [M, nTilesN, words] and [nTilesM, N, words], one slot per tile, and
// tiny finalize functions merge them in a fixed tile order (merge_row, merge_col below). No atomics:
// results are deterministic for a given tile shape and thread layout. The combine order is the
// engine's to fix and document (warp shuffles, then shared memory); every combine here is
// associative up to rounding, so orders differ only by rounding. The emulator's order is
// documented in gemm_emulator.hpp.
//
// Tile accesses (LoadTile, StoreTile, AccumulateTile) go through the element: e.load(p, layout)
// and e.store(p, layout, x), which rounds x to the tile's type and returns the value stored; so
// does every other write (Gather's, e.row_output(out, x)): element() has no other side effects, so
// the GPU engine can also run it with an element whose loads are L2 prefetches and whose writes do
// nothing, to fetch a tile's inputs while its mainloop still runs (gemm_epilogue.cuh). Element
// below does the accesses one by one; the GPU engine's element (gemm_epilogue.cuh) makes the
// accesses of 8 horizontally adjacent elements one 16-byte access (two for fp32). For that,
// element() makes the same sequence of tile loads, and of tile stores, for every element of a
// row: no tile access under a condition on the column or on data (a condition on the program's
// own fields, like LnBackwardX's optional dres, is fine; reduction updates and Gather's write may
// be conditional on anything). Vector reads (RowVec, ColVec,
// Gather's column) go through the element too, e.row_input(v) and e.col_input(v), under the same
// rule: the k-th vector read of element() is the same vector for every element, so the GPU engine
// reads a row's value once per 8 elements and a column's 8 values together; it keeps a tile's
// values of each column vector in shared memory, for at most kMaxColumnVectors of them.
//
// A program that only runs as a pass without a GEMM (K = 0, acc always 0: it reads its tiles
// instead, e.g. QkvGradient) declares `static constexpr bool kPass = true;`: the GPU engine then
// builds its pass kernel alone, and no GEMM kernel that would never run (gemm.cuh refuses K > 0).
//
// Element-level primitives are the vector and tile loaders and stores below plus plain float
// arithmetic, so a program body reads as its formula and compiles to straight-line code:
//   row scale          rstd(e) * x                        (RowVec)
//   column-vector add  x + bias(e)                        (ColVec)
//   rank-1 correction  x - mu(e) * c(e)                   (RowVec x ColVec)
//   load-and-add tile  x + residual(e)                    (LoadTile)
//   store / accumulate out.store(e, x), dw.add(e, x)      (StoreTile, AccumulateTile: return the
//                                                          value actually stored, after rounding)
//   GELU, GELU'        gelu(x), gelu_grad(f(e))
//   target gather      target_logit.take(e, x)            (Gather)
// Reductions: Sum (sum, dot with a column vector or a loaded tile: add(a, b)), Welford
// (count, mean, M2), MaxSumExp (online max and sum of exp), each with add, combine, store/load.
#pragma once
#include <math.h>
#include <stdint.h>

#include <type_traits>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#define CODA_HD __host__ __device__
#else
#include <string.h>
#define CODA_HD
#endif
// A loop of constant trip count unrolled in device code (the host compiler knows no such pragma).
#ifdef __CUDA_ARCH__
#define CODA_UNROLL _Pragma("unroll")
#else
#define CODA_UNROLL
#endif

namespace codagpt::coda {

constexpr int kMaxColumnVectors = 4;  // column vector reads of one element() (the programs make two at most)
constexpr int kMaxRowVectors = 4;     // row vector reads of one element() (LnBackwardX makes four)

// Values a program may declare: NAME<P> is P::MEMBER where the program declares it, else DEFAULT
// (also for P = void, no program: a plan by shape).
#define CODA_PROGRAM_VALUE(TYPE, NAME, MEMBER, DEFAULT) \
    template <class P, class = void>                    \
    constexpr TYPE NAME = DEFAULT;                      \
    template <class P>                                  \
    constexpr TYPE NAME<P, decltype((void)P::MEMBER)> = P::MEMBER;
// kPass: a pass without a GEMM (above).
CODA_PROGRAM_VALUE(bool, is_pass, kPass, false)
// kWideTile: the Hopper engine's plan prices the 128 x 320 tile without its unhidden-epilogue term
// for the program where K is long (gemm_sm90.cuh, choose_plan).
CODA_PROGRAM_VALUE(bool, wide_tile_pays, kWideTile, false)
// kPlainGemm: the program is a plain GEMM (out = acc, dw += acc): the Hopper engine's plan prices
// its tiles with the card's plain-GEMM cost model, the other programs with the H200's (gemm_sm90.cuh).
CODA_PROGRAM_VALUE(bool, plain_gemm, kPlainGemm, false)
// kNoWideTile: the plan never gives the program the 128 x 320 tile (whose epilogue it would spill:
// LnBackwardX's three column partials beside 160 accumulators).
CODA_PROGRAM_VALUE(bool, wide_tile_refused, kNoWideTile, false)
// kTileCopies = n: the GPU engine copies the program's n loaded bf16 tiles into shared memory a
// chunk at a time (cp.async, as a pass does) and its segments read them there, instead of reading
// them a segment ahead in registers, on tiles of at most 128 accumulators a thread
// (gemm_epilogue.cuh).
CODA_PROGRAM_VALUE(int, tile_copies, kTileCopies, 0)
// kRowVectors, kColumnVectors: how many row and column vectors the program reads at most: the GPU
// engine keeps a tile's values of that many in shared memory, so a program with tile copies may
// leave the mainloop a stage more.
CODA_PROGRAM_VALUE(int, row_vector_count, kRowVectors, kMaxRowVectors)
CODA_PROGRAM_VALUE(int, column_vector_count, kColumnVectors, kMaxColumnVectors)
// kUnrollPasses: the GPU engine unrolls the program's segment loop over a half chunk's passes
// (gemm_epilogue.cuh), where its code is short enough: no selects of its row states, and one
// warp's segments overlap. Longer programs spill or outgrow the instruction cache that way.
CODA_PROGRAM_VALUE(bool, unroll_passes, kUnrollPasses, false)
// kNoWholeVariant: the GPU engine compiles only its general segment loop for the program, not
// also the variant for tiles of whole segments (gemm_epilogue.cuh, WHOLE), where the two side by
// side make ptxas spill.
CODA_PROGRAM_VALUE(bool, whole_variant_refused, kNoWholeVariant, false)
#undef CODA_PROGRAM_VALUE

// ---------------------------------------------------------------- bf16 storage
#ifdef __CUDACC__
using bf16 = __nv_bfloat16;
CODA_HD inline float to_float(bf16 x) { return __bfloat162float(x); }
CODA_HD inline bf16 to_bf16(float x) { return __float2bfloat16(x); }
#else
// The host compiler has no bf16 type: the same 16 bits, rounded to nearest even like
// __float2bfloat16, so emulator buffers are bit-for-bit what the GPU reads and writes.
struct bf16 {
    uint16_t bits;
};
inline float to_float(bf16 x) {
    const uint32_t u = (uint32_t)x.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline bf16 to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fc0};  // NaN stays a (quiet) NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return {(uint16_t)(u >> 16)};
}
#endif
CODA_HD inline float to_float(float x) { return x; }
// Rounds to the storage type: what a store of x into a T buffer keeps.
template <class T>
CODA_HD inline T round_to(float x);
template <>
CODA_HD inline float round_to<float>(float x) { return x; }
template <>
CODA_HD inline bf16 round_to<bf16>(float x) { return to_bf16(x); }

// ---------------------------------------------------------------- reading vectors
// Per-row (length M) and per-column (length N) vectors: inputs of the GEMM, never written by the
// kernel that reads them, so the GPU reads them through the read-only data path.
template <class T>  // float or int
CODA_HD inline T load_input(const T* p) {
#ifdef __CUDA_ARCH__
    return __ldg(p);
#else
    return *p;
#endif
}

// ---------------------------------------------------------------- the element handed to programs
// The default element context: what the emulator passes and the minimum a GPU engine provides.
struct Element {
    float acc;  // fp32 accumulator of output (i, j)
    int i, j;   // global row and column
    template <class T, class L>
    CODA_HD T load(const T* p, const L& layout) const { return p[layout.at(i, j)]; }
    template <class T, class L>
    CODA_HD float store(T* p, const L& layout, float x) const {
        const T stored = round_to<T>(x);
        p[layout.at(i, j)] = stored;
        return to_float(stored);
    }
    CODA_HD void row_output(float* out, float x) const { out[i] = x; }  // out[i] of a row vector
    template <class T>
    CODA_HD T row_input(const T* v) const { return load_input(v + i); }  // v[i] of a row vector
    template <class T>
    CODA_HD T col_input(const T* v) const { return load_input(v + j); }  // v[j] of a column vector
};

// The base of the elements that run a program for its tile loads alone (to count, prefetch or
// copy them): element (i, j) with acc = 0, whose stores and vector reads do nothing and return
// zeros, so the compiler drops the program's arithmetic.
struct LoadsOnly {
    float acc = 0.f;
    int i = 0, j = 0;
    template <class T, class L>
    CODA_HD float store(T*, const L&, float) const { return 0.f; }
    CODA_HD void row_output(float*, float) const {}
    template <class T>
    CODA_HD T row_input(const T*) const { return T{}; }
    template <class T>
    CODA_HD T col_input(const T*) const { return T{}; }
};

// Counts the tile loads of one element() call (the same for every element, by the rule above)
// without touching memory: on the host, what a pass kernel sizes its shared copy of the tiles by.
struct LoadCountingElement : LoadsOnly {
    int* loads;
    template <class T, class L>
    CODA_HD T load(const T*, const L&) const {
        ++*loads;
        return T{};
    }
};
template <class P>
int tile_loads(const P& p) {
    int loads = 0;
    typename P::Row row{};
    typename P::Col col{};
    p.element(LoadCountingElement{{}, &loads}, row, col);
    return loads;
}

// ---------------------------------------------------------------- vectors and tiles
struct RowVec {
    const float* v = nullptr;
    template <class E>
    CODA_HD float operator()(const E& e) const { return e.row_input(v); }
};
struct ColVec {
    const float* v = nullptr;
    template <class E>
    CODA_HD float operator()(const E& e) const { return e.col_input(v); }
};

// Where element (i, j) of a matrix lives: row-major with leading dimension ld, or stored as its
// transpose (element (i, j) at j*ld + i: the LM head's weight and gradient are wte^T).
struct Layout {
    long ld = 0;
    bool transposed = false;
    CODA_HD long at(int i, int j) const { return transposed ? (long)j * ld + i : (long)i * ld + j; }
};

// A matrix read at the element's position (residual, gradient pass-through, stored activations).
template <class T>
struct LoadTile {
    const T* p = nullptr;
    Layout layout;
    template <class E>
    CODA_HD float operator()(const E& e) const { return to_float(e.load(p, layout)); }
    CODA_HD explicit operator bool() const { return p != nullptr; }
};

// An output matrix. store() returns the value as stored (rounded to T), so that statistics and
// later terms use exactly what the next kernel will read.
template <class T>
struct StoreTile {
    T* p = nullptr;
    Layout layout;
    template <class E>
    CODA_HD float store(const E& e, float x) const { return e.store(p, layout, x); }
};

// Accumulates into the existing output (gradient accumulation over micro-batches).
template <class T>
struct AccumulateTile {
    T* p = nullptr;
    Layout layout;
    template <class E>
    CODA_HD float add(const E& e, float x) const { return e.store(p, layout, to_float(e.load(p, layout)) + x); }
};

// Picks one column per row: out[i] = x at j == column[i] (the target logit). Exactly one element
// per row matches, so exactly one thread writes each out[i].
struct Gather {
    const int* column = nullptr;
    float* out = nullptr;
    template <class E>
    CODA_HD void take(const E& e, float x) const {
        if (e.j == e.row_input(column)) e.row_output(out, x);
    }
};

// ---------------------------------------------------------------- fast exp and division
// The per-element math of an epilogue runs while the tensor cores wait (or the other consumer's
// mainloop runs), so on the GPU it takes the hardware's approximate exp (ex2.approx: relative
// error ~1e-6 over the ranges used here) and division (rcp.approx, valid for |b| < 2^126), far
// below bf16's rounding. The host (the emulator) keeps expf and the IEEE division.
CODA_HD inline float exp_fast(float x) {
#ifdef __CUDA_ARCH__
    return __expf(x);
#else
    return expf(x);
#endif
}
CODA_HD inline float div_fast(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdividef(a, b);
#else
    return a / b;
#endif
}

// ---------------------------------------------------------------- tanh-GELU
// gelu(x) = x/2 (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3). 0.5 (1 + tanh u) is the logistic
// sigmoid s = 1 / (1 + exp(-2u)), which stays accurate in relative terms where 1 + tanh u is tiny
// (x << 0); -2u is clamped at 80 so exp stays finite (gelu and gelu' are below 1e-33 there).
// gelu'(x) = s + 2 x s (1 - s) du/dx, with 1 - s = exp(-2u) s. Both from one exp and one
// reciprocal, the constants folded (GeluBackward needs both; every op counts in an epilogue).
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

CODA_HD inline float exp2_fast(float x) {
#ifdef __CUDA_ARCH__
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}
// 1 / x for 1 <= x < 2^126 (rcp.approx: relative error below 2^-23).
CODA_HD inline float rcp_fast(float x) {
#ifdef __CUDA_ARCH__
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return 1.f / x;
#endif
}

struct GeluValues {
    float g, grad;  // gelu(x), gelu'(x)
};
CODA_HD inline GeluValues gelu_values(float x) {
    constexpr float kLog2e = 1.4426950408889634f;
    constexpr float kT0 = -2.f * kGeluScale * kLog2e, kT1 = kT0 * kGeluCubic;  // t = -2u log2(e) = x (kT0 + kT1 x^2)
    constexpr float kD0 = 2.f * kGeluScale, kD1 = kD0 * 3.f * kGeluCubic;    // 2 du/dx = kD0 + kD1 x^2
    const float x2 = x * x;
    const float e = exp2_fast(fminf(x * fmaf(x2, kT1, kT0), 80.f * kLog2e));  // exp(-2u)
    const float s = rcp_fast(1.f + e);
    const float g = x * s;
    return {g, fmaf(g * (e * s), fmaf(x2, kD1, kD0), s)};
}
CODA_HD inline float gelu(float x) { return gelu_values(x).g; }
CODA_HD inline float gelu_grad(float x) { return gelu_values(x).grad; }

// ---------------------------------------------------------------- reductions
// Each: value-initialised state is the empty reduction; add(element); combine(other) merges the
// state of a disjoint set of elements; store/load move it as kWords floats of a partials buffer.

// Sum, and dot products (add(a, b): a column vector or a loaded tile times the element).
struct Sum {
    static constexpr int kWords = 1;
    float s = 0.f;
    CODA_HD void add(float x) { s += x; }
    CODA_HD void add(float a, float b) { s = fmaf(a, b, s); }
    CODA_HD void combine(const Sum& o) { s += o.s; }
    CODA_HD void store(float* p) const { p[0] = s; }
    CODA_HD void load(const float* p) { s = p[0]; }
};

// Count, mean and M2 (sum of squared deviations from the mean): Welford's update per element,
// Chan's formula to combine. Never E[x^2] - mean^2, which cancels when |mean| >> std (the
// residual stream). The count is a float: exact up to 2^24 elements.
struct Welford {
    static constexpr int kWords = 3;
    float n = 0.f, mean = 0.f, m2 = 0.f;
    CODA_HD void add(float x) {
        n += 1.f;
        const float d = x - mean;
        mean += div_fast(d, n);
        m2 += d * (x - mean);
    }
    CODA_HD void combine(const Welford& o) {
        if (o.n == 0.f) return;
        if (n == 0.f) {
            *this = o;
            return;
        }
        const float total = n + o.n, d = o.mean - mean;
        mean += d * (o.n / total);
        m2 += o.m2 + d * d * (n * o.n / total);
        n = total;
    }
    CODA_HD void store(float* p) const { p[0] = n; p[1] = mean; p[2] = m2; }
    CODA_HD void load(const float* p) { n = p[0]; mean = p[1]; m2 = p[2]; }
};

// Online softmax denominator: the running max and sum_j exp(x_j - max), rescaled when the max
// grows. An empty state (sum 0) has max -inf and is skipped by combine (no exp(-inf + inf)).
struct MaxSumExp {
    static constexpr int kWords = 2;
    float max = -INFINITY, sum = 0.f;
    // One exp either way, exp(-|x - max|), and selects instead of a branch (the GPU epilogue
    // interleaves its elements' arithmetic only where their code has no branches).
    CODA_HD void add(float x) { add_if(x, true); }
    // add(x) where `counted`, else nothing, by selects too: a branch around add() (the LM head's
    // padded columns) made each element's exp wait for the one before it (bench/NOTES_gemm_sm90.md).
    CODA_HD void add_if(float x, bool counted) {
        const float e = exp_fast(-fabsf(x - max));  // 0 for the first element (max = -inf)
        const float grown = x > max ? fmaf(sum, e, 1.f) : sum + e;
        sum = counted ? grown : sum;
        max = counted ? fmaxf(max, x) : max;
    }
    CODA_HD void combine(const MaxSumExp& o) {
        if (o.sum == 0.f) return;
        if (sum == 0.f) {
            *this = o;
            return;
        }
        if (o.max > max) {
            sum = sum * expf(max - o.max) + o.sum;
            max = o.max;
        } else {
            sum += o.sum * expf(o.max - max);
        }
    }
    CODA_HD float lse() const { return max + logf(sum); }
    CODA_HD void store(float* p) const { p[0] = max; p[1] = sum; }
    CODA_HD void load(const float* p) { max = p[0]; sum = p[1]; }
};

// ---------------------------------------------------------------- partials buffers
// Where the engine writes a partial: row i of N-tile `tile` of n_tiles; column j of M-tile `tile`,
// in an output of n columns.
struct RowSlot {
    int i, tile, n_tiles;
};
struct ColSlot {
    int j, tile, n;
};

// Row partials, fp32 [M, n_tiles, R::kWords]: a row's partials are contiguous for the finalize.
template <class R>
struct RowPartials {
    float* p = nullptr;
    CODA_HD void write(const R& r, RowSlot s) const { r.store(p + ((long)s.i * s.n_tiles + s.tile) * R::kWords); }
};
// Column partials, fp32 [n_tiles, N, R::kWords]: one M-tile's partials are contiguous (coalesced writes).
template <class R>
struct ColPartials {
    float* p = nullptr;
    CODA_HD void write(const R& r, ColSlot s) const { r.store(p + ((long)s.tile * s.n + s.j) * R::kWords); }
};

// The finalize side. Row i's partials merge in kRowLanes lanes, lane l taking tiles l, l +
// kRowLanes, ... in increasing order (one GPU warp a row: consecutive lanes read consecutive
// partials; a row of the LM head has 393 of them), then the lanes combine as a pairwise tree: at
// m = 16, 8, 4, 2, 1 each lane l < m combines lane l + m's state into its own; lane 0 ends with the
// row's. A column's partials (one per M-tile, 128 at
// 16384 tokens) merge in kColGroups groups of consecutive M-tiles, each group in tile order, then
// the groups in order; the finalize kernels give each group its own thread.
constexpr int kRowLanes = 32;
template <class R>
CODA_HD R merge_row_lane(const float* partials, int i, int lane, int n_tiles) {
    R total{};
    for (int t = lane; t < n_tiles; t += kRowLanes) {
        R part;
        part.load(partials + ((long)i * n_tiles + t) * R::kWords);
        total.combine(part);
    }
    return total;
}
template <class R>
CODA_HD R merge_row(const float* partials, int i, int n_tiles) {
    R lanes[kRowLanes];
    for (int l = 0; l < kRowLanes; l++) lanes[l] = merge_row_lane<R>(partials, i, l, n_tiles);
    for (int m = kRowLanes / 2; m >= 1; m /= 2)
        for (int l = 0; l < m; l++) lanes[l].combine(lanes[l + m]);
    return lanes[0];
}
constexpr int kColGroups = 8;
// The first M-tile of column group g (g = kColGroups: n_tiles); groups may be empty.
CODA_HD inline int col_group_begin(int g, int n_tiles) { return (int)((long)n_tiles * g / kColGroups); }
// Group g of column j of each of kArrays partials arrays, each combined into total[a] in tile
// order. The partials of kColBatch tiles of every array are loaded before they are combined: in the
// GPU's finalize kernels, where a thread merges a group (16 tiles at 16384 tokens), tile by tile
// (4 loads in flight after nvcc's unrolling, the arrays one after another) finalize_ln_backward
// took 9.1 us a launch in the 1.5B step, 5.9 us so.
constexpr int kColBatch = 16;
template <class R, int kArrays>
CODA_HD void merge_col_groups(const float* const (&partials)[kArrays], int j, int g, int n_tiles, int n,
                              R (&total)[kArrays]) {
    const int end = col_group_begin(g + 1, n_tiles);
    for (int t0 = col_group_begin(g, n_tiles); t0 < end; t0 += kColBatch) {
        R part[kArrays][kColBatch];
        CODA_UNROLL
        for (int a = 0; a < kArrays; a++)
            CODA_UNROLL
            for (int u = 0; u < kColBatch; u++)
                if (t0 + u < end) part[a][u].load(partials[a] + ((long)(t0 + u) * n + j) * R::kWords);
        CODA_UNROLL
        for (int a = 0; a < kArrays; a++)
            CODA_UNROLL
            for (int u = 0; u < kColBatch; u++)
                if (t0 + u < end) total[a].combine(part[a][u]);
    }
}
template <class R>
CODA_HD R merge_col_group(const float* partials, int j, int g, int n_tiles, int n) {
    const float* const arrays[1] = {partials};
    R total[1] = {};
    merge_col_groups<R, 1>(arrays, j, g, n_tiles, n, total);
    return total[0];
}
// The groups' states group(0) ... group(kColGroups - 1) combined in order: merge_col's, and the
// finalize kernels', which merge each group on its own thread.
template <class R, class Group>
CODA_HD R combine_col_groups(const Group& group) {
    R total = group(0);
    for (int g = 1; g < kColGroups; g++) total.combine(group(g));
    return total;
}
template <class R>
CODA_HD R merge_col(const float* partials, int j, int n_tiles, int n) {
    return combine_col_groups<R>([&](int g) { return merge_col_group<R>(partials, j, g, n_tiles, n); });
}

// For programs without row or column reductions: inherit these.
struct NoPartials {
    CODA_HD void combine(const NoPartials&) {}
};
struct NoRowPartials {
    using Row = NoPartials;
    CODA_HD void write_row(const Row&, RowSlot) const {}
};
struct NoColPartials {
    using Col = NoPartials;
    CODA_HD void write_col(const Col&, ColSlot) const {}
};

}  // namespace codagpt::coda
