#include "checkpoint.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>

#include "common.hpp"
#include "fileio.hpp"
#include "gpt2_params.hpp"

namespace codagpt {
namespace fs = std::filesystem;
using nlohmann::json;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoints store host floats and integers as they are");

namespace {

// Slicing-by-8 tables: eight bytes per step, a few GB/s, so that checking a multi-GB checkpoint
// costs little next to reading it.
struct CrcTables {
    uint32_t t[8][256];
    CrcTables() {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
            t[0][i] = c;
        }
        for (uint32_t i = 0; i < 256; i++)
            for (int k = 1; k < 8; k++) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
    }
};

const char* const kGroups[3] = {"param", "adam_m", "adam_v"};  // the tensor groups, in file order

uint64_t data_start(uint64_t metadata_bytes) {
    return (kCheckpointHeaderBytes + metadata_bytes + kCheckpointAlign - 1) / kCheckpointAlign * kCheckpointAlign;
}

size_t layout_floats(const std::vector<ParamInfo>& layout) {
    size_t n = 0;
    for (const ParamInfo& p : layout) n += p.size;
    return n;
}

// A checkpoint's error: the file, then the problem.
Error bad(const std::string& path, const std::string& what) { return Error("checkpoint " + path + ": " + what); }

uint64_t unsigned_at(const json& j, const char* key) {
    const json& v = j.at(key);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
        throw Error(std::string(key) + " must be a non-negative integer, got " + v.dump());
    return v.get<uint64_t>();
}

// j[key]: an array of finite numbers (an outlier window), of at most kMaxOutlierWindow.
std::vector<double> finite_numbers(const json& j, const char* key) {
    if (!j.contains(key) || !j[key].is_array() || j[key].size() > size_t(kMaxOutlierWindow))
        throw Error(std::string("outlier_windows.") + key + " is not an array of at most " +
                    std::to_string(kMaxOutlierWindow) + " numbers");
    std::vector<double> out;
    for (const json& x : j[key]) {
        if (!x.is_number() || !std::isfinite(x.get<double>()))
            throw Error(std::string("outlier_windows.") + key + " holds " +
                        (x.is_number() ? x.dump() : std::string("a ") + x.type_name()) + ", not a finite number");
        out.push_back(x.get<double>());
    }
    return out;
}

// Fills everything but the tensor data from the metadata, checking the tensor table against the
// checkpoint's own config: the tensors must be exactly param.*, adam_m.*, adam_v.* over its
// param_layout(), contiguous, f32, covering data_bytes.
void parse_metadata(const std::string& text, uint64_t data_bytes, Checkpoint& ck) {
    const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) throw Error("its metadata is not a JSON object");
    try {
        if (j.value("format", "") != "codagpt checkpoint")
            throw Error("its metadata does not say \"format\": \"codagpt checkpoint\"");
        try {
            ck.config = config_from_json(j.at("config"));
        } catch (const Error& e) {
            throw Error(std::string("config in its metadata: ") + e.what());
        }
        const uint64_t step = unsigned_at(j, "step"), t = unsigned_at(j, "adamw_t");
        if (step > uint64_t(std::numeric_limits<int>::max())) throw Error("step " + std::to_string(step) + " is out of range");
        ck.step = int(step);
        ck.state.t = long(std::min<uint64_t>(t, std::numeric_limits<long>::max()));
        const json& loader = j.at("train_loader");
        ck.train_loader.epoch = unsigned_at(loader, "epoch");
        ck.train_loader.next = unsigned_at(loader, "next");
        // Written by data-parallel runs; older files are of one rank.
        const uint64_t ranks = loader.contains("ranks") ? unsigned_at(loader, "ranks") : 1;
        if (ranks < 1 || ranks > (1u << 20)) throw Error("train_loader.ranks " + std::to_string(ranks) + " is out of range");
        ck.data_ranks = int(ranks);
        if (j.contains("outlier_windows")) {
            const json& w = j.at("outlier_windows");
            if (!w.is_object()) throw Error("outlier_windows is not an object of \"loss\" and \"grad_norm\"");
            ck.loss_window = finite_numbers(w, "loss");
            ck.grad_norm_window = finite_numbers(w, "grad_norm");
        }
        if (j.contains("bad_steps_in_a_row")) {
            const uint64_t bad = unsigned_at(j, "bad_steps_in_a_row");
            if (bad > step) throw Error("bad_steps_in_a_row " + std::to_string(bad) + " is more than the steps taken");
            ck.bad_steps_in_a_row = int(bad);
        }

        const json& table = j.at("tensors");
        if (!table.is_array()) throw Error("tensor table: \"tensors\" is not an array");
        const std::vector<ParamInfo> layout = param_layout(ck.config.model);
        size_t i = 0;
        uint64_t offset = 0;
        for (const char* group : kGroups) {
            for (const ParamInfo& p : layout) {
                const std::string name = std::string(group) + "." + p.name;
                if (i >= table.size()) throw Error("tensor table: " + name + " is missing");
                const json& t = table[i];
                const std::string got = t.at("name").get<std::string>();
                if (got != name)
                    throw Error("tensor table: entry " + std::to_string(i) + " is '" + one_line(got) + "', expected '" + name + "'");
                if (t.at("dtype") != "f32")
                    throw Error("tensor table: " + name + " has dtype " + t.at("dtype").dump() + ", expected \"f32\"");
                const uint64_t at = unsigned_at(t, "offset"), size = unsigned_at(t, "size");
                if (at != offset || size != p.size * sizeof(float))
                    throw Error("tensor table: " + name + " is " + std::to_string(size) + " bytes at offset " +
                                std::to_string(at) + ", its config gives " + std::to_string(p.size * sizeof(float)) +
                                " at " + std::to_string(offset));
                offset += size;
                ++i;
            }
        }
        if (table.size() != i)
            throw Error("tensor table: " + std::to_string(table.size()) + " entries, expected " + std::to_string(i));
        if (offset != data_bytes)
            throw Error("tensor table: the tensors cover " + std::to_string(offset) + " bytes, the header says " +
                        std::to_string(data_bytes));
    } catch (const json::exception& e) {
        throw Error(std::string("its metadata: ") + e.what());
    }
}

