// Text files to llm.c-format token shards: what `codagpt prepare` runs.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "tokenizer.hpp"

namespace codagpt {

struct PrepareOptions {
    // Share of all tokens for validation, taken from the leading documents and cut at the document
    // boundary nearest to it (at least one document on each side); 0 writes no validation shard.
    double val_fraction = 0.1;
    size_t shard_tokens = 100'000'000;  // per shard file, as llm.c's FineWeb shards
    // Every "\n\n"-terminated section of a file is its own document, as llm.c's tinyshakespeare.py
    // cuts the text (it writes <|endoftext|> after every "\n\n").
    bool split_on_blank_lines = false;
};

struct PrepareStats {
    size_t documents = 0;
    size_t train_tokens = 0, val_tokens = 0;  // the EOT before each document included
    std::vector<std::string> shards;          // val_*.bin, then train_*.bin, as written
};

// Tokenizes the input files (read as bytes; each file, or section, one document preceded by EOT),
// writes out_dir/val_000000.bin ... and out_dir/train_000000.bin ... (creating out_dir), and removes
// higher-numbered shards that an earlier run left there. Throws Error naming the problem: an input
// file that cannot be read, val_fraction outside [0, 1), fewer than two documents to split.
PrepareStats prepare_shards(const std::vector<std::string>& inputs, const std::string& out_dir,
                            const PrepareOptions& opt, const Tokenizer& tok);

}  // namespace codagpt
