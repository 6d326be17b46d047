// LayerNorm backward configurations (kernels/layernorm.cu, BwdConfig) against the same-size device copy
// on the H200: 65536 x 1600, 16384 x 1600 and 65536 x 1024 bf16, random inputs.
//
//   bench_layernorm [--reps N] [--only SUBSTRING]
//
// The kernels are compiled into this binary from kernels/layernorm.cu itself (included below), so
// configurations the library does not ship can be instantiated. For each shape: the copy of one N*C
// bf16 tensor (cudaMemcpy D2D; the reference of tests/test_gpu_kernels.cpp GpuBandwidth: % of copy =
// (4 N C x 2 bytes / backward time) / (2 N C x 2 bytes / copy time)), timed before and after the
// variants; then each variant (row kernel + partial-row reduction, as layernorm_backward), medians of
// --reps launches after 5 warm-up ones, CUDA events.
// Checks: every variant against an fp64 CPU reference on 4000 x C (dinp in bf16 ulps of the reference,
// dweight/dbias error over the sum of |terms|), and on each timed shape against the shipped kernel
// (dinp: bf16 values that differ, largest difference in ulps; dweight/dbias: largest difference over
// max |value|). Prints a table last.
#include "layernorm.cu"  // the kernels (and the library's launchers) in this translation unit

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// The backward kernel as it was before BwdConfig (git HEAD of 2026-11-29, verbatim but for this
// namespace): the "orig" rows, to see that the templated kernel at the shipped configuration
// (the "cur" rows) runs as fast (ptxas gives it 148 registers at V = 7 against 167 here).
namespace codagpt {
namespace orig {

__device__ inline void unpack8(float (&v)[8], float4 lo, float4 hi) {
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
    v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
}

// Warps per block of the backward kernel (fewer when their accumulators, 8C bytes a warp, would not
// fit in the block's shared memory): 12 for rows over 1024 channels, whose registers (dout and inp
// of the row plus a dinp batch, 4 a pack) would spill under the cap of 16 warps; measured on the
// H200 at C = 1600 (bench/NOTES_layernorm.md).
template <int V>
constexpr int bwd_max_warps() { return V >= 5 ? 12 : 16; }
// dinp packs loaded together in the second pass.
constexpr int kDinpBatch = 4;

// dinp += r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),  dxhat = dout * w, xhat = (x - m) r;
// partial[block][0][c] = sum over the block's rows of dout * xhat, partial[block][1][c] = of dout.
// Block b owns rows [b rows, (b+1) rows) and its warp w the rows w, w + warps, ... of them.
// kRowInRegs: C <= 256 V, the row stays in registers between the passes; otherwise the row is taken
// in slices of 256 V channels and the second pass reads them again (from L2, just read).
// Shared memory: per warp, float4 acc[4][C/8]: [dweight lo, dweight hi, dbias lo, dbias hi] of pack i,
// i.e. entry (t, i) holds channels 8i + 4(t % 2) .. +3 of dweight (t < 2) or dbias (t >= 2). A warp
// reads 32 consecutive float4: no bank conflicts.
template <int V, bool kRowInRegs>
__global__ void __launch_bounds__(32 * bwd_max_warps<V>(), 1)
    layernorm_backward_kernel(bf16* dinp, float* partial, const bf16* dout, const bf16* inp, const bf16* weight,
                              const float* mean, const float* rstd, int N, int C, int rows) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int CV = C / 8;
    float4* acc = reinterpret_cast<float4*>(ln_smem) + (long)warp * 4 * CV;
    for (int i = lane; i < CV; i += 32)
#pragma unroll
        for (int t = 0; t < 4; t++) acc[t * CV + i] = make_float4(0.f, 0.f, 0.f, 0.f);

