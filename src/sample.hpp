// Text generation on the CPU from fp32 weights: an incremental GPT-2 forward with a KV cache (one
// new token per step attends to the keys and values cached for the earlier positions), and a
// sampler with temperature and top-k, deterministic for a fixed seed (codagpt::Rng).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "config.hpp"
#include "rng.hpp"

namespace codagpt {

// GPT-2's forward for one position at a time, built from the CPU reference ops (ops_cpu.hpp).
// Its logits equal GPT2CPU's full-sequence forward at every position, to fp32 rounding.
class GPT2Decoder {
public:
    // params: flat in param_layout(m) order; must outlive the decoder.
    GPT2Decoder(const ModelConfig& m, const float* params);
    // Appends `token` at position position() and returns the logits of the next token, [Vp] with the
    // first vocab_size meaningful. Error when the context (max_seq_len) is full or the id is out of range.
    const float* step(int token);
    int position() const { return pos_; }
    void reset() { pos_ = 0; }
    const ModelConfig& config() const { return m_; }

private:
    ModelConfig m_;
    const float* params_;
    int pos_ = 0;
    std::vector<float> k_cache_, v_cache_;  // [L, maxT, C] each
    std::vector<float> x_, ln_, qkv_, atty_, proj_, fch_, fch_gelu_, scores_, logits_;
};

struct SampleOptions {
    int max_tokens = 256;
    double temperature = 1.0;  // <= 0: greedy
    int top_k = 0;             // 0: the whole vocabulary
    uint64_t seed = 1337;
};

// One token from logits[0, V): argmax when temperature <= 0 or top_k == 1 (lowest id on ties);
// else softmax(logits / temperature) over the top_k largest (all when top_k is 0 or >= V), drawn
// with one rng.uniform().
int sample_token(const float* logits, int V, double temperature, int top_k, Rng& rng);

// Feeds the prompt (at least one token), then samples up to max_tokens tokens, stopping early when
// the context is full; on_token sees each as it is drawn. Returns the sampled tokens.
std::vector<int> generate(GPT2Decoder& dec, const std::vector<int>& prompt, const SampleOptions& opt,
                          const std::function<void(int)>& on_token = nullptr);

// Byte stream to complete UTF-8 characters: a token may end inside a multi-byte character, whose
// bytes are held until the rest arrives. Bytes that can never form a character pass through.
class Utf8Stream {
public:
    std::string push(std::string_view bytes);
    std::string flush();  // whatever is held

private:
    std::string held_;
};

}  // namespace codagpt
