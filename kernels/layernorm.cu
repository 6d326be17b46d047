// LayerNorm forward/backward and the residual add.
//
// Both LayerNorm kernels give a row to one warp: each lane issues the 16-byte loads of all its
// vectors of the row (pack i = lane + 32 k, k < V) before the first reduction, so the row is in
// flight at once, and keeps them in registers for the later passes (as bf16: 4 registers a pack),
// so that every row is read from memory once. Warp sums use the xor butterfly: every lane gets the
// same, run-to-run identical value.
//
// The backward pass is one pass over dout and inp: the warp that computes a row's dinp also adds the
// row's dout * xhat and dout into its own dweight/dbias accumulators (fp32, in shared memory, each
// entry touched only by the lane that owns its pack). A persistent grid of blocks owns contiguous
// row chunks; at the end each block adds its warps' accumulators in warp order and writes one
// partial row to scratch, and a last kernel adds the partial rows in chunk order: deterministic
// without atomics, and the partials cost 2 x 8C bytes a block, ~1.6% of the traffic at N = 16384.
#include "layernorm.cuh"

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

namespace codagpt {

namespace {

constexpr float kEps = 1e-5f;

__device__ inline float warp_sum(float v) {
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, k);
    return v;
}

// weight and bias: read by every row, so through the read-only cache.
__device__ inline Packed128<bf16> load128ldg(const bf16* p) {
    Packed128<bf16> r;
    *reinterpret_cast<int4*>(r.v) = __ldg(reinterpret_cast<const int4*>(p));
    return r;
}

// Hides the row's registers from the optimizer between two passes over it: otherwise it keeps the fp32
// values of the first pass live for the next (twice the registers of the bf16 row) instead of
// converting the bf16 values again.
template <int V>
__device__ inline void opaque(Packed128<bf16> (&v)[V]) {
#pragma unroll
    for (int k = 0; k < V; k++) {
        int4& q = *reinterpret_cast<int4*>(v[k].v);
        asm volatile("" : "+r"(q.x), "+r"(q.y), "+r"(q.z), "+r"(q.w));
    }
}

// Rows (warps) per block of the forward kernel.
constexpr int kFwdRows = 8;

extern __shared__ __align__(16) unsigned char ln_smem[];

// Needs C <= 256 V. Mean and variance in two passes over the registers (no E[x^2] - mean^2).
template <int V>
__global__ void __launch_bounds__(32 * kFwdRows) layernorm_forward_kernel(bf16* out, float* mean, float* rstd,
                                                                         const bf16* inp, const bf16* weight,
                                                                         const bf16* bias, int N, int C) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * kFwdRows + threadIdx.x / 32;
    if (row >= N) return;
    const int CV = C / 8;
    const bf16* x = inp + (long)row * C;
    Packed128<bf16> xv[V];
#pragma unroll
    for (int k = 0; k < V; k++)
        if (lane + 32 * k < CV) xv[k] = load128cs(x + (lane + 32 * k) * 8);
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < V; k++)
        if (lane + 32 * k < CV)
#pragma unroll
            for (int j = 0; j < 8; j++) sum += __bfloat162float(xv[k][j]);
    const float m = warp_sum(sum) / C;
    opaque(xv);
    float var = 0.f;
