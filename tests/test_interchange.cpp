// Interchange: safetensors and llm.c .bin round trips, a safetensors file built here byte by byte
// from the spec, the llm.c layout (transposed matmul weights), and every refusal.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>
#include <unistd.h>

#include "checkpoint.hpp"
#include "interchange.hpp"
#include "model_cpu.hpp"
#include "rng.hpp"
#include "test_util.hpp"

namespace codagpt {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::mentions;

ModelConfig tiny_model() {
    ModelConfig m;
    m.n_layer = 2;
    m.n_head = 4;
    m.n_embd = 32;
    m.max_seq_len = 16;
    m.vocab_size = 100;  // padded to 128
    return m;
}

// Every parameter random (LayerNorm and biases too, so that misplaced tensors show), padded wte rows 0.
std::vector<float> random_params(const ModelConfig& m, uint64_t seed) {
    size_t n = 0;
    for (const ParamInfo& p : param_layout(m)) n += p.size;
    std::vector<float> v(n);
    Rng rng(seed);
    for (float& x : v) x = float(0.1 * rng.normal());
    for (size_t i = size_t(m.vocab_size) * m.n_embd; i < size_t(m.padded_vocab()) * m.n_embd; i++) v[i] = 0;
    return v;
}

double cpu_loss(const ModelConfig& m, const std::vector<float>& params) {
    GPT2CPU<float> model(m);
    model.params = params;
    std::vector<int> in(2 * 8), tg(2 * 8);
    for (size_t i = 0; i < in.size(); i++) {
        in[i] = int(i * 7 % m.vocab_size);
        tg[i] = int((i * 13 + 5) % m.vocab_size);
    }
    return model.forward(in.data(), tg.data(), 2, 8);
}

void expect_same_model(const ModelConfig& a, const ModelConfig& b) {
    EXPECT_EQ(a.n_layer, b.n_layer);
    EXPECT_EQ(a.n_head, b.n_head);
    EXPECT_EQ(a.n_embd, b.n_embd);
    EXPECT_EQ(a.max_seq_len, b.max_seq_len);
    EXPECT_EQ(a.vocab_size, b.vocab_size);
}

float bf16_round(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    std::memcpy(&x, &u, 4);
    return x;
}

class Interchange : public testing::Test {
protected:
    void SetUp() override {
        dir = fs::temp_directory_path() /
              ("codagpt_interchange_" + std::to_string(::getpid()) + "_" +
               testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir);
        fs::create_directories(dir);
    }
    void TearDown() override { fs::remove_all(dir); }
    std::string file(const std::string& name) const { return (dir / name).string(); }
    fs::path dir;
};

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

// ---------------------------------------------------------------- round trips

TEST_F(Interchange, SafetensorsRoundTripIsExact) {
    const ModelConfig m = tiny_model();
    const std::vector<float> params = random_params(m, 1);
    export_safetensors(file("m.safetensors"), m, params.data());
    const ModelWeights w = import_safetensors(file("m.safetensors"));
    expect_same_model(w.config, m);
    ASSERT_EQ(w.params.size(), params.size());
    EXPECT_EQ(std::memcmp(w.params.data(), params.data(), params.size() * 4), 0);
    EXPECT_EQ(cpu_loss(m, w.params), cpu_loss(m, params));
    EXPECT_EQ(detect_weights_format(file("m.safetensors")), WeightsFormat::safetensors);
}

TEST_F(Interchange, SafetensorsBf16RoundsToNearestEven) {
    const ModelConfig m = tiny_model();
    const std::vector<float> params = random_params(m, 2);
    export_safetensors(file("m.safetensors"), m, params.data(), WeightsDtype::bf16);
    const ModelWeights w = import_safetensors(file("m.safetensors"));
    ASSERT_EQ(w.params.size(), params.size());
    for (size_t i = 0; i < params.size(); i++) ASSERT_EQ(w.params[i], bf16_round(params[i])) << i;
}

TEST_F(Interchange, SafetensorsHeaderHasGpt2NamesAndLayout) {
    const ModelConfig m = tiny_model();
    const std::vector<float> params = random_params(m, 3);
    export_safetensors(file("m.safetensors"), m, params.data());
    const std::string bytes = read_bytes(file("m.safetensors"));
    uint64_t n;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ(n % 8, 0u);
    const auto h = nlohmann::json::parse(bytes.substr(8, n));
    EXPECT_EQ(h["__metadata__"]["format"], "pt");
    EXPECT_EQ(h["transformer.wte.weight"]["shape"], nlohmann::json({100, 32}));  // unpadded
    EXPECT_EQ(h["transformer.h.1.attn.c_attn.weight"]["shape"], nlohmann::json({32, 96}));
    EXPECT_EQ(h["transformer.h.1.mlp.c_proj.weight"]["shape"], nlohmann::json({128, 32}));
    EXPECT_EQ(h["transformer.ln_f.bias"]["dtype"], "F32");
    EXPECT_FALSE(h.contains("lm_head.weight"));  // tied to wte
    EXPECT_EQ(h.size(), 1u + 2 + 12 * 2 + 2);
    // h.1.attn.c_attn.weight[i, o] is our qkv_w[1, i, o]: no transpose (HF Conv1D is [in, out]).
    const uint64_t begin = h["transformer.h.1.attn.c_attn.weight"]["data_offsets"][0];
    float x;
    std::memcpy(&x, bytes.data() + 8 + n + begin + (5 * 96 + 7) * 4, 4);
    size_t qkv = 0;
    for (const ParamInfo& p : param_layout(m)) {
        if (p.name == "qkv_w") break;
        qkv += p.size;
    }
    EXPECT_EQ(x, params[qkv + 32 * 96 + 5 * 96 + 7]);
}

TEST_F(Interchange, LlmcRoundTripIsExact) {
    const ModelConfig m = tiny_model();
    const std::vector<float> params = random_params(m, 4);
    export_llmc(file("m.bin"), m, params.data());
    EXPECT_EQ(detect_weights_format(file("m.bin")), WeightsFormat::llmc);
    const ModelWeights w = import_llmc(file("m.bin"));
    expect_same_model(w.config, m);
    ASSERT_EQ(w.params.size(), params.size());
    EXPECT_EQ(std::memcmp(w.params.data(), params.data(), params.size() * 4), 0);
    EXPECT_EQ(cpu_loss(m, w.params), cpu_loss(m, params));
    const ModelWeights any = load_weights(file("m.bin"));
    EXPECT_EQ(any.params, params);
}

TEST_F(Interchange, LlmcBf16RoundTrip) {
    const ModelConfig m = tiny_model();
    const std::vector<float> params = random_params(m, 5);
    export_llmc(file("m.bin"), m, params.data(), WeightsDtype::bf16);
    const ModelWeights w = import_llmc(file("m.bin"));
    ASSERT_EQ(w.params.size(), params.size());
    for (size_t i = 0; i < params.size(); i++) ASSERT_EQ(w.params[i], bf16_round(params[i])) << i;
}

// llm.c's file, read as llm.c reads it: header ints, then its tensors with matmul weights [out, in].
TEST_F(Interchange, LlmcLayoutMatchesTrainGpt2) {
    const ModelConfig m = tiny_model();
    const std::vector<float> params = random_params(m, 6);
    export_llmc(file("m.bin"), m, params.data());
    const std::string bytes = read_bytes(file("m.bin"));
    const size_t L = 2, C = 32, Vp = 128, T = 16;
    ASSERT_EQ(bytes.size(), 1024 + 4 * (Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C));
    int32_t h[8];
    std::memcpy(h, bytes.data(), sizeof h);
    EXPECT_EQ(std::vector<int32_t>(h, h + 8), (std::vector<int32_t>{20240326, 3, 16, 100, 2, 4, 32, 128}));
    auto file_float = [&](size_t i) {
        float x;
        std::memcpy(&x, bytes.data() + 1024 + 4 * i, 4);
        return x;
    };
    // qkvw (L, 3C, C) follows wte, wpe, ln1w, ln1b.
    const size_t qkvw_file = Vp * C + T * C + 2 * L * C;
    const size_t qkvw_ours = Vp * C + T * C + 2 * L * C;  // same position in our layout
    for (size_t l : {0, 1})
        for (size_t o : {0, 17, 95})
            for (size_t i : {0, 3, 31})
                EXPECT_EQ(file_float(qkvw_file + l * 3 * C * C + o * C + i),
                          params[qkvw_ours + l * C * 3 * C + i * 3 * C + o]);
}

// ---------------------------------------------------------------- a safetensors file from the spec

struct StTensor {
    std::string name, dtype;
    std::vector<int64_t> shape;
};

std::vector<StTensor> tiny_hf_tensors() {  // L=1, C=4, maxT=3, V=5; names as in the released gpt2 file
    std::vector<StTensor> t = {{"wte.weight", "F32", {5, 4}}, {"wpe.weight", "F32", {3, 4}}};
    for (auto [n, s] : std::vector<std::pair<const char*, std::vector<int64_t>>>{
             {"ln_1.weight", {4}},         {"ln_1.bias", {4}},       {"attn.bias", {1, 1, 3, 3}},
             {"attn.c_attn.weight", {4, 12}}, {"attn.c_attn.bias", {12}}, {"attn.c_proj.weight", {4, 4}},
             {"attn.c_proj.bias", {4}},   {"ln_2.weight", {4}},     {"ln_2.bias", {4}},
             {"mlp.c_fc.weight", {4, 16}}, {"mlp.c_fc.bias", {16}},   {"mlp.c_proj.weight", {16, 4}},
             {"mlp.c_proj.bias", {4}}})
        t.push_back({std::string("h.0.") + n, "F32", s});
    t.push_back({"ln_f.weight", "F32", {4}});
    t.push_back({"ln_f.bias", "F32", {4}});
    return t;
}

// Element j of tensor k holds k * 1000 + j. The header is written by hand: 8-byte length, JSON.
std::string tiny_hf_file(const std::vector<StTensor>& tensors, const std::string& metadata = R"({"n_head":"2"})") {
    std::string json = "{";
    if (!metadata.empty()) json += "\"__metadata__\":" + metadata;
    std::string data;
    for (size_t k = 0; k < tensors.size(); k++) {
        size_t n = 1;
        for (int64_t d : tensors[k].shape) n *= size_t(d);
        const size_t begin = data.size();
        for (size_t j = 0; j < n; j++) {
            const float x = float(k * 1000 + j);
            data.append(reinterpret_cast<const char*>(&x), 4);
        }
        std::string shape;
        for (int64_t d : tensors[k].shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
        if (json.size() > 1) json += ",";
        json += "\"" + tensors[k].name + "\":{\"dtype\":\"" + tensors[k].dtype + "\",\"shape\":[" + shape +
                "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(data.size()) + "]}";
    }
    json += "}";
    const uint64_t n = json.size();
    return std::string(reinterpret_cast<const char*>(&n), 8) + json + data;
}

