// `codagpt plot RUN_DIR`: the run's metrics.jsonl drawn as an SVG (no dependencies): loss and
// validation loss against step in one panel, tokens/s against step in the other.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace codagpt {

struct MetricsSeries {
    std::vector<std::pair<double, double>> loss, val_loss, tok_s;  // (step, value)
};

// Reads a metrics.jsonl (one JSON object per line, as run_train writes it; skipped-step records
// are ignored). Throws Error naming the file (and line) when it is missing, empty, holds a line
// that is not a JSON object with an integer "step", or holds no training records.
MetricsSeries read_metrics(const std::string& path);
// The two-panel SVG document: axes with ticks and labels, one polyline per series, legends.
std::string metrics_svg(const MetricsSeries& m, const std::string& title);
// Reads run_dir/metrics.jsonl and writes the SVG to out (default run_dir/metrics.svg); returns
// the path written.
std::string plot_run(const std::string& run_dir, const std::string& out = "");

}  // namespace codagpt
