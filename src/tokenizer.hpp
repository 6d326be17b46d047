// GPT-2 byte-level BPE (encoder.json + vocab.bpe), token-for-token identical to OpenAI's encoder
// (encoder.py with Python's `regex` module; Unicode classes come from ICU).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace codagpt {

class Tokenizer {
public:
    static constexpr int kEot = 50256;
    // Loads <dir>/encoder.json and <dir>/vocab.bpe; throws Error naming the file on any problem.
    static Tokenizer load(const std::string& dir);
    // UTF-8 text to token ids. Invalid UTF-8 never fails: each maximal ill-formed subsequence
    // (Unicode's "maximal subpart": a lone continuation byte, a truncated sequence, each byte of an
    // overlong form, a UTF-8-encoded surrogate or a value above U+10FFFF) becomes one U+FFFD, as
    // Python's decode(errors='replace') and the WHATWG TextDecoder do before the reference encodes.
    // The text "<|endoftext|>" is ordinary text here, as in the reference: append kEot yourself.
    // Thread-safe: each thread keeps its own cache of the words it has encoded.
    std::vector<int> encode(std::string_view text) const;
    // Token ids to the exact bytes they stand for; a token may hold part of a UTF-8 sequence, so
    // the result of a slice of ids need not be valid UTF-8. Ids outside the vocabulary throw Error.
    std::string decode(const int* ids, size_t n) const;
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

// GPT-2's split of UTF-8 text into the pieces BPE runs on, i.e. the matches of
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with \s the Unicode White_Space property; invalid UTF-8 is replaced as in encode(). For tests.
std::vector<std::string> pretokenize(std::string_view text);

// Searches for the tokenizer files: $CODAGPT_DATA/gpt2, then data/gpt2 (what
// scripts/get_tokenizer.sh fills). Returns the folder, or throws Error saying how to get them.
std::string find_tokenizer_dir();

}  // namespace codagpt
