// The energy of the parts of one GPT-2 training step that fusing the GEMM epilogues cannot remove.
//
// A GPU at its power limit runs a step in its energy divided by the limit: on the H200 (700 W)
// both training paths run there (README "Measured"), so a fused path is faster than the unfused
// one only by the energy it saves. This runs, back to back for about S seconds each, a step's
// worth (the batch and sequence length of a training config: 16 x 1024 for the GPT-2 configs) of:
//   gemm       the step's GEMMs on cuBLASLt, as the unfused path calls them (Matmul): per layer the
//              qkv, proj, fc and fcproj forward (with bias), their dX and dW (fp32, accumulated),
//              then the tied LM head's forward, dW and dX; every layer's weights and gradients
//              their own, as in training
//   attention  cuDNN flash attention (the trainer's Attention), forward and backward, every layer
//   optimizer  the global gradient norm, the clip scale and AdamW over every parameter
// and reads the GPU's energy counter (NVML) around each run: ms, joules and mean watts a step's
// worth. Every CODA schedule keeps these; their sum is a floor under the energy of any step made
// of these kernels, and the unfused step's measured energy over it bounds what fusing the rest can
// gain on a GPU that runs at its power limit.
//
//   bench_step_energy [--config NAME|PATH] [--seconds S] [--json FILE]     (default gpt2-1.5b)
//
// Appends one "step_energy" record a part to --json (../shared/design/RESULTS.md's common keys,
// then model, part, ms_step, j_step, w, steps, seconds). NVML's counter is coarse (bench_gemm's
// notes: 0.6 s windows scattered by 20%): give each part several seconds.
#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "adamw.cuh"
#include "attention.cuh"
#include "bench_util.cuh"
#include "common.cuh"
#include "config.hpp"
#include "device.hpp"
#include "matmul.cuh"
#include "results.hpp"

using namespace codagpt;

