#include "data.hpp"

#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "common.hpp"
#include "fileio.hpp"
#include "rng.hpp"

namespace codagpt {

// The format is little-endian on disk; tokens and header are read and written in host order.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "shard I/O assumes a little-endian host");

namespace {

constexpr uint64_t kHeaderBytes = kShardHeaderInts * sizeof(int32_t);

std::string errno_text() { return std::strerror(errno); }

std::ifstream open_shard(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error("cannot open shard " + path + ": " + errno_text());
    return f;
}

// Reads the header of an open shard and checks it against the file size; returns the token count
// and leaves the stream at the first token.
uint64_t read_header(std::ifstream& f, const std::string& path) {
    f.seekg(0, std::ios::end);
    const std::streamoff size = f.tellg();
    if (size < 0) throw Error("cannot read shard " + path + ": " + errno_text());
    if (uint64_t(size) < kHeaderBytes)
        throw Error("shard " + path + ": " + std::to_string(size) + " bytes, shorter than the " +
                    std::to_string(kHeaderBytes) + "-byte header");
    int32_t header[kShardHeaderInts];
    f.seekg(0);
    if (!f.read(reinterpret_cast<char*>(header), kHeaderBytes))
        throw Error("cannot read shard " + path + ": " + errno_text());
    if (header[0] != kShardMagic)
        throw Error("shard " + path + ": bad magic " + std::to_string(header[0]) + " (expected " +
                    std::to_string(kShardMagic) + ": not an llm.c token shard)");
    if (header[1] != kShardVersion)
        throw Error("shard " + path + ": unsupported version " + std::to_string(header[1]) +
                    " (expected " + std::to_string(kShardVersion) + ": uint16 tokens)");
    if (header[2] < 0) throw Error("shard " + path + ": negative token count " + std::to_string(header[2]));
    const uint64_t count = uint64_t(header[2]);
    const uint64_t expected = kHeaderBytes + 2 * count;
    if (uint64_t(size) != expected)
        throw Error("shard " + path + ": " + std::string(uint64_t(size) < expected ? "truncated" : "trailing bytes") +
                    ": header says " + std::to_string(count) + " tokens (" + std::to_string(expected) +
                    " bytes), file has " + std::to_string(size) + " bytes");
    return count;
}

void check_tokens(const uint16_t* tokens, size_t n, uint64_t first_offset, int vocab_size,
                  const std::string& path) {
    for (size_t i = 0; i < n; ++i)
        if (tokens[i] >= vocab_size)
            throw Error("shard " + path + ": token id " + std::to_string(tokens[i]) + " at token offset " +
                        std::to_string(first_offset + i) + " is >= vocab size " + std::to_string(vocab_size));
}

// Seed of one epoch's shuffle. The epoch is hashed in (splitmix64's finalizer) so that nearby
// (seed, epoch) pairs do not give Rngs with overlapping state words.
uint64_t epoch_seed(uint64_t seed, uint64_t epoch) {
    uint64_t z = epoch + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return seed ^ z ^ (z >> 31);
}

}  // namespace

void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
    if (tokens.size() > size_t(INT32_MAX))
        throw Error("cannot write shard " + path + ": " + std::to_string(tokens.size()) +
                    " tokens exceed the format's int32 count");
    const int32_t header[kShardHeaderInts] = {kShardMagic, kShardVersion, int32_t(tokens.size())};
    std::string bytes(reinterpret_cast<const char*>(header), sizeof header);
    bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
    write_file_atomic(path, bytes);
}

std::vector<uint16_t> read_shard(const std::string& path, int vocab_size) {
    std::ifstream f = open_shard(path);
    std::vector<uint16_t> tokens(read_header(f, path));
    if (!f.read(reinterpret_cast<char*>(tokens.data()), std::streamsize(tokens.size() * sizeof(uint16_t))))
        throw Error("cannot read shard " + path);
    check_tokens(tokens.data(), tokens.size(), 0, vocab_size, path);
    return tokens;
}

std::vector<std::string> glob_shards(const std::string& pattern) {
    glob_t g;
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
    if (rc != 0) {
        ::globfree(&g);
        if (rc == GLOB_NOMATCH) throw Error("no files match " + pattern);
        throw Error("cannot list files matching " + pattern + (rc == GLOB_ABORTED ? ": read error" : ": out of memory"));
    }
    std::vector<std::string> paths(g.gl_pathv, g.gl_pathv + g.gl_pathc);
    ::globfree(&g);
    // glob sorts by the locale's collation; byte order is the same on every machine
    std::sort(paths.begin(), paths.end());
    return paths;
}