TEST_F(Interchange, HandBuiltSafetensorsLoads) {
    write_bytes(file("t.safetensors"), tiny_hf_file(tiny_hf_tensors()));
    const ModelWeights w = load_weights(file("t.safetensors"));
    EXPECT_EQ(w.config.n_layer, 1);
    EXPECT_EQ(w.config.n_head, 2);
    EXPECT_EQ(w.config.n_embd, 4);
    EXPECT_EQ(w.config.max_seq_len, 3);
    EXPECT_EQ(w.config.vocab_size, 5);
    const GPT2Params<const float> p = param_views<const float>(w.params.data(), w.config);
    EXPECT_EQ(p.wte[4 * 4 + 3], 19.0f);           // tensor 0, element 19
    EXPECT_EQ(p.wte[5 * 4], 0.0f);                // padded rows are zero
    EXPECT_EQ(p.wte[127 * 4 + 3], 0.0f);
    EXPECT_EQ(p.wpe[2 * 4 + 1], 1009.0f);
    EXPECT_EQ(p.qkv_w[1 * 12 + 7], 5019.0f);      // tensor 5 (after the mask buffer), [in=1, out=7]
    EXPECT_EQ(p.fcproj_w[15 * 4 + 3], 13063.0f);
    EXPECT_EQ(p.lnf_b[2], 16002.0f);
}

