// `codagpt plot RUN_DIR [RUN_DIR ...]`: runs' metrics.jsonl drawn as one SVG (no dependencies):
// loss and validation loss against step in one panel, tokens/s against step in the other. Several
// runs share the axes, one colour each, so that two runs (fused and unfused, two seeds) compare at
// a glance.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace codagpt {

struct MetricsSeries {
    std::vector<std::pair<double, double>> loss, val_loss, tok_s;  // (step, value)
};

struct RunMetrics {
    std::string label;  // the run's name in the legend
    MetricsSeries metrics;
};

// Reads a metrics.jsonl (one JSON object per line, as run_train writes it; skipped-step records
// are ignored). Throws Error naming the file (and line) when it is missing, empty, holds a line
// that is not a JSON object with an integer "step", or holds no training records.
MetricsSeries read_metrics(const std::string& path);
// The two-panel SVG document: axes with ticks and labels, polylines, legends. One run: one colour
// per series, the legend names the series. Several: one colour per run (loss solid, validation
// loss dashed), the legend names the runs; every polyline carries its run's label as data-label.
std::string metrics_svg(const std::vector<RunMetrics>& runs, const std::string& title);
// Reads run_dir/metrics.jsonl of every run and writes the SVG to out (for one run, default
// run_dir/metrics.svg; several need out); returns the path written. labels, when given, name the
// runs in order (default: each run folder's name, or the paths as given where two folders share
// a name). Throws Error, writing nothing, for a missing run directory, a labels count that is not
// the runs count, an empty label, or several runs without out.
std::string plot_runs(const std::vector<std::string>& run_dirs, const std::string& out = "",
                      const std::vector<std::string>& labels = {});

}  // namespace codagpt
