#include "sample.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "common.hpp"
#include "gpt2_params.hpp"
#include "ops_cpu.hpp"

namespace codagpt {

const float* Decoder::feed(const int* tokens, int n) {
    const ModelConfig& m = config();
    if (n < 1) throw Error("a decoder needs at least one token per call, got " + std::to_string(n));
    if (n > m.max_seq_len - pos_)
        throw Error("context full: " + std::to_string(m.max_seq_len) + " positions (max_seq_len), " +
                    std::to_string(pos_) + " used, " + std::to_string(n) + " more asked");
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m.vocab_size)
            throw Error("token id " + std::to_string(tokens[i]) + " outside the vocabulary of " +
                        std::to_string(m.vocab_size));
    const float* logits = forward(tokens, n);
    pos_ += n;
    return logits;
}

GPT2Decoder::GPT2Decoder(const ModelConfig& m, const float* params) : m_(m), params_(params) {
    const size_t L = m.n_layer, C = m.n_embd, T = m.max_seq_len;
    k_cache_.assign(L * T * C, 0.0f);
    v_cache_.assign(L * T * C, 0.0f);
    x_.resize(C);
    ln_.resize(C);
    qkv_.resize(3 * C);
    atty_.resize(C);
    proj_.resize(C);
    fch_.resize(4 * C);
    fch_gelu_.resize(4 * C);
    scores_.resize(T);
    logits_.assign(m.padded_vocab(), 0.0f);
}

void GPT2Decoder::advance(int token, long t) {
    const long C = m_.n_embd, NH = m_.n_head, hs = C / NH, T = m_.max_seq_len;
    const GPT2Params<const float> p = param_views(params_, m_);
    float mean, rstd;
    for (long c = 0; c < C; c++) x_[c] = p.wte[token * C + c] + p.wpe[t * C + c];

    for (long l = 0; l < m_.n_layer; l++) {
        const LayerParams<const float> lp = layer_params(p, l, C);
        float* kc = k_cache_.data() + l * T * C;
        float* vc = v_cache_.data() + l * T * C;
        cpu::layernorm_forward(ln_.data(), &mean, &rstd, x_.data(), lp.ln1_w, lp.ln1_b, 1L, C);
        cpu::matmul_forward(qkv_.data(), ln_.data(), lp.qkv_w, lp.qkv_b, 1L, C, 3 * C);
        std::copy(qkv_.begin() + C, qkv_.begin() + 2 * C, kc + t * C);
        std::copy(qkv_.begin() + 2 * C, qkv_.begin() + 3 * C, vc + t * C);
        // The new query against every cached key: row t of cpu::attention_forward.
        const float scale = 1.0f / std::sqrt(float(hs));
        for (long h = 0; h < NH; h++)
            cpu::attention_row(atty_.data() + h * hs, scores_.data(), qkv_.data() + h * hs, kc + h * hs, vc + h * hs, C,
                               t, hs, scale);
        cpu::matmul_forward(proj_.data(), atty_.data(), lp.proj_w, lp.proj_b, 1L, C, C);
        cpu::residual_forward(x_.data(), x_.data(), proj_.data(), C);
        cpu::layernorm_forward(ln_.data(), &mean, &rstd, x_.data(), lp.ln2_w, lp.ln2_b, 1L, C);
        cpu::matmul_forward(fch_.data(), ln_.data(), lp.fc_w, lp.fc_b, 1L, C, 4 * C);
        cpu::gelu_forward(fch_gelu_.data(), fch_.data(), 4 * C);
        cpu::matmul_forward(proj_.data(), fch_gelu_.data(), lp.fcproj_w, lp.fcproj_b, 1L, 4 * C, C);
        cpu::residual_forward(x_.data(), x_.data(), proj_.data(), C);
    }
}

