// GPT-2 tokenizer: GPT-2's pre-tokenization regex written out as a scanner (character classes from
// ICU), then byte-level BPE on each piece, with a per-thread cache of finished words.
#include "tokenizer.hpp"

#include <unicode/uchar.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "common.hpp"

namespace codagpt {
namespace {

// ---------------------------------------------------------------- UTF-8

// Length of the well-formed UTF-8 sequence at p (Unicode Table 3-7), or minus the length of its
// maximal subpart: the longest prefix of a well-formed sequence found there (at least one byte).
int utf8_sequence(const unsigned char* p, size_t avail) {
    const unsigned char b = p[0];
    if (b < 0x80) return 1;
    int continuations;
    unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte; later ones are 80..BF
    if (b >= 0xC2 && b <= 0xDF) {
        continuations = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        continuations = 2;
        if (b == 0xE0) lo = 0xA0;  // no overlong forms
        if (b == 0xED) hi = 0x9F;  // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
        continuations = 3;
        if (b == 0xF0) lo = 0x90;  // no overlong forms
        if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
        return -1;  // a continuation byte, or a lead byte no well-formed sequence starts with
    }
    for (int k = 1; k <= continuations; ++k) {
        if (size_t(k) >= avail || p[k] < lo || p[k] > hi) return -k;
        lo = 0x80;
        hi = 0xBF;
    }
    return continuations + 1;
}

// Replaces each maximal subpart of ill-formed UTF-8 by U+FFFD into out. Returns false, leaving out
// alone, when text is valid (the common case, which is then used without a copy).
bool repair_utf8(std::string_view text, std::string& out) {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    size_t copied = 0;  // text before this is in out
    bool repaired = false;
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            ++i;
            continue;
        }
        const int len = utf8_sequence(s + i, n - i);
        if (len > 0) {
            i += len;
            continue;
        }
        if (!repaired) out.clear();
        out.append(text.data() + copied, i - copied);
        out.append("\xEF\xBF\xBD");
        i += -len;
        copied = i;
        repaired = true;
    }
    if (repaired) out.append(text.data() + copied, n - copied);
    return repaired;
}

// ---------------------------------------------------------------- pre-tokenization

// The pattern's classes \p{L}, \p{N}, \s (White_Space) and the rest. They are disjoint: no
// White_Space character is a letter or a number.
enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

CharClass classify(UChar32 c) {
    if (u_isUWhiteSpace(c)) return CharClass::kSpace;
    const uint32_t category = U_GET_GC_MASK(c);
    if (category & U_GC_L_MASK) return CharClass::kLetter;
    if (category & U_GC_N_MASK) return CharClass::kNumber;
    return CharClass::kOther;
}

// Most text is ASCII: a table spares the ICU calls, and filling it from ICU keeps both paths equal.
using AsciiClasses = std::array<CharClass, 128>;
const AsciiClasses& ascii_classes() {
    static const AsciiClasses table = [] {
        AsciiClasses t{};
        for (int c = 0; c < 128; ++c) t[c] = classify(c);
        return t;
    }();
    return table;
}