    const int r0 = blockIdx.x * rows, r1 = min(N, r0 + rows);
    const int slice_end = kRowInRegs ? 1 : CV;  // pass loops below: one slice when the row fits
#pragma unroll 1
    for (int row = r0 + warp; row < r1; row += warps) {
        const long base = (long)row * C;
        const float m = mean[row], r = rstd[row];
        Packed128<bf16> dv[V], xv[V];
        float dxhat_sum = 0.f, dxhat_xhat_sum = 0.f;
        for (int s = 0; s < slice_end; s += 32 * V) {
#pragma unroll
            for (int k = 0; k < V; k++) {
                const int i = s + lane + 32 * k;
                if (i < CV) {
                    dv[k] = kRowInRegs ? load128cs(dout + base + i * 8) : load128(dout + base + i * 8);
                    xv[k] = kRowInRegs ? load128cs(inp + base + i * 8) : load128(inp + base + i * 8);
                }
            }
#pragma unroll
            for (int k = 0; k < V; k++) {
                const int i = s + lane + 32 * k;
                if (i < CV) {
                    const Packed128<bf16> w = load128ldg(weight + i * 8);
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const float dxhat = __bfloat162float(dv[k][j]) * __bfloat162float(w[j]);
                        dxhat_sum += dxhat;
                        dxhat_xhat_sum += dxhat * ((__bfloat162float(xv[k][j]) - m) * r);
                    }
                }
            }
        }
        const float dxhat_mean = warp_sum(dxhat_sum) / C, dxhat_xhat_mean = warp_sum(dxhat_xhat_sum) / C;
        opaque(dv);
        opaque(xv);
        for (int s = 0; s < slice_end; s += 32 * V) {
            if (!kRowInRegs) {
#pragma unroll
                for (int k = 0; k < V; k++) {
                    const int i = s + lane + 32 * k;
                    if (i < CV) {
                        dv[k] = load128(dout + base + i * 8);
                        xv[k] = load128(inp + base + i * 8);
                    }
                }
            }
            // dinp is loaded in batches before any of the batch is stored: the compiler keeps a load
            // after an earlier store to the same array, so one pack at a time would serialise a
            // memory latency per pack.
#pragma unroll
            for (int k0 = 0; k0 < V; k0 += kDinpBatch) {
                Packed128<bf16> gv[kDinpBatch];
#pragma unroll
                for (int b = 0; b < kDinpBatch; b++) {
                    const int k = k0 + b, i = s + lane + 32 * k;
                    if (k < V && i < CV) gv[b] = load128(dinp + base + i * 8);
                }
#pragma unroll
                for (int b = 0; b < kDinpBatch; b++) {
                    const int k = k0 + b, i = s + lane + 32 * k;
                    if (k < V && i < CV) {
                        const Packed128<bf16> w = load128ldg(weight + i * 8);
                        Packed128<bf16> g = gv[b];
                        float dw[8], db[8];  // channels 8i .. 8i+7
                        unpack8(dw, acc[0 * CV + i], acc[1 * CV + i]);
                        unpack8(db, acc[2 * CV + i], acc[3 * CV + i]);
#pragma unroll
                        for (int j = 0; j < 8; j++) {
                            const float d = __bfloat162float(dv[k][j]);
                            const float xhat = (__bfloat162float(xv[k][j]) - m) * r;
                            const float dxhat = d * __bfloat162float(w[j]);
                            g[j] = __float2bfloat16(__bfloat162float(g[j]) +
                                                    (dxhat - dxhat_mean - xhat * dxhat_xhat_mean) * r);
                            dw[j] += d * xhat;
                            db[j] += d;
                        }
                        acc[0 * CV + i] = make_float4(dw[0], dw[1], dw[2], dw[3]);
                        acc[1 * CV + i] = make_float4(dw[4], dw[5], dw[6], dw[7]);
                        acc[2 * CV + i] = make_float4(db[0], db[1], db[2], db[3]);
                        acc[3 * CV + i] = make_float4(db[4], db[5], db[6], db[7]);
                        store128(dinp + base + i * 8, g);
                    }
                }
            }
        }
    }

