#include "interchange.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "checkpoint.hpp"
#include "common.hpp"
#include "fileio.hpp"
#include "gpt2_params.hpp"
#include "model_cpu.hpp"
#include "rng.hpp"

namespace codagpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// ---------------------------------------------------------------- element conversion

uint16_t bf16_from_f32(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                           // nearest even
    return uint16_t(u >> 16);
}

float f32_from_bf16(uint16_t h) {
    const uint32_t u = uint32_t(h) << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

size_t dtype_bytes(WeightsDtype d) { return d == WeightsDtype::f32 ? 4 : 2; }

using Sink = std::function<void(const void*, size_t)>;

// n floats to the sink as dtype, converted in chunks (no copy of a whole tensor).
void put_floats(const Sink& sink, const float* p, size_t n, WeightsDtype dtype) {
    if (dtype == WeightsDtype::f32) {
        sink(p, n * sizeof(float));
        return;
    }
    constexpr size_t kChunk = 1 << 16;
    std::vector<uint16_t> buf(std::min(n, kChunk));
    for (size_t i = 0; i < n; i += kChunk) {
        const size_t k = std::min(kChunk, n - i);
        for (size_t j = 0; j < k; j++) buf[j] = bf16_from_f32(p[i + j]);
        sink(buf.data(), k * 2);
    }
}

// A file opened for reading at arbitrary offsets; errors name the file.
class InFile {
public:
    explicit InFile(const std::string& path, const char* what) : path_(path) {
        std::error_code ec;
        if (fs::is_directory(path, ec)) throw Error(path + ": is a folder, not a " + what + " file");
        f_ = std::fopen(path.c_str(), "rb");
        if (!f_) throw Error("cannot open " + std::string(what) + " file " + path + ": " + std::strerror(errno));
        size_ = fs::file_size(path, ec);
        if (ec) throw Error("cannot read " + path + ": " + ec.message());
    }
    ~InFile() { std::fclose(f_); }
    InFile(const InFile&) = delete;
    InFile& operator=(const InFile&) = delete;
    uint64_t size() const { return size_; }
    void read_at(uint64_t offset, void* dst, size_t n) {
        if (offset + n > size_ || fseeko(f_, (off_t)offset, SEEK_SET) != 0 || std::fread(dst, 1, n, f_) != n)
            throw Error(path_ + ": cannot read " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                        " (truncated or unreadable)");
    }
    // n elements of dtype at offset into fp32 dst.
    void read_floats_at(uint64_t offset, float* dst, size_t n, WeightsDtype dtype) {
        if (dtype == WeightsDtype::f32) return read_at(offset, dst, n * 4);
        constexpr size_t kChunk = 1 << 16;
        std::vector<uint16_t> buf(std::min(n, kChunk));
        for (size_t i = 0; i < n; i += kChunk) {
            const size_t k = std::min(kChunk, n - i);
            read_at(offset + i * 2, buf.data(), k * 2);
            for (size_t j = 0; j < k; j++) dst[i + j] = f32_from_bf16(buf[j]);
        }
    }

private:
    std::string path_;
    std::FILE* f_ = nullptr;
    uint64_t size_ = 0;
};

std::map<std::string, size_t> param_offsets(const ModelConfig& m) {
    std::map<std::string, size_t> off;
    size_t o = 0;
    for (const ParamInfo& p : param_layout(m)) {
        off[p.name] = o;
        o += p.size;
    }
    return off;
}

size_t num_floats(const ModelConfig& m) {
    size_t n = 0;
    for (const ParamInfo& p : param_layout(m)) n += p.size;
    return n;
}

// ---------------------------------------------------------------- safetensors

// One HF tensor: where its elements live in our flat buffer (contiguous in both layouts).
struct HfTensor {
    std::string name;
    std::vector<int64_t> shape;
    size_t offset;  // in floats, into the param_layout buffer
    size_t count() const {
        size_t n = 1;
        for (int64_t d : shape) n *= size_t(d);
        return n;
    }
};

std::vector<HfTensor> hf_tensors(const ModelConfig& m, const std::string& prefix) {
    const auto off = param_offsets(m);
    const int64_t C = m.n_embd, V = m.vocab_size, T = m.max_seq_len;
    std::vector<HfTensor> t;
    t.push_back({prefix + "wte.weight", {V, C}, off.at("wte")});
    t.push_back({prefix + "wpe.weight", {T, C}, off.at("wpe")});
    for (int l = 0; l < m.n_layer; l++) {
        const std::string h = prefix + "h." + std::to_string(l) + ".";
        const size_t L = size_t(l);
        t.push_back({h + "ln_1.weight", {C}, off.at("ln1_w") + L * C});
        t.push_back({h + "ln_1.bias", {C}, off.at("ln1_b") + L * C});
        t.push_back({h + "attn.c_attn.weight", {C, 3 * C}, off.at("qkv_w") + L * C * 3 * C});
        t.push_back({h + "attn.c_attn.bias", {3 * C}, off.at("qkv_b") + L * 3 * C});
        t.push_back({h + "attn.c_proj.weight", {C, C}, off.at("proj_w") + L * C * C});
        t.push_back({h + "attn.c_proj.bias", {C}, off.at("proj_b") + L * C});
        t.push_back({h + "ln_2.weight", {C}, off.at("ln2_w") + L * C});
        t.push_back({h + "ln_2.bias", {C}, off.at("ln2_b") + L * C});
        t.push_back({h + "mlp.c_fc.weight", {C, 4 * C}, off.at("fc_w") + L * C * 4 * C});
        t.push_back({h + "mlp.c_fc.bias", {4 * C}, off.at("fc_b") + L * 4 * C});
        t.push_back({h + "mlp.c_proj.weight", {4 * C, C}, off.at("fcproj_w") + L * 4 * C * C});
        t.push_back({h + "mlp.c_proj.bias", {C}, off.at("fcproj_b") + L * C});
    }
    t.push_back({prefix + "ln_f.weight", {C}, off.at("lnf_w")});
    t.push_back({prefix + "ln_f.bias", {C}, off.at("lnf_b")});
    return t;
}

const char* st_dtype_name(WeightsDtype d) { return d == WeightsDtype::f32 ? "F32" : "BF16"; }

// Bytes per element of the safetensors dtypes (to check the offsets of tensors we skip too).
int st_dtype_size(const std::string& d) {
    static const std::map<std::string, int> sizes = {
        {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2},
        {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},     {"F32", 4},     {"F64", 8}, {"I64", 8},
        {"U64", 8}};
    const auto it = sizes.find(d);
    return it == sizes.end() ? 0 : it->second;
}

std::string shape_str(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); i++) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

