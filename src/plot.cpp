// metrics.jsonl to SVG by hand: two panels (loss and validation loss; tokens/s) sharing the step
// axis, each with ticks at "nice" values (1, 2 or 5 times a power of ten), labels and a legend.
// Several runs are drawn over each other on axes that cover them all.
#include "plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

#include "common.hpp"
#include "fileio.hpp"

namespace codagpt {

MetricsSeries read_metrics(const std::string& path) {
    std::ifstream in(path);
    if (!in || std::filesystem::is_directory(path)) throw Error("cannot read metrics file " + path + " (is it a run directory?)");
    MetricsSeries m;
    int line_no = 0, records = 0;
    for (std::string line; std::getline(in, line);) {
        ++line_no;
        if (line.empty()) continue;
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        // A last line without its newline is one a killed run was writing (the resumed run drops it too).
        if (j.is_discarded() && in.eof()) break;
        if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer())
            throw Error(path + ":" + std::to_string(line_no) + ": not a metrics record (a JSON object with an integer \"step\")");
        ++records;
        const double step = j["step"].get<double>();
        auto take = [&](const char* key, std::vector<std::pair<double, double>>& series) {
            if (j.contains(key) && j[key].is_number() && std::isfinite(j[key].get<double>()))
                series.emplace_back(step, j[key].get<double>());
        };
        if (!j.contains("skipped")) take("loss", m.loss);  // a skipped outlier's loss trained nothing
        take("val_loss", m.val_loss);
        take("tok_s", m.tok_s);
    }
    if (records == 0) throw Error("metrics file " + path + " is empty: the run has not finished a step yet");
    if (m.loss.empty() && m.val_loss.empty()) throw Error("metrics file " + path + " has no loss records");
    return m;
}

