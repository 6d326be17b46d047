// The input-facing parsers, each as a function of raw bytes: shared by the libFuzzer targets
// (fuzz_*.cpp, built with -DCODAGPT_FUZZ=ON and clang) and by test_bad_inputs.cpp, which feeds them
// the kept corpus (tests/fuzz/corpus/<target>/) on every CI run.
//
// Contract: a parser accepts the bytes or throws codagpt::Error with a one-line message. Any other
// exception, a crash, a hang or a sanitizer report is a bug.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "checkpoint.hpp"
#include "common.hpp"
#include "config.hpp"
#include "data.hpp"
#include "gpt2_params.hpp"
#include "interchange.hpp"
#ifdef CODAGPT_HAVE_TOKENIZER
#include "tokenizer.hpp"
#endif

namespace codagpt::fuzz {

// A folder of this process's own for the files the parsers read.
inline const std::filesystem::path& scratch_dir() {
    static const std::filesystem::path dir = [] {
        auto d = std::filesystem::temp_directory_path() / ("codagpt_fuzz_" + std::to_string(::getpid()));
        std::filesystem::create_directories(d);
        return d;
    }();
    return dir;
}

inline std::string write_scratch(const std::string& name, std::string_view bytes) {
    const std::string path = (scratch_dir() / name).string();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), std::streamsize(bytes.size()));
    if (!f) {
        std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
        std::abort();
    }
    return path;
}

inline std::string_view as_text(const uint8_t* data, size_t n) { return {reinterpret_cast<const char*>(data), n}; }

// A config file (load_config: JSON parse, schema, validation), then its lines as KEY=VALUE overrides.
inline void config(const uint8_t* data, size_t n) {
    const std::string_view text = as_text(data, n);
    TrainConfig c = load_config(write_scratch("config.json", text));
    std::vector<std::string> overrides;
    for (size_t pos = 0; pos < text.size();) {
        const size_t end = std::min(text.find('\n', pos), text.size());
        overrides.emplace_back(text.substr(pos, end - pos));
        pos = end + 1;
    }
    apply_overrides(c, overrides);
}

// A token shard: read whole, and through the data loader (headers up front, tokens per batch).
inline void shard(const uint8_t* data, size_t n) {
    const std::string path = write_scratch("shard.bin", as_text(data, n));
    read_shard(path, 50257);
    DataLoader loader(path, /*B=*/1, /*T=*/4, /*rank=*/0, /*world=*/1, /*shuffle=*/true, /*seed=*/1, /*vocab=*/50257);
    std::vector<int> in(4), tgt(4);
    for (int i = 0; i < 3; i++) loader.next_batch(in.data(), tgt.data());
}

// A checkpoint file: header, metadata JSON, tensor table, data and checksum; then the resume check
// against its own config.
inline void checkpoint(const uint8_t* data, size_t n) {
    const std::string path = write_scratch("ckpt_1.bin", as_text(data, n));
    const Checkpoint ck = load_checkpoint(path);
    check_resumable(ck, ck.config, path);
}

// A weights file through load_weights (what `codagpt sample` and `codagpt export` read): llm.c
// model .bin or codagpt checkpoint by their magic, else safetensors (the name ends in .safetensors).
// Weights that load must fill the model's flat layout, and survive our own writers: export as
// safetensors and as llm.c .bin, import again, same model and the same bits.
inline void weights(const uint8_t* data, size_t n) {
    const ModelWeights w = load_weights(write_scratch("weights.safetensors", as_text(data, n)));
    const ModelConfig& m = w.config;
    size_t expected = 0;
    for (const ParamInfo& p : param_layout(m)) expected += p.size;
    if (w.params.size() != expected) {
        std::fprintf(stderr, "fuzz: loaded %zu floats, the model's layout has %zu\n", w.params.size(), expected);
        std::abort();
    }
    // The writers keep the real vocabulary's rows of wte (first in the layout): padding reads back zero.
    std::vector<float> want = w.params;
    std::fill(want.begin() + size_t(m.vocab_size) * m.n_embd, want.begin() + size_t(m.padded_vocab()) * m.n_embd, 0.0f);
    const std::string st = (scratch_dir() / "roundtrip.safetensors").string();
    const std::string llmc = (scratch_dir() / "roundtrip.bin").string();
    export_safetensors(st, m, w.params.data());
    export_llmc(llmc, m, w.params.data());
    for (const std::string& path : {st, llmc}) {
        const ModelWeights back = load_weights(path);
        const ModelConfig& b = back.config;
        if (b.n_layer != m.n_layer || b.n_head != m.n_head || b.n_embd != m.n_embd ||
            b.max_seq_len != m.max_seq_len || b.vocab_size != m.vocab_size || back.params.size() != want.size() ||
            std::memcmp(back.params.data(), want.data(), want.size() * sizeof(float)) != 0) {
            std::fprintf(stderr, "fuzz: %s does not read back as the model written\n", path.c_str());
            std::abort();
        }
    }
}

#ifdef CODAGPT_HAVE_TOKENIZER
// The two tokenizer files in one input: encoder.json, then this separator line, then vocab.bpe
// (without it, the whole input is encoder.json and vocab.bpe holds only its header). A tokenizer
// that loads then encodes and decodes the input.
constexpr std::string_view kTokenizerSeparator = "\n@@vocab.bpe@@\n";
inline void tokenizer_files(const uint8_t* data, size_t n) {
    const std::string_view text = as_text(data, n);
    const size_t sep = text.find(kTokenizerSeparator);
    write_scratch("encoder.json", text.substr(0, sep));
    write_scratch("vocab.bpe", sep == std::string_view::npos ? std::string_view("#version: 0.2\n")
                                                             : text.substr(sep + kTokenizerSeparator.size()));
    const Tokenizer tok = Tokenizer::load(scratch_dir().string());
    tok.decode(tok.encode(text));
}

// Arbitrary bytes through the real GPT-2 tokenizer (find_tokenizer_dir(): $CODAGPT_DATA/gpt2 or
// data/gpt2). encode never fails; decode(encode(x)) == x for valid UTF-8 x (checked where x is ASCII).
inline void tokenizer_encode(const uint8_t* data, size_t n) {
    static const Tokenizer tok = Tokenizer::load(find_tokenizer_dir());
    const std::string_view text = as_text(data, n);
    const std::string back = tok.decode(tok.encode(text));
    bool ascii = true;
    for (char ch : text) ascii = ascii && (unsigned char)ch < 0x80;
    if (ascii && back != text) {
        std::fprintf(stderr, "fuzz: decode(encode(x)) != x for ASCII input of %zu bytes\n", n);
        std::abort();
    }
}
#endif

struct Target {
    const char* name;  // also the corpus folder: tests/fuzz/corpus/<name>/
    void (*run)(const uint8_t*, size_t);
};
inline std::vector<Target> targets() {
    return {{"config", config}, {"shard", shard}, {"checkpoint", checkpoint}, {"weights", weights},
#ifdef CODAGPT_HAVE_TOKENIZER
            {"tokenizer_files", tokenizer_files}, {"tokenizer_encode", tokenizer_encode},
#endif
    };
}

// One input under the contract above: Error is a clean refusal, but its message must be one line.
inline int run_one(void (*run)(const uint8_t*, size_t), const uint8_t* data, size_t n) {
    try {
        run(data, n);
    } catch (const Error& e) {
        const char* msg = e.what();
        if (msg[0] == '\0' || std::strchr(msg, '\n')) {
            std::fprintf(stderr, "fuzz: error message is empty or not one line: [%s]\n", msg);
            std::abort();
        }
    }
    return 0;
}

}  // namespace codagpt::fuzz
