// The CODA GEMM engine's Hopper mainloop against cuBLASLt on every GEMM shape of one GPT-2
// training step (350M and 1.5B at B*T = 16384 tokens, forward, dX and dW, LM head) and the C=4096
// forward shapes; then each fused epilogue program of coda_programs.cuh on its natural shape of
// one model (--model: 1.5B by default, or 350M) against the plain GEMM of that shape; then the
// passes without a GEMM (QkvGradient at 350M and 1.5B, CrossEntropyGradient) against a
// device-to-device copy of the bytes they must move.
//
//   bench_gemm [--json FILE] [--reps N] [--sweep] [--only SUBSTRING] [--no-fused] [--energy SECONDS] [--model M]
//   bench_gemm --ablate [--json FILE] [--reps N] [--model M]
//
// Each shape: a correctness check against cuBLASLt's output (relative Frobenius error, our
// output poisoned with NaN first), then --reps timed rounds (CUDA events, after warm-up), each
// running cuBLASLt then ours (a fused program: our plain GEMM, then the program), rotating among
// input sets when the inputs fit in L2: the medians of each, and as the ratio the median of the
// rounds' ratios (paired_median_ms: the two calls of a round share the GPU's clock state; our
// plain GEMM's median alone moved by up to 10% between two runs in one process). --sweep also
// times every tile configuration of the mainloop with K unsplit (the default times the engine's
// plan: its tile configuration and split-K factor, "/kS" in the tile column). Prints a table, the
// geometric-mean ratio last, and appends "gemm" records (../shared/design/RESULTS.md, with
// paired_ratio) to --json.
// --energy S: the GPU draws up to its power limit under long GEMM runs (the H200 caps at 700 W,
// and the trainer runs there), so the short timed rounds above need not rank the contenders as a
// training step does. With --energy each shape of --model's model also runs each contender back
// to back for about S seconds after a quarter of that as warm-up, and reads the GPU's energy
// counter (NVML) around the run: ms a call, joules a call, mean watts. Contenders: cuBLASLt and
// our plan (with --sweep every tile configuration) for the plain shapes; for the fused programs
// cuBLASLt's plain GEMM, our plain GEMM and the program, each program on every tile configuration
// with --sweep.
// Records of program "...:energy" carry ours_ms / ours_j / ours_w and the same of the reference.
// --model 350m|1.5b (default 1.5b): the model whose shapes the fused programs, --ablate and
// --energy run; at 350M every forward GEMM and the LM head's have K = 1024, 0.64 times 1.5B's mainloop a
// tile for the same epilogue.
// --ablate instead times, for the programs above 1.08x their plain GEMM, what each part of the
// program's element() adds: each rung of a ladder (Bench::ablation) on ping-pong 128 x 128 against
// the plain GEMM on that tile, paired; records of program "ablate:<rung>".
// NVML's counter is coarse: on the H200, windows of 0.6 s gave the ms a call steadily but the
// same contender's J a call 20% apart between runs (bench/NOTES_gemm_sm90.md, seventeenth session).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.cuh"
#include "coda_programs.cuh"
#include "common.cuh"
#include "device.hpp"
#include "gemm.cuh"
#include "gemm_sm90.cuh"
#include "matmul.cuh"
#include "results.hpp"

using namespace codagpt;
using namespace codagpt::coda;
using codagpt::bench::fill;
using codagpt::bench::Sustained;

namespace {

constexpr int kTokens = 16384;  // B*T = 16 * 1024
constexpr int kVocabPadded = 50304, kVocab = 50257;

// ---------------------------------------------------------------- device helpers
template <class T>
__global__ void poison_kernel(T* p, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        p[i] = (T)NAN;
}
// sums[0] += sum (a - b)^2, sums[1] += sum b^2; a non-finite a makes sums[0] NaN.
template <class T>
__global__ void diff_kernel(const T* a, const T* b, long n, double* sums) {
    double d2 = 0, r2 = 0;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const double x = (double)(float)a[i], y = (double)(float)b[i];
        d2 += (x - y) * (x - y);
        r2 += y * y;
    }
    for (int off = 16; off > 0; off /= 2) {
        d2 += __shfl_xor_sync(0xffffffffu, d2, off);
        r2 += __shfl_xor_sync(0xffffffffu, r2, off);
    }
    if (threadIdx.x % 32 == 0) {
        atomicAdd(&sums[0], d2);
        atomicAdd(&sums[1], r2);
    }
}