#pragma unroll
    for (int k = 0; k < V; k++)
        if (lane + 32 * k < CV)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float d = __bfloat162float(xv[k][j]) - m;
                var += d * d;
            }
    const float r = rsqrtf(warp_sum(var) / C + kEps);
    opaque(xv);
    bf16* o = out + (long)row * C;
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int i = lane + 32 * k;
        if (i < CV) {
            const Packed128<bf16> w = load128ldg(weight + i * 8), b = load128ldg(bias + i * 8);
            Packed128<bf16> y;
#pragma unroll
            for (int j = 0; j < 8; j++)
                y[j] = __float2bfloat16((__bfloat162float(xv[k][j]) - m) * r * __bfloat162float(w[j]) +
                                        __bfloat162float(b[j]));
            store128(o + i * 8, y);
        }
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// bf16 values moved as one access of 2E bytes (E = 8: the 16-byte packs above; E = 4: 8 bytes).
template <int E>
struct alignas(2 * E) BfPack {
    bf16 v[E];
    __device__ bf16& operator[](int j) { return v[j]; }
    __device__ const bf16& operator[](int j) const { return v[j]; }
};
template <int E>
struct PackWord;
template <>
struct PackWord<8> {
    using type = int4;
};
template <>
struct PackWord<4> {
    using type = int2;
};

// kCache: 0 default caching, 1 streaming (ld.global.cs, evict first), 2 read-only path (ld.global.nc).
template <int E, int kCache>
__device__ inline BfPack<E> load_pack(const bf16* p) {
    using W = typename PackWord<E>::type;
    const W* q = reinterpret_cast<const W*>(p);
    BfPack<E> r;
    if constexpr (kCache == 1)
        *reinterpret_cast<W*>(r.v) = __ldcs(q);
    else if constexpr (kCache == 2)
        *reinterpret_cast<W*>(r.v) = __ldg(q);
    else
        *reinterpret_cast<W*>(r.v) = *q;
    return r;
}
template <int E, bool kStream>
__device__ inline void store_pack(bf16* p, const BfPack<E>& v) {
    using W = typename PackWord<E>::type;
    if constexpr (kStream)
        __stcs(reinterpret_cast<W*>(p), *reinterpret_cast<const W*>(v.v));
    else
        *reinterpret_cast<W*>(p) = *reinterpret_cast<const W*>(v.v);
}
// Asks L2 for the 128-byte lines of a row of C bf16 (lanes take lines in turn; no registers).
__device__ inline void prefetch_row_l2(const bf16* row, int C, int lane) {
    for (int c = 64 * lane; c < C + 63; c += 64 * 32)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(row + min(c, C - 1)));
}

template <int E, int V>
__device__ inline void opaque(BfPack<E> (&v)[V]) {
#pragma unroll
    for (int k = 0; k < V; k++) {
        if constexpr (E == 8) {
            int4& q = *reinterpret_cast<int4*>(v[k].v);
            asm volatile("" : "+r"(q.x), "+r"(q.y), "+r"(q.z), "+r"(q.w));
        } else {
            int2& q = *reinterpret_cast<int2*>(v[k].v);
            asm volatile("" : "+r"(q.x), "+r"(q.y));
        }
    }
}

// The backward kernel's tuning knobs (bench/bench_layernorm.cu times them against each other):
//   kWarps, kMinBlocks: warps a block and the blocks an SM __launch_bounds__ asks for (the register cap
//     is 65536 / (32 kWarps kMinBlocks), at most 255);
//   kBatch: dinp packs loaded together in the second pass (see there);
//   kRowsPerWarp: rows a warp has in flight at once (the warp's rows w, w + warps, ... taken R at a
//     time: the same rows and the same order of accumulation as one at a time; the accumulators are
//     read and written once per R rows);
//   kPackBytes: 16 (8 channels a lane access) or 8 (4 channels);
//   kWeightInRegs: the lane's weight packs loaded once per block into registers instead of every row;
//   kCacheBits: 1 dout/inp loads streaming (evict first), 2 dinp loads streaming, 4 dinp stores
//     streaming (dout/inp of rows over 256 V channels are read twice and always use default caching);
//     8: the rows' dinp prefetched into L2 with the first pass's loads, 16: the warp's next rows' dout
//     and inp prefetched into L2 (no registers held for either).
template <int kWarps, int kMinBlocks = 1, int kBatch = 4, int kRowsPerWarp = 1, int kPackBytes = 16,
          bool kWeightInRegs = false, int kCacheBits = 1>