TEST_F(Interchange, HeadCountDefaultsToWidthOver64) {
    // Without metadata n_head is C/64; C = 4 cannot tell it.
    write_bytes(file("t.safetensors"), tiny_hf_file(tiny_hf_tensors(), ""));
    const std::string msg = error_of([&] { import_safetensors(file("t.safetensors")); });
    EXPECT_TRUE(mentions(msg, file("t.safetensors")));
    EXPECT_TRUE(mentions(msg, "n_head"));
}

// ---------------------------------------------------------------- refusals

class Refusals : public Interchange {
protected:
    std::string refusal(const std::string& bytes) {
        write_bytes(file("bad.safetensors"), bytes);
        const std::string msg = error_of([&] { import_safetensors(file("bad.safetensors")); });
        EXPECT_TRUE(mentions(msg, file("bad.safetensors")));
        return msg;
    }
    std::string with_header(const std::string& json, const std::string& data = std::string(64, '\0')) {
        const uint64_t n = json.size();
        return std::string(reinterpret_cast<const char*>(&n), 8) + json + data;
    }
};

TEST_F(Refusals, Truncated) { EXPECT_TRUE(mentions(refusal("abc"), "truncated")); }

TEST_F(Refusals, HeaderLengthBeyondFile) {
    std::string bytes = tiny_hf_file(tiny_hf_tensors());
    const uint64_t n = bytes.size();
    std::memcpy(bytes.data(), &n, 8);
    EXPECT_TRUE(mentions(refusal(bytes), "beyond the end of the file"));
}