template <class T>
void poison(T* p, long n) {
    poison_kernel<<<1024, 256>>>(p, n);
    CUDA_CHECK_LAUNCH(poison_kernel);
}
template <class T>
double rel_error(const T* ours, const T* ref, long n) {
    double* sums;
    CUDA_CHECK(cudaMalloc(&sums, 2 * sizeof(double)));
    CUDA_CHECK(cudaMemset(sums, 0, 2 * sizeof(double)));
    diff_kernel<<<1024, 256>>>(ours, ref, n, sums);
    CUDA_CHECK_LAUNCH(diff_kernel);
    double h[2];
    CUDA_CHECK(cudaMemcpy(h, sums, sizeof h, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(sums));
    return std::sqrt(h[0] / h[1]);  // NaN when any output is NaN
}

// Device buffers freed at scope exit.
struct Buffers {
    std::vector<void*> ptrs;
    template <class T>
    T* get(long n) {
        void* p;
        CUDA_CHECK(cudaMalloc(&p, std::max(n, 1l) * sizeof(T)));
        ptrs.push_back(p);
        return (T*)p;
    }
    ~Buffers() {
        for (void* p : ptrs) cudaFree(p);
    }
};

// ---------------------------------------------------------------- shapes
// out[M, N] (+)= A[M, K] B[K, N]; a_t: A stored [K, M]; b_t: B stored [N, K]; accumulate: fp32 +=
// (weight gradients), else bf16 store.
struct Shape {
    std::string model, name;
    int M, N, K;
    bool a_t, b_t, accumulate;
    std::string layout() const { return std::string(a_t ? "A^T" : "A") + (b_t ? " B^T" : " B"); }
    double flops() const { return 2.0 * M * N * K; }
    bool timed() const { return model != "odd"; }
};

// The GPT-2 models whose training shapes are timed (their names are --model's values), with their width C.
struct GptModel {
    const char* name;
    int C;
};
constexpr GptModel kModels[] = {{"350m", 1024}, {"1.5b", 1600}};

std::vector<Shape> training_shapes() {
    std::vector<Shape> s;
    for (auto [model, C] : kModels) {
        const int T = kTokens, V = kVocabPadded;
        // forward: x[T, C] W[C, N]; LM head x wte^T with wte stored [V, C]
        s.push_back({model, "qkv fwd", T, 3 * C, C, false, false, false});
        s.push_back({model, "proj fwd", T, C, C, false, false, false});
        s.push_back({model, "fc fwd", T, 4 * C, C, false, false, false});
        s.push_back({model, "fcproj fwd", T, C, 4 * C, false, false, false});
        s.push_back({model, "lmhead fwd", T, V, C, false, true, false});
        // dX: dz[T, N] W^T with W stored [in, out] = [N_dx, K_dx]; LM head dlogits[T, V] wte[V, C]
        s.push_back({model, "qkv dX", T, C, 3 * C, false, true, false});
        s.push_back({model, "proj dX", T, C, C, false, true, false});
        s.push_back({model, "fc dX", T, C, 4 * C, false, true, false});
        s.push_back({model, "fcproj dX", T, 4 * C, C, false, true, false});
        s.push_back({model, "lmhead dX", T, C, V, false, false, false});
        // dW (fp32, accumulated): x^T dz with x stored [T, in]; LM head dlogits^T x -> dwte[V, C]
        s.push_back({model, "qkv dW", C, 3 * C, T, true, false, true});
        s.push_back({model, "proj dW", C, C, T, true, false, true});
        s.push_back({model, "fc dW", C, 4 * C, T, true, false, true});
        s.push_back({model, "fcproj dW", 4 * C, C, T, true, false, true});
        s.push_back({model, "lmhead dW", V, C, T, true, false, true});
    }
    const int C = 4096, T = kTokens;
    // Awkward sizes (no dimension a tile multiple), checked but not timed: every layout pair that
    // training uses, bf16 store and fp32 accumulate.
    s.push_back({"odd", "store", 136, 200, 72, false, false, false});
    s.push_back({"odd", "store B^T", 136, 200, 72, false, true, false});
    s.push_back({"odd", "accumulate", 136, 200, 72, true, false, true});
    s.push_back({"odd", "store 2", 1000, 1600, 6400, false, false, false});
    s.push_back({"odd", "store B^T 2", 392, 328, 200, false, true, false});
    s.push_back({"odd", "accumulate 2", 1600, 1000, 520, true, false, true});
    s.push_back({"c4096", "qkv fwd", T, 3 * C, C, false, false, false});
    s.push_back({"c4096", "proj fwd", T, C, C, false, false, false});
    s.push_back({"c4096", "fc fwd", T, 4 * C, C, false, false, false});
    s.push_back({"c4096", "fcproj fwd", T, C, 4 * C, false, false, false});
    s.push_back({"c4096", "lmhead fwd", T, kVocabPadded, C, false, true, false});
    return s;
}

struct Inputs {
    std::vector<const bf16*> a, b;  // rotating sets
};

// The training shape of `model` ("350m" or "1.5b") a fused program is timed on (Bench::fused_programs
// and Bench::ablation).
Shape fused_shape(const std::string& model, const std::string& gemm) {
    for (const Shape& s : training_shapes())
        if (s.model == model && s.name == gemm) return s;
    throw Error("no " + model + " shape " + gemm);
}

GemmProblem problem(const Shape& s, const bf16* a, const bf16* b) {
    GemmProblem p;
    p.M = s.M;
    p.N = s.N;
    p.K = s.K;
    p.a = {a, Layout{s.a_t ? s.M : s.K, s.a_t}};
    p.b = {b, Layout{s.b_t ? s.K : s.N, s.b_t}};
    return p;
}

// cuBLASLt through the trainer's Matmul, same operands and output type.
void cublas_gemm(Matmul& mm, const Shape& s, const bf16* a, const bf16* b, void* out) {
    if (s.accumulate) {
        if (!s.a_t || s.b_t) throw Error("accumulate shapes are A^T B");
        mm.backward_weight((float*)out, a, b, /*M=*/s.K, /*K=*/s.M, /*N=*/s.N, /*accumulate=*/true, 0);
    } else if (s.a_t) {
        throw Error("A^T with bf16 output is not a training shape");
    } else if (s.b_t) {
        mm.forward_nt((bf16*)out, a, b, s.M, s.K, s.N, 0);
    } else {
        mm.forward((bf16*)out, a, b, nullptr, s.M, s.K, s.N, 0);
    }
}

PlainStore<bf16> plain_store(bf16* out, int n) {
    PlainStore<bf16> p;
    p.out = {out, Layout{n, false}};
    return p;
}
PlainAccumulate plain_accumulate(float* dw, int n) {
    PlainAccumulate p;
    p.dw = {dw, Layout{n, false}};
    return p;
}

// tile < 0: the engine's plan; else that tile configuration, K unsplit.
template <class P>
void ours(const P& program, const GemmProblem& prob, int tile) {
    if (tile < 0) sm90::gemm(program, prob, 0);
    else sm90::detail::gemm_with_plan(program, prob, {sm90::kTiles[tile], 1}, 0);
}

// The engine's plan for program type P on prob: "128x256", or "128x256/k4" with K split 4 ways.
template <class P = void>
std::string plan_name(const GemmProblem& prob) {
    const sm90::detail::Plan p = sm90::plan<P>(prob);
    return sm90::tile_name(p.tile) + (p.splits > 1 ? "/k" + std::to_string(p.splits) : std::string());
}

// ---------------------------------------------------------------- --ablate: where an epilogue's time goes
// The fused programs that run slower than their plain GEMM, rebuilt as ladders: each rung a variant
// of element() with one part more than the one before, the trainer's program the last rung
// (Bench::ablation). The variants exist only here.
namespace ablation {
// GeluBackward: df = acc gelu'(f), g = gelu(f), the fold's row partials (m1, m2), its column partials (db).
struct DfTimesF : NoRowPartials, NoColPartials {  // the tile load and one store, no GELU
    LoadTile<bf16> f;
    StoreTile<bf16> df;
    template <class E>
    CODA_HD void element(const E& e, Row&, Col&) const { df.store(e, e.acc * f(e)); }
};
struct GeluDf : NoRowPartials, NoColPartials {  // + gelu'(f)
    LoadTile<bf16> f;
    StoreTile<bf16> df;
    template <class E>
    CODA_HD void element(const E& e, Row&, Col&) const { df.store(e, e.acc * gelu_grad(f(e))); }
};
struct GeluDfG : NoRowPartials, NoColPartials {  // + g stored
    LoadTile<bf16> f;
    StoreTile<bf16> g, df;
    template <class E>
    CODA_HD void element(const E& e, Row&, Col&) const {
        const GeluValues gv = gelu_values(f(e));
        g.store(e, gv.g);
        df.store(e, e.acc * gv.grad);
    }
};
// FcForward: f = LN fold, g = gelu(f). Without the GELU: g = f stored twice.
struct FcNoGelu : NoRowPartials, NoColPartials {
    LnFold ln;
    StoreTile<bf16> f, g;
    template <class E>
    CODA_HD void element(const E& e, Row&, Col&) const { g.store(e, f.store(e, ln(e))); }
};
// LmHeadForward without its LSE partials (the target gather kept).
struct LmNoLse : NoRowPartials, NoColPartials {
    LnFold ln;
    StoreTile<bf16> logits;
    Gather target_logit;
    template <class E>
    CODA_HD void element(const E& e, Row&, Col&) const { target_logit.take(e, logits.store(e, ln(e))); }
};
// ResidualForward without its Welford row partials, and with sums of x and x^2 instead.
struct ResNoStats : NoRowPartials, NoColPartials {
    ColVec bias;
    LoadTile<bf16> residual;
    StoreTile<bf16> x_out;
    template <class E>
    CODA_HD void element(const E& e, Row&, Col&) const { x_out.store(e, e.acc + bias(e) + residual(e)); }
};
struct ResSums : NoColPartials {
    ColVec bias;
    LoadTile<bf16> residual;
    StoreTile<bf16> x_out;
    RowPartials<Sum> s1, s2;
    struct Row {
        Sum s1, s2;
        CODA_HD void combine(const Row& o) { s1.combine(o.s1); s2.combine(o.s2); }
    };
    template <class E>
    CODA_HD void element(const E& e, Row& row, Col&) const {
        const float x = x_out.store(e, e.acc + bias(e) + residual(e));
        row.s1.add(x);
        row.s2.add(x, x);
    }
    CODA_HD void write_row(const Row& row, RowSlot s) const { s1.write(row.s1, s); s2.write(row.s2, s); }
};
// LnBackwardX: dx = r (gamma acc - m1 - xhat m2) + dres, LN(x) stored over x, three column
// partials. Its rungs: the LayerNorm backward with x loaded and dx stored, + dres loaded (kDres),
// + LN(x) stored (kLn), + the column partials (the program).
template <bool kDres, bool kLn>
struct LnDx : NoRowPartials, NoColPartials {
    RowVec mu, rstd, m1, m2;
    ColVec gamma, beta;
    LoadTile<bf16> x, dres;
    StoreTile<bf16> ln_out, dx_out;
    template <class E>
    CODA_HD void element(const E& e, Row&, Col&) const {
        const float r = rstd(e), xhat = (x(e) - mu(e)) * r, gamma_j = gamma(e);
        if constexpr (kLn) ln_out.store(e, fmaf(xhat, gamma_j, beta(e)));
        dx_out.store(e, r * (gamma_j * e.acc - m1(e) - xhat * m2(e)) + (kDres ? dres(e) : 0.f));
    }
};
}  // namespace ablation

struct Row {
    std::string label;
    double ratio;  // median of the rounds' ours / reference times
};

// The command line, read before anything touches the GPU: a bad option gets its error line on any machine.
struct Options {
    std::string json, only, model = "1.5b";
    int reps = 30;
    bool sweep = false, programs = true, ablate = false;  // programs: the fused programs and passes (--no-fused: off)
    double energy_seconds = 0;
};

// The options (model: the fused programs', the ladders' and --energy's shapes), and what a run keeps.
struct Bench : Options {
    explicit Bench(const Options& o) : Options(o) {}
    Matmul mm;
    std::string command, gpu;
    long l2_bytes = 0;
    std::vector<Row> plain_rows, fused_rows;
    FILE* log = stdout;
    int failures = 0;
    std::unique_ptr<GpuEnergy> meter;    // NVML's energy counter, where --energy asked for it

    // A contender back to back for about energy_seconds (est_ms: a call's time in the timed rounds).
    template <class F>
    Sustained sustained(F&& f, double est_ms) {
        return bench::sustained(f, est_ms, energy_seconds, *meter);
    }
    bool energy_for(const Shape& s) const { return meter && s.model == model; }
    void print_energy(const char* what, const Sustained& e) {
        fprintf(log, "    energy %-26s %9.4f ms %8.4f J %5.0f W\n", what, e.ms, e.j, e.w);
        fflush(log);
    }
    // `lt`: cuBLASLt's plain GEMM of the shape, run the same way.
    void record_energy(const Shape& s, const std::string& program, const std::string& tile, const Sustained& e,
                       const Sustained& lt) {
        append_gemm_record(s, program + ":energy", e.ms, tile,
                           {{"sustained_s", energy_seconds},
                            {"ours_j", e.j},
                            {"ours_w", e.w},
                            {"cublaslt_ms", lt.ms},
                            {"cublaslt_j", lt.j},
                            {"cublaslt_w", lt.w}});
    }

    // t: ours against the reference named ref_key ("cublaslt_ms", "plain_ms" or "copy_ms"); `more`:
    // further keys of the record.
    void record(const Shape& s, const std::string& program, const PairedTimes& t, const char* ref_key,
                const std::string& tile, double err, const nlohmann::json& more = nlohmann::json::object()) {
        nlohmann::json r = more;
        r[ref_key] = t.ref_ms;
        r["paired_ratio"] = t.ratio;  // median of the rounds' ours_ms / ref_key times
        r["rel_err"] = err;
        append_gemm_record(s, program, t.ms, tile, std::move(r));
    }
    // The keys every "gemm" record has, added to r, which --json then receives.
    void append_gemm_record(const Shape& s, const std::string& program, double ours_ms, const std::string& tile,
                            nlohmann::json r) {
        if (json.empty()) return;
        r["kind"] = "gemm";
        r["gpu"] = gpu;
        r["shape"] = {{"M", s.M}, {"N", s.N}, {"K", s.K}, {"layout", s.layout()}};
        r["model"] = s.model;
        r["gemm"] = s.name;
        r["program"] = program;
        r["ours_ms"] = ours_ms;
        r["ours_tflops"] = s.flops() / ours_ms * 1e-9;
        r["tile"] = tile;
        stamp_record(r, command);
        append_record(json, r);
    }

    void plain(const Shape& s) {
        Buffers buf;
        const long a_n = (long)s.M * s.K, b_n = (long)s.K * s.N, out_n = (long)s.M * s.N;
        const long in_bytes = (a_n + b_n) * 2;
        const int sets = in_bytes < 2 * l2_bytes ? 3 : 1;  // inputs that fit in L2 rotate
        std::vector<bf16*> a(sets), b(sets);
        for (int i = 0; i < sets; i++) {
            a[i] = buf.get<bf16>(a_n);
            b[i] = buf.get<bf16>(b_n);
            fill(a[i], a_n, 17 + i);
            fill(b[i], b_n, 91 + i);
        }
        void *out, *ref;
        if (s.accumulate) {
            out = buf.get<float>(out_n);
            ref = buf.get<float>(out_n);
        } else {
            out = buf.get<bf16>(out_n);
            ref = buf.get<bf16>(out_n);
        }
        auto run_ours = [&](int set, int tile) {
            const GemmProblem prob = problem(s, a[set], b[set]);
            if (s.accumulate) ours(plain_accumulate((float*)out, s.N), prob, tile);
            else ours(plain_store((bf16*)out, s.N), prob, tile);
        };
        // Correctness: the same start for the accumulating shapes; ours poisoned otherwise. With
        // --sweep every tile configuration is checked, else the one the engine picks.
        auto check = [&](int tile) {
            if (s.accumulate) {
                fill((float*)out, out_n, 5);
                fill((float*)ref, out_n, 5);
                cublas_gemm(mm, s, a[0], b[0], ref);
                run_ours(0, tile);
                return rel_error((const float*)out, (const float*)ref, out_n);
            }
            poison((bf16*)out, out_n);
            cublas_gemm(mm, s, a[0], b[0], ref);
            run_ours(0, tile);
            return rel_error((const bf16*)out, (const bf16*)ref, out_n);
        };
        const double bound = s.accumulate ? 1e-4 : 1e-2;
        double err = check(-1);
        std::string failed;
        if (sweep)
            for (int t = 0; t < sm90::kNumTiles; t++) {
                const double e = check(t);
                if (!(e <= bound)) failed += std::string(" ") + sm90::tile_name(sm90::kTiles[t]);
                err = std::max(err, e);
            }
        const bool ok = err <= bound && failed.empty();  // false for NaN too
        if (!ok) failures++;
        const std::string tile = plan_name(problem(s, a[0], b[0]));
        if (!s.timed() || !ok) {
            fprintf(log, "%-18s %6d %6d %6d %-7s %-12s  err %.2e %s%s\n", (s.model + " " + s.name).c_str(), s.M, s.N,
                    s.K, s.layout().c_str(), tile.c_str(), err, ok ? "ok" : "FAIL", failed.c_str());
            return;
        }

        const PairedTimes t = paired_median_ms([&](int r) { cublas_gemm(mm, s, a[r % sets], b[r % sets], ref); },
                                               [&](int r) { run_ours(r % sets, -1); }, reps);
        std::string sweep_text;
        if (sweep)
            for (int k = 0; k < sm90::kNumTiles; k++) {
                const double tms = median_ms([&](int r) { run_ours(r % sets, k); }, reps);
                char b2[64];
                snprintf(b2, sizeof b2, " %s %.4f", sm90::tile_name(sm90::kTiles[k]), tms);
                sweep_text += b2;
            }
        const std::string label = s.model + " " + s.name;
        fprintf(log, "%-18s %6d %6d %6d %-7s %-12s %9.4f %9.4f %6.3f %7.1f  err %.2e %s%s%s\n", label.c_str(), s.M,
                s.N, s.K, s.layout().c_str(), tile.c_str(), t.ms, t.ref_ms, 1.0 / t.ratio, s.flops() / t.ms * 1e-9, err,
                ok ? "ok" : "FAIL", sweep ? " |" : "", sweep_text.c_str());
        fflush(log);
        plain_rows.push_back({label, t.ratio});
        record(s, "plain", t, "cublaslt_ms", tile, err);
        if (!energy_for(s)) return;
        const Sustained lt = sustained([&](int r) { cublas_gemm(mm, s, a[r % sets], b[r % sets], ref); }, t.ref_ms);
        print_energy("cuBLASLt", lt);
        const Sustained plan = sustained([&](int r) { run_ours(r % sets, -1); }, t.ms);
        print_energy(("ours " + tile).c_str(), plan);
        record_energy(s, "plain", tile, plan, lt);
        if (sweep)
            for (int k = 0; k < sm90::kNumTiles; k++) {
                const Sustained e = sustained([&](int r) { run_ours(r % sets, k); }, t.ms);
                const std::string name = sm90::tile_name(sm90::kTiles[k]);
                print_energy(("ours " + name).c_str(), e);
                record_energy(s, "plain", name, e, lt);
            }
    }

    // A fused program on `s` against our plain GEMM of the same shape and output type.
    template <class MakeProgram>
    void fused(const Shape& s, const std::string& name, MakeProgram make) {
        Buffers buf;
        const long out_n = (long)s.M * s.N;
        const GemmProblem prob = filled_problem(buf, s);
        using P = decltype(make(buf, prob, TileShape{}));  // not evaluated
        const TileShape ts = sm90::tile_shape<P>(prob);
        const auto program = make(buf, prob, ts);
        const std::string program_plan = plan_name<P>(prob), plain_plan = plan_name(prob);
        void* plain_out = s.accumulate ? (void*)buf.get<float>(out_n) : (void*)buf.get<bf16>(out_n);
        auto run_plain = [&](int) {
            if (s.accumulate) sm90::gemm(plain_accumulate((float*)plain_out, s.N), prob, 0);
            else sm90::gemm(plain_store((bf16*)plain_out, s.N), prob, 0);
        };
        const PairedTimes t = paired_median_ms(run_plain, [&](int) { sm90::gemm(program, prob, 0); }, reps);
        const std::string label = s.model + " " + s.name + " " + name;
        fprintf(log, "%-36s %9.4f %9.4f %6.3f\n", label.c_str(), t.ms, t.ref_ms, t.ratio);
        fflush(log);
        fused_rows.push_back({label, t.ratio});
        record(s, name, t, "plain_ms", program_plan, NAN);
        if (!energy_for(s)) return;
        const Sustained lt = sustained([&](int) { cublas_gemm(mm, s, prob.a.p, prob.b.p, plain_out); }, t.ref_ms);
        print_energy("cuBLASLt plain", lt);
        const Sustained plain = sustained(run_plain, t.ref_ms);
        print_energy(("ours plain " + plain_plan).c_str(), plain);
        record_energy(s, "plain", plain_plan, plain, lt);
        const Sustained prog = sustained([&](int) { sm90::gemm(program, prob, 0); }, t.ms);
        print_energy((name + " " + program_plan).c_str(), prog);
        record_energy(s, name, program_plan, prog, lt);
        if (sweep)
            for (int k = 0; k < sm90::kNumTiles; k++) {
                // partials buffers sized for this tile configuration
                const auto tiled = make(buf, prob, sm90::detail::tile_shape_of(sm90::kTiles[k]));
                const Sustained e = sustained(
                    [&](int) { sm90::detail::gemm_with_plan(tiled, prob, {sm90::kTiles[k], 1}, 0); }, t.ms);
                const std::string tile = sm90::tile_name(sm90::kTiles[k]);
                print_energy((name + " " + tile).c_str(), e);
                record_energy(s, name, tile, e, lt);
            }
    }

    // Filled inputs and the outputs of a fold's dz producer, for the programs below.
    static float* vec(Buffers& b, long n, unsigned seed, float scale = 1.f, float offset = 0.f) {
        float* p = b.get<float>(n);
        fill(p, n, seed, scale, offset);
        return p;
    }
    static bf16* act(Buffers& b, long n, unsigned seed, float scale = 1.f) {
        bf16* p = b.get<bf16>(n);
        fill(p, n, seed, scale);
        return p;
    }
    // Target column i * 7919 mod vocab of each of the M rows.
    static int* targets(Buffers& b, int M) {
        std::vector<int> host(M);
        for (int i = 0; i < M; i++) host[i] = (int)((i * 7919l) % kVocab);
        int* t = b.get<int>(M);
        CUDA_CHECK(cudaMemcpy(t, host.data(), M * sizeof(int), cudaMemcpyHostToDevice));
        return t;
    }
    template <bool kBias = true>
    static FoldGradient<kBias> fold_grad(Buffers& b, const GemmProblem& p, const TileShape& ts) {
        const long tn = n_tiles(p.N, ts.bn), tm = n_tiles(p.M, ts.bm);
        FoldGradient<kBias> f;
        f.c = {vec(b, p.N, 23)};
        f.b_folded = {vec(b, p.N, 24)};
        f.m1 = {b.get<float>(p.M * tn)};
        f.m2 = {b.get<float>(p.M * tn)};
        if constexpr (kBias) f.db = {b.get<float>(tm * p.N)};
        return f;
    }

    // Shape s with filled operands: what fused() and ablation() time their programs on.
    static GemmProblem filled_problem(Buffers& b, const Shape& s) {
        return problem(s, act(b, (long)s.M * s.K, 3), act(b, (long)s.K * s.N, 4));
    }
    // The trainer's programs on filled inputs, partials sized for tile shape ts: fused_programs()
    // times them, ablation() takes them apart.
    static LnFold ln_fold(Buffers& b, const GemmProblem& p) {
        return LnFold{{vec(b, p.M, 11)}, {vec(b, p.M, 12, 0.1f, 1.f)}, {vec(b, p.N, 13)}, {vec(b, p.N, 14)}};
    }
    static StoreTile<bf16> out_tile(Buffers& b, const GemmProblem& p) {
        return {b.get<bf16>((long)p.M * p.N), Layout{p.N, false}};
    }
    static LoadTile<bf16> in_tile(Buffers& b, const GemmProblem& p, unsigned seed) {
        return {act(b, (long)p.M * p.N, seed), Layout{p.N, false}};
    }
    static QkvForward<bf16> qkv_forward(Buffers& b, const GemmProblem& p, const TileShape&) {
        return {{}, {}, ln_fold(b, p), out_tile(b, p)};
    }
    static ResidualForward<bf16> residual_forward(Buffers& b, const GemmProblem& p, const TileShape& ts) {
        ResidualForward<bf16> r;
        r.bias = {vec(b, p.N, 31)};
        r.residual = in_tile(b, p, 32);
        r.x_out = out_tile(b, p);
        r.row_stats = {b.get<float>((long)p.M * n_tiles(p.N, ts.bn) * 3)};
        return r;
    }
    static FcForward<bf16> fc_forward(Buffers& b, const GemmProblem& p, const TileShape&) {
        return {{}, {}, ln_fold(b, p), out_tile(b, p), out_tile(b, p)};
    }
    static LmHeadForward<bf16> lm_head_forward(Buffers& b, const GemmProblem& p, const TileShape& ts) {
        LmHeadForward<bf16> l;
        l.ln = ln_fold(b, p);
        l.logits = out_tile(b, p);
        l.vocab = kVocab;
        l.lse_partials = {b.get<float>((long)p.M * n_tiles(p.N, ts.bn) * 2)};
        l.target_logit = {targets(b, p.M), b.get<float>(p.M)};
        return l;
    }
    static GeluBackward<bf16> gelu_backward(Buffers& b, const GemmProblem& p, const TileShape& ts) {
        return {in_tile(b, p, 41), out_tile(b, p), out_tile(b, p), fold_grad(b, p, ts)};
    }
    static LnBackwardX<bf16> ln_backward_x(Buffers& b, const GemmProblem& p, const TileShape& ts) {
        LnBackwardX<bf16> l;
        l.mu = {vec(b, p.M, 51)};
        l.rstd = {vec(b, p.M, 52, 0.1f, 1.f)};
        l.m1 = {vec(b, p.M, 53)};
        l.m2 = {vec(b, p.M, 54)};
        l.gamma = {vec(b, p.N, 57, 0.1f, 1.f)};
        l.beta = {vec(b, p.N, 58)};
        bf16* x = act(b, (long)p.M * p.N, 55);
        l.x = {x, Layout{p.N, false}};
        l.dres = in_tile(b, p, 56);
        l.ln_out = {x, Layout{p.N, false}};  // over x, as the trainer
        l.dx_out = out_tile(b, p);
        const long tm = n_tiles(p.M, ts.bm);
        l.bias_grad = {b.get<float>(tm * p.N)};
        l.dgamma = {b.get<float>(tm * p.N)};
        l.dbeta = {b.get<float>(tm * p.N)};
        return l;
    }

    void fused_programs() {
        fused(fused_shape(model, "qkv fwd"), "QkvForward", qkv_forward);
        fused(fused_shape(model, "proj fwd"), "ResidualForward", residual_forward);
        fused(fused_shape(model, "fcproj fwd"), "ResidualForward", residual_forward);
        fused(fused_shape(model, "fc fwd"), "FcForward", fc_forward);
        fused(fused_shape(model, "lmhead fwd"), "LmHeadForward", lm_head_forward);
        fused(fused_shape(model, "fcproj dX"), "GeluBackward", gelu_backward);  // dres Wp^T
        fused(fused_shape(model, "fc dX"), "LnBackwardX", ln_backward_x);
    }

    // --ablate: each rung on ping-pong 128 x 128, the trainer's tile for these shapes, against our
    // plain GEMM on that tile, paired. One kernel a rung: A is K-major on every fused shape, so only
    // B's layout is dispatched (launch_layouts would build the three other layouts of every rung).
    template <class P>
    void time_rung(const Shape& s, const std::string& name, const P& program, const GemmProblem& prob, bf16* out) {
        if (s.a_t) throw Error("--ablate: " + s.name + " has a transposed A");
        using Cfg = sm90::CfgPingPong128x128;
        auto run = [&](const auto& p) {
            if (s.b_t) sm90::detail::launch<Cfg, false, false>(p, prob, 1, 0);
            else sm90::detail::launch<Cfg, false, true>(p, prob, 1, 0);
        };
        const PairedTimes t = paired_median_ms([&](int) { run(plain_store(out, s.N)); }, [&](int) { run(program); }, reps);
        const std::string label = s.model + " " + s.name + " " + name;
        fprintf(log, "%-44s %9.4f %9.4f %6.3f\n", label.c_str(), t.ms, t.ref_ms, t.ratio);
        fflush(log);
        record(s, "ablate:" + name, t, "plain_ms", "pp128x128", NAN);
    }

    // The ladders: each rung the one before with one part of the program's element() more, the
    // trainer's program (its fused_programs() setup) last.
    void ablation() {
        using namespace ablation;
        const TileShape ts = sm90::detail::tile_shape_of(sm90::Tile::kPingPong128x128);
        auto ladder = [&](const std::string& gemm, auto&& rungs) {
            const Shape s = fused_shape(model, gemm);
            Buffers b;
            const GemmProblem p = filled_problem(b, s);
            bf16* plain_out = out_tile(b, p).p;
            rungs(b, p, [&](const std::string& name, const auto& program) { time_rung(s, name, program, p, plain_out); });
        };
        ladder("fcproj dX", [&](Buffers& b, const GemmProblem& p, auto&& rung) {
            const GeluBackward<bf16> g = gelu_backward(b, p, ts);
            rung("df = acc f", DfTimesF{{}, {}, g.f, g.df});
            rung("+ gelu'", GeluDf{{}, {}, g.f, g.df});
            rung("+ g stored", GeluDfG{{}, {}, g.f, g.g, g.df});
            const FoldGradient<false> rows_only{g.fold.c, g.fold.b_folded, g.fold.m1, g.fold.m2, {}};
            rung("+ m1, m2", GeluBackward<bf16, false>{g.f, g.g, g.df, rows_only});
            rung("+ db (GeluBackward)", g);
        });
        ladder("fc fwd", [&](Buffers& b, const GemmProblem& p, auto&& rung) {
            const FcForward<bf16> f = fc_forward(b, p, ts);
            rung("f = LN fold", QkvForward<bf16>{{}, {}, f.ln, f.f});
            rung("+ g = f stored", FcNoGelu{{}, {}, f.ln, f.f, f.g});
            rung("+ gelu (FcForward)", f);
        });
        ladder("lmhead fwd", [&](Buffers& b, const GemmProblem& p, auto&& rung) {
            const LmHeadForward<bf16> l = lm_head_forward(b, p, ts);
            rung("z = LN fold", QkvForward<bf16>{{}, {}, l.ln, l.logits});
            rung("+ target gather", LmNoLse{{}, {}, l.ln, l.logits, l.target_logit});
            rung("+ LSE partials (LmHeadForward)", l);
        });
        ladder("proj fwd", [&](Buffers& b, const GemmProblem& p, auto&& rung) {
            const ResidualForward<bf16> r = residual_forward(b, p, ts);
            const long rows = (long)p.M * n_tiles(p.N, ts.bn);
            rung("x = acc + b + res", ResNoStats{{}, {}, r.bias, r.residual, r.x_out});
            rung("+ sums of x, x^2", ResSums{{}, r.bias, r.residual, r.x_out, {b.get<float>(rows)}, {b.get<float>(rows)}});
            rung("+ Welford (ResidualForward)", r);
        });
        ladder("fc dX", [&](Buffers& b, const GemmProblem& p, auto&& rung) {
            const LnBackwardX<bf16> l = ln_backward_x(b, p, ts);
            auto rung_of = [&](auto d, auto ln) {  // LnDx<d, ln> on this ladder's buffers
                return LnDx<decltype(d)::value, decltype(ln)::value>{{}, {}, l.mu, l.rstd, l.m1, l.m2, l.gamma, l.beta,
                                                                       l.x, l.dres, l.ln_out, l.dx_out};
            };
            rung("dx = LN backward, x loaded", rung_of(std::false_type{}, std::false_type{}));
            rung("+ dres loaded", rung_of(std::true_type{}, std::false_type{}));
            rung("+ LN(x) stored", rung_of(std::true_type{}, std::true_type{}));
            rung("+ column partials (LnBackwardX)", l);
        });
    }

    // A pass without a GEMM (K = 0: the engine's pass kernel) against a device-to-device copy of
    // the same bytes (`bytes`, read + written: what the pass must move), paired: the ratio, and the
    // pass's effective bandwidth over those bytes.
    template <class MakeProgram>
    void pass_program(const std::string& shape_model, const std::string& name, int M, int N, double bytes,
                      MakeProgram make) {
        Buffers buf;
        const GemmProblem prob{M, N, 0, {}, {}};
        const auto program = make(buf, prob);
        const long half = (long)(bytes / 2);
        char* src = buf.get<char>(half);
        char* dst = buf.get<char>(half);
        CUDA_CHECK(cudaMemset(src, 1, half));
        const PairedTimes t = paired_median_ms(
            [&](int) { CUDA_CHECK(cudaMemcpyAsync(dst, src, half, cudaMemcpyDeviceToDevice, 0)); },
            [&](int) { gemm(program, prob, 0); }, reps);
        const double tb_s = bytes / (t.ms * 1e-3) / 1e12;
        fprintf(log, "%-36s %9.4f %9.4f %6.3f %6.2f\n", (shape_model + " " + name).c_str(), t.ms, t.ref_ms, t.ratio,
                tb_s);
        fflush(log);
        // copy_ms: cudaMemcpyAsync of bytes / 2, in the same rounds
        record(Shape{shape_model, "pass", M, N, 0, false, false, false}, name, t, "copy_ms", "pass", NAN,
               {{"bytes", bytes}, {"ours_tb_s", tb_s}});
    }

    void pass_programs() {
        const int T = kTokens;
        for (auto [model_name, C] : kModels) {
            const int N = 3 * C;
            pass_program(model_name, "QkvGradient", T, N, 2.0 * T * N * 2, [&](Buffers& b, const GemmProblem& p) {
                QkvGradient<bf16> q;
                q.dqkv = {act(b, (long)p.M * p.N, 71), Layout{p.N, false}};
                q.qkv = {act(b, (long)p.M * p.N, 72), Layout{p.N, false}};
                q.fold = fold_grad(b, p, gemm_tile_shape(p));
                return q;
            });
        }
        pass_program("both", "CrossEntropyGradient", T, kVocabPadded, 2.0 * T * kVocabPadded * 2,
                     [&](Buffers& b, const GemmProblem& p) {
                         CrossEntropyGradient<bf16> c;
                         bf16* logits = act(b, (long)p.M * p.N, 81, 4.f);
                         c.logits = {logits, Layout{p.N, false}};
                         c.lse = {vec(b, p.M, 82, 1.f, 12.f)};
                         c.target = targets(b, p.M);
                         c.vocab = kVocab;
                         c.scale = 1.f / p.M;
                         c.dz = {logits, Layout{p.N, false}};  // in place, as the trainer
                         c.fold = fold_grad<false>(b, p, gemm_tile_shape(p));
                         return c;
                     });
    }
};

// Geometric mean of the rows' speed ratios (reference time / ours).
double speed_geomean(const std::vector<Row>& rows) {
    double s = 0;
    for (const Row& r : rows) s -= std::log(r.ratio);
    return rows.empty() ? NAN : std::exp(s / rows.size());
}

Options parse_options(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) throw Error(a + " needs a value");
            return argv[++i];
        };
        if (a == "--json") o.json = next();
        else if (a == "--reps") o.reps = (int)bench::number_option(a, next(), 1, /*integer=*/true);
        else if (a == "--sweep") o.sweep = true;
        else if (a == "--only") o.only = next();
        else if (a == "--no-fused") o.programs = false;
        else if (a == "--energy") o.energy_seconds = bench::number_option(a, next(), 0);
        else if (a == "--ablate") o.ablate = true;
        else if (a == "--model") o.model = next();
        else throw Error("unknown option " + a +
                         " (usage: bench_gemm [--json FILE] [--reps N] [--sweep] [--only SUBSTRING] [--no-fused]"
                         " [--energy SECONDS] [--model 350m|1.5b] [--ablate])");
    }
    bool known_model = false;
    std::string model_names;
    for (const GptModel& m : kModels) {
        known_model |= o.model == m.name;
        model_names += (model_names.empty() ? "" : ", ") + std::string(m.name);
    }
    if (!known_model)
        throw Error("--model " + o.model + ": not a model of the training shapes (" + model_names + ")");
    return o;
}