const float* GPT2Decoder::forward(const int* tokens, int n) {
    for (int i = 0; i < n; i++) advance(tokens[i], pos_ + i);
    // The LM head only for the last position: the prompt's other logits are never read.
    const long C = m_.n_embd, V = m_.vocab_size;
    const GPT2Params<const float> p = param_views(params_, m_);
    float mean, rstd;
    cpu::layernorm_forward(ln_.data(), &mean, &rstd, x_.data(), p.lnf_w, p.lnf_b, 1L, C);
    // Tied LM head, one row: logits[v] = <lnf, wte[v]> (padded columns stay 0).
    const float* xf = ln_.data();
#pragma omp parallel for schedule(static)
    for (long v = 0; v < V; v++) {
        const float* e = p.wte + v * C;
        float s = 0;
        for (long c = 0; c < C; c++) s += xf[c] * e[c];
        logits_[v] = s;
    }
    return logits_.data();
}

int sample_token(const float* logits, int V, double temperature, int top_k, Rng& rng) {
    if (V < 1) throw Error("sample_token: empty vocabulary");
    if (temperature <= 0 || top_k == 1)
        return int(std::max_element(logits, logits + V) - logits);  // first of the largest
    std::vector<int> ids(V);
    std::iota(ids.begin(), ids.end(), 0);
    if (top_k > 0 && top_k < V) {
        // The k largest, ordered by (logit desc, id asc) so that ties cannot change the draw.
        std::partial_sort(ids.begin(), ids.begin() + top_k, ids.end(), [&](int a, int b) {
            return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
        });
        ids.resize(top_k);
    }
    double maxv = -std::numeric_limits<double>::infinity();
    for (int i : ids) maxv = std::max(maxv, double(logits[i]));
    std::vector<double> w(ids.size());
    double sum = 0;
    for (size_t j = 0; j < ids.size(); j++) sum += w[j] = std::exp((double(logits[ids[j]]) - maxv) / temperature);
    const double u = rng.uniform() * sum;
    double acc = 0;
    for (size_t j = 0; j < ids.size(); j++) {
        acc += w[j];
        if (u < acc) return ids[j];
    }
    return ids.back();  // u within rounding of sum
}

std::vector<int> generate(Decoder& dec, const std::vector<int>& prompt, const SampleOptions& opt,
                          const std::function<void(int)>& on_token) {
    const ModelConfig& m = dec.config();
    if (prompt.empty()) throw Error("generate: the prompt needs at least one token");
    if (int(prompt.size()) > m.max_seq_len)
        throw Error("prompt of " + std::to_string(prompt.size()) + " tokens is longer than the model's context (" +
                    std::to_string(m.max_seq_len) + ")");
    dec.reset();
    const float* logits = dec.feed(prompt.data(), int(prompt.size()));
    Rng rng(opt.seed);
    std::vector<int> out;
    for (int i = 0; i < opt.max_tokens; i++) {
        const int tok = sample_token(logits, m.vocab_size, opt.temperature, opt.top_k, rng);
        out.push_back(tok);
        if (on_token) on_token(tok);
        if (i + 1 == opt.max_tokens || dec.position() == m.max_seq_len) break;
        logits = dec.step(tok);
    }
    return out;
}

std::string Utf8Stream::push(std::string_view bytes) {
    held_.append(bytes);
    // Find the start of the last character; hold it if its lead byte promises more bytes than came.
    const size_t n = held_.size();
    size_t j = n;
    for (size_t back = 1; back <= std::min<size_t>(4, n); back++) {
        const unsigned char c = held_[n - back];
        if ((c & 0xC0) != 0x80) {
            j = n - back;
            break;
        }
    }
    if (j == n) {  // no lead byte in the last 4: stray continuation bytes pass through
        std::string out;
        out.swap(held_);
        return out;
    }
    const unsigned char lead = held_[j];
    const size_t need = lead >= 0xF0 && lead <= 0xF4 ? 4 : lead >= 0xE0 && lead < 0xF0 ? 3 : lead >= 0xC2 && lead < 0xE0 ? 2 : 1;
    const size_t keep = n - j < need ? n - j : 0;
    std::string out = held_.substr(0, n - keep);
    held_.erase(0, n - keep);
    return out;
}

std::string Utf8Stream::flush() {
    std::string out;
    out.swap(held_);
    return out;
}

}  // namespace codagpt