void read_exact(std::ifstream& f, void* dst, size_t n, const std::string& path) {
    if (!f.read(static_cast<char*>(dst), std::streamsize(n)))
        throw bad(path, "truncated: the file ended while being read (changed since it was opened?)");
}

// CRC of the file's first n bytes, read in chunks.
uint32_t file_crc(const std::string& path, uint64_t n) {
    std::ifstream f(path, std::ios::binary);
    std::vector<char> buf(8 << 20);
    uint32_t crc = 0;
    while (n > 0) {
        const size_t k = (size_t)std::min<uint64_t>(n, buf.size());
        read_exact(f, buf.data(), k, path);
        crc = crc32(buf.data(), k, crc);
        n -= k;
    }
    return crc;
}

std::string hex32(uint32_t x) {
    char s[16];
    std::snprintf(s, sizeof s, "%08x", x);
    return s;
}

Error checksum_mismatch(const std::string& path, uint32_t stored, uint32_t computed) {
    return bad(path, "checksum mismatch (stored " + hex32(stored) + ", computed " + hex32(computed) +
                         "): the file is corrupted");
}

}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
    static const CrcTables tables;
    const auto& T = tables.t;
    const auto* p = static_cast<const uint8_t*>(data);
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo, hi;
        std::memcpy(&lo, p, 4);
        std::memcpy(&hi, p + 4, 4);
        lo ^= crc;
        crc = T[7][lo & 0xFF] ^ T[6][(lo >> 8) & 0xFF] ^ T[5][(lo >> 16) & 0xFF] ^ T[4][lo >> 24] ^
              T[3][hi & 0xFF] ^ T[2][(hi >> 8) & 0xFF] ^ T[1][(hi >> 16) & 0xFF] ^ T[0][hi >> 24];
    }
    for (; n > 0; n--) crc = (crc >> 8) ^ T[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

void write_checkpoint(const Checkpoint& ck, const std::function<void(const void*, size_t)>& sink) {
    const std::vector<ParamInfo> layout = param_layout(ck.config.model);
    const size_t n = layout_floats(layout);
    const TrainState& s = ck.state;
    if (s.params.size() != n || s.m.size() != n || s.v.size() != n)
        throw Error("cannot write a checkpoint of " + std::to_string(s.params.size()) + " parameters for a model of " +
                    std::to_string(n));
    json table = json::array();
    uint64_t offset = 0;
    for (const char* group : kGroups)
        for (const ParamInfo& p : layout) {
            table.push_back({{"name", std::string(group) + "." + p.name}, {"dtype", "f32"}, {"offset", offset},
                             {"size", p.size * sizeof(float)}});
            offset += p.size * sizeof(float);
        }
    const json meta = {{"format", "codagpt checkpoint"},
                       {"config", config_to_json(ck.config)},
                       {"step", ck.step},
                       {"adamw_t", s.t},
                       {"train_loader",
                        {{"epoch", ck.train_loader.epoch}, {"next", ck.train_loader.next}, {"ranks", ck.data_ranks}}},
                       {"outlier_windows", {{"loss", ck.loss_window}, {"grad_norm", ck.grad_norm_window}}},
                       {"bad_steps_in_a_row", ck.bad_steps_in_a_row},
                       {"tensors", table}};
    const std::string text = meta.dump();
    if (text.size() > std::numeric_limits<uint32_t>::max()) throw Error("checkpoint metadata is too large");

    char head[kCheckpointHeaderBytes];
    const uint32_t version = kCheckpointVersion, meta_bytes = uint32_t(text.size());
    const uint64_t data_bytes = offset;
    std::memcpy(head, kCheckpointMagic, 8);
    std::memcpy(head + 8, &version, 4);
    std::memcpy(head + 12, &meta_bytes, 4);
    std::memcpy(head + 16, &data_bytes, 8);
    const std::string pad(data_start(meta_bytes) - kCheckpointHeaderBytes - meta_bytes, '\0');

    uint32_t crc = 0;
    auto put = [&](const void* p, size_t k) {
        crc = crc32(p, k, crc);
        sink(p, k);
    };
    put(head, sizeof head);
    put(text.data(), text.size());
    put(pad.data(), pad.size());
    for (const std::vector<float>* t : {&s.params, &s.m, &s.v}) put(t->data(), t->size() * sizeof(float));
    sink(&crc, 4);
}

void save_checkpoint(const std::string& path, const Checkpoint& ck) {
    AtomicFileWriter out(path);
    write_checkpoint(ck, [&](const void* p, size_t k) { out.write(p, k); });
    out.commit();
}

Checkpoint load_checkpoint(const std::string& path) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) throw bad(path, "is a folder, not a file");
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error("cannot open checkpoint " + path + ": " + std::strerror(errno));
    const uint64_t size = fs::file_size(path, ec);
    if (ec) throw Error("cannot read checkpoint " + path + ": " + ec.message());

    // Fixed header: what the file is, which version, and how long it must be.
    char head[kCheckpointHeaderBytes] = {};
    const size_t got = (size_t)std::min<uint64_t>(size, sizeof head);
    read_exact(f, head, got, path);
    if (std::memcmp(head, kCheckpointMagic, std::min<size_t>(got, 8)) != 0)
        throw bad(path, "not a codagpt checkpoint (bad magic)");
    if (got < sizeof head)
        throw bad(path, "truncated: " + std::to_string(size) + " bytes, less than its " +
                            std::to_string(kCheckpointHeaderBytes) + "-byte header");
    uint32_t version, meta_bytes;
    uint64_t data_bytes;
    std::memcpy(&version, head + 8, 4);
    std::memcpy(&meta_bytes, head + 12, 4);
    std::memcpy(&data_bytes, head + 16, 8);
    if (version != kCheckpointVersion)
        throw bad(path, "unsupported checkpoint format version " + std::to_string(version) + " (this build reads " +
                            std::to_string(kCheckpointVersion) + ")");
    const uint64_t start = data_start(meta_bytes);
    const bool fits = data_bytes <= size && start + data_bytes + 4 <= size;
    if (!fits)
        throw bad(path, "truncated: " + std::to_string(size) + " bytes, its header describes " +
                            (data_bytes <= size ? std::to_string(start + data_bytes + 4) : "more than that"));
    if (size != start + data_bytes + 4)
        throw bad(path, std::to_string(size - (start + data_bytes + 4)) +
                            " unexpected bytes after the checksum (damaged or not written by codagpt)");

    std::string text(meta_bytes, '\0');
    read_exact(f, text.data(), text.size(), path);
    std::string pad(start - kCheckpointHeaderBytes - meta_bytes, '\0');
    read_exact(f, pad.data(), pad.size(), path);
    uint32_t crc = crc32(head, sizeof head);
    crc = crc32(text.data(), text.size(), crc);
    crc = crc32(pad.data(), pad.size(), crc);

    Checkpoint ck;
    try {
        parse_metadata(text, data_bytes, ck);
    } catch (const Error& e) {
        // Damage shows as a checksum mismatch; only an intact file reports its metadata as wrong.
        uint32_t stored;
        std::ifstream tail(path, std::ios::binary);
        tail.seekg(std::streamoff(size - 4));
        read_exact(tail, &stored, 4, path);
        const uint32_t computed = file_crc(path, size - 4);
        if (stored != computed) throw checksum_mismatch(path, stored, computed);
        throw bad(path, e.what());
    }

    // Tensor data, straight into the state: parse_metadata checked that it is param, m, v in order.
    const size_t n = layout_floats(param_layout(ck.config.model));
    for (std::vector<float>* t : {&ck.state.params, &ck.state.m, &ck.state.v}) {
        t->resize(n);
        read_exact(f, t->data(), n * sizeof(float), path);
        crc = crc32(t->data(), n * sizeof(float), crc);
    }
    uint32_t stored;
    read_exact(f, &stored, 4, path);
    if (stored != crc) throw checksum_mismatch(path, stored, crc);
    return ck;
}