namespace {

struct Part {
    std::string name;
    bench::Sustained run;
};

// step() back to back for about `seconds` (bench::sustained, after one call to time it).
template <class F>
Part part(const std::string& name, F&& step, double seconds, const GpuEnergy& meter) {
    const double est_ms = median_ms(step, /*runs=*/1, /*warmup=*/1);
    const bench::Sustained r = bench::sustained([&](int) { step(); }, est_ms, seconds, meter);
    if (std::isnan(r.j)) throw Error("reading the GPU's energy counter failed");
    return {name, r};
}

int run(int argc, char** argv) {
    std::string config = "gpt2-1.5b", json;
    double seconds = 8;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) throw Error(a + " needs a value");
            return argv[++i];
        };
        if (a == "--config") config = next();
        else if (a == "--seconds") seconds = bench::number_option(a, next(), 0);
        else if (a == "--json") json = next();
        else throw Error("unknown option " + a +
                         " (usage: bench_step_energy [--config NAME|PATH] [--seconds S] [--json FILE])");
    }
    // The model, batch and sequence length of a training config, as `codagpt train` reads it.
    const TrainConfig cfg = load_config(config);
    const ModelConfig& m = cfg.model;
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        fprintf(stderr, "bench_step_energy: needs a CUDA GPU\n");
        return 77;
    }
    const std::unique_ptr<GpuEnergy> meter = GpuEnergy::open();
    if (!meter) throw Error("needs NVML's energy counter (libnvidia-ml.so.1)");
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const std::string command = join_command(argc, argv);

    const int B = cfg.batch_size, T = cfg.seq_len, NH = m.n_head, HS = m.n_embd / m.n_head;
    const long C = m.n_embd, L = m.n_layer, BT = (long)B * T, Vp = m.padded_vocab();
    std::vector<Part> parts;
    {
        // The step's GEMMs. Inputs and outputs in separate buffers (no output is read again, so no
        // value grows over the runs); weights, biases and fp32 weight gradients a layer each.
        bench::Buffers b;
        const float kW = 0.02f, kAct = 1.f, kGrad = 1e-3f;
        bf16 *ln = b.make<bf16>(BT * C, kAct), *g4 = b.make<bf16>(BT * 4 * C, kAct);
        bf16 *dres = b.make<bf16>(BT * C, kGrad), *d4 = b.make<bf16>(BT * 4 * C, kGrad);
        bf16 *dqkv = b.make<bf16>(BT * 3 * C, kGrad), *logits = b.make<bf16>(BT * Vp, kGrad);
        bf16 *out = b.make<bf16>(BT * 4 * C, 0.f), *out_logits = b.make<bf16>(BT * Vp, 0.f);
        bf16* wte = b.make<bf16>(Vp * C, kW);
        float* dwte = b.make<float>(Vp * C, 0.f);
        struct Layer {
            bf16 *qkv, *proj, *fc, *fcproj, *bias;
            float *dqkv, *dproj, *dfc, *dfcproj;
        };
        std::vector<Layer> layers(L);
        for (Layer& l : layers) {
            l = {b.make<bf16>(C * 3 * C, kW), b.make<bf16>(C * C, kW), b.make<bf16>(C * 4 * C, kW),
                 b.make<bf16>(4 * C * C, kW), b.make<bf16>(4 * C, kW),
                 b.make<float>(C * 3 * C, 0.f), b.make<float>(C * C, 0.f), b.make<float>(C * 4 * C, 0.f),
                 b.make<float>(4 * C * C, 0.f)};
        }
        Matmul mm;
        auto step = [&] {
            for (const Layer& l : layers) {
                mm.forward(out, ln, l.qkv, l.bias, BT, C, 3 * C, 0);
                mm.forward(out, ln, l.proj, l.bias, BT, C, C, 0);
                mm.forward(out, ln, l.fc, l.bias, BT, C, 4 * C, 0);
                mm.forward(out, g4, l.fcproj, l.bias, BT, 4 * C, C, 0);
            }
            mm.forward_nt(out_logits, ln, wte, BT, C, Vp, 0);
            mm.backward_nt_weight(dwte, ln, logits, BT, C, Vp, /*accumulate=*/false, 0);
            mm.backward_nt_input(out, logits, wte, BT, C, Vp, false, 0);
            for (long i = L - 1; i >= 0; i--) {
                const Layer& l = layers[i];
                mm.backward_weight(l.dfcproj, g4, dres, BT, 4 * C, C, /*accumulate=*/false, 0);
                mm.backward_input(out, dres, l.fcproj, BT, 4 * C, C, false, 0);
                mm.backward_weight(l.dfc, ln, d4, BT, C, 4 * C, /*accumulate=*/false, 0);
                mm.backward_input(out, d4, l.fc, BT, C, 4 * C, false, 0);
                mm.backward_weight(l.dproj, ln, dres, BT, C, C, /*accumulate=*/false, 0);
                mm.backward_input(out, dres, l.proj, BT, C, C, false, 0);
                mm.backward_weight(l.dqkv, ln, dqkv, BT, C, 3 * C, /*accumulate=*/false, 0);
                mm.backward_input(out, dqkv, l.qkv, BT, C, 3 * C, false, 0);
            }
        };
        parts.push_back(part("gemm", step, seconds, *meter));
    }
    {
        bench::Buffers b;
        bf16 *qkv = b.make<bf16>(BT * 3 * C, 1.f), *y = b.make<bf16>(BT * C, 0.f);
        bf16 *dy = b.make<bf16>(BT * C, 1e-3f), *dqkv = b.make<bf16>(BT * 3 * C, 0.f);
        float* lse = b.make<float>(BT * NH, 0.f);
        Attention attention;
        attention.reserve(B, T, NH, HS);
        auto step = [&] {
            for (long l = 0; l < L; l++) attention.forward(y, lse, qkv, B, T, NH, HS, 0);
            for (long l = 0; l < L; l++) attention.backward(dqkv, dy, qkv, y, lse, B, T, NH, HS, 0);
        };
        parts.push_back(part(std::string("attention (") + attention.backend() + ")", step, seconds, *meter));
    }
    {
        bench::Buffers b;
        const long P = (long)m.num_params();  // every parameter the trainer's AdamW updates
        float *grads = b.make<float>(P, 1e-3f), *mom = b.make<float>(P, 1e-4f), *var = b.make<float>(P, 1e-8f);
        bf16* params = b.make<bf16>(P, 0.02f);
        auto* master_lo = reinterpret_cast<uint16_t*>(b.make<bf16>(P, 0.02f));  // any low halves
        float *norm2 = b.make<float>(1, 0.f), *norm = b.make<float>(1, 0.f), *scale = b.make<float>(1, 0.f);
        float* scratch = b.make<float>((long)global_norm_scratch_floats(), 0.f);
        int t = 1;
        auto step = [&] {
            global_norm_squared(norm2, scratch, grads, P, 0);
            clip_scale(scale, norm, norm2, 1.f, 0);
            adamw_update(params, master_lo, grads, mom, var, P, AdamWArgs{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t++}, scale, 0);
        };
        parts.push_back(part("optimizer", step, seconds, *meter));
    }

    printf("%s, power limit %.0f W; %s (%ld layers, C = %ld), B = %d, T = %d, a step's worth of each part, "
           "back to back for ~%.0f s\n",
           prop.name, meter->power_limit_w(), cfg.name.c_str(), L, C, B, T, seconds);
    printf("%-22s %10s %10s %7s %6s\n", "part", "ms", "J", "W", "steps");
    double ms = 0, j = 0;
    for (const Part& p : parts) {
        const bench::Sustained& e = p.run;
        printf("%-22s %10.2f %10.2f %7.0f %6d\n", p.name.c_str(), e.ms, e.j, e.w, e.calls);
        ms += e.ms, j += e.j;
        if (json.empty()) continue;
        nlohmann::json r = {{"kind", "step_energy"}, {"gpu", prop.name},   {"model", cfg.name},
                            {"part", p.name},        {"batch", B},         {"seq", T},
                            {"ms_step", e.ms},       {"j_step", e.j},      {"w", e.w},
                            {"steps", e.calls},      {"seconds", seconds}, {"power_limit_w", meter->power_limit_w()}};
        stamp_record(r, command);
        append_record(json, r);
    }
    printf("%-22s %10.2f %10.2f\n", "sum", ms, j);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        fprintf(stderr, "bench_step_energy: %s\n", e.what());
        return 1;
    }
}