    // the block's partial row: its warps' accumulators added in warp order
    __syncthreads();
    const float4* all = reinterpret_cast<const float4*>(ln_smem);
    float* p = partial + (long)blockIdx.x * 2 * C;
    for (int e = threadIdx.x; e < 4 * CV; e += blockDim.x) {
        float4 s = all[e];
#pragma unroll 1
        for (int w = 1; w < warps; w++) {
            const float4 a = all[(long)w * 4 * CV + e];
            s.x += a.x;
            s.y += a.y;
            s.z += a.z;
            s.w += a.w;
        }
        const int t = e / CV, i = e % CV;
        float* dst = p + (t / 2) * C + 8 * i + 4 * (t % 2);
        dst[0] = s.x;
        dst[1] = s.y;
        dst[2] = s.z;
        dst[3] = s.w;
    }
}

}  // namespace orig
}  // namespace codagpt

using namespace codagpt;

namespace lnbench {

struct Variant {
    const char* name;
    const char* what;
    int C;
    BackwardKernelInfo info;
    bool api = false;  // through layernorm_backward (the library's own plan)
};

// Rows of C channels, held in registers: V packs of E channels a lane.
template <int C, class Cfg>
Variant make(const char* name, const char* what) {
    constexpr int V = (C + 32 * Cfg::E - 1) / (32 * Cfg::E);
    return {name, what, C, backward_kernel<V, true, Cfg>()};
}

// The shipped configuration at C (what it is), the same through layernorm_backward(), and the kernel
// before BwdConfig with its warp count.
template <int C>
void push_shipped(std::vector<Variant>& v, const char* what, int orig_warps) {
    constexpr int V = (C + 255) / 256;  // 16-byte packs a lane
    v.push_back(make<C, DefaultBwdConfig<V>>("cur", what));
    Variant api = make<C, DefaultBwdConfig<V>>("api", "layernorm_backward() itself");
    api.api = true;
    v.push_back(api);
    v.push_back({"orig", "the kernel before BwdConfig (HEAD)", C, {orig::layernorm_backward_kernel<V, true>, orig_warps}});
}

std::vector<Variant> variants() {
    // BwdConfig<warps, min blocks/SM, dinp batch, rows per warp, pack bytes, weight in regs, cache bits>
    std::vector<Variant> v;
    push_shipped<1600>(v, "shipped: 12 warps, dinp batch 4, 16B packs", 12);
    v.push_back(make<1600, BwdConfig<8>>("w8", "8 warps (reg cap 255)"));
    v.push_back(make<1600, BwdConfig<10>>("w10", "10 warps"));
    v.push_back(make<1600, BwdConfig<12, 1, 7>>("w12b7", "dinp batch 7 (whole row)"));
    v.push_back(make<1600, BwdConfig<6, 2>>("w6x2", "2 blocks/SM x 6 warps"));
    v.push_back(make<1600, BwdConfig<7, 2>>("w7x2", "2 blocks/SM x 7 warps (reg cap 146)"));
    v.push_back(make<1600, BwdConfig<8, 1, 4, 1, 16, true>>("wreg", "weight packs in registers once, 8 warps"));
    v.push_back(make<1600, BwdConfig<12, 1, 4, 1, 16, false, 7>>("cs_dinp", "dinp load+store streaming (.cs)"));
    v.push_back(make<1600, BwdConfig<12, 1, 4, 1, 8>>("p8w12", "8-byte packs (13 a lane), 12 warps"));
    v.push_back(make<1600, BwdConfig<16, 1, 4, 1, 8>>("p8w16", "8-byte packs, 16 warps"));
    v.push_back(make<1600, BwdConfig<8, 1, 2, 2>>("r2w8b2", "2 rows a warp, 8 warps, batch 2"));
    v.push_back(make<1600, BwdConfig<8, 1, 4, 2>>("r2w8b4", "2 rows a warp, 8 warps, batch 4"));
    v.push_back(make<1600, BwdConfig<6, 1, 4, 2>>("r2w6b4", "2 rows a warp, 6 warps, batch 4"));
    v.push_back(make<1600, BwdConfig<8, 1, 7, 2>>("r2w8b7", "2 rows a warp, 8 warps, batch 7"));
    v.push_back(make<1600, BwdConfig<12, 1, 4, 1, 16, false, 9>>("pf_dinp", "dinp prefetched to L2 in pass 1"));
    v.push_back(make<1600, BwdConfig<12, 1, 4, 1, 16, false, 17>>("pf_next", "next row dout/inp prefetched to L2"));
    v.push_back(make<1600, BwdConfig<12, 1, 4, 1, 16, false, 25>>("pf_both", "pf_dinp + pf_next"));
    v.push_back(make<1600, BwdConfig<12, 1, 7, 1, 16, false, 25>>("pf_b7", "pf_both, dinp batch 7"));
    v.push_back(make<1600, BwdConfig<10, 1, 4, 1, 16, false, 25>>("pf_w10", "pf_both, 10 warps"));
    v.push_back(make<1600, BwdConfig<16, 1, 2, 1, 16, false, 25>>("pf16b2", "pf_both, 16 warps, dinp batch 2"));
    v.push_back(make<1600, BwdConfig<8, 1, 4, 2, 16, false, 25>>("r2w8pf", "r2w8b4 + pf_both"));
    v.push_back(make<1600, BwdConfig<16, 1, 4, 1, 8, false, 25>>("p8w16pf", "p8w16 + pf_both"));

    push_shipped<1024>(v, "shipped: 16 warps, dinp batch 4", 16);
    v.push_back(make<1024, BwdConfig<16, 1, 4, 1, 16, true>>("wreg", "weight packs in registers"));
    v.push_back(make<1024, BwdConfig<16, 1, 4, 1, 16, false, 7>>("cs_dinp", "dinp load+store streaming"));
    v.push_back(make<1024, BwdConfig<8, 1, 4, 2>>("r2w8b4", "2 rows a warp, 8 warps, batch 4"));
    v.push_back(make<1024, BwdConfig<16, 1, 4, 1, 16, false, 9>>("pf_dinp", "dinp prefetched to L2 in pass 1"));
    v.push_back(make<1024, BwdConfig<16, 1, 4, 1, 16, false, 25>>("pf_both", "pf_dinp + next rows prefetched"));
    return v;
}

__global__ void fill_kernel(bf16* p, long n, unsigned seed, float scale, float offset) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16(offset + scale * hash_uniform(i, seed));
}
void fill(bf16* p, long n, unsigned seed, float scale, float offset) {
    fill_kernel<<<1024, 256>>>(p, n, seed, scale, offset);
    CUDA_CHECK_LAUNCH(fill_kernel);
}

