// Where a training step's time goes (`codagpt train --phase-times`, issue 7): forward + backward on
// the compute stream, the gradient reductions on the side stream of a data-parallel job
// (data_parallel.hpp) and the part of them that backward did not hide, and the optimizer step.
// The CUDA events are recorded and read by TrainableParams (gpu_training.hpp); this is the host-only
// arithmetic and reporting, without CUDA.
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace codagpt {

// One optimizer step's events, in ms after it began (gradients zeroed; compute stream).
struct StepMarks {
    double backward_end = 0;     // the step's last backward has finished
    double optimizer_begin = 0;  // the reduced gradients are there: the gradient norm begins
    double optimizer_end = 0;    // the updated weights are in place (AdamW, all-gather)
    // Each gradient bucket's reduction on the side stream: (start, end). None for one process.
    std::vector<std::pair<double, double>> reductions;
};

// The phases of a step, in ms.
struct StepPhases {
    double fwd_bwd = 0;         // step begins (gradients zeroed) -> last backward ends
    double reduce = 0;          // first reduction starts -> last reduction ends (side stream)
    double reduce_busy = 0;     // the sum of the buckets' reduction times
    double exposed_reduce = 0;  // last reduction ends - backward ends, at least 0: communication not hidden
    double optimizer = 0;       // gradient norm, clipping, AdamW, all-gather of the weights
};

StepPhases step_phases(const StepMarks& m);

// The upper median of a non-empty v (the middle element after sorting; of two, the larger).
double median(std::vector<double> v);

// Each phase's median over steps[skip..] (all zero when there are none).
StepPhases median_phases(const std::vector<StepPhases>& steps, size_t skip);

// {"fwd_bwd", "reduce", "reduce_busy", "exposed_reduce", "optimizer"}; the three reduction keys
// only with `reduced` (a data-parallel job).
nlohmann::json phases_json(const StepPhases& p, bool reduced);
// The same as one line: "fwd_bwd 412.31 | reduce 60.02 | ... | optimizer 9.80".
std::string phases_text(const StepPhases& p, bool reduced);

}  // namespace codagpt
