// CPU emulator of the CODA GEMM engine: a plain tiled GEMM that runs an epilogue program
// (kernels/coda_programs.cuh) on each output tile exactly as the GPU engine's contract says
// (kernels/epilogue.cuh): elementwise per element, row partials per N-tile, column partials per
// M-tile, one slot per tile. CI tests every program through it against fp64 math.
//
// Accumulator: fp32, summed over k in increasing order, from the operands' values as stored
// (bf16 operands are read as the bf16 numbers they are).
//
// Reduction order, modelling the threads of the GPU epilogue: the columns of a tile row are dealt
// to `rows.lanes` lanes in chunks of `rows.chunk` columns (lane = (j_in_tile / chunk) % lanes);
// each lane accumulates its elements in increasing column order into its own Row state; then the
// lane states are combined as a pairwise tree in lane order, ((l0 l1)(l2 l3)), which is what
// xor-butterfly warp shuffles leave on lane 0. The defaults, 4 lanes of 8 columns, are the GPU
// epilogue's segments (kernels/gemm_epilogue.cuh: 4 threads share a row of a 32-column half chunk,
// each taking 8 adjacent columns). Columns of a tile likewise with `cols` (default 8 lanes of 1
// row: the 8 lanes of a warp sharing a column). So every combine path of a program runs in CI.
// The GPU engine fixes its own order (shuffles, then shared memory across warps): its results
// agree with these to rounding.
//
// Tiles run in parallel (OpenMP); each writes only its own elements and partial slots, so the
// results do not depend on the thread count.
#pragma once
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "epilogue.cuh"

namespace codagpt::coda {

// A GEMM operand: the logical matrix element (r, c) read from p with a Layout (row-major, or
// stored transposed: A = x^T of the dW GEMM, B = W^T of the dX GEMM).
template <class T>
struct Operand {
    const T* p = nullptr;
    Layout layout;
    float operator()(int r, int c) const { return to_float(p[layout.at(r, c)]); }
};

// How the threads holding one row (column) of a tile split it: lanes, a power of two, each
// owning chunks of `chunk` consecutive columns (rows).
struct LaneSplit {
    int lanes, chunk;
};

struct TileShape {
    int bm = 128, bn = 128;
    LaneSplit rows{4, 8}, cols{8, 1};
};

inline int n_tiles(int extent, int tile) { return (extent + tile - 1) / tile; }

namespace detail {

// Combines states[0..n) as a pairwise tree in index order; n a power of two.
template <class S>
S combine_tree(S* states, int n) {
    for (int stride = 1; stride < n; stride *= 2)
        for (int l = 0; l + stride < n; l += 2 * stride) states[l].combine(states[l + stride]);
    return states[0];
}

}  // namespace detail

// out[M, N] = epilogue(A[M, K] B[K, N]) with program P.
template <class P, class TA, class TB>
void emulate_gemm(const P& program, int M, int N, int K, Operand<TA> a, Operand<TB> b, const TileShape& shape) {
    for (const LaneSplit s : {shape.rows, shape.cols})
        if (s.lanes < 1 || (s.lanes & (s.lanes - 1)) != 0 || s.chunk < 1)
            throw std::invalid_argument("emulate_gemm: lanes must be a power of two, chunks positive");
    const int tiles_m = n_tiles(M, shape.bm), tiles_n = n_tiles(N, shape.bn);
    const int row_lanes = shape.rows.lanes, col_lanes = shape.cols.lanes;

#pragma omp parallel for schedule(dynamic)
    for (long t = 0; t < (long)tiles_m * tiles_n; t++) {
        const int tm = (int)(t / tiles_n), tn = (int)(t % tiles_n);
        const int i0 = tm * shape.bm, j0 = tn * shape.bn;
        const int rows = std::min(shape.bm, M - i0), cols = std::min(shape.bn, N - j0);  // edge tiles are smaller

        // Accumulator tile: B's tile packed as [K][cols] so the inner loop runs along a row.
        std::vector<float> acc((size_t)rows * cols, 0.f), b_tile((size_t)K * cols), a_row(K);
        for (int k = 0; k < K; k++)
            for (int jj = 0; jj < cols; jj++) b_tile[(size_t)k * cols + jj] = b(k, j0 + jj);
        for (int ii = 0; ii < rows; ii++) {
            for (int k = 0; k < K; k++) a_row[k] = a(i0 + ii, k);
            float* out = &acc[(size_t)ii * cols];
            for (int k = 0; k < K; k++) {
                const float a_ik = a_row[k];
                const float* b_k = &b_tile[(size_t)k * cols];
                for (int jj = 0; jj < cols; jj++) out[jj] += a_ik * b_k[jj];
            }
        }

        // Epilogue: one Row state per (row, lane), one Col state per (column, lane).
        std::vector<typename P::Row> row_states((size_t)rows * row_lanes);
        std::vector<typename P::Col> col_states((size_t)cols * col_lanes);
        for (int ii = 0; ii < rows; ii++) {
            const int col_lane = (ii / shape.cols.chunk) % col_lanes;
            for (int jj = 0; jj < cols; jj++) {
                const int row_lane = (jj / shape.rows.chunk) % row_lanes;
                const Element e{acc[(size_t)ii * cols + jj], i0 + ii, j0 + jj};
                program.element(e, row_states[(size_t)ii * row_lanes + row_lane],
                                col_states[(size_t)jj * col_lanes + col_lane]);
            }
        }
        for (int ii = 0; ii < rows; ii++)
            program.write_row(detail::combine_tree(&row_states[(size_t)ii * row_lanes], row_lanes),
                              RowSlot{i0 + ii, tn, tiles_n});
        for (int jj = 0; jj < cols; jj++)
            program.write_col(detail::combine_tree(&col_states[(size_t)jj * col_lanes], col_lanes),
                              ColSlot{j0 + jj, tm, N});
    }
}

// An elementwise pass over an M x N output with no GEMM (acc = 0): QkvGradient.
template <class P>
void emulate_pass(const P& program, int M, int N, const TileShape& shape) {
    emulate_gemm(program, M, N, 0, Operand<float>{}, Operand<float>{}, shape);
}

}  // namespace codagpt::coda