// Class of the code point at p (valid UTF-8), and its length in bytes.
inline CharClass class_at(const unsigned char* p, const AsciiClasses& ascii, int& len) {
    if (p[0] < 0x80) {
        len = 1;
        return ascii[p[0]];
    }
    UChar32 c;
    if (p[0] < 0xE0) {
        len = 2;
        c = (p[0] & 0x1F) << 6 | (p[1] & 0x3F);
    } else if (p[0] < 0xF0) {
        len = 3;
        c = (p[0] & 0x0F) << 12 | (p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    } else {
        len = 4;
        c = (p[0] & 0x07) << 18 | (p[1] & 0x3F) << 12 | (p[2] & 0x3F) << 6 | (p[3] & 0x3F);
    }
    return classify(c);
}

// Length of a contraction at p ('s 't 're 've 'm 'll 'd: lowercase only, like the pattern), or 0.
size_t contraction_length(const unsigned char* p, size_t avail) {
    if (p[0] != '\'' || avail < 2) return 0;
    switch (p[1]) {
        case 's': case 't': case 'm': case 'd': return 2;
        case 'r': case 'v': return avail >= 3 && p[2] == 'e' ? 3 : 0;
        case 'l': return avail >= 3 && p[2] == 'l' ? 3 : 0;
        default: return 0;
    }
}

// Calls emit(begin, length) for each match of GPT-2's pattern in valid UTF-8 text, in order:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// At each position the alternatives are tried in the pattern's order, as the regex engine does.
template <class Emit>
void split_words(std::string_view text, Emit&& emit) {
    const AsciiClasses& ascii = ascii_classes();
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    for (size_t i = 0; i < n;) {
        const size_t begin = i;
        if (const size_t len = contraction_length(s + i, n - i)) {
            emit(begin, len);
            i += len;
            continue;
        }
        int width;
        CharClass cls = class_at(s + i, ascii, width);
        // " ?\p{L}+" and its siblings: one U+0020 (no other space) joins the run after it.
        if (s[i] == ' ' && i + 1 < n) {
            int next_width;
            const CharClass next = class_at(s + i + 1, ascii, next_width);
            if (next != CharClass::kSpace) {
                cls = next;
                i += 1;
                width = next_width;
            }
        }
        if (cls != CharClass::kSpace) {
            i += width;
            while (i < n && class_at(s + i, ascii, width) == cls) i += width;
            emit(begin, i - begin);
            continue;
        }
        // "\s+(?!\S)" backtracks off the last character of a run followed by a non-space, leaving
        // it to lead the next piece; a run of one such character is matched by the final "\s+".
        size_t last = i;
        while (i < n && class_at(s + i, ascii, width) == CharClass::kSpace) {
            last = i;
            i += width;
        }
        if (i < n && last > begin) i = last;
        emit(begin, i - begin);
    }
}

// ---------------------------------------------------------------- byte-level alphabet

// GPT-2's files spell each byte as one printable code point: the printable Latin-1 bytes as
// themselves, the 68 others (controls, space, ...) as U+0100 + n in byte order.
constexpr int kAlphabetEnd = 0x100 + 68;

std::array<int, kAlphabetEnd> code_point_bytes() {
    std::array<int, kAlphabetEnd> byte_of;
    byte_of.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        byte_of[printable ? b : 0x100 + n++] = b;
    }
    return byte_of;
}

// The bytes a token of the files stands for; false when it has a code point outside the alphabet.
bool alphabet_to_bytes(std::string_view token, const std::array<int, kAlphabetEnd>& byte_of,
                       std::string& bytes) {
    bytes.clear();
    const auto* s = reinterpret_cast<const unsigned char*>(token.data());
    for (size_t i = 0; i < token.size();) {
        const int len = utf8_sequence(s + i, token.size() - i);
        if (len < 0 || len > 2) return false;
        const int c = len == 1 ? s[i] : (s[i] & 0x1F) << 6 | (s[i + 1] & 0x3F);
        if (c >= kAlphabetEnd || byte_of[c] < 0) return false;
        bytes.push_back(char(byte_of[c]));
        i += len;
    }
    return !bytes.empty();
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("cannot open tokenizer file " + path);
    std::ostringstream contents;
    contents << in.rdbuf();
    if (in.bad()) throw Error("cannot read tokenizer file " + path);
    return contents.str();
}

// ---------------------------------------------------------------- BPE state of one thread

// A pair of adjacent symbols that a merge would join, as it was when found; it is stale once
// either symbol has changed.
struct Candidate {
    int rank;  // lower merges first
    int pos;   // the left symbol's byte offset, so ties go left to right
    int left, right, right_pos, merged;
};

