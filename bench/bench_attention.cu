// What deterministic attention costs: causal flash attention forward and backward at a training
// config's shape, three ways.
//
//   cudnn-deterministic  cuDNN SDPA as the trainer runs it: the backward writes dQ straight from
//                        dS K (the dP-workspace engine), the same bits every run
//   cudnn-accumulator    cuDNN SDPA whose backward adds dQ into an fp32 accumulator with atomics
//                        (the frontend's default form; its dQ may differ run to run)
//   own                  our flash-attention kernels (kernels/attention.cu), the trainer's fallback
//
// Each variant: forward and backward, median of --reps calls (CUDA events, 3 untimed first); whether
// two backward calls on the same inputs, output poisoned before each, give the same bits; and the
// largest |difference| of its output and dqkv from the first variant's (cudnn-deterministic where
// the build has cuDNN), relative to the largest |value| of those. A step's worth is n_layer
// forward + backward calls.
//
//   bench_attention [--config NAME|PATH] [--reps N] [--json FILE]       (default gpt2-1.5b)
//
// Appends one "attention" record a variant to --json (../shared/design/RESULTS.md's common keys,
// then model, variant, batch, seq, n_head, head_size, fwd_ms, bwd_ms, step_ms, bwd_repeatable,
// out_rel_diff, dqkv_rel_diff).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attention.cuh"
#include "bench_util.cuh"
#include "common.cuh"
#include "config.hpp"
#include "results.hpp"

using namespace codagpt;

namespace {

std::vector<bf16> to_host(const bf16* p, long n) {
    std::vector<bf16> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    return h;
}

// max |a - ref| / max |ref|
double rel_diff(const std::vector<bf16>& a, const std::vector<bf16>& ref) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double r = (double)(float)ref[i];
        diff = std::max(diff, std::fabs((double)(float)a[i] - r));
        scale = std::max(scale, std::fabs(r));
    }
    return scale > 0 ? diff / scale : diff;
}

int run(int argc, char** argv) {
    std::string config = "gpt2-1.5b", json;
    int reps = 20;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) throw Error(a + " needs a value");
            return argv[++i];
        };
        if (a == "--config") config = next();
        else if (a == "--reps") reps = (int)bench::number_option(a, next(), 1, /*integer=*/true);
        else if (a == "--json") json = next();
        else throw Error("unknown option " + a + " (usage: bench_attention [--config NAME|PATH] [--reps N] [--json FILE])");
    }
    const TrainConfig cfg = load_config(config);
    const ModelConfig& m = cfg.model;
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        fprintf(stderr, "bench_attention: needs a CUDA GPU\n");
        return 77;
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const std::string command = join_command(argc, argv);
    const int B = cfg.batch_size, T = cfg.seq_len, NH = m.n_head, HS = m.n_embd / m.n_head;
    const long C = m.n_embd, BT = (long)B * T;

    bench::Buffers b;
    bf16 *qkv = b.make<bf16>(BT * 3 * C, 1.f), *dy = b.make<bf16>(BT * C, 1.f);
    bf16 *y = b.make<bf16>(BT * C, 0.f), *dqkv = b.make<bf16>(BT * 3 * C, 0.f);
    float* lse = b.make<float>(BT * NH, 0.f);

    // The variants, the reference first.
    struct Variant {
        const char* name;
        bool cudnn, deterministic;
    };
    const Variant variants[] = {{"cudnn-deterministic", true, true}, {"cudnn-accumulator", true, false}, {"own", false, true}};
    printf("%s; %s (%d layers), B = %d, T = %d, %d heads of %d; medians of %d calls\n", prop.name, cfg.name.c_str(),
           m.n_layer, B, T, NH, HS, reps);
    printf("%-20s %9s %9s %12s %11s %13s %13s\n", "variant", "fwd ms", "bwd ms", "step's ms", "bwd repeat", "out vs ref",
           "dqkv vs ref");
    std::vector<bf16> ref_y, ref_dqkv;
    for (const Variant& v : variants) {
        Attention attn(v.cudnn, v.deterministic);
        // Attention runs the own kernels where cuDNN is not built in or not usable: no cuDNN row then.
        if (v.cudnn && !attn.uses_cudnn()) continue;
        attn.reserve(B, T, NH, HS);
        auto forward = [&] { attn.forward(y, lse, qkv, B, T, NH, HS, 0); };
        auto backward = [&] { attn.backward(dqkv, dy, qkv, y, lse, B, T, NH, HS, 0); };
        // Outputs poisoned (0xFF bytes: bf16 NaN) before each checked call.
        CUDA_CHECK(cudaMemset(y, 0xFF, BT * C * sizeof(bf16)));
        forward();
        CUDA_CHECK(cudaMemset(dqkv, 0xFF, BT * 3 * C * sizeof(bf16)));
        backward();
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<bf16> hy = to_host(y, BT * C), hd = to_host(dqkv, BT * 3 * C);
        CUDA_CHECK(cudaMemset(dqkv, 0xFF, BT * 3 * C * sizeof(bf16)));
        backward();
        CUDA_CHECK(cudaDeviceSynchronize());
        const bool repeatable = std::memcmp(to_host(dqkv, BT * 3 * C).data(), hd.data(), hd.size() * sizeof(bf16)) == 0;
        if (ref_y.empty()) ref_y = hy, ref_dqkv = hd;  // the first variant is the reference
        const double out_diff = rel_diff(hy, ref_y), dqkv_diff = rel_diff(hd, ref_dqkv);

        const double fwd = median_ms(forward, reps), bwd = median_ms(backward, reps);
        const double step = m.n_layer * (fwd + bwd);
        printf("%-20s %9.3f %9.3f %12.2f %11s %13.2e %13.2e\n", v.name, fwd, bwd, step,
               repeatable ? "same bits" : "DIFFERS", out_diff, dqkv_diff);
        if (json.empty()) continue;
        nlohmann::json r = {{"kind", "attention"}, {"gpu", prop.name},          {"model", cfg.name},
                            {"variant", v.name},   {"batch", B},                {"seq", T},
                            {"n_head", NH},        {"head_size", HS},           {"fwd_ms", fwd},
                            {"bwd_ms", bwd},       {"step_ms", step},           {"bwd_repeatable", repeatable},
                            {"out_rel_diff", out_diff}, {"dqkv_rel_diff", dqkv_diff}, {"reps", reps}};
        stamp_record(r, command);
        append_record(json, r);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        fprintf(stderr, "bench_attention: %s\n", e.what());
        return 1;
    }
}