namespace {

std::string num(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return buf;
}

// Tick label: plain for moderate magnitudes, k/M suffixes for throughput-sized numbers.
std::string tick_label(double v, double step) {
    char buf[32];
    const double a = std::fabs(v);
    if (a >= 1e6) std::snprintf(buf, sizeof buf, "%gM", v / 1e6);
    else if (a >= 1e4) std::snprintf(buf, sizeof buf, "%gk", v / 1e3);
    else if (step >= 1) std::snprintf(buf, sizeof buf, "%.0f", v);
    else std::snprintf(buf, sizeof buf, "%.*f", std::min(6, int(std::ceil(-std::log10(step)))), v);
    return buf;
}

std::string xml_escape(const std::string& s) {
    std::string out;
    for (char ch : s) {
        switch (ch) {
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '&': out += "&amp;"; break;
            case '"': out += "&quot;"; break;
            default: out += (unsigned char)ch < 0x20 ? ' ' : ch;
        }
    }
    return out;
}

// Round range [lo, hi] out to multiples of a nice tick step giving about 5 ticks.
struct Axis {
    double lo, hi, step;
    Axis(double a, double b) {
        if (!(b > a)) {  // one value: a range around it
            const double pad = a != 0 ? std::fabs(a) * 0.1 : 1;
            a -= pad;
            b += pad;
        }
        const double raw = (b - a) / 5, p = std::pow(10.0, std::floor(std::log10(raw))), f = raw / p;
        step = (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
        lo = std::floor(a / step) * step;
        hi = std::ceil(b / step) * step;
    }
    // lo, lo + step, ... hi, counted (values a few roundings apart give a step that adding to lo
    // cannot move it by).
    std::vector<double> ticks() const {
        std::vector<double> t;
        const long n = std::lround((hi - lo) / step);
        for (long i = 0; i <= std::min(n, 100L); i++) t.push_back(lo + i * step);
        return t;
    }
};

using Series = std::vector<std::pair<double, double>>;

struct Panel {
    double x0, y0, w, h;  // plot area in SVG units
};

struct Line {
    const Series* points;
    std::string cls, color, label;  // label: the run's, on several-run figures only
    bool dashed;
};

struct LegendKey {
    std::string text, color;
    bool dashed;
};

std::string stroke(const std::string& color, const char* width, bool dashed) {
    return " stroke=\"" + color + "\" stroke-width=\"" + width + "\"" + (dashed ? " stroke-dasharray=\"6,4\"" : "");
}

void draw_panel(std::string& svg, const Panel& p, const Axis& xa, const std::vector<Line>& lines,
                const std::vector<LegendKey>& keys, const std::string& ylabel) {
    double lo = INFINITY, hi = -INFINITY;
    for (const Line& l : lines)
        for (const auto& [x, y] : *l.points) lo = std::min(lo, y), hi = std::max(hi, y);
    if (!(lo <= hi)) lo = 0, hi = 1;
    const Axis ya(lo, hi);
    auto X = [&](double x) { return p.x0 + (x - xa.lo) / (xa.hi - xa.lo) * p.w; };
    auto Y = [&](double y) { return p.y0 + p.h - (y - ya.lo) / (ya.hi - ya.lo) * p.h; };

    svg += "<g class=\"panel\">\n";
    svg += "<rect x=\"" + num(p.x0) + "\" y=\"" + num(p.y0) + "\" width=\"" + num(p.w) + "\" height=\"" + num(p.h) +
           "\" fill=\"none\" stroke=\"#444\"/>\n";
    for (const double t : xa.ticks()) {
        const std::string x = num(X(t));
        svg += "<line x1=\"" + x + "\" y1=\"" + num(p.y0 + p.h) + "\" x2=\"" + x + "\" y2=\"" + num(p.y0 + p.h + 5) +
               "\" stroke=\"#444\"/>\n";
        svg += "<text x=\"" + x + "\" y=\"" + num(p.y0 + p.h + 18) + "\" text-anchor=\"middle\">" +
               tick_label(t, xa.step) + "</text>\n";
    }
    for (const double t : ya.ticks()) {
        const std::string y = num(Y(t));
        svg += "<line x1=\"" + num(p.x0 - 5) + "\" y1=\"" + y + "\" x2=\"" + num(p.x0 + p.w) + "\" y2=\"" + y +
               "\" stroke=\"#ddd\"/>\n";
        svg += "<text x=\"" + num(p.x0 - 8) + "\" y=\"" + num(Y(t) + 4) + "\" text-anchor=\"end\">" +
               tick_label(t, ya.step) + "</text>\n";
    }
    svg += "<text x=\"" + num(p.x0 + p.w / 2) + "\" y=\"" + num(p.y0 + p.h + 36) + "\" text-anchor=\"middle\">step</text>\n";
    svg += "<text transform=\"translate(" + num(p.x0 - 62) + "," + num(p.y0 + p.h / 2) +
           ") rotate(-90)\" text-anchor=\"middle\">" + xml_escape(ylabel) + "</text>\n";
    for (const Line& l : lines) {
        if (l.points->empty()) continue;
        if (l.points->size() == 1) {  // a polyline of one point draws nothing: a dot instead
            const auto [x, y] = l.points->front();
            svg += "<circle class=\"" + l.cls + "\" cx=\"" + num(X(x)) + "\" cy=\"" + num(Y(y)) + "\" r=\"3\" fill=\"" +
                   l.color + "\"/>\n";
            continue;
        }
        svg += "<polyline class=\"" + l.cls + "\"" + (l.label.empty() ? "" : " data-label=\"" + xml_escape(l.label) + "\"") +
               " fill=\"none\"" + stroke(l.color, "1.5", l.dashed) + " points=\"";
        for (const auto& [x, y] : *l.points) svg += num(X(x)) + "," + num(Y(y)) + " ";
        svg.back() = '"';
        svg += "/>\n";
    }
    // Legend, top right, moved left as far as its longest text needs (about 7 units a character).
    size_t longest = 0;
    for (const LegendKey& k : keys) longest = std::max(longest, k.text.size());
    const double lx = p.x0 + p.w - std::max(130.0, 40.0 + 7.0 * longest);
    for (size_t i = 0; i < keys.size(); i++) {
        const double ly = p.y0 + 16 + 18 * i;
        svg += "<line x1=\"" + num(lx) + "\" y1=\"" + num(ly - 4) + "\" x2=\"" + num(lx + 24) + "\" y2=\"" + num(ly - 4) +
               "\"" + stroke(keys[i].color, "2", keys[i].dashed) + "/>\n";
        svg += "<text x=\"" + num(lx + 30) + "\" y=\"" + num(ly) + "\">" + xml_escape(keys[i].text) + "</text>\n";
    }
    svg += "</g>\n";
}

// One colour per run on several-run figures (matplotlib's tab10 without its grey, which the legend
// uses for the line styles); runs past the ninth reuse colours.
const char* const kRunColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                  "#8c564b", "#e377c2", "#bcbd22", "#17becf"};

}  // namespace