// Names that GPT-2 safetensors files may hold beside the weights: the tied LM head and the
// causal-mask buffers of older transformers versions.
bool ignorable_hf_name(const std::string& name) {
    auto ends_with = [&](const char* s) {
        const size_t n = std::strlen(s);
        return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
    };
    return name == "lm_head.weight" || ends_with(".attn.bias") || ends_with(".attn.masked_bias");
}

struct StEntry {
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
};

// ---------------------------------------------------------------- llm.c

// The 16 llm.c tensors in file order: our name, element count, and for matmul weights the
// [in, out] shape of ours (llm.c stores [out, in] per layer).
struct LlmcTensor {
    const char* name;
    size_t per_layer;  // elements per layer (or the whole tensor when layers == 1)
    size_t layers;
    size_t in = 0, out = 0;  // nonzero: a matmul weight, transposed per layer
};

std::vector<LlmcTensor> llmc_tensors(const ModelConfig& m, size_t Vp) {
    const size_t L = m.n_layer, C = m.n_embd, T = m.max_seq_len;
    return {{"wte", Vp * C, 1},          {"wpe", T * C, 1},
            {"ln1_w", C, L},             {"ln1_b", C, L},
            {"qkv_w", C * 3 * C, L, C, 3 * C}, {"qkv_b", 3 * C, L},
            {"proj_w", C * C, L, C, C},  {"proj_b", C, L},
            {"ln2_w", C, L},             {"ln2_b", C, L},
            {"fc_w", C * 4 * C, L, C, 4 * C}, {"fc_b", 4 * C, L},
            {"fcproj_w", 4 * C * C, L, 4 * C, C}, {"fcproj_b", C, L},
            {"lnf_w", C, 1},             {"lnf_b", C, 1}};
}

