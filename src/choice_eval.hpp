// Multiple-choice evaluation, as llm.c and build-nanogpt run HellaSwag ("completion style"): each
// item is a context and candidate endings; the model's loss on each ending's tokens, given the
// context, ranks the endings. The config key hellaswag_data: at a training run's evaluations and in
// `codagpt eval` (train.hpp).
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace codagpt {

class TrainBackend;

struct ChoiceItem {
    std::vector<int> context;
    std::vector<std::vector<int>> endings;
    int label = 0;  // the index of the right ending
};

// HellaSwag's jsonl (github.com/rowanz/hellaswag, data/hellaswag_val.jsonl: 10,042 items), one
// object a line with "ctx", "endings" (strings) and "label"; the context is encode(ctx) and each
// ending encode(" " + ending). At most `limit` items (0: all). Errors name the file and line.
std::vector<ChoiceItem> read_hellaswag(const std::string& path,
                                       const std::function<std::vector<int>(const std::string&)>& encode,
                                       size_t limit = 0);

struct ChoiceScore {
    size_t items = 0;
    size_t correct_sum = 0;   // items whose ending of lowest summed loss is the right one ("acc")
    size_t correct_mean = 0;  // ... of lowest mean loss a token ("acc_norm", llm.c's HellaSwag figure)
    size_t cut = 0;           // items with a context cut from the left to fit seq_len
    double acc_norm() const { return double(correct_mean) / items; }
    double acc() const { return double(correct_sum) / items; }
};

// Throws Error naming the first item that rows of T positions cannot score: an empty context or
// ending, a label that is not an ending's index, an ending too long to follow one context token, a
// token id outside [0, vocab).
void check_choices(const std::vector<ChoiceItem>& items, int T, int vocab);

// Scores `items` with `model`, whose micro-batches are B rows of T positions: each ending is a row
// holding its context and itself (tokens t_0 ... t_n, n <= T: inputs t_0 ... t_{n-1}, targets
// t_1 ... t_n, then padding), the context cut from the left where they do not fit; rows of padding
// fill the last micro-batch. Ties go to the lower index. Checks the items first (check_choices).
ChoiceScore score_choices(TrainBackend& model, int B, int T, int vocab, const std::vector<ChoiceItem>& items);

}  // namespace codagpt