// counts[0] += values whose bits differ, counts[1] = max |difference| in bf16 ulps (ordered bits).
__global__ void compare_kernel(const bf16* a, const bf16* b, long n, unsigned long long* counts) {
    unsigned long long diff = 0, maxd = 0;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const unsigned short ua = __bfloat16_as_ushort(a[i]), ub = __bfloat16_as_ushort(b[i]);
        if (ua != ub) {
            diff++;
            const long ka = ua & 0x8000 ? -(long)(ua & 0x7fff) : (long)ua;
            const long kb = ub & 0x8000 ? -(long)(ub & 0x7fff) : (long)ub;
            const unsigned long long d = (unsigned long long)(ka > kb ? ka - kb : kb - ka);
            if (d > maxd) maxd = d;
        }
    }
    if (diff) {
        atomicAdd(&counts[0], diff);
        atomicMax(&counts[1], maxd);
    }
}

float bf2f(bf16 v) { return __bfloat162float(v); }
std::vector<bf16> to_host(const bf16* d, long n) {
    std::vector<bf16> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    return h;
}
std::vector<float> to_host(const float* d, long n) {
    std::vector<float> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

struct Buffers {
    bf16 *pool, *dout, *inp, *dinp, *dinp0, *dinp_ref, *tmp, *weight, *bias;
    float *mean, *rstd, *dw, *db, *dw_ref, *db_ref, *scratch;
    unsigned long long* counts;
};

struct Row {
    std::string name;
    int C;
    std::string shape, what, check;
    int regs, local, warps, per_sm;
    double ms, tbs, pct;
};

// One backward of variant v from dinp0 and zeroed dweight/dbias.
void run_once(const Variant& v, const BackwardPlan& plan, Buffers& b, int N, int C) {
    CUDA_CHECK(cudaMemcpy(b.dinp, b.dinp0, (size_t)N * C * sizeof(bf16), cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemset(b.dw, 0, C * sizeof(float)));
    CUDA_CHECK(cudaMemset(b.db, 0, C * sizeof(float)));
    if (v.api)
        layernorm_backward(b.dinp, b.dw, b.db, b.scratch, b.dout, b.inp, b.weight, b.mean, b.rstd, N, C, 0);
    else
        launch_backward(plan, b.dinp, b.dw, b.db, b.scratch, b.dout, b.inp, b.weight, b.mean, b.rstd, N, C, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
}

void setup_shape(Buffers& b, int N, int C, unsigned seed) {
    const long NC = (long)N * C;
    b.dout = b.pool;
    b.inp = b.pool + NC;
    fill(b.dout, NC, seed + 1, 1.f, 0.f);
    fill(b.inp, NC, seed + 2, 2.f, 0.3f);
    fill(b.dinp0, NC, seed + 3, 0.5f, 0.f);
    fill(b.weight, C, seed + 4, 0.5f, 1.f);
    fill(b.bias, C, seed + 5, 0.1f, 0.f);
    layernorm_forward(b.tmp, b.mean, b.rstd, b.inp, b.weight, b.bias, N, C, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
}

// fp64 reference on N x C: returns, per variant, "ok"/"FAIL" with the errors.
std::string check_small(const Variant& v, Buffers& b, int N, int C, const std::vector<double>& dinp_ref,
                        const std::vector<double>& dw_ref, const std::vector<double>& db_ref,
                        const std::vector<double>& dw_abs, const std::vector<double>& db_abs) {
    const BackwardPlan plan = backward_plan(v.info, N, C);
    run_once(v, plan, b, N, C);
    const auto dinp = to_host(b.dinp, (long)N * C);
    const auto dw = to_host(b.dw, C), db = to_host(b.db, C);
    double ulps = 0, wrel = 0;
    for (long k = 0; k < (long)N * C; k++) {
        const double ref = dinp_ref[k], mag = std::max(std::fabs(ref), 1e-2);
        const double ulp = std::ldexp(1.0, std::ilogb(mag) - 7);
        ulps = std::max(ulps, std::fabs(bf2f(dinp[k]) - ref) / ulp);
    }
    for (int c = 0; c < C; c++) {
        wrel = std::max(wrel, std::fabs(dw[c] - dw_ref[c]) / (dw_abs[c] + 1e-30));
        wrel = std::max(wrel, std::fabs(db[c] - db_ref[c]) / (db_abs[c] + 1e-30));
    }
    const bool ok = ulps <= 1.0 && wrel <= 2e-5 && std::isfinite(ulps) && std::isfinite(wrel);
    char s[96];
    snprintf(s, sizeof s, "%s %.2fulp %.0e", ok ? "ok" : "FAIL", ulps, wrel);
    return s;
}

}  // namespace lnbench

using namespace lnbench;

int main(int argc, char** argv) {
    int reps = 30;
    std::string only;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: bench_layernorm [--reps N] [--only SUBSTRING]\n");
            return 2;
        }
    }
    try {
        int dev = 0, sms = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
        sms = prop.multiProcessorCount;
        printf("device: %s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);

        std::vector<Variant> all = variants(), vs;
        for (const Variant& v : all)
            if (only.empty() || std::string(v.name).find(only) != std::string::npos || !strcmp(v.name, "cur"))
                vs.push_back(v);

        const int maxN = 65536, maxC = 1600;
        const long maxNC = (long)maxN * maxC;
        Buffers b;
        CUDA_CHECK(cudaMalloc(&b.pool, 2 * maxNC * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&b.tmp, 2 * maxNC * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&b.dinp, maxNC * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&b.dinp0, maxNC * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&b.dinp_ref, maxNC * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&b.weight, maxC * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&b.bias, maxC * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&b.mean, maxN * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&b.rstd, maxN * sizeof(float)));
        for (float** p : {&b.dw, &b.db, &b.dw_ref, &b.db_ref}) CUDA_CHECK(cudaMalloc(p, maxC * sizeof(float)));
        const size_t scratch_floats = (size_t)sms * 8 * 2 * maxC;  // chunks <= SMs x blocks/SM (<= 2 here)
        CUDA_CHECK(cudaMalloc(&b.scratch, scratch_floats * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&b.counts, 2 * sizeof(unsigned long long)));

        // ---- fp64 reference checks, 4000 rows (odd tails of rows per warp)
        std::vector<std::pair<std::string, std::string>> small_check;  // (name@C, result)
        for (int C : {1600, 1024}) {
            const int N = 4000;
            const long NC = (long)N * C;
            setup_shape(b, N, C, 100 + C);
            const auto dout = to_host(b.dout, NC), inp = to_host(b.inp, NC), dinp0 = to_host(b.dinp0, NC),
                       w = to_host(b.weight, C);
            const auto mean = to_host(b.mean, N), rstd = to_host(b.rstd, N);
            std::vector<double> dinp_ref(NC), dw_ref(C, 0), db_ref(C, 0), dw_abs(C, 0), db_abs(C, 0);
            for (int n = 0; n < N; n++) {
                const double m = mean[n], r = rstd[n];
                double s1 = 0, s2 = 0;
                for (int c = 0; c < C; c++) {
                    const double d = bf2f(dout[(long)n * C + c]), xh = (bf2f(inp[(long)n * C + c]) - m) * r;
                    const double dx = d * bf2f(w[c]);
                    s1 += dx;
                    s2 += dx * xh;
                }
                s1 /= C, s2 /= C;
                for (int c = 0; c < C; c++) {
                    const long k = (long)n * C + c;
                    const double d = bf2f(dout[k]), xh = (bf2f(inp[k]) - m) * r, dx = d * bf2f(w[c]);
                    dinp_ref[k] = bf2f(dinp0[k]) + (dx - s1 - xh * s2) * r;
                    dw_ref[c] += d * xh;
                    db_ref[c] += d;
                    dw_abs[c] += std::fabs(d * xh);
                    db_abs[c] += std::fabs(d);
                }
            }
            for (const Variant& v : vs) {
                if (v.C != C) continue;
                std::string r;
                try {
                    r = check_small(v, b, N, C, dinp_ref, dw_ref, db_ref, dw_abs, db_abs);
                } catch (const Error& e) {  // a launch the device refuses: report it, go on
                    r = std::string("ERROR ") + e.what();
                    cudaGetLastError();
                }
                small_check.push_back({std::string(v.name) + "@" + std::to_string(C), r});
            }
        }
        auto small_result = [&](const Variant& v) {
            for (auto& [k, s] : small_check)
                if (k == std::string(v.name) + "@" + std::to_string(v.C)) return s;
            return std::string("?");
        };

        // ---- timed shapes
        std::vector<Row> rows;
        std::vector<std::string> copies;
        const std::pair<int, int> shapes[] = {{65536, 1600}, {16384, 1600}, {65536, 1024}};
        for (const auto& shape_nc : shapes) {
            const int N = shape_nc.first, C = shape_nc.second;
            const long NC = (long)N * C;
            char shape[32];
            snprintf(shape, sizeof shape, "%dx%d", N, C);
            setup_shape(b, N, C, 7 * C + N);
            auto copy1 = [&] {
                return median_ms([&] {
                    CUDA_CHECK(cudaMemcpyAsync(b.tmp, b.inp, NC * sizeof(bf16), cudaMemcpyDeviceToDevice, 0));
                }, reps);
            };
            const double copy_ms = copy1();
            const double copy2_ms = median_ms([&] {  // the backward's byte count: 2 N C bf16 read + written
                CUDA_CHECK(cudaMemcpyAsync(b.tmp, b.pool, 2 * NC * sizeof(bf16), cudaMemcpyDeviceToDevice, 0));
            }, reps);
            const double copy_tbs = 2.0 * NC * 2 / (copy_ms * 1e-3) / 1e12;

            // reference outputs: the shipped kernel from dinp0
            bool have_ref = false;
            for (const Variant& v : vs) {
                if (v.C != C) continue;
                try {
                    const BackwardPlan plan = backward_plan(v.info, N, C);
                    cudaFuncAttributes attr;
                    CUDA_CHECK(cudaFuncGetAttributes(&attr, v.info.kernel));
                    int per_sm = 0;
                    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, plan.kernel, 32 * plan.warps,
                                                                             plan.smem));
                    if ((size_t)plan.chunks * 2 * C > scratch_floats) throw Error("scratch too small");
                    run_once(v, plan, b, N, C);
                    std::string check;
                    if (!have_ref) {  // "cur" comes first for each C
                        CUDA_CHECK(cudaMemcpy(b.dinp_ref, b.dinp, NC * sizeof(bf16), cudaMemcpyDeviceToDevice));
                        CUDA_CHECK(cudaMemcpy(b.dw_ref, b.dw, C * sizeof(float), cudaMemcpyDeviceToDevice));
                        CUDA_CHECK(cudaMemcpy(b.db_ref, b.db, C * sizeof(float), cudaMemcpyDeviceToDevice));
                        have_ref = true;
                        check = "ref";
                    } else {
                        CUDA_CHECK(cudaMemset(b.counts, 0, 2 * sizeof(unsigned long long)));
                        compare_kernel<<<1024, 256>>>(b.dinp, b.dinp_ref, NC, b.counts);
                        CUDA_CHECK_LAUNCH(compare_kernel);
                        unsigned long long counts[2];
                        CUDA_CHECK(cudaMemcpy(counts, b.counts, sizeof counts, cudaMemcpyDeviceToHost));
                        const auto dw = to_host(b.dw, C), db = to_host(b.db, C), dwr = to_host(b.dw_ref, C),
                                   dbr = to_host(b.db_ref, C);
                        double wmax = 0, werr = 0, bmax = 0, berr = 0;
                        bool wexact = true;
                        for (int c = 0; c < C; c++) {
                            wmax = std::max(wmax, (double)std::fabs(dwr[c]));
                            bmax = std::max(bmax, (double)std::fabs(dbr[c]));
                            werr = std::max(werr, (double)std::fabs(dw[c] - dwr[c]));
                            berr = std::max(berr, (double)std::fabs(db[c] - dbr[c]));
                            wexact = wexact && !memcmp(&dw[c], &dwr[c], 4) && !memcmp(&db[c], &dbr[c], 4);
                        }
                        char s[96];
                        if (counts[0] == 0 && wexact)
                            snprintf(s, sizeof s, "exact");
                        else
                            snprintf(s, sizeof s, "dinp %llu>%lluulp dW %.0e", counts[0], counts[1],
                                     std::max(werr / wmax, berr / bmax));
                        check = s;
                    }
                    const double ms = median_ms([&] {
                        if (v.api)
                            layernorm_backward(b.dinp, b.dw, b.db, b.scratch, b.dout, b.inp, b.weight, b.mean,
                                               b.rstd, N, C, 0);
                        else
                            launch_backward(plan, b.dinp, b.dw, b.db, b.scratch, b.dout, b.inp, b.weight, b.mean,
                                            b.rstd, N, C, 0);
                    }, reps);
                    const double tbs = 4.0 * NC * 2 / (ms * 1e-3) / 1e12;
                    rows.push_back({v.name, C, shape, v.what, check + " | " + small_result(v), attr.numRegs,
                                    (int)attr.localSizeBytes, plan.warps, per_sm, ms, tbs, 100 * tbs / copy_tbs});
                    const Row& row = rows.back();
                    printf("  %-9s %-11s regs %3d spill %3d warps %2dx%d %7.4f ms %5.3f TB/s %5.1f%%  %s\n", v.name,
                           shape, row.regs, row.local, row.warps, row.per_sm, ms, tbs, row.pct, row.check.c_str());
                    fflush(stdout);
                } catch (const Error& e) {
                    printf("  %-9s %-11s ERROR %s\n", v.name, shape, e.what());
                    cudaGetLastError();
                }
            }
            const double copy_after = copy1();
            char s[256];
            snprintf(s, sizeof s,
                     "%-11s copy N*C: %.4f ms %.3f TB/s (after: %.4f ms %.3f TB/s); copy 2N*C: %.4f ms %.3f TB/s",
                     shape, copy_ms, copy_tbs, copy_after, 2.0 * NC * 2 / (copy_after * 1e-3) / 1e12, copy2_ms,
                     4.0 * NC * 2 / (copy2_ms * 1e-3) / 1e12);
            copies.push_back(s);
        }

        printf("\nvariants:\n");
        for (const Variant& v : vs)
            if (v.C == 1600 || (v.C == 1024 && strcmp(v.name, "cur") && strcmp(v.name, "api")))
                printf("  %-9s C=%-4d %s\n", v.name, v.C, v.what);
        printf("\n");
        for (auto& c : copies) printf("%s\n", c.c_str());
        printf("%% of copy = backward TB/s (4 N C x 2 B) / copy TB/s of one N*C tensor (copy timed before the "
               "variants)\n");
        printf("check: vs shipped kernel on this shape | fp64 CPU reference, 4000 x C (dinp ulps, dW/dB rel)\n\n");
        for (int C : {1600, 1024}) {
            std::vector<std::string> cshapes;
            for (const Row& r : rows)
                if (r.C == C && std::find(cshapes.begin(), cshapes.end(), r.shape) == cshapes.end())
                    cshapes.push_back(r.shape);
            if (cshapes.empty()) continue;
            printf("%-9s %4s %5s %5s", "variant", "regs", "spill", "warps");
            for (auto& sh : cshapes) printf(" | %-11s %6s %5s", sh.c_str(), "TB/s", "%copy");
            printf(" | check (%s | fp64)\n", cshapes[0].c_str());
            for (const Variant& v : vs) {
                if (v.C != C) continue;
                const Row* first = nullptr;
                for (const Row& r : rows)
                    if (r.C == C && r.name == v.name && r.shape == cshapes[0]) first = &r;
                if (!first) continue;
                printf("%-9s %4d %5d %3dx%d", v.name, first->regs, first->local, first->warps, first->per_sm);
                for (auto& sh : cshapes) {
                    const Row* r = nullptr;
                    for (const Row& x : rows)
                        if (x.C == C && x.name == v.name && x.shape == sh) r = &x;
                    if (r)
                        printf(" | %8.4f ms %6.3f %5.1f", r->ms, r->tbs, r->pct);
                    else
                        printf(" | %-11s %6s %5s", "-", "-", "-");
                }
                printf(" | %s\n", first->check.c_str());
            }
            printf("\n");
        }
    } catch (const std::exception& e) {
        fprintf(stderr, "bench_layernorm: %s\n", e.what());
        return 1;
    }
    return 0;
}