// out[c, r] = in[r, c] for an R x C matrix
void transpose_into(float* out, const float* in, size_t R, size_t C) {
    for (size_t r = 0; r < R; r++)
        for (size_t c = 0; c < C; c++) out[c * R + r] = in[r * C + c];
}

}  // namespace

// ---------------------------------------------------------------- safetensors export

void export_safetensors(const std::string& path, const ModelConfig& m, const float* params, WeightsDtype dtype) {
    const std::vector<HfTensor> tensors = hf_tensors(m, "transformer.");
    json header = json::object();
    header["__metadata__"] = {{"format", "pt"},
                              {"producer", "codagpt"},
                              {"n_layer", std::to_string(m.n_layer)},
                              {"n_head", std::to_string(m.n_head)},
                              {"n_embd", std::to_string(m.n_embd)},
                              {"n_positions", std::to_string(m.max_seq_len)},
                              {"vocab_size", std::to_string(m.vocab_size)}};
    uint64_t offset = 0;
    for (const HfTensor& t : tensors) {
        const uint64_t bytes = t.count() * dtype_bytes(dtype);
        header[t.name] = {{"dtype", st_dtype_name(dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
        offset += bytes;
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // data 8-byte aligned, as the reference writer does
    const uint64_t n = text.size();

    AtomicFileWriter out(path);
    const Sink sink = [&](const void* p, size_t k) { out.write(p, k); };
    sink(&n, 8);
    sink(text.data(), text.size());
    for (const HfTensor& t : tensors) put_floats(sink, params + t.offset, t.count(), dtype);
    out.commit();
}

// ---------------------------------------------------------------- safetensors import

ModelWeights import_safetensors(const std::string& path) {
    InFile f(path, "safetensors");
    auto bad = [&](const std::string& what) { return Error(path + ": not a valid GPT-2 safetensors file: " + one_line(what)); };
    if (f.size() < 8) throw bad("truncated: " + std::to_string(f.size()) + " bytes, less than the 8-byte header length");
    uint64_t n = 0;
    f.read_at(0, &n, 8);
    if (n > f.size() - 8)
        throw bad("header length " + std::to_string(n) + " runs beyond the end of the file (" +
                  std::to_string(f.size()) + " bytes)");
    if (n > (uint64_t(100) << 20)) throw bad("header length " + std::to_string(n) + " is over 100 MB");
    std::string text(n, '\0');
    f.read_at(8, text.data(), n);
    json header;
    try {
        header = json::parse(text);
    } catch (const json::exception& e) {
        throw bad(std::string("header is not valid JSON: ") + e.what());
    }
    if (!header.is_object()) throw bad("header is not a JSON object");
    const uint64_t data_start = 8 + n, data_size = f.size() - data_start;

    // Every entry: well formed, sized as its dtype and shape say, inside the data, not overlapping.
    std::map<std::string, StEntry> entries;
    json meta = json::object();
    for (auto it = header.begin(); it != header.end(); ++it) {
        const std::string& name = it.key();
        if (name == "__metadata__") {
            if (!it->is_object()) throw bad("__metadata__ is not an object");
            meta = *it;
            continue;
        }
        const json& e = *it;
        if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() || !e.contains("shape") ||
            !e["shape"].is_array() || !e.contains("data_offsets") || !e["data_offsets"].is_array() ||
            e["data_offsets"].size() != 2)
            throw bad("tensor " + name + " lacks dtype, shape or data_offsets [begin, end]");
        StEntry s;
        s.dtype = e["dtype"].get<std::string>();
        uint64_t count = 1;
        for (const json& d : e["shape"]) {
            if (!d.is_number_unsigned()) throw bad("tensor " + name + " has a shape entry that is not a count");
            s.shape.push_back(d.get<int64_t>());
            count *= d.get<uint64_t>();
            if (count > data_size) throw bad("tensor " + name + " " + shape_str(s.shape) + " does not fit the file");
        }
        for (const json& d : e["data_offsets"])
            if (!d.is_number_unsigned()) throw bad("tensor " + name + " has data_offsets that are not byte offsets");
        s.begin = e["data_offsets"][0].get<uint64_t>();
        s.end = e["data_offsets"][1].get<uint64_t>();
        const int esize = st_dtype_size(s.dtype);
        if (esize == 0) throw bad("tensor " + name + " has unknown dtype " + s.dtype);
        if (s.begin > s.end || s.end > data_size)
            throw bad("tensor " + name + " data_offsets [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                      "] lie outside the " + std::to_string(data_size) + " data bytes");
        if (s.end - s.begin != count * uint64_t(esize))
            throw bad("tensor " + name + " " + s.dtype + " " + shape_str(s.shape) + " needs " +
                      std::to_string(count * esize) + " bytes, its data_offsets span " + std::to_string(s.end - s.begin));
        entries[name] = s;
    }
    std::vector<std::pair<uint64_t, std::string>> by_begin;
    for (const auto& [name, s] : entries)
        if (s.end > s.begin) by_begin.push_back({s.begin, name});
    std::sort(by_begin.begin(), by_begin.end());
    for (size_t i = 1; i < by_begin.size(); i++)
        if (by_begin[i].first < entries[by_begin[i - 1].second].end)
            throw bad("tensors " + by_begin[i - 1].second + " and " + by_begin[i].second + " overlap");

    // The model's shape from the tensors; n_head from the metadata (shapes do not hold it).
    const std::string prefix = entries.count("transformer.wte.weight") ? "transformer." : "";
    auto need = [&](const std::string& name) -> const StEntry& {
        const auto it = entries.find(name);
        if (it == entries.end()) throw bad("missing tensor " + name);
        return it->second;
    };
    const StEntry& wte = need(prefix + "wte.weight");
    const StEntry& wpe = need(prefix + "wpe.weight");
    if (wte.shape.size() != 2 || wpe.shape.size() != 2)
        throw bad(prefix + "wte.weight and " + prefix + "wpe.weight must be matrices");
    ModelWeights w;
    ModelConfig& m = w.config;
    m.vocab_size = int(wte.shape[0]);
    m.n_embd = int(wte.shape[1]);
    m.max_seq_len = int(wpe.shape[0]);
    m.n_layer = 0;
    while (entries.count(prefix + "h." + std::to_string(m.n_layer) + ".ln_1.weight")) m.n_layer++;
    if (m.vocab_size < 1 || m.n_embd < 1 || m.max_seq_len < 1 || m.n_layer < 1)
        throw bad("empty model: vocabulary " + std::to_string(m.vocab_size) + ", width " + std::to_string(m.n_embd) +
                  ", positions " + std::to_string(m.max_seq_len) + ", layers " + std::to_string(m.n_layer));
    if (wte.shape[0] > (1 << 24) || wte.shape[1] > (1 << 20) || wpe.shape[0] > (1 << 24))
        throw bad("implausible sizes " + shape_str(wte.shape) + " / " + shape_str(wpe.shape));
    m.n_head = m.n_embd % 64 == 0 ? m.n_embd / 64 : 0;
    if (meta.contains("n_head")) {
        const json& h = meta["n_head"];
        try {
            m.n_head = h.is_string() ? std::stoi(h.get<std::string>()) : h.get<int>();
        } catch (const std::exception&) {
            throw bad("__metadata__ n_head is not a number");
        }
    }
    if (m.n_head < 1 || m.n_embd % m.n_head != 0)
        throw bad("cannot tell the number of heads: __metadata__ n_head " +
                  (meta.contains("n_head") ? meta["n_head"].dump() : std::string("absent")) + " for width " +
                  std::to_string(m.n_embd));

    // Every tensor by name, shape and dtype; no unknown names.
    const std::vector<HfTensor> tensors = hf_tensors(m, prefix);
    std::map<std::string, const HfTensor*> expected;
    for (const HfTensor& t : tensors) expected[t.name] = &t;
    for (const auto& [name, s] : entries)
        if (!expected.count(name) && !ignorable_hf_name(name))
            throw bad("unexpected tensor " + name + " (not part of a " + std::to_string(m.n_layer) + "-layer GPT-2)");
    for (const HfTensor& t : tensors) {
        const StEntry& s = need(t.name);
        if (s.shape != t.shape)
            throw bad("tensor " + t.name + " has shape " + shape_str(s.shape) + ", expected " + shape_str(t.shape));
        if (s.dtype != "F32" && s.dtype != "BF16")
            throw bad("tensor " + t.name + " has dtype " + s.dtype + " (F32 or BF16 are read)");
    }

    w.params.assign(num_floats(m), 0.0f);  // wte's padded rows stay zero
    for (const HfTensor& t : tensors) {
        const StEntry& s = entries.at(t.name);
        f.read_floats_at(data_start + s.begin, w.params.data() + t.offset, t.count(),
                         s.dtype == "F32" ? WeightsDtype::f32 : WeightsDtype::bf16);
    }
    return w;
}

// ---------------------------------------------------------------- llm.c

void export_llmc(const std::string& path, const ModelConfig& m, const float* params, WeightsDtype dtype) {
    int32_t header[256] = {};
    header[0] = kLlmcModelMagic;
    header[1] = dtype == WeightsDtype::f32 ? 3 : 5;
    header[2] = m.max_seq_len;
    header[3] = m.vocab_size;
    header[4] = m.n_layer;
    header[5] = m.n_head;
    header[6] = m.n_embd;
    header[7] = m.padded_vocab();
    const auto off = param_offsets(m);

    AtomicFileWriter out(path);
    const Sink sink = [&](const void* p, size_t k) { out.write(p, k); };
    sink(header, sizeof header);
    std::vector<float> t;
    for (const LlmcTensor& x : llmc_tensors(m, m.padded_vocab())) {
        const float* src = params + off.at(x.name);
        if (!x.in) {
            put_floats(sink, src, x.per_layer * x.layers, dtype);
            continue;
        }
        t.resize(x.per_layer);
        for (size_t l = 0; l < x.layers; l++) {
            transpose_into(t.data(), src + l * x.per_layer, x.in, x.out);  // [in, out] -> [out, in]
            put_floats(sink, t.data(), t.size(), dtype);
        }
    }
    out.commit();
}

ModelWeights import_llmc(const std::string& path) {
    InFile f(path, "llm.c model");
    auto bad = [&](const std::string& what) { return Error(path + ": not a valid llm.c model file: " + what); };
    int32_t h[256];
    if (f.size() < sizeof h) throw bad("truncated: " + std::to_string(f.size()) + " bytes, less than the 1024-byte header");
    f.read_at(0, h, sizeof h);
    if (h[0] != kLlmcModelMagic) throw bad("bad magic " + std::to_string(h[0]) + " (expected 20240326)");
    if (h[1] != 3 && h[1] != 5) throw bad("unsupported version " + std::to_string(h[1]) + " (3: fp32, 5: bf16)");
    const WeightsDtype dtype = h[1] == 3 ? WeightsDtype::f32 : WeightsDtype::bf16;
    ModelWeights w;
    ModelConfig& m = w.config;
    m.max_seq_len = h[2];
    m.vocab_size = h[3];
    m.n_layer = h[4];
    m.n_head = h[5];
    m.n_embd = h[6];
    const int Vp_file = h[7];
    if (m.max_seq_len < 1 || m.vocab_size < 1 || m.n_layer < 1 || m.n_head < 1 || m.n_embd < 1 ||
        m.n_embd % m.n_head != 0 || Vp_file < m.vocab_size || m.max_seq_len > (1 << 24) ||
        Vp_file > (1 << 24) || m.n_layer > 4096 || m.n_embd > (1 << 20))
        throw bad("implausible header: maxT " + std::to_string(h[2]) + ", V " + std::to_string(h[3]) + ", L " +
                  std::to_string(h[4]) + ", NH " + std::to_string(h[5]) + ", C " + std::to_string(h[6]) + ", Vp " +
                  std::to_string(h[7]));
    const std::vector<LlmcTensor> tensors = llmc_tensors(m, size_t(Vp_file));
    uint64_t floats = 0;
    for (const LlmcTensor& x : tensors) floats += uint64_t(x.per_layer) * x.layers;
    const uint64_t expected = sizeof h + floats * dtype_bytes(dtype);
    if (f.size() != expected)
        throw bad(std::string(f.size() < expected ? "truncated" : "unexpected trailing bytes") + ": " +
                  std::to_string(f.size()) + " bytes, its header describes " + std::to_string(expected));

    const auto off = param_offsets(m);
    w.params.assign(num_floats(m), 0.0f);
    const size_t C = m.n_embd, esize = dtype_bytes(dtype);
    uint64_t pos = sizeof h;
    std::vector<float> t;
    for (const LlmcTensor& x : tensors) {
        float* dst = w.params.data() + off.at(x.name);
        const size_t n = x.per_layer * x.layers;
        if (std::string(x.name) == "wte") {
            f.read_floats_at(pos, dst, size_t(m.vocab_size) * C, dtype);  // real rows; ours re-padded
        } else if (!x.in) {
            f.read_floats_at(pos, dst, n, dtype);
        } else {
            t.resize(x.per_layer);
            for (size_t l = 0; l < x.layers; l++) {
                f.read_floats_at(pos + l * x.per_layer * esize, t.data(), t.size(), dtype);
                transpose_into(dst + l * x.per_layer, t.data(), x.out, x.in);  // [out, in] -> [in, out]
            }
        }
        pos += n * esize;
    }
    return w;
}

// ---------------------------------------------------------------- any weights file

WeightsFormat detect_weights_format(const std::string& path) {
    InFile f(path, "weights");
    unsigned char head[9] = {};
    const size_t got = (size_t)std::min<uint64_t>(f.size(), sizeof head);
    f.read_at(0, head, got);
    if (got >= 8 && std::memcmp(head, kCheckpointMagic, 8) == 0) return WeightsFormat::checkpoint;
    int32_t magic = 0;
    if (got >= 4) std::memcpy(&magic, head, 4);
    if (magic == kLlmcModelMagic) return WeightsFormat::llmc;
    const bool st_name = fs::path(path).extension() == ".safetensors";
    if (st_name || (got == 9 && head[8] == '{')) return WeightsFormat::safetensors;
    throw Error(path + ": not a weights file codagpt reads (a codagpt checkpoint, a .safetensors file, or an "
                       "llm.c model .bin with magic 20240326)");
}

ModelWeights load_weights(const std::string& path) {
    switch (detect_weights_format(path)) {
        case WeightsFormat::checkpoint: {
            Checkpoint ck = load_checkpoint(path);
            return {ck.config.model, std::move(ck.state.params)};
        }
        case WeightsFormat::llmc:
            return import_llmc(path);
        case WeightsFormat::safetensors:
            break;
    }
    return import_safetensors(path);
}

void check_reference_tokens(const ModelConfig& m, int T) {
    if (T < 1 || T > m.max_seq_len)
        throw Error("reference logits: T " + std::to_string(T) + " outside [1, " + std::to_string(m.max_seq_len) +
                    "] (--reference-tokens, at most the model's max_seq_len)");
}

void write_reference_logits(const std::string& path, const ModelWeights& w, int T, uint64_t seed) {
    const ModelConfig& m = w.config;
    check_reference_tokens(m, T);
    GPT2CPU<float> model(m);
    model.params = w.params;
    Rng rng(seed);
    std::vector<int> tokens(T);
    for (int& t : tokens) t = int(rng.below(uint64_t(m.vocab_size)));
    model.forward(tokens.data(), nullptr, 1, T);
    const int32_t dims[3] = {1, T, m.vocab_size};
    AtomicFileWriter out(path);
    out.write(dims, sizeof dims);
    out.write(tokens.data(), tokens.size() * sizeof(int));
    for (int t = 0; t < T; t++) out.write(model.logits() + size_t(t) * m.padded_vocab(), size_t(m.vocab_size) * 4);
    out.commit();
}

}  // namespace codagpt
