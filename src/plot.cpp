// metrics.jsonl to SVG by hand: two panels (loss and validation loss; tokens/s) sharing the step
// axis, each with ticks at "nice" values (1, 2 or 5 times a power of ten), labels and a legend.
#include "plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

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
        if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer())
            throw Error(path + ":" + std::to_string(line_no) + ": not a metrics record (a JSON object with an integer \"step\")");
        ++records;
        const double step = j["step"].get<double>();
        auto take = [&](const char* key, std::vector<std::pair<double, double>>& series) {
            if (j.contains(key) && j[key].is_number() && std::isfinite(j[key].get<double>()))
                series.emplace_back(step, j[key].get<double>());
        };
        take("loss", m.loss);
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
};

using Series = std::vector<std::pair<double, double>>;

struct Panel {
    double x0, y0, w, h;  // plot area in SVG units
};

void draw_panel(std::string& svg, const Panel& p, const Axis& xa, const std::vector<const Series*>& series,
                const std::vector<std::string>& names, const std::vector<std::string>& colors, const std::string& ylabel) {
    double lo = INFINITY, hi = -INFINITY;
    for (const Series* s : series)
        for (const auto& [x, y] : *s) lo = std::min(lo, y), hi = std::max(hi, y);
    if (!(lo <= hi)) lo = 0, hi = 1;
    const Axis ya(lo, hi);
    auto X = [&](double x) { return p.x0 + (x - xa.lo) / (xa.hi - xa.lo) * p.w; };
    auto Y = [&](double y) { return p.y0 + p.h - (y - ya.lo) / (ya.hi - ya.lo) * p.h; };

    svg += "<g class=\"panel\">\n";
    svg += "<rect x=\"" + num(p.x0) + "\" y=\"" + num(p.y0) + "\" width=\"" + num(p.w) + "\" height=\"" + num(p.h) +
           "\" fill=\"none\" stroke=\"#444\"/>\n";
    for (double t = xa.lo; t <= xa.hi + xa.step / 2; t += xa.step) {
        const std::string x = num(X(t));
        svg += "<line x1=\"" + x + "\" y1=\"" + num(p.y0 + p.h) + "\" x2=\"" + x + "\" y2=\"" + num(p.y0 + p.h + 5) +
               "\" stroke=\"#444\"/>\n";
        svg += "<text x=\"" + x + "\" y=\"" + num(p.y0 + p.h + 18) + "\" text-anchor=\"middle\">" +
               tick_label(t, xa.step) + "</text>\n";
    }
    for (double t = ya.lo; t <= ya.hi + ya.step / 2; t += ya.step) {
        const std::string y = num(Y(t));
        svg += "<line x1=\"" + num(p.x0 - 5) + "\" y1=\"" + y + "\" x2=\"" + num(p.x0 + p.w) + "\" y2=\"" + y +
               "\" stroke=\"#ddd\"/>\n";
        svg += "<text x=\"" + num(p.x0 - 8) + "\" y=\"" + num(Y(t) + 4) + "\" text-anchor=\"end\">" +
               tick_label(t, ya.step) + "</text>\n";
    }
    svg += "<text x=\"" + num(p.x0 + p.w / 2) + "\" y=\"" + num(p.y0 + p.h + 36) + "\" text-anchor=\"middle\">step</text>\n";
    svg += "<text transform=\"translate(" + num(p.x0 - 62) + "," + num(p.y0 + p.h / 2) +
           ") rotate(-90)\" text-anchor=\"middle\">" + xml_escape(ylabel) + "</text>\n";
    for (size_t i = 0; i < series.size(); i++) {
        if (series[i]->empty()) continue;
        svg += "<polyline class=\"" + names[i] + "\" fill=\"none\" stroke=\"" + colors[i] + "\" stroke-width=\"1.5\" points=\"";
        for (const auto& [x, y] : *series[i]) svg += num(X(x)) + "," + num(Y(y)) + " ";
        svg.back() = '"';
        svg += "/>\n";
        // legend, top right
        const double ly = p.y0 + 16 + 18 * i, lx = p.x0 + p.w - 130;
        svg += "<line x1=\"" + num(lx) + "\" y1=\"" + num(ly - 4) + "\" x2=\"" + num(lx + 24) + "\" y2=\"" + num(ly - 4) +
               "\" stroke=\"" + colors[i] + "\" stroke-width=\"2\"/>\n";
        svg += "<text x=\"" + num(lx + 30) + "\" y=\"" + num(ly) + "\">" + names[i] + "</text>\n";
    }
    svg += "</g>\n";
}

}  // namespace

std::string metrics_svg(const MetricsSeries& m, const std::string& title) {
    double lo = INFINITY, hi = -INFINITY;
    for (const Series* s : {&m.loss, &m.val_loss, &m.tok_s})
        for (const auto& pt : *s) lo = std::min(lo, pt.first), hi = std::max(hi, pt.first);
    if (!(lo <= hi)) lo = 0, hi = 1;
    const Axis xa(lo, hi);
    std::string svg =
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"700\" viewBox=\"0 0 900 700\" "
        "font-family=\"sans-serif\" font-size=\"12\">\n"
        "<rect width=\"900\" height=\"700\" fill=\"white\"/>\n"
        "<text x=\"450\" y=\"26\" text-anchor=\"middle\" font-size=\"16\">" + xml_escape(title) + "</text>\n";
    draw_panel(svg, {90, 50, 780, 260}, xa, {&m.loss, &m.val_loss}, {"loss", "val_loss"}, {"#1f77b4", "#d62728"}, "loss");
    draw_panel(svg, {90, 380, 780, 260}, xa, {&m.tok_s}, {"tok_s"}, {"#2ca02c"}, "tokens/s");
    svg += "</svg>\n";
    return svg;
}

std::string plot_run(const std::string& run_dir, const std::string& out) {
    namespace fs = std::filesystem;
    const MetricsSeries m = read_metrics((fs::path(run_dir) / "metrics.jsonl").string());
    const std::string path = out.empty() ? (fs::path(run_dir) / "metrics.svg").string() : out;
    write_file_atomic(path, metrics_svg(m, fs::path(run_dir).lexically_normal().string() + ": metrics.jsonl"));
    return path;
}

}  // namespace codagpt
