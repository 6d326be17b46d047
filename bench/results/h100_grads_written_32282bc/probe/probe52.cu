// Probe (not committed): AdamW kernel variants' bandwidth at 1.5B size, the grads memset, and
// cuBLASLt dW GEMMs with beta = 0 against beta = 1 (the accumulate read of fp32 C).
#include <cublasLt.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#include "common.cuh"
#include "master_weights.cuh"
using namespace codagpt;

struct A { float lr, b1, b2, omb1, omb2, eps, wd, bias1, bias2; };
__device__ inline void el(float& p, float& m, float& v, float g, const A& a, float s) {
    g *= s; m = a.b1 * m + a.omb1 * g; v = a.b2 * v + a.omb2 * g * g;
    const float mh = __fdiv_rn(m, a.bias1), vh = __fdiv_rn(v, a.bias2);
    p -= a.lr * (__fdiv_rn(mh, __fsqrt_rn(vh) + a.eps) + a.wd * p);
}
template <typename T> __device__ inline void st_cs(T* p, const Packed128<T>& x) { __stcs(reinterpret_cast<int4*>(p), *reinterpret_cast<const int4*>(x.v)); }
template <typename T> __device__ inline Packed128<T> ld_plain(const T* p) { Packed128<T> r; *reinterpret_cast<int4*>(r.v) = *reinterpret_cast<const int4*>(p); return r; }
template <typename T> __device__ inline void st_plain(T* p, const Packed128<T>& x) { *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(x.v); }

template <bool CS>
__device__ inline void one_pack(uint16_t* hi, uint16_t* lo, const float* g_, float* m, float* v, size_t k, const A& a, float scale) {
    const size_t i = 8 * k;
    Packed128<uint16_t> h = CS ? load128cs(hi + i) : ld_plain(hi + i), l = CS ? load128cs(lo + i) : ld_plain(lo + i);
    Packed128<float> mm[2], vv[2], g[2];
    for (int s = 0; s < 2; s++) { mm[s] = CS ? load128cs(m + i + 4 * s) : ld_plain(m + i + 4 * s); vv[s] = CS ? load128cs(v + i + 4 * s) : ld_plain(v + i + 4 * s); g[s] = CS ? load128cs(g_ + i + 4 * s) : ld_plain(g_ + i + 4 * s); }
    for (int s = 0; s < 2; s++) for (int j = 0; j < 4; j++) { const int e = 4 * s + j; float p = master_join(h[e], l[e]); el(p, mm[s][j], vv[s][j], g[s][j], a, scale); h[e] = master_hi(p); l[e] = master_lo(p); }
    for (int s = 0; s < 2; s++) { if (CS) { st_cs(m + i + 4 * s, mm[s]); st_cs(v + i + 4 * s, vv[s]); } else { st_plain(m + i + 4 * s, mm[s]); st_plain(v + i + 4 * s, vv[s]); } }
    if (CS) { st_cs(hi + i, h); st_cs(lo + i, l); } else { st_plain(hi + i, h); st_plain(lo + i, l); }
}
template <bool CS>
__global__ void k_one(uint16_t* __restrict__ hi, uint16_t* __restrict__ lo, const float* __restrict__ g, float* __restrict__ m, float* __restrict__ v, size_t packs, A a, const float* __restrict__ sc) {
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; if (k >= packs) return; one_pack<CS>(hi, lo, g, m, v, k, a, *sc);
}
// grid-stride, fixed grid
__global__ void k_stride(uint16_t* __restrict__ hi, uint16_t* __restrict__ lo, const float* __restrict__ g, float* __restrict__ m, float* __restrict__ v, size_t packs, A a, const float* __restrict__ sc) {
    const float s = *sc;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < packs; k += (size_t)gridDim.x * blockDim.x) one_pack<true>(hi, lo, g, m, v, k, a, s);
}
__global__ void k_copy(int4* __restrict__ d, const int4* __restrict__ s, size_t n) {
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; if (k < n) __stcs(d + k, __ldcs(s + k));
}
__global__ void k_fill(float* p, size_t n, float x) { for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x) p[k] = x; }

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)
#define LK(x) do { cublasStatus_t e = (x); if (e != CUBLAS_STATUS_SUCCESS) { printf("cublas %d at %d\n", (int)e, __LINE__); exit(1); } } while (0)

