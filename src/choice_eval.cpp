#include "choice_eval.hpp"

#include <fstream>
#include <nlohmann/json.hpp>

#include "backend.hpp"
#include "common.hpp"

namespace codagpt {

std::vector<ChoiceItem> read_hellaswag(const std::string& path,
                                       const std::function<std::vector<int>(const std::string&)>& encode,
                                       size_t limit) {
    std::ifstream f(path);
    if (!f) throw Error("cannot open HellaSwag file " + path);
    std::vector<ChoiceItem> items;
    size_t line_no = 0;
    for (std::string line; (limit == 0 || items.size() < limit) && std::getline(f, line);) {
        line_no++;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where = path + " line " + std::to_string(line_no);
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (!j.is_object()) throw Error(where + ": not a JSON object");
        const auto ctx = j.find("ctx");
        const auto endings = j.find("endings");
        const auto label = j.find("label");
        if (ctx == j.end() || !ctx->is_string()) throw Error(where + ": no \"ctx\" string");
        if (endings == j.end() || !endings->is_array() || endings->empty())
            throw Error(where + ": no \"endings\" array of strings");
        if (label == j.end() || !label->is_number_integer() || label->get<long>() < 0 ||
            label->get<long>() >= (long)endings->size())
            throw Error(where + ": \"label\" is not the index of one of its " + std::to_string(endings->size()) +
                        " endings");
        ChoiceItem item;
        item.context = encode(ctx->get<std::string>());
        for (const nlohmann::json& e : *endings) {
            if (!e.is_string()) throw Error(where + ": an ending is not a string");
            item.endings.push_back(encode(" " + e.get<std::string>()));
        }
        item.label = label->get<int>();
        items.push_back(std::move(item));
    }
    if (f.bad()) throw Error("cannot read HellaSwag file " + path);
    if (items.empty()) throw Error("HellaSwag file " + path + " holds no items");
    return items;
}

void check_choices(const std::vector<ChoiceItem>& items, int T, int vocab) {
    auto check_ids = [&](const std::string& which, const std::vector<int>& ids) {
        for (int t : ids)
            if (t < 0 || t >= vocab)
                throw Error(which + ": token id " + std::to_string(t) + " outside the vocabulary of " +
                            std::to_string(vocab));
    };
    for (size_t i = 0; i < items.size(); i++) {
        const ChoiceItem& item = items[i];
        const std::string which = "multiple-choice item " + std::to_string(i + 1);
        if (item.context.empty()) throw Error(which + ": empty context");
        if (item.label < 0 || item.label >= (int)item.endings.size())
            throw Error(which + ": label " + std::to_string(item.label) + " is not the index of one of its " +
                        std::to_string(item.endings.size()) + " endings");
        check_ids(which, item.context);
        for (size_t e = 0; e < item.endings.size(); e++) {
            const std::vector<int>& ending = item.endings[e];
            if (ending.empty()) throw Error(which + ": ending " + std::to_string(e + 1) + " is empty");
            if ((long)ending.size() > T)
                throw Error(which + ": ending " + std::to_string(e + 1) + " of " + std::to_string(ending.size()) +
                            " tokens does not fit seq_len " + std::to_string(T) + " after one context token");
            check_ids(which, ending);
        }
    }
}

ChoiceScore score_choices(TrainBackend& model, int B, int T, int vocab, const std::vector<ChoiceItem>& items) {
    check_choices(items, T, vocab);
    ChoiceScore score;
    score.items = items.size();
    // Each ending's summed loss, filled a micro-batch at a time.
    std::vector<std::vector<double>> sums(items.size());
    struct Row {
        size_t item;
        size_t ending;
        int first;  // the position whose target is the ending's first token
    };
    std::vector<Row> rows;
    std::vector<int> inputs((size_t)B * T, 0), targets((size_t)B * T, 0);
    auto flush = [&] {
        if (rows.empty()) return;
        const std::vector<float> losses = model.evaluate_tokens(inputs.data(), targets.data());
        for (size_t r = 0; r < rows.size(); r++) {
            const Row& row = rows[r];
            const size_t n = items[row.item].endings[row.ending].size();
            double sum = 0;
            for (size_t k = 0; k < n; k++) sum += losses[r * T + row.first + k];
            sums[row.item][row.ending] = sum;
        }
        rows.clear();
        std::fill(inputs.begin(), inputs.end(), 0);
        std::fill(targets.begin(), targets.end(), 0);
    };

    for (size_t i = 0; i < items.size(); i++) {
        const ChoiceItem& item = items[i];
        sums[i].assign(item.endings.size(), 0.0);
        bool cut = false;
        for (size_t e = 0; e < item.endings.size(); e++) {
            const std::vector<int>& ending = item.endings[e];
            // The row: the last `keep` context tokens, then the ending: keep + n - 1 <= T positions.
            const size_t keep = std::min(item.context.size(), (size_t)T + 1 - ending.size());
            cut |= keep < item.context.size();
            std::vector<int> seq(item.context.end() - keep, item.context.end());
            seq.insert(seq.end(), ending.begin(), ending.end());
            const size_t r = rows.size();
            for (size_t t = 0; t + 1 < seq.size(); t++) {
                inputs[r * T + t] = seq[t];
                targets[r * T + t] = seq[t + 1];
            }
            rows.push_back({i, e, (int)keep - 1});
            if ((int)rows.size() == B) flush();
        }
        score.cut += cut;
    }
    flush();

    for (size_t i = 0; i < items.size(); i++) {
        size_t best_sum = 0, best_mean = 0;
        for (size_t e = 1; e < sums[i].size(); e++) {
            if (sums[i][e] < sums[i][best_sum]) best_sum = e;
            const double mean = sums[i][e] / items[i].endings[e].size();
            if (mean < sums[i][best_mean] / items[i].endings[best_mean].size()) best_mean = e;
        }
        score.correct_sum += (int)best_sum == items[i].label;
        score.correct_mean += (int)best_mean == items[i].label;
    }
    return score;
}

}  // namespace codagpt