void check_resumable(const Checkpoint& ck, const TrainConfig& cfg, const std::string& path) {
    const json saved = config_to_json(ck.config), now = config_to_json(cfg);
    struct Key {
        const char* name;
        const char* why;
    };
    static const Key keys[] = {
        {"n_layer", "another model shape"}, {"n_head", "another model shape"},
        {"n_embd", "another model shape"},  {"max_seq_len", "another model shape"},
        {"vocab_size", "another vocabulary"}, {"batch_size", "another data order"},
        {"seq_len", "another data order"},  {"shuffle", "another data order"},
        {"seed", "another data order"},
    };
    for (const Key& k : keys)
        if (saved[k.name] != now[k.name])
            throw bad(path, std::string(k.name) + " is " + saved[k.name].dump() + " in the checkpoint but " +
                                now[k.name].dump() + " in this run's config (" + k.why + ")");
    if (ck.step > cfg.steps)
        throw bad(path, "it is at step " + std::to_string(ck.step) + ", beyond this run's steps (" +
                            std::to_string(cfg.steps) + ")");
}

DataLoader::State loader_state_for(const Checkpoint& ck, int ranks, int micro_steps, uint64_t windows_per_rank) {
    if (ranks < 1) throw Error("loader_state_for: rank count " + std::to_string(ranks) + " is not positive");
    if (micro_steps < 1) throw Error("loader_state_for: micro-steps " + std::to_string(micro_steps) + " is not positive");
    uint64_t next = ck.train_loader.next * uint64_t(ck.data_ranks) / uint64_t(ranks);
    next -= next % uint64_t(micro_steps);
    return {ck.train_loader.epoch, std::min(next, windows_per_rank)};
}