std::string metrics_svg(const std::vector<RunMetrics>& runs, const std::string& title) {
    double lo = INFINITY, hi = -INFINITY;
    for (const RunMetrics& r : runs)
        for (const Series* s : {&r.metrics.loss, &r.metrics.val_loss, &r.metrics.tok_s})
            for (const auto& pt : *s) lo = std::min(lo, pt.first), hi = std::max(hi, pt.first);
    if (!(lo <= hi)) lo = 0, hi = 1;
    const Axis xa(lo, hi);
    std::vector<Line> loss_lines, tok_lines;
    std::vector<LegendKey> loss_keys, tok_keys;
    if (runs.size() == 1) {
        const MetricsSeries& m = runs[0].metrics;
        loss_lines = {{&m.loss, "loss", "#1f77b4", "", false}, {&m.val_loss, "val_loss", "#d62728", "", false}};
        tok_lines = {{&m.tok_s, "tok_s", "#2ca02c", "", false}};
        auto series_keys = [](const std::vector<Line>& lines) {
            std::vector<LegendKey> keys;
            for (const Line& l : lines)
                if (!l.points->empty()) keys.push_back({l.cls, l.color, false});
            return keys;
        };
        loss_keys = series_keys(loss_lines);
        tok_keys = series_keys(tok_lines);
    } else {
        bool any_loss = false, any_val = false;
        for (size_t i = 0; i < runs.size(); i++) {
            const MetricsSeries& m = runs[i].metrics;
            const std::string color = kRunColors[i % std::size(kRunColors)], &label = runs[i].label;
            loss_lines.push_back({&m.loss, "loss", color, label, false});
            loss_lines.push_back({&m.val_loss, "val_loss", color, label, true});
            tok_lines.push_back({&m.tok_s, "tok_s", color, label, false});
            loss_keys.push_back({label, color, false});
            tok_keys.push_back({label, color, false});
            any_loss |= !m.loss.empty();
            any_val |= !m.val_loss.empty();
        }
        // colour says which run, the line style which series
        if (any_loss) loss_keys.push_back({"loss", "#444", false});
        if (any_val) loss_keys.push_back({"val_loss", "#444", true});
    }
    std::string svg =
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"700\" viewBox=\"0 0 900 700\" "
        "font-family=\"sans-serif\" font-size=\"12\">\n"
        "<rect width=\"900\" height=\"700\" fill=\"white\"/>\n"
        "<text x=\"450\" y=\"26\" text-anchor=\"middle\" font-size=\"16\">" + xml_escape(title) + "</text>\n";
    draw_panel(svg, {90, 50, 780, 260}, xa, loss_lines, loss_keys, "loss");
    draw_panel(svg, {90, 380, 780, 260}, xa, tok_lines, tok_keys, "tokens/s");
    svg += "</svg>\n";
    return svg;
}

std::string plot_runs(const std::vector<std::string>& run_dirs, const std::string& out,
                      const std::vector<std::string>& labels) {
    namespace fs = std::filesystem;
    if (run_dirs.empty()) throw Error("no run directory to plot");
    if (!labels.empty() && labels.size() != run_dirs.size())
        throw Error("--labels and the run directories differ in number (" + std::to_string(labels.size()) + " vs " +
                    std::to_string(run_dirs.size()) + "): give one label per run, in order");
    for (const std::string& l : labels)
        if (l.empty()) throw Error("--labels holds an empty label");
    if (run_dirs.size() > 1 && out.empty()) throw Error("plotting several runs needs -o FILE.svg (no one run directory owns the figure)");
    for (const std::string& d : run_dirs)
        if (!fs::is_directory(d)) throw Error("no run directory " + d);
    const std::string path = out.empty() ? (fs::path(run_dirs[0]) / "metrics.svg").string() : out;
    for (const std::string& d : run_dirs)
        check_not_overwriting(path, (fs::path(d) / "metrics.jsonl").string(), "the run log");

    std::vector<std::string> names = labels;
    if (names.empty()) {
        // weakly_canonical names "." and "runs/a/" after their folder
        for (const std::string& d : run_dirs) names.push_back(fs::weakly_canonical(d).filename().string());
        // the default out_dir is runs/<config>, so two runs of one config often share a folder name
        if (std::set<std::string>(names.begin(), names.end()).size() < names.size())
            for (size_t i = 0; i < run_dirs.size(); i++) names[i] = fs::path(run_dirs[i]).lexically_normal().string();
    }
    std::vector<RunMetrics> runs;
    for (size_t i = 0; i < run_dirs.size(); i++)
        runs.push_back({names[i], read_metrics((fs::path(run_dirs[i]) / "metrics.jsonl").string())});

    std::string title;
    if (runs.size() == 1) {
        title = (labels.empty() ? fs::path(run_dirs[0]).lexically_normal().string() : labels[0]) + ": metrics.jsonl";
    } else {
        title = "metrics.jsonl:";
        for (size_t i = 0; i < runs.size(); i++) title += (i ? " vs " : " ") + runs[i].label;
    }
    write_file_atomic(path, metrics_svg(runs, title));
    return path;
}

}  // namespace codagpt