TEST_F(Refusals, InvalidJson) { EXPECT_TRUE(mentions(refusal(with_header("{\"wte.weight\": {")), "not valid JSON")); }

TEST_F(Refusals, NotAnObject) { EXPECT_TRUE(mentions(refusal(with_header("[1, 2]")), "not a JSON object")); }

TEST_F(Refusals, MalformedEntry) {
    EXPECT_TRUE(mentions(refusal(with_header(R"({"wte.weight": {"dtype": "F32", "shape": [2, 2]}})")),
                         "wte.weight lacks dtype, shape or data_offsets"));
}

TEST_F(Refusals, OffsetsOutOfRange) {
    EXPECT_TRUE(mentions(
        refusal(with_header(R"({"wte.weight": {"dtype": "F32", "shape": [2, 16], "data_offsets": [0, 128]}})")),
        "outside the 64 data bytes"));
}

TEST_F(Refusals, OffsetsDisagreeWithShape) {
    EXPECT_TRUE(mentions(
        refusal(with_header(R"({"wte.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}})")),
        "needs 16 bytes"));
}

TEST_F(Refusals, Overlap) {
    EXPECT_TRUE(mentions(refusal(with_header(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                                  "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})")),
                         "overlap"));
}

TEST_F(Refusals, MissingTensor) {
    std::vector<StTensor> t = tiny_hf_tensors();
    t.erase(t.begin() + 7);  // h.0.attn.c_proj.weight
    EXPECT_TRUE(mentions(refusal(tiny_hf_file(t)), "missing tensor h.0.attn.c_proj.weight"));
    EXPECT_TRUE(mentions(refusal(with_header("{}")), "missing tensor wte.weight"));
}

TEST_F(Refusals, WrongShape) {
    std::vector<StTensor> t = tiny_hf_tensors();
    t[5].shape = {12, 4};  // c_attn transposed
    EXPECT_TRUE(mentions(refusal(tiny_hf_file(t)), "h.0.attn.c_attn.weight has shape [12, 4], expected [4, 12]"));
}

TEST_F(Refusals, WrongDtype) {
    std::vector<StTensor> t = tiny_hf_tensors();
    t[3].dtype = "I32";
    EXPECT_TRUE(mentions(refusal(tiny_hf_file(t)), "h.0.ln_1.bias has dtype I32"));
    t[3].dtype = "Q4";
    EXPECT_TRUE(mentions(refusal(tiny_hf_file(t)), "unknown dtype Q4"));
}