std::string checkpoint_path(const std::string& out_dir, int step) {
    return (fs::path(out_dir) / ("ckpt_" + std::to_string(step) + ".bin")).string();
}

namespace {
// The step of a checkpoint's file name (exactly ckpt_<step>.bin, checkpoint_path's), if it is one.
std::optional<int> checkpoint_step(const std::string& name) {
    const size_t prefix = 5, suffix = 4;  // "ckpt_", ".bin"
    if (name.size() <= prefix + suffix || name.compare(0, prefix, "ckpt_") != 0 ||
        name.compare(name.size() - suffix, suffix, ".bin") != 0)
        return std::nullopt;
    const std::string digits = name.substr(prefix, name.size() - prefix - suffix);
    if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return std::nullopt;
    return std::stoi(digits);
}

// Deletes `path`, warning on failure: not fatal, the run and its newer checkpoints are fine; the
// disk just fills sooner.
void remove_or_warn(const std::string& path, const char* what) {
    std::error_code ec;
    fs::remove(path, ec);
    if (ec) std::fprintf(stderr, "warning: cannot delete %s %s: %s\n", what, path.c_str(), ec.message().c_str());
}
}  // namespace

std::vector<CheckpointFile> list_checkpoints(const std::string& out_dir) {
    std::vector<CheckpointFile> found;
    std::error_code ec;
    for (fs::directory_iterator it(out_dir, ec), end; !ec && it != end; it.increment(ec))
        if (const std::optional<int> step = checkpoint_step(it->path().filename().string()))
            found.push_back({*step, it->path().string()});
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
    return found;
}