template <class F> float med_ms(F f, int reps = 9) {
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b); std::vector<float> t;
    f(); f(); CK(cudaDeviceSynchronize());
    for (int r = 0; r < reps; r++) { cudaEventRecord(a); f(); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); t.push_back(ms); }
    std::sort(t.begin(), t.end()); return t[t.size() / 2];
}

struct LtPlan { cublasLtMatmulDesc_t d; cublasLtMatrixLayout_t a, b, c; cublasLtMatmulAlgo_t algo; };
// out[K,N] (row-major fp32) (+)= inp[M,K]^T dout[M,N]   -> col-major D[N,K] = dout^T(N x M, as col-major [N,M]) * inp (col-major [K,M])^T
LtPlan plan_dw(cublasLtHandle_t h, int M, int K, int N, float beta, size_t ws) {
    LtPlan p; LK(cublasLtMatmulDescCreate(&p.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t tn = CUBLAS_OP_N, tt = CUBLAS_OP_T;
    LK(cublasLtMatmulDescSetAttribute(p.d, CUBLASLT_MATMUL_DESC_TRANSA, &tn, sizeof tn));
    LK(cublasLtMatmulDescSetAttribute(p.d, CUBLASLT_MATMUL_DESC_TRANSB, &tt, sizeof tt));
    LK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, N, M, N));
    LK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, K, M, K));
    LK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, N, K, N));
    cublasLtMatmulPreference_t pr; LK(cublasLtMatmulPreferenceCreate(&pr));
    LK(cublasLtMatmulPreferenceSetAttribute(pr, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t r; int n = 0;
    LK(cublasLtMatmulAlgoGetHeuristic(h, p.d, p.a, p.b, p.c, p.c, pr, 1, &r, &n));
    if (!n) { printf("no algo\n"); exit(1); }
    p.algo = r.algo; (void)beta; return p;
}

int main() {
    cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0)); printf("# %s\n", prop.name);
    // ---- AdamW at 1.5B size
    const size_t n = 1557686400ull / 8 * 8, packs = n / 8;
    uint16_t *hi, *lo; float *g, *m, *v, *sc;
    CK(cudaMalloc(&hi, n * 2)); CK(cudaMalloc(&lo, n * 2)); CK(cudaMalloc(&g, n * 4)); CK(cudaMalloc(&m, n * 4)); CK(cudaMalloc(&v, n * 4)); CK(cudaMalloc(&sc, 4));
    k_fill<<<1024, 256>>>(g, n, 1e-3f); k_fill<<<1024, 256>>>(m, n, 1e-4f); k_fill<<<1024, 256>>>(v, n, 1e-6f);
    CK(cudaMemset(hi, 0x3c, n * 2)); CK(cudaMemset(lo, 0x11, n * 2)); { float one = 1; CK(cudaMemcpy(sc, &one, 4, cudaMemcpyHostToDevice)); }
    A a{1e-4f, 0.9f, 0.95f, 0.1f, 0.05f, 1e-8f, 0.1f, 0.5f, 0.3f};
    const double bytes = 28.0 * n;
    auto rep = [&](const char* name, float ms) { printf("%-34s %8.3f ms  %6.3f TB/s\n", name, ms, bytes / ms / 1e9); };
    for (int round = 0; round < 1; round++) {
        rep("adamw cs 256 (current)", med_ms([&] { k_one<true><<<(packs + 255) / 256, 256>>>(hi, lo, g, m, v, packs, a, sc); }));
        rep("adamw plain 256", med_ms([&] { k_one<false><<<(packs + 255) / 256, 256>>>(hi, lo, g, m, v, packs, a, sc); }));
        rep("adamw cs 128", med_ms([&] { k_one<true><<<(packs + 127) / 128, 128>>>(hi, lo, g, m, v, packs, a, sc); }));
        rep("adamw cs 512", med_ms([&] { k_one<true><<<(packs + 511) / 512, 512>>>(hi, lo, g, m, v, packs, a, sc); }));
        rep("adamw stride 132x8x256", med_ms([&] { k_stride<<<prop.multiProcessorCount * 8, 256>>>(hi, lo, g, m, v, packs, a, sc); }));
        rep("adamw stride 132x4x512", med_ms([&] { k_stride<<<prop.multiProcessorCount * 4, 512>>>(hi, lo, g, m, v, packs, a, sc); }));
        // copy of the same bytes: 16 B read + 12 B written per param ~ copy 14 B each way
        const size_t n4 = n / 4;  // all of g into m: 8 B a param moved, scaled to 28 below
        { float ms = med_ms([&] { k_copy<<<(n4 + 255) / 256, 256>>>((int4*)m, (const int4*)g, n4); }); printf("%-34s %8.3f ms  %6.3f TB/s\n", "copy 4n bytes", ms, 8.0 * n / ms / 1e9); }
        printf("%-34s %8.3f ms\n", "memset grads (4 B/param)", med_ms([&] { cudaMemsetAsync(g, 0, n * 4); }));
    }
    CK(cudaFree(hi)); CK(cudaFree(lo)); CK(cudaFree(m)); CK(cudaFree(v)); CK(cudaFree(g));
    // ---- cuBLASLt dW, beta 0 vs 1
    cublasLtHandle_t h; LK(cublasLtCreate(&h)); size_t ws = 32 << 20; void* wsp; CK(cudaMalloc(&wsp, ws));
    struct S { const char* name; int M, K, N; };
    std::vector<S> shapes = {{"1.5B qkv dW", 16384, 1600, 4800}, {"1.5B proj dW", 16384, 1600, 1600}, {"1.5B fc dW", 16384, 1600, 6400},
                             {"1.5B fcproj dW", 16384, 6400, 1600}, {"1.5B wte dW chunk", 4096, 50304, 1600}, {"1.5B wte dW full", 16384, 50304, 1600},
                             {"350M qkv dW", 16384, 1024, 3072}, {"350M proj dW", 16384, 1024, 1024}, {"350M fc dW", 16384, 1024, 4096}, {"350M fcproj dW", 16384, 4096, 1024}};
    for (auto& s : shapes) {
        bf16 *x, *dy; float* out;
        CK(cudaMalloc(&x, (size_t)s.M * s.K * 2)); CK(cudaMalloc(&dy, (size_t)s.M * s.N * 2)); CK(cudaMalloc(&out, (size_t)s.K * s.N * 4));
        CK(cudaMemset(x, 0x3c, (size_t)s.M * s.K * 2)); CK(cudaMemset(dy, 0x3c, (size_t)s.M * s.N * 2)); CK(cudaMemset(out, 0, (size_t)s.K * s.N * 4));
        LtPlan p0 = plan_dw(h, s.M, s.K, s.N, 0.f, ws), p1 = plan_dw(h, s.M, s.K, s.N, 1.f, ws);
        float one = 1, zero = 0; float t0 = 0, t1 = 0;
        for (int r = 0; r < 3; r++) {
            t0 += med_ms([&] { LK(cublasLtMatmul(h, p0.d, &one, dy, p0.a, x, p0.b, &zero, out, p0.c, out, p0.c, &p0.algo, wsp, ws, 0)); }, 7);
            t1 += med_ms([&] { LK(cublasLtMatmul(h, p1.d, &one, dy, p1.a, x, p1.b, &one, out, p1.c, out, p1.c, &p1.algo, wsp, ws, 0)); }, 7);
        }
        printf("%-20s beta0 %7.3f ms  beta1 %7.3f ms  ratio %.3f\n", s.name, t0 / 3, t1 / 3, t1 / t0);
        CK(cudaFree(x)); CK(cudaFree(dy)); CK(cudaFree(out));
    }
    return 0;
}