struct BwdConfig {
    static constexpr int warps = kWarps, min_blocks = kMinBlocks, batch = kBatch, rows = kRowsPerWarp;
    static constexpr int E = kPackBytes / 2;  // channels a pack
    static constexpr bool weight_regs = kWeightInRegs;
    static constexpr int cache_bits = kCacheBits;
    static_assert(kPackBytes == 16 || kPackBytes == 8, "packs of 8 or 16 bytes");
};

// The shipped configuration, the fastest of the sweep on the H200 (bench/NOTES_layernorm.md): warps
// per block 12 for rows over 1024 channels, whose registers (dout and inp of the row plus a dinp
// batch, 4 a pack) would spill under the cap of 16 warps; dinp in batches of 4; 16-byte packs; each
// row's dinp prefetched into L2 during the first pass, and for rows over 1024 channels the warp's
// next row of dout and inp too (87.5% of the copy at 65536 x 1600, 93.0% at 65536 x 1024). (Fewer
// warps when their accumulators, 8C bytes a warp, would not fit in the block's shared memory.)
template <int V>
using DefaultBwdConfig = std::conditional_t<(V >= 5), BwdConfig<12, 1, 4, 1, 16, false, 25>, BwdConfig<16, 1, 4, 1, 16, false, 9>>;

