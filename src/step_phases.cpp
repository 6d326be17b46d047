#include "step_phases.hpp"

#include <algorithm>
#include <cstdio>

namespace codagpt {

namespace {
struct Field {
    const char* name;
    double StepPhases::*ms;
    bool reduction;  // reported for data-parallel jobs only
};
constexpr Field kFields[] = {{"fwd_bwd", &StepPhases::fwd_bwd, false},
                             {"reduce", &StepPhases::reduce, true},
                             {"reduce_busy", &StepPhases::reduce_busy, true},
                             {"exposed_reduce", &StepPhases::exposed_reduce, true},
                             {"optimizer", &StepPhases::optimizer, false}};
}  // namespace

StepPhases step_phases(const StepMarks& m) {
    StepPhases p;
    p.fwd_bwd = m.backward_end;
    p.optimizer = m.optimizer_end - m.optimizer_begin;
    if (m.reductions.empty()) return p;
    double first = m.reductions[0].first, last = m.reductions[0].second;
    for (const auto& [start, end] : m.reductions) {
        first = std::min(first, start);
        last = std::max(last, end);
        p.reduce_busy += end - start;
    }
    p.reduce = last - first;
    p.exposed_reduce = std::max(0.0, last - m.backward_end);
    return p;
}

double median(std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
}

StepPhases median_phases(const std::vector<StepPhases>& steps, size_t skip) {
    StepPhases med;
    if (skip >= steps.size()) return med;
    for (const Field& f : kFields) {
        std::vector<double> ms;
        for (size_t i = skip; i < steps.size(); i++) ms.push_back(steps[i].*f.ms);
        med.*f.ms = median(std::move(ms));
    }
    return med;
}

nlohmann::json phases_json(const StepPhases& p, bool reduced) {
    nlohmann::json j = nlohmann::json::object();
    for (const Field& f : kFields)
        if (reduced || !f.reduction) j[f.name] = p.*f.ms;
    return j;
}

std::string phases_text(const StepPhases& p, bool reduced) {
    std::string s;
    char buf[64];
    for (const Field& f : kFields)
        if (reduced || !f.reduction) {
            std::snprintf(buf, sizeof buf, "%s%s %.2f", s.empty() ? "" : " | ", f.name, p.*f.ms);
            s += buf;
        }
    return s;
}

}  // namespace codagpt
