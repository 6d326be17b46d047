// Token shards in llm.c's format and the data loader.
// Shard: 256 int32 header (magic 20240520, version 1, token count), then uint16 tokens.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace codagpt {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr int kShardHeaderInts = 256;

// Writes a shard atomically (temporary file, fsync, rename). Throws Error on I/O failure.
void write_shard(const std::string& path, const std::vector<uint16_t>& tokens);
// Reads and checks a shard: bad magic, bad version, truncated or oversized file, and any token id
// >= vocab_size throw Error naming the file (and offset where it applies).
std::vector<uint16_t> read_shard(const std::string& path, int vocab_size);
// Sorted paths matching a glob pattern; throws Error when none match.
std::vector<std::string> glob_shards(const std::string& pattern);

// Serves batches of B x T inputs and targets (targets = inputs shifted by one) from windows of
// B*T+1 consecutive tokens at stride B*T inside each shard (a window never crosses shards). Windows
// are numbered over all shards in order. Each epoch visits them in one global order (identity, or
// with shuffle a permutation drawn from (seed, epoch), identical on every rank); rank r of R takes
// positions r, r+R, r+2R, ... of that order: disjoint shares that together cover every window.
class DataLoader {
public:
    DataLoader(const std::string& pattern, int B, int T, int rank, int world, bool shuffle,
               uint64_t seed, int vocab_size);
    void next_batch(int* inputs, int* targets);  // each B*T ints
    void reset();                                // back to epoch 0, first window
    size_t windows_per_rank() const;             // batches one epoch gives this rank
    // Position, for checkpoints: epoch and index of the next window within this rank's order.
    struct State { uint64_t epoch = 0; uint64_t next = 0; };
    State state() const { return state_; }
    void set_state(State s);
    int B() const { return B_; }
    int T() const { return T_; }

private:
    void build_order();
    int B_, T_, rank_, world_;
    bool shuffle_;
    uint64_t seed_;
    std::vector<std::vector<uint16_t>> shards_;
    struct Window { uint32_t shard; uint64_t offset; };
    std::vector<Window> windows_;   // all windows of all shards
    std::vector<uint64_t> order_;   // this rank's window indices for the current epoch
    State state_;
};

}  // namespace codagpt