// dinp += r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),  dxhat = dout * w, xhat = (x - m) r;
// partial[block][0][c] = sum over the block's rows of dout * xhat, partial[block][1][c] = of dout.
// Block b owns rows [b rows, (b+1) rows) and its warp w the rows w, w + warps, ... of them.
// V: packs of E channels a lane (pack i = lane + 32 k of a slice, k < V).
// kRowInRegs: C <= 32 E V, the row stays in registers between the passes; otherwise the row is taken
// in slices of 32 E V channels and the second pass reads them again (from L2, just read).
// Shared memory: per warp, float4 acc[2Q][C/E], Q = E/4 float4 a quantity: entry (t, i) holds
// channels E i + 4 (t % Q) .. +3 of dweight (t < Q) or dbias (t >= Q); with E = 8:
// [dweight lo, dweight hi, dbias lo, dbias hi] of pack i. A warp reads 32 consecutive float4: no
// bank conflicts.
template <int V, bool kRowInRegs, class Cfg = DefaultBwdConfig<V>>
__global__ void __launch_bounds__(32 * Cfg::warps, Cfg::min_blocks)
    layernorm_backward_kernel(bf16* dinp, float* partial, const bf16* dout, const bf16* inp, const bf16* weight,
                              const float* mean, const float* rstd, int N, int C, int rows) {
    constexpr int E = Cfg::E, Q = E / 4, R = Cfg::rows, B = Cfg::batch;
    constexpr int kInCache = kRowInRegs && (Cfg::cache_bits & 1) ? 1 : 0;
    constexpr int kDinpCache = Cfg::cache_bits & 2 ? 1 : 0;
    constexpr bool kDinpStream = Cfg::cache_bits & 4;
    constexpr bool kWeightRegs = Cfg::weight_regs && kRowInRegs;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int CP = C / E;
    float4* acc = reinterpret_cast<float4*>(ln_smem) + (long)warp * 2 * Q * CP;
    for (int i = lane; i < CP; i += 32)
#pragma unroll
        for (int t = 0; t < 2 * Q; t++) acc[t * CP + i] = make_float4(0.f, 0.f, 0.f, 0.f);

    BfPack<E> wv[kWeightRegs ? V : 1];
    if constexpr (kWeightRegs) {
#pragma unroll
        for (int k = 0; k < V; k++)
            if (lane + 32 * k < CP) wv[k] = load_pack<E, 2>(weight + (lane + 32 * k) * E);
    }

    const int r0 = blockIdx.x * rows, r1 = min(N, r0 + rows);
    const int slice_end = kRowInRegs ? 1 : CP;  // pass loops below: one slice when the row fits
#pragma unroll 1
    for (int row0 = r0 + warp; row0 < r1; row0 += R * warps) {
        bool live[R];  // row q of this step exists (row 0 always)
        long base[R];
        float m[R], r[R];
#pragma unroll
        for (int q = 0; q < R; q++) {
            const int row = row0 + q * warps;
            live[q] = q == 0 || row < r1;
            const int rr = live[q] ? row : row0;
            base[q] = (long)rr * C;
            m[q] = mean[rr];
            r[q] = rstd[rr];
        }
        BfPack<E> dv[R][V], xv[R][V];
        float dxhat_sum[R], dxhat_xhat_sum[R];
#pragma unroll
        for (int q = 0; q < R; q++) dxhat_sum[q] = 0.f, dxhat_xhat_sum[q] = 0.f;
        for (int s = 0; s < slice_end; s += 32 * V) {
#pragma unroll
            for (int q = 0; q < R; q++)
#pragma unroll
                for (int k = 0; k < V; k++) {
                    const int i = s + lane + 32 * k;
                    if (live[q] && i < CP) {
                        dv[q][k] = load_pack<E, kInCache>(dout + base[q] + i * E);
                        xv[q][k] = load_pack<E, kInCache>(inp + base[q] + i * E);
                    }
                }
            if constexpr (kRowInRegs && (Cfg::cache_bits & 8)) {
#pragma unroll
                for (int q = 0; q < R; q++)
                    if (live[q]) prefetch_row_l2(dinp + base[q], C, lane);
            }
            if constexpr (kRowInRegs && (Cfg::cache_bits & 16)) {
#pragma unroll
                for (int q = 0; q < R; q++) {
                    const int next = row0 + (R + q) * warps;
                    if (next < r1) {
                        prefetch_row_l2(dout + (long)next * C, C, lane);
                        prefetch_row_l2(inp + (long)next * C, C, lane);
                    }
                }
            }
#pragma unroll
            for (int k = 0; k < V; k++) {
                const int i = s + lane + 32 * k;
                if (i < CP) {
                    const BfPack<E> w = kWeightRegs ? wv[kWeightRegs ? k : 0] : load_pack<E, 2>(weight + i * E);
#pragma unroll
                    for (int q = 0; q < R; q++)
                        if (live[q])
#pragma unroll
                            for (int j = 0; j < E; j++) {
                                const float dxhat = __bfloat162float(dv[q][k][j]) * __bfloat162float(w[j]);
                                dxhat_sum[q] += dxhat;
                                dxhat_xhat_sum[q] += dxhat * ((__bfloat162float(xv[q][k][j]) - m[q]) * r[q]);
                            }
                }
            }
        }
        float dxhat_mean[R], dxhat_xhat_mean[R];
#pragma unroll
        for (int q = 0; q < R; q++) {
            dxhat_mean[q] = warp_sum(dxhat_sum[q]) / C;
            dxhat_xhat_mean[q] = warp_sum(dxhat_xhat_sum[q]) / C;
            opaque(dv[q]);
            opaque(xv[q]);
        }
        for (int s = 0; s < slice_end; s += 32 * V) {
            if (!kRowInRegs) {
#pragma unroll
                for (int q = 0; q < R; q++)
#pragma unroll
                    for (int k = 0; k < V; k++) {
                        const int i = s + lane + 32 * k;
                        if (live[q] && i < CP) {
                            dv[q][k] = load_pack<E, 0>(dout + base[q] + i * E);
                            xv[q][k] = load_pack<E, 0>(inp + base[q] + i * E);
                        }
                    }
            }
            // dinp is loaded in batches before any of the batch is stored: the compiler keeps a load
            // after an earlier store to the same array, so one pack at a time would serialise a
            // memory latency per pack.
#pragma unroll
            for (int k0 = 0; k0 < V; k0 += B) {
                BfPack<E> gv[R][B];
#pragma unroll
                for (int q = 0; q < R; q++)
#pragma unroll
                    for (int b = 0; b < B; b++) {
                        const int k = k0 + b, i = s + lane + 32 * k;
                        if (k < V && live[q] && i < CP)
                            gv[q][b] = load_pack<E, kDinpCache>(dinp + base[q] + i * E);
                    }
#pragma unroll
                for (int b = 0; b < B; b++) {
                    const int k = k0 + b, i = s + lane + 32 * k;
                    if (k < V && i < CP) {
                        const BfPack<E> w = kWeightRegs ? wv[kWeightRegs ? k : 0] : load_pack<E, 2>(weight + i * E);
                        float dw[E], db[E];  // channels E i .. E i + E - 1
#pragma unroll
                        for (int t = 0; t < Q; t++) {
                            const float4 a = acc[t * CP + i], c = acc[(Q + t) * CP + i];
                            dw[4 * t] = a.x, dw[4 * t + 1] = a.y, dw[4 * t + 2] = a.z, dw[4 * t + 3] = a.w;
                            db[4 * t] = c.x, db[4 * t + 1] = c.y, db[4 * t + 2] = c.z, db[4 * t + 3] = c.w;
                        }
#pragma unroll
                        for (int q = 0; q < R; q++)
                            if (live[q])
#pragma unroll
                                for (int j = 0; j < E; j++) {
                                    const float d = __bfloat162float(dv[q][k][j]);
                                    const float xhat = (__bfloat162float(xv[q][k][j]) - m[q]) * r[q];
                                    const float dxhat = d * __bfloat162float(w[j]);
                                    gv[q][b][j] = __float2bfloat16(
                                        __bfloat162float(gv[q][b][j]) +
                                        (dxhat - dxhat_mean[q] - xhat * dxhat_xhat_mean[q]) * r[q]);
                                    dw[j] += d * xhat;
                                    db[j] += d;
                                }
#pragma unroll
                        for (int t = 0; t < Q; t++) {
                            acc[t * CP + i] = make_float4(dw[4 * t], dw[4 * t + 1], dw[4 * t + 2], dw[4 * t + 3]);
                            acc[(Q + t) * CP + i] =
                                make_float4(db[4 * t], db[4 * t + 1], db[4 * t + 2], db[4 * t + 3]);
                        }
#pragma unroll
                        for (int q = 0; q < R; q++)
                            if (live[q]) store_pack<E, kDinpStream>(dinp + base[q] + i * E, gv[q][b]);
                    }
                }
            }
        }
    }

    // the block's partial row: its warps' accumulators added in warp order
    __syncthreads();
    const float4* all = reinterpret_cast<const float4*>(ln_smem);
    float* p = partial + (long)blockIdx.x * 2 * C;
    for (int e = threadIdx.x; e < 2 * Q * CP; e += blockDim.x) {
        float4 s = all[e];
#pragma unroll 1
        for (int w = 1; w < warps; w++) {
            const float4 a = all[(long)w * 2 * Q * CP + e];
            s.x += a.x;
            s.y += a.y;
            s.z += a.z;
            s.w += a.w;
        }
        const int t = e / CP, i = e % CP;
        float* dst = p + (t / Q) * C + E * i + 4 * (t % Q);
        dst[0] = s.x;
        dst[1] = s.y;
        dst[2] = s.z;
        dst[3] = s.w;
    }
}

