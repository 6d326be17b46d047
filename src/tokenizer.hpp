// GPT-2 byte-level BPE (encoder.json + vocab.bpe), token-for-token identical to OpenAI's encoder.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace codagpt {

class Tokenizer {
public:
    static constexpr int kEot = 50256;
    // Loads <dir>/encoder.json and <dir>/vocab.bpe; throws Error naming the file on any problem.
    static Tokenizer load(const std::string& dir);
    // UTF-8 text to token ids. Invalid UTF-8 is replaced by U+FFFD per maximal bad subsequence,
    // as the reference's text decoding does.
    std::vector<int> encode(std::string_view text) const;
    std::string decode(const int* ids, size_t n) const;  // ids outside the vocabulary throw Error
    std::string decode(const std::vector<int>& ids) const { return decode(ids.data(), ids.size()); }
    int vocab_size() const;

    ~Tokenizer();
    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;

private:
    Tokenizer();
    struct Impl;
    Impl* impl_;
};

// Searches for the tokenizer files: $CODAGPT_DATA/gpt2, then data/gpt2 (what
// scripts/get_tokenizer.sh fills). Returns the folder, or throws Error saying how to get them.
std::string find_tokenizer_dir();

}  // namespace codagpt
