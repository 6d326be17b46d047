// Training-run fixtures shared by the trainer, checkpoint and guard tests: synthetic shards in a
// temporary folder and a small TrainConfig that trains on them.
#pragma once
#include <string>
#include <vector>

#include "config.hpp"
#include "data.hpp"
#include "rng.hpp"
#include "test_util.hpp"

namespace codagpt::test {

// A shard of a learnable sequence, (i * 7) % 61, with a fraction `noise` of random tokens < vocab.
inline void write_pattern_shard(const std::string& path, size_t n, int vocab, uint64_t seed, double noise = 0.1) {
    Rng rng(seed);
    std::vector<uint16_t> tokens(n);
    for (size_t i = 0; i < n; i++) tokens[i] = rng.uniform() < noise ? rng.below(vocab) : (i * 7) % 61;
    write_shard(path, tokens);
}

// train_000000.bin and val_000000.bin of pattern shards in a temporary folder, and a config of model
// m with micro-batches of B x T that trains on them and writes its run to <folder>/run.
struct SyntheticRun {
    TempDir dir;
    TrainConfig cfg;
    SyntheticRun(const std::string& name, const ModelConfig& m, int B, int T, size_t train_tokens,
                 size_t val_tokens, double noise = 0.1) {
        write_pattern_shard(dir / "train_000000.bin", train_tokens, m.vocab_size, 1, noise);
        write_pattern_shard(dir / "val_000000.bin", val_tokens, m.vocab_size, 2, noise);
        cfg.name = name;
        cfg.model = m;
        cfg.train_data = dir / "train_*.bin";
        cfg.val_data = dir / "val_*.bin";
        cfg.out_dir = dir / "run";
        cfg.batch_size = B;
        cfg.seq_len = T;
        cfg.sample_every = 0;  // the default is gpt2-tiny's; samples only where a test asks for them
    }
};

}  // namespace codagpt::test