// dweight[c] += sum_k partial[k][0][c], dbias[c] += sum_k partial[k][1][c], k in a fixed order: the
// partial rows are read as rows of 2C; in a block of 32 columns, warp y adds the chunks k = y mod 16
// in order, then the 16 warp sums are added in warp order.
constexpr int kReduceCols = 32, kReduceSplit = 16;

__global__ void __launch_bounds__(kReduceCols * kReduceSplit)
    layernorm_backward_reduce_kernel(float* dweight, float* dbias, const float* partial, int chunks, int C) {
    __shared__ float s[kReduceSplit][kReduceCols + 1];
    const int tx = threadIdx.x % kReduceCols, ty = threadIdx.x / kReduceCols;
    const int c = blockIdx.x * kReduceCols + tx;  // column of the 2C-wide partial row
    float sum = 0.f;
    if (c < 2 * C) {
#pragma unroll 4
        for (int k = ty; k < chunks; k += kReduceSplit) sum += partial[(long)k * 2 * C + c];
    }
    s[ty][tx] = sum;
    __syncthreads();
    if (ty != 0 || c >= 2 * C) return;
    float total = 0.f;
#pragma unroll
    for (int y = 0; y < kReduceSplit; y++) total += s[y][tx];
    if (c < C)
        dweight[c] += total;
    else
        dbias[c - C] += total;
}