bool merges_later(const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

// Per thread so that encode() stays const and thread-safe without locks: the finished words (a
// few thousand distinct words make up most of English text) and scratch space for BPE.
struct ThreadState {
    uint64_t owner = 0;  // the Impl::serial the cache belongs to
    std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> cache;  // word -> ids span
    std::vector<int> cached_ids;
    std::string key;
    std::vector<int> symbol, prev, next;  // the word as a linked list of symbols, by byte offset
    std::vector<Candidate> heap, pending;
};

// Longer words are rarely repeated: caching them would only grow memory. Past kMaxCachedWords the
// cache starts over, which bounds it on an endless stream of new words.
constexpr size_t kMaxCachedWordBytes = 64;
constexpr size_t kMaxCachedWords = size_t(1) << 20;

// The calling thread's state for tokenizer `owner`; a thread that switches tokenizers starts over.
ThreadState& thread_state(uint64_t owner) {
    thread_local ThreadState state;
    if (state.owner != owner) {
        state.cache.clear();
        state.cached_ids.clear();
        state.owner = owner;
    }
    return state;
}

std::atomic<uint64_t> next_serial{1};

}  // namespace

// ---------------------------------------------------------------- the tokenizer

struct Tokenizer::Impl {
    struct Merge {
        int rank, token;
    };
    std::unordered_map<uint64_t, Merge> merges;  // keyed by the pair of token ids they join
    std::array<int, 256> byte_token{};           // the token of each single byte
    std::vector<std::string> token_bytes;        // what each token id decodes to
    uint64_t serial = next_serial++;             // tells thread caches of tokenizers apart

    static uint64_t pair_key(int left, int right) {
        return uint64_t(uint32_t(left)) << 32 | uint32_t(right);
    }
    const Merge* find_merge(int left, int right) const {
        const auto it = merges.find(pair_key(left, right));
        return it == merges.end() ? nullptr : &it->second;
    }
    void bpe(std::string_view word, ThreadState& ts, std::vector<int>& out) const;
    void encode_word(std::string_view word, ThreadState& ts, std::vector<int>& out) const;
};

// The reference repeatedly takes the lowest-ranked adjacent pair and merges it everywhere in the
// word, left to right. A heap ordered by (rank, position) does the same in O(n log n) rather than
// O(n^2) on long words, provided that pairs made while one merge is being applied wait until it
// is applied everywhere: they go to `pending` until the rank at the top of the heap changes.
void Tokenizer::Impl::bpe(std::string_view word, ThreadState& ts, std::vector<int>& out) const {
    const int n = int(word.size());
    auto& symbol = ts.symbol;
    auto& prev = ts.prev;
    auto& next = ts.next;
    symbol.resize(n);
    prev.resize(n);
    next.resize(n);
    for (int i = 0; i < n; ++i) {
        symbol[i] = byte_token[uint8_t(word[i])];
        prev[i] = i - 1;
        next[i] = i + 1 < n ? i + 1 : -1;
    }
    auto& heap = ts.heap;
    auto& pending = ts.pending;
    heap.clear();
    pending.clear();
    auto find_candidate = [&](int pos, std::vector<Candidate>& into) {
        const int right_pos = next[pos];
        if (const Merge* m = find_merge(symbol[pos], symbol[right_pos]))
            into.push_back({m->rank, pos, symbol[pos], symbol[right_pos], right_pos, m->token});
    };
    for (int i = 0; i + 1 < n; ++i) find_candidate(i, heap);
    std::make_heap(heap.begin(), heap.end(), merges_later);

    int rank = -1;
    while (true) {
        if (heap.empty() || heap.front().rank != rank) {
            for (const Candidate& c : pending) {
                heap.push_back(c);
                std::push_heap(heap.begin(), heap.end(), merges_later);
            }
            pending.clear();
            if (heap.empty()) break;
            rank = heap.front().rank;
        }
        std::pop_heap(heap.begin(), heap.end(), merges_later);
        const Candidate c = heap.back();
        heap.pop_back();
        // Symbols only grow and dead ones are -1, so an unchanged pair has the same ids.
        if (symbol[c.pos] != c.left || next[c.pos] != c.right_pos || symbol[c.right_pos] != c.right)
            continue;
        symbol[c.pos] = c.merged;
        symbol[c.right_pos] = -1;
        next[c.pos] = next[c.right_pos];
        if (next[c.pos] >= 0) {
            prev[next[c.pos]] = c.pos;
            find_candidate(c.pos, pending);
        }
        if (prev[c.pos] >= 0) find_candidate(prev[c.pos], pending);
    }
    for (int i = 0; i >= 0; i = next[i]) out.push_back(symbol[i]);
}