int run(int argc, char** argv) {
    const Options o = parse_options(argc, argv);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0 || !sm90::available()) {
        fprintf(stderr, "bench_gemm: needs a compute capability 9.0 GPU and a build with sm_90a\n");
        return 77;
    }
    Bench bench(o);
    if (bench.energy_seconds > 0) {
        bench.meter = GpuEnergy::open();
        if (!bench.meter) throw Error("--energy needs NVML's energy counter (libnvidia-ml.so.1)");
    }
    bench.command = join_command(argc, argv);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    bench.gpu = prop.name;
    bench.l2_bytes = prop.l2CacheSize;
    const sm90::detail::DeviceInfo& dev = sm90::detail::device_info();
    printf("%s, %d SMs, L2 %d MiB, HBM %.2f TB/s, plain GEMMs planned by the %s model, reps %d (median)\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, dev.dram_bytes_per_s / 1e12,
           sm90::detail::plan_costs(dev, true).card, bench.reps);
    if (o.ablate) {
        const std::string title = "rung on pp128x128 (" + bench.model + " shape)";
        printf("%-44s %9s %9s %6s\n", title.c_str(), "ms", "plain ms", "ratio");
        bench.ablation();
        return 0;
    }
    printf("%-18s %6s %6s %6s %-7s %-12s %9s %9s %6s %7s\n", "shape", "M", "N", "K", "layout", "tile", "ours ms",
           "cublas ms", "ratio", "TFLOP/s");
    for (const Shape& s : training_shapes())
        if (o.only.empty() || (s.model + " " + s.name).find(o.only) != std::string::npos) bench.plain(s);
    if (o.programs) {
        const std::string title = "fused program (" + bench.model + " shape)";
        printf("\n%-36s %9s %9s %6s\n", title.c_str(), "ms", "plain ms", "ratio");
        bench.fused_programs();
        printf("\n%-36s %9s %9s %6s %6s\n", "pass without a GEMM", "ms", "copy ms", "ratio", "TB/s");
        bench.pass_programs();
    }
    printf("\n");
    for (const Row& r : bench.fused_rows) printf("fused %-36s %.3fx plain\n", r.label.c_str(), r.ratio);
    if (!bench.plain_rows.empty())  // none where --only matched no plain shape
        printf("geomean cuBLASLt/ours (speed ratio ours vs cuBLASLt) over %zu shapes: %.4f\n", bench.plain_rows.size(),
               speed_geomean(bench.plain_rows));
    if (bench.failures) printf("%d shapes FAILED the check against cuBLASLt\n", bench.failures);
    return bench.failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        fprintf(stderr, "bench_gemm: %s\n", e.what());
        return 1;
    }
}