TEST_F(Refusals, UnexpectedTensor) {
    std::vector<StTensor> t = tiny_hf_tensors();
    t.push_back({"h.0.mlp.gate.weight", "F32", {4}});
    EXPECT_TRUE(mentions(refusal(tiny_hf_file(t)), "unexpected tensor h.0.mlp.gate.weight"));
}

TEST_F(Refusals, LlmcFiles) {
    const ModelConfig m = tiny_model();
    const std::vector<float> params = random_params(m, 7);
    export_llmc(file("m.bin"), m, params.data());
    const std::string good = read_bytes(file("m.bin"));
    auto llmc_refusal = [&](const std::string& bytes) {
        write_bytes(file("bad.bin"), bytes);
        const std::string msg = error_of([&] { import_llmc(file("bad.bin")); });
        EXPECT_TRUE(mentions(msg, file("bad.bin")));
        return msg;
    };
    EXPECT_TRUE(mentions(llmc_refusal(good.substr(0, 100)), "truncated"));
    EXPECT_TRUE(mentions(llmc_refusal(good.substr(0, good.size() - 4)), "truncated"));
    EXPECT_TRUE(mentions(llmc_refusal(good + "x"), "trailing bytes"));
    std::string b = good;
    b[0] = 1;
    EXPECT_TRUE(mentions(llmc_refusal(b), "bad magic"));
    b = good;
    b[4] = 4;
    EXPECT_TRUE(mentions(llmc_refusal(b), "unsupported version 4"));
    b = good;
    b[20] = 5;  // NH 5 does not divide C 32
    EXPECT_TRUE(mentions(llmc_refusal(b), "implausible header"));
}

TEST_F(Refusals, UnknownFormat) {
    write_bytes(file("x.txt"), "hello there, not weights");
    EXPECT_TRUE(mentions(error_of([&] { load_weights(file("x.txt")); }), "not a weights file"));
    EXPECT_TRUE(mentions(error_of([&] { load_weights(file("none.bin")); }), "cannot open"));
}

TEST_F(Interchange, LoadsCodagptCheckpoints) {
    Checkpoint ck;
    ck.config.model = tiny_model();
    ck.config.seq_len = 16;
    ck.state.params = random_params(ck.config.model, 8);
    ck.state.m.assign(ck.state.params.size(), 0.0f);
    ck.state.v.assign(ck.state.params.size(), 0.0f);
    save_checkpoint(file("ckpt_1.bin"), ck);
    EXPECT_EQ(detect_weights_format(file("ckpt_1.bin")), WeightsFormat::checkpoint);
    const ModelWeights w = load_weights(file("ckpt_1.bin"));
    expect_same_model(w.config, ck.config.model);
    EXPECT_EQ(w.params, ck.state.params);
    // and on to the other formats and back
    export_safetensors(file("m.safetensors"), w.config, w.params.data());
    export_llmc(file("m.bin"), w.config, w.params.data());
    EXPECT_EQ(load_weights(file("m.safetensors")).params, ck.state.params);
    EXPECT_EQ(load_weights(file("m.bin")).params, ck.state.params);
}

TEST_F(Interchange, ReferenceLogitsFile) {
    const ModelConfig m = tiny_model();
    ModelWeights w{m, random_params(m, 9)};
    write_reference_logits(file("logits.bin"), w, 8, 3);
    const std::string bytes = read_bytes(file("logits.bin"));
    ASSERT_EQ(bytes.size(), 12 + 8 * 4 + 8 * 100 * 4);
    std::vector<int> tokens(8);
    std::memcpy(tokens.data(), bytes.data() + 12, 32);
    GPT2CPU<float> model(m);
    model.params = w.params;
    model.forward(tokens.data(), nullptr, 1, 8);
    float x;
    std::memcpy(&x, bytes.data() + 12 + 32 + (7 * 100 + 42) * 4, 4);
    EXPECT_EQ(x, model.logits()[7 * 128 + 42]);
}

}  // namespace
}  // namespace codagpt