std::string latest_checkpoint(const std::string& out_dir) {
    const std::vector<CheckpointFile> all = list_checkpoints(out_dir);
    if (all.empty()) throw Error("no checkpoint ckpt_<step>.bin in " + out_dir + " to resume from (--resume latest)");
    return all.back().path;
}

std::vector<CheckpointFile> check_run_folder(const std::string& out_dir, const std::string& log,
                                             const std::string& resume_path, std::optional<int> resume_step) {
    const std::vector<CheckpointFile> held = list_checkpoints(out_dir);
    const bool resumes_from_here = std::any_of(held.begin(), held.end(), [&](const CheckpointFile& c) {
        std::error_code ec;
        return fs::equivalent(c.path, resume_path, ec);
    });
    const std::string where = "out_dir " + one_line(out_dir);
    if (!resume_step) {
        if (!held.empty())
            throw Error(where + " holds the checkpoints of an earlier run (newest " +
                        fs::path(held.back().path).filename().string() +
                        "): continue it with --resume latest, or train into another out_dir");
        return {};
    }
    if (!resumes_from_here) {
        const std::string elsewhere = ": resume " + one_line(resume_path) + " into another out_dir";
        if (!held.empty())
            throw Error(where + " holds the checkpoints of another run (newest " +
                        fs::path(held.back().path).filename().string() + ")" + elsewhere);
        if (fs::exists(log)) throw Error(where + " holds the log of another run (" + fs::path(log).filename().string() + ")" + elsewhere);
        return {};
    }
    std::vector<CheckpointFile> later;
    for (const CheckpointFile& c : held)
        if (c.step > *resume_step) later.push_back(c);
    return later;
}

std::string set_aside(const std::string& path) {
    std::string aside = path + ".superseded";
    for (int n = 2; fs::exists(aside); n++) aside = path + ".superseded." + std::to_string(n);
    std::error_code ec;
    fs::rename(path, aside, ec);
    if (ec) throw Error("cannot move " + one_line(path) + " aside to " + one_line(aside) + ": " + ec.message());
    return aside;
}

void prune_checkpoints(const std::string& out_dir, int step, int keep) {
    std::vector<CheckpointFile> older;
    for (const CheckpointFile& c : list_checkpoints(out_dir))
        if (c.step <= step) older.push_back(c);
    for (size_t i = 0; i + size_t(std::max(keep, 1)) < older.size(); i++) remove_or_warn(older[i].path, "old checkpoint");

    // A writer killed before its rename (SIGKILL, a node lost) leaves its temporary file, as large
    // as a checkpoint.
    for (const OrphanedTemporary& t : orphaned_temporaries(out_dir))
        if (checkpoint_step(fs::path(t.target).filename().string())) remove_or_warn(t.path, "the unfinished checkpoint");
}

}  // namespace codagpt
