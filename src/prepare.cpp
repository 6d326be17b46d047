#include "prepare.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <regex>
#include <string_view>

#include "common.hpp"
#include "data.hpp"
#include "fileio.hpp"

namespace fs = std::filesystem;

namespace codagpt {
namespace {

std::string read_file(const std::string& path) {
    struct Closer { void operator()(std::FILE* f) const { std::fclose(f); } };
    std::unique_ptr<std::FILE, Closer> f(std::fopen(path.c_str(), "rb"));
    if (!f) throw Error("cannot open input file " + path + ": " + std::strerror(errno));
    std::string text;
    char buf[1 << 16];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f.get())) > 0;) text.append(buf, n);
    // fopen succeeds on a folder; reading it is what fails
    if (std::ferror(f.get())) throw Error("cannot read input file " + path + ": " + std::strerror(errno));
    return text;
}

// Sections as llm.c's tinyshakespeare.py cuts them with text.replace("\n\n", "\n\n<|endoftext|>"):
// each ends right after a "\n\n" (matched left to right, not overlapping); the rest, possibly empty,
// is the last section.
void split_on_blank_lines(std::string_view text, std::vector<std::string_view>& docs) {
    size_t pos = 0;
    for (size_t cut; (cut = text.find("\n\n", pos)) != std::string_view::npos; pos = cut + 2)
        docs.push_back(text.substr(pos, cut + 2 - pos));
    docs.push_back(text.substr(pos));
}

// Number of leading documents for validation: the boundary whose token count is nearest to
// val_fraction of all tokens, keeping at least one document on each side.
size_t val_documents(const std::vector<std::vector<int>>& ids, double val_fraction) {
    if (val_fraction == 0) return 0;
    size_t total = 0;
    for (const auto& d : ids) total += d.size() + 1;
    const double target = val_fraction * double(total);
    size_t best = 1, cumulative = 0;
    double best_distance = INFINITY;
    for (size_t k = 1; k < ids.size(); ++k) {
        cumulative += ids[k - 1].size() + 1;
        const double distance = std::fabs(double(cumulative) - target);
        if (distance < best_distance) {
            best = k;
            best_distance = distance;
        }
    }
    return best;
}

// Writes documents [first, last), each preceded by EOT, as <out_dir>/<split>_000000.bin, ... of
// shard_tokens tokens each (a document may continue in the next shard, as in llm.c's FineWeb).
// Returns the token count; appends the paths to `shards`.
size_t write_split(const std::vector<std::vector<int>>& ids, size_t first, size_t last, const fs::path& out_dir,
                   const std::string& split, size_t shard_tokens, std::vector<std::string>& shards) {
    std::vector<uint16_t> shard;
    size_t count = 0, index = 0;
    auto flush = [&] {
        char name[32];
        std::snprintf(name, sizeof name, "%s_%06zu.bin", split.c_str(), index++);
        shards.push_back((out_dir / name).string());
        write_shard(shards.back(), shard);
        count += shard.size();
        shard.clear();
    };
    auto push = [&](int id) {
        shard.push_back(uint16_t(id));
        if (shard.size() == shard_tokens) flush();
    };
    for (size_t d = first; d < last; ++d) {
        push(Tokenizer::kEot);
        for (int id : ids[d]) push(id);
    }
    if (!shard.empty()) flush();
    return count;
}

// The names of the shards prepare writes into its folder, and replaces or removes there.
bool is_shard_name(const fs::path& name) {
    static const std::regex shard_name(R"((train|val)_\d{6}\.bin)");
    return std::regex_match(name.string(), shard_name);
}

// An earlier run with more data may have left train_000007.bin behind, which a train_*.bin glob
// would then mix into this run's data.
void remove_stale_shards(const fs::path& out_dir, const std::vector<std::string>& written) {
    std::vector<fs::path> keep;
    for (const std::string& path : written) keep.push_back(fs::path(path).filename());
    for (const auto& entry : fs::directory_iterator(out_dir)) {
        const fs::path name = entry.path().filename();
        if (is_shard_name(name) && std::find(keep.begin(), keep.end(), name) == keep.end()) {
            std::error_code ec;
            if (!fs::remove(entry.path(), ec) && ec)
                throw Error("cannot remove stale shard " + entry.path().string() + ": " + ec.message());
        }
    }
}

}  // namespace

PrepareStats prepare_shards(const std::vector<std::string>& inputs, const std::string& out_dir,
                            const PrepareOptions& opt, const Tokenizer& tok) {
    if (inputs.empty()) throw Error("prepare: no input files");
    if (!(opt.val_fraction >= 0 && opt.val_fraction < 1)) {
        char fraction[32];
        std::snprintf(fraction, sizeof fraction, "%g", opt.val_fraction);
        throw Error("prepare: val fraction " + std::string(fraction) + " is outside [0, 1)");
    }
    if (opt.shard_tokens == 0) throw Error("prepare: shard tokens must be positive");
    for (const std::string& path : inputs) {
        const fs::path p(path), folder = p.has_parent_path() ? p.parent_path() : fs::path(".");
        std::error_code ec;  // false, with ec set, where out_dir does not exist yet
        if (is_shard_name(p.filename()) && fs::equivalent(folder, out_dir, ec))
            throw Error("prepare: input " + one_line(path) + " is named like a shard in the output folder " +
                        one_line(out_dir) +
                        ", where prepare replaces or removes such files: move it or choose another --out");
    }

    std::vector<std::string> texts;
    for (const std::string& path : inputs) texts.push_back(read_file(path));
    std::vector<std::string_view> docs;
    for (const std::string& text : texts) {
        if (opt.split_on_blank_lines) split_on_blank_lines(text, docs);
        else docs.push_back(text);
    }
    if (opt.val_fraction > 0 && docs.size() < 2)
        throw Error("prepare: a validation split needs at least 2 documents, the input has " +
                    std::to_string(docs.size()) +
                    " (give more files, split on blank lines, or set the val fraction to 0)");

    // Each document into its own slot: the output order does not depend on the threads.
    std::vector<std::vector<int>> ids(docs.size());
    std::exception_ptr failure;  // an exception must not leave an OpenMP region
#pragma omp parallel for schedule(dynamic)
    for (std::ptrdiff_t d = 0; d < std::ptrdiff_t(docs.size()); ++d) {
        try {
            ids[d] = tok.encode(docs[d]);
        } catch (...) {
#pragma omp critical
            if (!failure) failure = std::current_exception();
        }
    }
    if (failure) std::rethrow_exception(failure);
    for (const auto& d : ids)
        for (int id : d)
            if (id < 0 || id > UINT16_MAX)
                throw Error("prepare: token id " + std::to_string(id) + " does not fit the shards' uint16 tokens");

    create_folders(out_dir);

    PrepareStats stats;
    stats.documents = docs.size();
    const size_t n_val = val_documents(ids, opt.val_fraction);
    stats.val_tokens = write_split(ids, 0, n_val, out_dir, "val", opt.shard_tokens, stats.shards);
    stats.train_tokens = write_split(ids, n_val, ids.size(), out_dir, "train", opt.shard_tokens, stats.shards);
    remove_stale_shards(out_dir, stats.shards);
    return stats;
}

}  // namespace codagpt