__global__ void residual_forward_kernel(bf16* out, const bf16* a, const bf16* b, long n) {
    const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i + 8 <= n) {
        const Packed128<bf16> x = load128cs(a + i), y = load128cs(b + i);
        Packed128<bf16> o;
#pragma unroll
        for (int j = 0; j < 8; j++) o[j] = __float2bfloat16(__bfloat162float(x[j]) + __bfloat162float(y[j]));
        store128(out + i, o);
    } else {
        for (long k = i; k < n; k++) out[k] = __float2bfloat16(__bfloat162float(a[k]) + __bfloat162float(b[k]));
    }
}

void check_row_shape(int N, int C, const char* fn) {
    if (N < 0 || C <= 0 || C % 8 != 0 || C > 4096)
        throw Error(std::string(fn) + ": needs C a multiple of 8 in 8..4096 and N >= 0, got N=" + std::to_string(N) +
                    " C=" + std::to_string(C));
}

// Runs f(std::integral_constant<int, V>) with the smallest instantiated V that covers C (C <= 256 V).
template <typename Fn>
void dispatch_vectors(int C, Fn&& f) {
    const int need = ceil_div(C, 256);
    switch (need) {
        case 1: return f(std::integral_constant<int, 1>{});
        case 2: return f(std::integral_constant<int, 2>{});
        case 3: return f(std::integral_constant<int, 3>{});
        case 4: return f(std::integral_constant<int, 4>{});
        case 5: return f(std::integral_constant<int, 5>{});
        case 6: return f(std::integral_constant<int, 6>{});
        case 7: return f(std::integral_constant<int, 7>{});
        case 8: return f(std::integral_constant<int, 8>{});
        case 9: case 10: case 11: case 12: return f(std::integral_constant<int, 12>{});
        default: return f(std::integral_constant<int, 16>{});
    }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

using BackwardKernel = void (*)(bf16*, float*, const bf16*, const bf16*, const bf16*, const float*, const float*, int,
                                int, int);

// A backward kernel and its most warps a block.
struct BackwardKernelInfo {
    BackwardKernel kernel;
    int max_warps;
};
template <int V, bool kRowInRegs, class Cfg = DefaultBwdConfig<V>>
BackwardKernelInfo backward_kernel() {
    return {layernorm_backward_kernel<V, kRowInRegs, Cfg>, Cfg::warps};
}

// Rows up to 2048 channels stay in registers; wider ones go in slices of 1024 channels.
BackwardKernelInfo backward_kernel_for(int C) {
    switch (ceil_div(C, 256)) {
        case 1: return backward_kernel<1, true>();
        case 2: return backward_kernel<2, true>();
        case 3: return backward_kernel<3, true>();
        case 4: return backward_kernel<4, true>();
        case 5: return backward_kernel<5, true>();
        case 6: return backward_kernel<6, true>();
        case 7: return backward_kernel<7, true>();
        case 8: return backward_kernel<8, true>();
        default: return backward_kernel<4, false>();
    }
}

// The backward launch for a shape on the current device: as many blocks as fit on the GPU at once
// (but at least a row per warp), each owning `rows` consecutive rows; `chunks` blocks in all, one
// partial row each. A function of (N, C, device) only, so the summation order is fixed for a shape.
struct BackwardPlan {
    BackwardKernel kernel;
    int warps, rows, chunks;
    size_t smem;
};

BackwardPlan backward_plan(const BackwardKernelInfo& info, int N, int C) {
    BackwardPlan plan;
    plan.kernel = info.kernel;
    int dev = 0, sms = 0, smem_optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    const size_t warp_bytes = (size_t)C * 8;  // float4 acc[4][C/8]
    plan.warps = (int)std::max<size_t>(1, std::min<size_t>(info.max_warps, (size_t)smem_optin / warp_bytes));
    plan.smem = plan.warps * warp_bytes;
    CUDA_CHECK(cudaFuncSetAttribute(plan.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)plan.smem));
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, plan.kernel, 32 * plan.warps, plan.smem));
    const int blocks = std::max(1, std::min(sms * std::max(per_sm, 1), ceil_div(N, plan.warps)));
    plan.rows = ceil_div(N, blocks);
    plan.chunks = ceil_div(N, plan.rows);  // <= blocks; every block has at least one row
    return plan;
}
BackwardPlan backward_plan(int N, int C) { return backward_plan(backward_kernel_for(C), N, C); }

