// Token shards in llm.c's format and the data loader.
// Shard: 256 int32 header (magic 20240520, version 1, token count), then uint16 tokens, both
// little-endian, nothing after the tokens: the files llm.c's Python scripts write load unchanged.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace codagpt {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr int kShardHeaderInts = 256;

// Writes a shard atomically (temporary file in the same folder, fsync, rename): a reader never
// sees a half-written shard and nothing is left behind on error. Throws Error on I/O failure.
void write_shard(const std::string& path, const std::vector<uint16_t>& tokens);
// Reads and checks a shard: a missing or short file, bad magic, bad version, negative count,
// truncated tokens, trailing bytes, and any token id >= vocab_size throw Error naming the file
// (and the token offset where it applies).
std::vector<uint16_t> read_shard(const std::string& path, int vocab_size);
// Sorted paths matching a glob pattern; throws Error when none match.
std::vector<std::string> glob_shards(const std::string& pattern);

// Serves batches of B x T inputs and targets (targets = inputs shifted by one) from windows of
// B*T+1 consecutive tokens at stride B*T inside each shard (a window never crosses shards). Windows
// are numbered over all shards in order. Each epoch visits them in one global order (identity, or
// with shuffle a permutation drawn from (seed, epoch), identical on every rank); rank r of R takes
// positions r, r+R, r+2R, ... of that order: disjoint shares, micro-batch m of optimizer step s
// (A micro-batches a step, gradient accumulation) at position (s A + m) R + r. An epoch holds
// whole optimizer steps: num_windows / (R A) of them, A windows each per rank (the last
// num_windows % (R A) positions of the order are skipped that epoch), so that ranks step in
// lockstep and every split of a step's windows over ranks and micro-batches wraps to the next
// epoch at the same step: without shuffle, R ranks x A micro-batches of B sequences read the same
// tokens each step as one rank with one batch of R A B (with shuffle the windows themselves depend
// on B), as long as each shard's count of windows of B is a multiple of R A (a window of R A B
// never crosses shards, while R A windows of B can: past the first shard whose count is not, the
// splits read different tokens). After its share, a rank continues with the next epoch.
// Tokens are read from the files per batch (shards can be larger than memory); headers and sizes
// are checked up front, token ids as they are read.
class DataLoader {
public:
    // micro_steps: A, the micro-batches a rank accumulates for one optimizer step.
    DataLoader(const std::string& pattern, int B, int T, int rank, int world, bool shuffle,
               uint64_t seed, int vocab_size, int micro_steps = 1);
    void next_batch(int* inputs, int* targets);  // each B*T ints
    void reset();                                // back to epoch 0, first window
    // Windows a rank reads per epoch: whole optimizer steps of micro_steps windows.
    size_t windows_per_rank() const {
        return windows_.size() / (size_t(world_) * size_t(micro_steps_)) * size_t(micro_steps_);
    }
    size_t num_windows() const { return windows_.size(); }  // over all shards and ranks
    // Position, for checkpoints: epoch and index of the next window within this rank's order.
    struct State { uint64_t epoch = 0; uint64_t next = 0; };
    State state() const { return state_; }
    void set_state(State s);  // throws Error when next is beyond this rank's share
    int B() const { return B_; }
    int T() const { return T_; }

private:
    void build_order();
    int B_, T_, rank_, world_, micro_steps_;
    bool shuffle_;
    uint64_t seed_;
    int vocab_size_;
    std::vector<std::string> paths_;
    std::vector<std::ifstream> files_;
    struct Window { uint32_t shard; uint64_t offset; };  // offset in tokens
    std::vector<Window> windows_;   // all windows of all shards
    std::vector<uint64_t> order_;   // this rank's window indices for the current epoch
    std::vector<uint16_t> buf_;     // one window
    State state_;
};

}  // namespace codagpt
