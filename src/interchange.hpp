// Model weights in other programs' formats: Hugging Face safetensors (GPT2LMHeadModel's names and
// layout) and llm.c's model .bin, written and read; and one loader for every weights file codagpt
// accepts (its own checkpoints too).
//
// safetensors (github.com/huggingface/safetensors): uint64 little-endian N, then N bytes of JSON
//   {"__metadata__": {string: string}, name: {"dtype": "F32"|"BF16", "shape": [...],
//   "data_offsets": [begin, end]}, ...}, then the data; offsets are from the end of the header.
//   Names are GPT-2's: transformer.wte.weight [V, C] (the real vocabulary, unpadded),
//   transformer.wpe.weight [maxT, C], transformer.h.{i}.ln_1.weight/bias [C],
//   .attn.c_attn.weight [C, 3C] / .bias [3C], .attn.c_proj.weight [C, C] / .bias, .ln_2.weight/bias,
//   .mlp.c_fc.weight [C, 4C] / .bias [4C], .mlp.c_proj.weight [4C, C] / .bias, transformer.ln_f.*.
//   HF GPT-2's Conv1D keeps matrices [in, out], as we do, so no transposes. lm_head.weight is tied
//   to wte and left out (as in the released gpt2 files). __metadata__ holds "format": "pt"
//   (transformers requires it) and n_head (shapes do not tell it; imports without it take C/64).
//   Import accepts the names with or without the "transformer." prefix and ignores the tied
//   lm_head.weight and the attention-mask buffers (h.{i}.attn.bias, h.{i}.attn.masked_bias).
// llm.c .bin (train_gpt2.c, gpt2_build_from_checkpoint): 256 int32 header [0]=20240326,
//   [1]=3 (fp32) or 5 (bf16), [2]=maxT, [3]=V, [4]=L, [5]=NH, [6]=C, [7]=Vp, then wte [Vp, C],
//   wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw,
//   lnfb, stacked over layers like ours, but llm.c's matmul weights are [out, in] (its
//   matmul_forward computes inp @ weight^T), so they are transposed on the way in and out.
#pragma once
#include <string>
#include <vector>

#include "config.hpp"

namespace codagpt {

// A model's fp32 weights, flat in param_layout(config) order (wte padded to Vp with zero rows).
struct ModelWeights {
    ModelConfig config;
    std::vector<float> params;
};

enum class WeightsDtype { f32, bf16 };  // bf16: round to nearest even

// Writers stream tensor by tensor through an AtomicFileWriter: a failure leaves `path` as it was.
void export_safetensors(const std::string& path, const ModelConfig& m, const float* params,
                        WeightsDtype dtype = WeightsDtype::f32);
void export_llmc(const std::string& path, const ModelConfig& m, const float* params,
                 WeightsDtype dtype = WeightsDtype::f32);

// Readers check everything before trusting it (header bounds, JSON, offsets, every tensor's name,
// shape and dtype) and throw one Error naming the file and the problem.
ModelWeights import_safetensors(const std::string& path);
ModelWeights import_llmc(const std::string& path);

enum class WeightsFormat { checkpoint, safetensors, llmc };
// By the first bytes: "CODAGPTC" (codagpt checkpoint), int32 20240326 (llm.c), else safetensors
// when the name ends in .safetensors or the header looks like one; Error otherwise.
WeightsFormat detect_weights_format(const std::string& path);
// Any of the three: a checkpoint gives its config's model and its fp32 weights of record.
ModelWeights load_weights(const std::string& path);

// For checking an export elsewhere (scripts/check_hf_export.py): the CPU reference's logits for
// one sequence of T tokens drawn uniformly from the vocabulary with Rng(seed). File: int32 B=1, T,
// V; int32 tokens [T]; float32 logits [T, V] (the real vocabulary), little-endian.
// Refuses (Error) a T the model cannot run: outside [1, max_seq_len]. export checks it before it
// writes anything.
void check_reference_tokens(const ModelConfig& m, int T);
void write_reference_logits(const std::string& path, const ModelWeights& w, int T, uint64_t seed);

constexpr int kLlmcModelMagic = 20240326;

}  // namespace codagpt