DataLoader::DataLoader(const std::string& pattern, int B, int T, int rank, int world, bool shuffle,
                       uint64_t seed, int vocab_size, int micro_steps)
    : B_(B), T_(T), rank_(rank), world_(world), micro_steps_(micro_steps), shuffle_(shuffle), seed_(seed),
      vocab_size_(vocab_size) {
    if (B <= 0 || T <= 0 || micro_steps <= 0)
        throw Error("data loader: B, T and the micro-batches a step must be positive (B=" + std::to_string(B) +
                    ", T=" + std::to_string(T) + ", micro-batches " + std::to_string(micro_steps) + ")");
    if (world <= 0 || rank < 0 || rank >= world)
        throw Error("data loader: rank " + std::to_string(rank) + " outside 0.." + std::to_string(world - 1));
    paths_ = glob_shards(pattern);
    const uint64_t stride = uint64_t(B) * uint64_t(T);
    uint64_t total_tokens = 0;
    for (size_t s = 0; s < paths_.size(); ++s) {
        files_.push_back(open_shard(paths_[s]));
        const uint64_t n = read_header(files_.back(), paths_[s]);
        total_tokens += n;
        for (uint64_t offset = 0; offset + stride + 1 <= n; offset += stride) windows_.push_back({uint32_t(s), offset});
    }
    if (windows_.size() < size_t(world) * size_t(micro_steps))
        throw Error("data " + pattern + ": " + std::to_string(total_tokens) + " tokens in " +
                    std::to_string(paths_.size()) + " shard(s) give " + std::to_string(windows_.size()) +
                    " windows of B*T+1 tokens (B=" + std::to_string(B) + ", T=" + std::to_string(T) +
                    "), fewer than one step's " + std::to_string(world) + " rank(s)" +
                    (micro_steps > 1 ? " x " + std::to_string(micro_steps) + " micro-batches" : "") +
                    ": need more data or smaller B or T");
    buf_.resize(stride + 1);
    build_order();
}

void DataLoader::build_order() {
    std::vector<uint64_t> global(windows_.size());
    std::iota(global.begin(), global.end(), uint64_t(0));
    if (shuffle_) {  // Fisher-Yates with the portable Rng: the same order on every rank and machine
        Rng rng(epoch_seed(seed_, state_.epoch));
        for (size_t i = global.size() - 1; i > 0; --i) std::swap(global[i], global[rng.below(i + 1)]);
    }
    order_.resize(windows_per_rank());
    for (size_t k = 0; k < order_.size(); ++k) order_[k] = global[size_t(rank_) + k * size_t(world_)];
}

void DataLoader::set_state(State s) {
    if (s.next > windows_per_rank())
        throw Error("data loader state: next window " + std::to_string(s.next) + " is beyond this rank's " +
                    std::to_string(windows_per_rank()) + " windows per epoch (saved with other data, B, T, ranks or grad_accum?)");
    state_ = s;
    build_order();
}

void DataLoader::reset() { set_state(State{}); }

void DataLoader::next_batch(int* inputs, int* targets) {
    if (state_.next == order_.size()) {
        ++state_.epoch;
        state_.next = 0;
        build_order();
    }
    const Window w = windows_[order_[state_.next]];
    std::ifstream& f = files_[w.shard];
    f.seekg(std::streamoff(kHeaderBytes + w.offset * sizeof(uint16_t)));
    if (!f.read(reinterpret_cast<char*>(buf_.data()), std::streamsize(buf_.size() * sizeof(uint16_t))))
        throw Error("cannot read shard " + paths_[w.shard] + " at token offset " + std::to_string(w.offset) +
                    " (changed since it was opened?)");
    check_tokens(buf_.data(), buf_.size(), w.offset, vocab_size_, paths_[w.shard]);
    for (size_t i = 0; i + 1 < buf_.size(); ++i) {
        inputs[i] = buf_[i];
        targets[i] = buf_[i + 1];
    }
    ++state_.next;
}

}  // namespace codagpt
