// Text generation: a GPT-2 forward one position at a time with a KV cache (the keys and values of
// earlier positions are kept, so each new token costs one row of work), on the CPU (GPT2Decoder,
// below, fp32) or the GPU (GPT2GPUDecoder, model_gpu.hpp, bf16); and one sampler over the fp32
// logits on the host (temperature, top-k, deterministic for a fixed seed with codagpt::Rng) that
// drives either.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "config.hpp"
#include "rng.hpp"

namespace codagpt {

// A model that takes tokens at successive positions and gives the next token's logits.
class Decoder {
public:
    virtual ~Decoder() = default;
    virtual const ModelConfig& config() const = 0;
    // Appends tokens[0, n) at positions position() .. position()+n-1 (a prompt in one call: the
    // prefill) and returns the logits of the token after the last: vocab_size fp32 values on the
    // host, valid until the next call. Error when n < 1, an id is outside the vocabulary or the
    // context (max_seq_len) would overflow; nothing is changed then.
    const float* feed(const int* tokens, int n);
    const float* step(int token) { return feed(&token, 1); }
    int position() const { return pos_; }
    void reset() { pos_ = 0; }  // forget the cache: the next token goes to position 0

protected:
    int pos_ = 0;

private:
    // feed() after its checks; pos_ is the first new position and advances when this returns.
    virtual const float* forward(const int* tokens, int n) = 0;
};

// GPT-2's forward for one position at a time, built from the CPU reference ops (ops_cpu.hpp).
// Its logits equal GPT2CPU's full-sequence forward at every position, to fp32 rounding.
class GPT2Decoder final : public Decoder {
public:
    // params: flat in param_layout(m) order; must outlive the decoder, which reads them at every call.
    GPT2Decoder(const ModelConfig& m, const float* params);
    const ModelConfig& config() const override { return m_; }

private:
    const float* forward(const int* tokens, int n) override;
    void advance(int token, long t);  // the blocks for one token at position t: fills the cache, leaves x_

    ModelConfig m_;
    const float* params_;
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

// Starts the decoder afresh, feeds the prompt (at least one token) in one call, then samples up to
// max_tokens tokens with Rng(opt.seed), stopping early when the context is full; on_token sees each
// as it is drawn. Returns the sampled tokens.
std::vector<int> generate(Decoder& dec, const std::vector<int>& prompt, const SampleOptions& opt,
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