// The backward pass with a given plan: the row kernel, then the fixed-order reduction of its partials.
void launch_backward(const BackwardPlan& plan, bf16* dinp, float* dweight, float* dbias, float* scratch,
                     const bf16* dout, const bf16* inp, const bf16* weight, const float* mean, const float* rstd,
                     int N, int C, cudaStream_t stream) {
    plan.kernel<<<plan.chunks, 32 * plan.warps, plan.smem, stream>>>(dinp, scratch, dout, inp, weight, mean, rstd, N,
                                                                      C, plan.rows);
    CUDA_CHECK_LAUNCH(layernorm_backward_kernel);
    layernorm_backward_reduce_kernel<<<ceil_div(2L * C, kReduceCols), kReduceCols * kReduceSplit, 0, stream>>>(
        dweight, dbias, scratch, plan.chunks, C);
    CUDA_CHECK_LAUNCH(layernorm_backward_reduce_kernel);
}

}  // namespace

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight, const bf16* bias,
                       int N, int C, cudaStream_t stream) {
    check_row_shape(N, C, "layernorm_forward");
    if (N == 0) return;
    dispatch_vectors(C, [&](auto v) {
        layernorm_forward_kernel<decltype(v)::value>
            <<<ceil_div(N, kFwdRows), 32 * kFwdRows, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
        CUDA_CHECK_LAUNCH(layernorm_forward_kernel);
    });
}

// Sized for the current device (the block count depends on its multiprocessors).
size_t layernorm_backward_scratch_floats(int N, int C) {
    if (N <= 0 || C <= 0) return 0;
    return (size_t)backward_plan(N, C).chunks * 2 * C;
}

void layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout, const bf16* inp,
                        const bf16* weight, const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
    check_row_shape(N, C, "layernorm_backward");
    if (N == 0) return;
    launch_backward(backward_plan(N, C), dinp, dweight, dbias, scratch, dout, inp, weight, mean, rstd, N, C, stream);
}

void residual_forward(bf16* out, const bf16* a, const bf16* b, long n, cudaStream_t stream) {
    if (!aligned16(out) || !aligned16(a) || !aligned16(b))
        throw Error("residual_forward: pointers must be 16-byte aligned");
    if (n <= 0) return;
    residual_forward_kernel<<<ceil_div(ceil_div(n, 8), 256), 256, 0, stream>>>(out, a, b, n);
    CUDA_CHECK_LAUNCH(residual_forward_kernel);
}

}  // namespace codagpt
