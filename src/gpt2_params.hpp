// GPT-2's parameter tensors: their names, shapes, storage order and initialisation, shared by the
// CPU reference and the GPU paths (which start from, and are tested against, the same weights).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config.hpp"

namespace codagpt {

// Parameters by name. Layer tensors are stacked over layers, llm.c-style:
// e.g. qkv_w is [L, C, 3C]. Matrices are stored [in, out] (z = x W + b).
template <typename F>
struct GPT2Params {
    F* wte;     // [Vp, C]  token embedding, tied LM head
    F* wpe;     // [maxT, C]
    F* ln1_w;   // [L, C]
    F* ln1_b;   // [L, C]
    F* qkv_w;   // [L, C, 3C]
    F* qkv_b;   // [L, 3C]
    F* proj_w;  // [L, C, C]
    F* proj_b;  // [L, C]
    F* ln2_w;   // [L, C]
    F* ln2_b;   // [L, C]
    F* fc_w;    // [L, C, 4C]
    F* fc_b;    // [L, 4C]
    F* fcproj_w;  // [L, 4C, C]
    F* fcproj_b;  // [L, C]
    F* lnf_w;   // [C]
    F* lnf_b;   // [C]
};

// Name, element count and whether AdamW decays it (matrices and embeddings yes; biases and
// LayerNorm no), in storage order. Both the parameter and gradient buffers follow it.
struct ParamInfo {
    std::string name;
    size_t size;
    bool decay;
    int layers = 1;  // n_layer for the layers' tensors (stacked [L, ...], LayerParams' fields), else 1
};
std::vector<ParamInfo> param_layout(const ModelConfig& m);

enum class Init { zeros, ones, normal, normal_residual };

// The parameter tensors in storage order: param_layout(), the buffer views and init() all walk
// this one list, so a tensor is always addressed by name. fn(name, field, size, decay, init).
template <typename F, typename Fn>
void for_each_param(GPT2Params<F>& p, const ModelConfig& m, Fn&& fn) {
    const size_t L = m.n_layer, C = m.n_embd, Vp = m.padded_vocab(), maxT = m.max_seq_len;
    fn("wte", p.wte, Vp * C, true, Init::normal);
    fn("wpe", p.wpe, maxT * C, true, Init::normal);
    fn("ln1_w", p.ln1_w, L * C, false, Init::ones);
    fn("ln1_b", p.ln1_b, L * C, false, Init::zeros);
    fn("qkv_w", p.qkv_w, L * C * 3 * C, true, Init::normal);
    fn("qkv_b", p.qkv_b, L * 3 * C, false, Init::zeros);
    fn("proj_w", p.proj_w, L * C * C, true, Init::normal_residual);
    fn("proj_b", p.proj_b, L * C, false, Init::zeros);
    fn("ln2_w", p.ln2_w, L * C, false, Init::ones);
    fn("ln2_b", p.ln2_b, L * C, false, Init::zeros);
    fn("fc_w", p.fc_w, L * C * 4 * C, true, Init::normal);
    fn("fc_b", p.fc_b, L * 4 * C, false, Init::zeros);
    fn("fcproj_w", p.fcproj_w, L * 4 * C * C, true, Init::normal_residual);
    fn("fcproj_b", p.fcproj_b, L * C, false, Init::zeros);
    fn("lnf_w", p.lnf_w, C, false, Init::ones);
    fn("lnf_b", p.lnf_b, C, false, Init::zeros);
}

// One layer's slice of the stacked parameters.
template <typename F>
struct LayerParams {
    F *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
};

template <typename F>
LayerParams<F> layer_params(const GPT2Params<F>& p, size_t l, size_t C) {
    return {p.ln1_w + l * C,         p.ln1_b + l * C,  p.qkv_w + l * C * 3 * C, p.qkv_b + l * 3 * C,
            p.proj_w + l * C * C,    p.proj_b + l * C, p.ln2_w + l * C,         p.ln2_b + l * C,
            p.fc_w + l * C * 4 * C,  p.fc_b + l * 4 * C, p.fcproj_w + l * 4 * C * C, p.fcproj_b + l * C};
}

// Views of a flat buffer laid out in param_layout() order.
template <typename F>
GPT2Params<F> param_views(F* base, const ModelConfig& m) {
    GPT2Params<F> v{};
    for_each_param(v, m, [&](const char*, F*& ptr, size_t size, bool, Init) {
        ptr = base;
        base += size;
    });
    return v;
}

// GPT-2 initial weights, flat in param_layout() order: N(0, 0.02) for wte (real vocabulary rows;
// padded rows 0), wpe, qkv_w, fc_w; N(0, 0.02/sqrt(2L)) for proj_w, fcproj_w (residual
// projections); biases 0, LayerNorm weights 1. Portable (codagpt::Rng) and independent of the
// thread count: each tensor is drawn in chunks of 2^20 elements, chunk k of tensor i (layout
// order) from its own stream Rng(seed ^ ((i+1) << 48) ^ (k * 0x9E3779B97F4A7C15)), one normal()
// per element in storage order, so chunks can be drawn in parallel.
std::vector<float> gpt2_init_params(const ModelConfig& m, uint64_t seed);

}  // namespace codagpt