void Tokenizer::Impl::encode_word(std::string_view word, ThreadState& ts,
                                  std::vector<int>& out) const {
    if (word.size() == 1) {
        out.push_back(byte_token[uint8_t(word[0])]);
        return;
    }
    if (word.size() > kMaxCachedWordBytes) {
        bpe(word, ts, out);
        return;
    }
    ts.key.assign(word);  // reuses its buffer, so a cache hit allocates nothing
    if (const auto it = ts.cache.find(ts.key); it != ts.cache.end()) {
        const auto first = ts.cached_ids.begin() + it->second.first;
        out.insert(out.end(), first, first + it->second.second);
        return;
    }
    const size_t begin = out.size();
    bpe(word, ts, out);
    if (ts.cache.size() >= kMaxCachedWords) {
        ts.cache.clear();
        ts.cached_ids.clear();
    }
    const auto span = std::make_pair(uint32_t(ts.cached_ids.size()), uint32_t(out.size() - begin));
    ts.cache.emplace(ts.key, span);
    ts.cached_ids.insert(ts.cached_ids.end(), out.begin() + begin, out.end());
}

Tokenizer::Tokenizer() : impl_(new Impl) {}
Tokenizer::~Tokenizer() { delete impl_; }
Tokenizer::Tokenizer(Tokenizer&& other) noexcept : impl_(std::exchange(other.impl_, nullptr)) {}
Tokenizer& Tokenizer::operator=(Tokenizer&& other) noexcept {
    std::swap(impl_, other.impl_);
    return *this;
}

int Tokenizer::vocab_size() const { return int(impl_->token_bytes.size()); }

Tokenizer Tokenizer::load(const std::string& dir) {
    Tokenizer tok;
    Impl& impl = *tok.impl_;
    const auto byte_of = code_point_bytes();
    std::string bytes;

    const std::string encoder_path = dir + "/encoder.json";
    nlohmann::json encoder;
    try {
        encoder = nlohmann::json::parse(read_file(encoder_path));
    } catch (const nlohmann::json::exception& e) {
        throw Error(encoder_path + ": not valid JSON: " + e.what());
    }
    if (!encoder.is_object() || encoder.empty())
        throw Error(encoder_path + ": expected a JSON object mapping each token to its id");
    const size_t vocab = encoder.size();
    impl.token_bytes.resize(vocab);
    std::vector<bool> seen(vocab, false);
    std::unordered_map<std::string, int> id_of;  // token bytes -> id
    id_of.reserve(vocab);
    for (auto it = encoder.begin(); it != encoder.end(); ++it) {
        const std::string& token = it.key();
        if (!it.value().is_number_integer())
            throw Error(encoder_path + ": the id of token \"" + one_line(token) + "\" is not an integer");
        const int64_t id = it.value().get<int64_t>();
        if (id < 0 || uint64_t(id) >= vocab || seen[id])
            throw Error(encoder_path + ": token \"" + one_line(token) + "\" has id " + std::to_string(id) +
                        ": ids must be 0.." + std::to_string(vocab - 1) + ", each once");
        if (!alphabet_to_bytes(token, byte_of, bytes))
            throw Error(encoder_path + ": token \"" + one_line(token) + "\" is not in GPT-2's byte alphabet");
        seen[id] = true;
        impl.token_bytes[id] = bytes;
        id_of.emplace(bytes, int(id));
    }
    for (int b = 0; b < 256; ++b) {
        const auto it = id_of.find(std::string(1, char(b)));
        if (it == id_of.end())
            throw Error(encoder_path + ": no token for the single byte " + std::to_string(b));
        impl.byte_token[b] = it->second;
    }

    const std::string merges_path = dir + "/vocab.bpe";
    const std::string merges = read_file(merges_path);
    if (merges.rfind("#version", 0) != 0)
        throw Error(merges_path + ": expected a '#version' header line (GPT-2's vocab.bpe)");
    if (merges.back() != '\n')
        throw Error(merges_path + ": the last line has no newline (truncated file?)");
    auto token_id = [&](std::string_view token) {
        const auto it = alphabet_to_bytes(token, byte_of, bytes) ? id_of.find(bytes) : id_of.end();
        return it == id_of.end() ? -1 : it->second;
    };
    impl.merges.reserve(vocab);
    int rank = 0;
    int line_no = 1;
    for (size_t pos = merges.find('\n') + 1; pos < merges.size(); ++rank) {
        const size_t end = merges.find('\n', pos);
        const std::string_view line(merges.data() + pos, end - pos);
        pos = end + 1;
        const std::string where = merges_path + ":" + std::to_string(++line_no);
        const size_t space = line.find(' ');
        if (space == 0 || space == std::string_view::npos || space + 1 == line.size() ||
            line.find(' ', space + 1) != std::string_view::npos)
            throw Error(where + ": expected two tokens separated by one space");
        const std::string_view left = line.substr(0, space), right = line.substr(space + 1);
        const int left_id = token_id(left), right_id = token_id(right);
        if (left_id < 0 || right_id < 0)
            throw Error(where + ": \"" + std::string(left_id < 0 ? left : right) +
                        "\" is not a token of encoder.json");
        const std::string merged = std::string(left) + std::string(right);
        const int merged_id = token_id(merged);
        if (merged_id < 0)
            throw Error(where + ": the merged token \"" + merged + "\" is not in encoder.json");
        // A repeated pair takes its last rank, as in the reference's dict.
        impl.merges[Impl::pair_key(left_id, right_id)] = {rank, merged_id};
    }
    return tok;
}

std::vector<int> Tokenizer::encode(std::string_view text) const {
    std::string repaired;
    if (repair_utf8(text, repaired)) text = repaired;
    ThreadState& ts = thread_state(impl_->serial);
    std::vector<int> ids;
    ids.reserve(text.size() / 4 + 1);
    split_words(text, [&](size_t begin, size_t len) {
        impl_->encode_word(text.substr(begin, len), ts, ids);
    });
    return ids;
}

std::string Tokenizer::decode(const int* ids, size_t n) const {
    const std::vector<std::string>& table = impl_->token_bytes;
    std::string text;
    for (size_t i = 0; i < n; ++i) {
        if (ids[i] < 0 || size_t(ids[i]) >= table.size())
            throw Error("decode: token id " + std::to_string(ids[i]) + " at position " +
                        std::to_string(i) + " is outside the vocabulary [0, " +
                        std::to_string(table.size()) + ")");
        text += table[ids[i]];
    }
    return text;
}

std::vector<std::string> pretokenize(std::string_view text) {
    std::string repaired;
    if (repair_utf8(text, repaired)) text = repaired;
    std::vector<std::string> pieces;
    split_words(text, [&](size_t begin, size_t len) { pieces.emplace_back(text.substr(begin, len)); });
    return pieces;
}

std::string find_tokenizer_dir() {
    auto has_files = [](const std::string& dir) {
        return std::filesystem::is_regular_file(dir + "/encoder.json") &&
               std::filesystem::is_regular_file(dir + "/vocab.bpe");
    };
    const char* data = std::getenv("CODAGPT_DATA");
    if (data && *data && has_files(std::string(data) + "/gpt2")) return std::string(data) + "/gpt2";
    if (has_files("data/gpt2")) return "data/gpt2";
    throw Error("GPT-2 tokenizer files (encoder.json, vocab.bpe) not found in $CODAGPT_DATA/gpt2 "
                "or data/gpt2: run scripts/get_tokenizer.sh");
}

}  // namespace codagpt
