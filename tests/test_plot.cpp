// `codagpt plot`: metrics.jsonl to a two-panel SVG, several runs overlaid on shared axes, and
// clear refusals of missing, empty and garbled metrics files, missing run directories and labels
// that do not fit the runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <vector>

#include "plot.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using namespace codagpt;

namespace {

struct Plot : ::testing::Test {
    fs::path dir = fs::temp_directory_path() / ("codagpt_plot_" + std::to_string(::getpid()));
    void SetUp() override { fs::create_directories(dir); }
    void TearDown() override { fs::remove_all(dir); }
    void write_metrics(const std::string& text) { std::ofstream(dir / "metrics.jsonl") << text; }
    std::string read(const fs::path& p) {
        std::ifstream f(p);
        return std::string((std::istreambuf_iterator<char>(f)), {});
    }
};

// Checks that every tag is closed in order (self-closing tags count as closed); returns the tag
// names seen. Comments, the XML declaration and attribute values holding '>' are not expected.
std::vector<std::string> balanced_tags(const std::string& svg) {
    std::vector<std::string> stack, seen;
    for (size_t i = svg.find('<'); i != std::string::npos; i = svg.find('<', i + 1)) {
        const size_t end = svg.find('>', i);
        EXPECT_NE(end, std::string::npos);
        if (end == std::string::npos) break;
        std::string tag = svg.substr(i + 1, end - i - 1);
        if (tag[0] == '?') continue;
        const bool closing = tag[0] == '/', self_closing = tag.back() == '/';
        const std::string name = tag.substr(closing, tag.find_first_of(" /", closing) - closing);
        if (closing) {
            EXPECT_FALSE(stack.empty()) << "</" << name << "> closes nothing";
            if (stack.empty()) break;
            EXPECT_EQ(stack.back(), name) << "</" << name << "> closes <" << stack.back() << ">";
            stack.pop_back();
        } else {
            seen.push_back(name);
            if (!self_closing) stack.push_back(name);
        }
    }
    EXPECT_TRUE(stack.empty()) << stack.size() << " unclosed tags, first <" << (stack.empty() ? "" : stack[0]) << ">";
    return seen;
}

struct Polyline {
    std::string cls, label, color;  // label: data-label, on several-run figures
    bool dashed;
    std::vector<std::pair<double, double>> points;
};

std::vector<Polyline> polylines(const std::string& svg) {
    std::vector<Polyline> out;
    const std::regex line("<polyline class=\"([a-z_]+)\"(?: data-label=\"([^\"]*)\")? fill=\"none\" stroke=\"([^\"]*)\""
                          "([^>]*) points=\"([^\"]*)\"");
    const std::regex point("(-?[0-9.]+),(-?[0-9.]+)");
    for (std::sregex_iterator it(svg.begin(), svg.end(), line), e; it != e; ++it) {
        const std::smatch& m = *it;
        Polyline p{m[1], m[2], m[3], m[4].str().find("stroke-dasharray") != std::string::npos, {}};
        const std::string pts = m[5];
        for (std::sregex_iterator pt(pts.begin(), pts.end(), point), pe; pt != pe; ++pt)
            p.points.emplace_back(std::stod((*pt)[1]), std::stod((*pt)[2]));
        out.push_back(p);
    }
    return out;
}

// Number of points of the first polyline of class `name`, or -1 when there is none.
int polyline_points(const std::string& svg, const std::string& name) {
    for (const Polyline& p : polylines(svg))
        if (p.cls == name) return int(p.points.size());
    return -1;
}

// The panels' plot areas (x0, y0, w, h), top to bottom.
std::vector<std::array<double, 4>> panel_rects(const std::string& svg) {
    std::vector<std::array<double, 4>> out;
    const std::regex rect("<g class=\"panel\">\n<rect x=\"([0-9.]+)\" y=\"([0-9.]+)\" width=\"([0-9.]+)\" height=\"([0-9.]+)\"");
    for (std::sregex_iterator it(svg.begin(), svg.end(), rect), e; it != e; ++it)
        out.push_back({std::stod((*it)[1]), std::stod((*it)[2]), std::stod((*it)[3]), std::stod((*it)[4])});
    return out;
}

// A run of `steps` steps whose loss falls linearly from loss0 to loss1, validated every 10 steps,
// at a constant tok_s.
std::string run_metrics(int steps, double loss0, double loss1, double tok_s) {
    std::string text;
    for (int step = 1; step <= steps; step++) {
        const double loss = loss0 + (loss1 - loss0) * (step - 1) / (steps - 1);
        text += "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(loss) +
                ",\"tok_s\":" + std::to_string(tok_s) + "}\n";
        if (step % 10 == 0) text += "{\"step\":" + std::to_string(step) + ",\"val_loss\":" + std::to_string(loss + 0.2) + "}\n";
    }
    return text;
}

}  // namespace

TEST_F(Plot, DrawsLossValLossAndThroughput) {
    std::string text;
    for (int step = 1; step <= 40; step++) {
        if (step % 10 == 1) text += "{\"step\":" + std::to_string(step - 1) + ",\"val_loss\":" + std::to_string(9.0 - step * 0.1) + "}\n";
        if (step == 17) {
            text += "{\"step\":17,\"skipped\":\"non-finite loss\"}\n";
            continue;
        }
        if (step == 23) {  // an outlier's line carries the loss it did not train on
            text += "{\"step\":23,\"skipped\":\"loss outlier\",\"loss\":99.0,\"grad_norm\":1.5,\"z\":12.0}\n";
            continue;
        }
        text += "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(10.0 - step * 0.15) +
                ",\"lr\":0.001,\"grad_norm\":1.5,\"ms\":12.5,\"tok_s\":" + std::to_string(20000 + 100 * step) + "}\n";
    }
    text += "{\"step\":40,\"val_loss\":5.1}\n";
    write_metrics(text);
    const std::string out = plot_runs({dir.string()}, (dir / "p.svg").string());
    EXPECT_EQ(out, (dir / "p.svg").string());
    const std::string svg = read(out);
    ASSERT_FALSE(svg.empty());
    EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
    const auto tags = balanced_tags(svg);
    EXPECT_EQ(tags.front(), "svg");
    EXPECT_EQ(polyline_points(svg, "loss"), 38);      // 40 steps, two skipped
    EXPECT_EQ(polyline_points(svg, "val_loss"), 5);   // steps 0, 10, 20, 30, 40
    EXPECT_EQ(polyline_points(svg, "tok_s"), 38);
    EXPECT_EQ(std::count(tags.begin(), tags.end(), "polyline"), 3);
    // two panels, axis labels, tick labels, legends
    EXPECT_EQ(std::count(tags.begin(), tags.end(), "g"), 2);
    EXPECT_NE(svg.find(">step</text>"), std::string::npos);
    EXPECT_NE(svg.find(">tokens/s</text>"), std::string::npos);
    EXPECT_NE(svg.find(">val_loss</text>"), std::string::npos);
    EXPECT_NE(svg.find(">24k</text>"), std::string::npos);  // a throughput tick
    // Default output: RUN_DIR/metrics.svg
    EXPECT_EQ(plot_runs({dir.string()}), (dir / "metrics.svg").string());
    EXPECT_TRUE(fs::exists(dir / "metrics.svg"));
}

TEST_F(Plot, OnePointAndNoValidationStillDraw) {
    write_metrics("{\"step\":1,\"loss\":3.5,\"tok_s\":100}\n");
    const std::string svg = read(plot_runs({dir.string()}));
    balanced_tags(svg);
    // A polyline of one point draws nothing: one point is a dot.
    EXPECT_EQ(polyline_points(svg, "loss"), -1);
    EXPECT_NE(svg.find("<circle class=\"loss\""), std::string::npos);
    EXPECT_NE(svg.find("<circle class=\"tok_s\""), std::string::npos);
    EXPECT_EQ(polyline_points(svg, "val_loss"), -1);
    EXPECT_EQ(svg.find("<circle class=\"val_loss\""), std::string::npos);
}

// The last line of a run killed while writing it (no newline, cut short) is left out, as a resumed
// run leaves it out; values a few roundings apart still get a finite axis.
TEST_F(Plot, TornLastLineAndNearlyEqualValues) {
    write_metrics("{\"step\":1,\"loss\":2.5}\n{\"step\":2,\"loss\":2.5000000000000004}\n{\"step\":3,\"lo");
    const std::string svg = read(plot_runs({dir.string()}));
    balanced_tags(svg);
    EXPECT_EQ(polyline_points(svg, "loss"), 2);
}

TEST_F(Plot, RefusesMissingEmptyAndGarbledMetrics) {
    auto refused = [&](const std::string& part) {
        const std::string msg = test::error_of([&] { plot_runs({dir.string()}); });
        EXPECT_TRUE(test::mentions(msg, part));
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    };
    refused("cannot read metrics file");
    write_metrics("");
    refused("is empty");
    write_metrics("{\"step\":1,\"loss\":3.5}\n{\"step\":2,\"lo\n{\"step\":3,\"loss\":3.4}\n");
    refused("metrics.jsonl:2: not a metrics record");
    write_metrics("[1,2]\n");
    refused("metrics.jsonl:1: not a metrics record");
    write_metrics("{\"step\":\"one\",\"loss\":1}\n");
    refused("metrics.jsonl:1");
    write_metrics("{\"step\":3,\"skipped\":\"non-finite loss\"}\n");
    refused("no loss records");
    EXPECT_FALSE(fs::exists(dir / "metrics.svg"));
}

TEST_F(Plot, OverlaysRunsOnSharedAxes) {
    // fused: 20 steps, loss 5 -> 3.1, 20k tok/s; unfused: 40 steps, loss 8 -> 4, 50k tok/s
    fs::create_directories(dir / "fused");
    fs::create_directories(dir / "unfused");
    std::ofstream(dir / "fused" / "metrics.jsonl") << run_metrics(20, 5.0, 3.1, 20000);
    std::ofstream(dir / "unfused" / "metrics.jsonl") << run_metrics(40, 8.0, 4.0, 50000);
    const std::string out = (dir / "both.svg").string();
    // a trailing slash still names the run after its folder
    EXPECT_EQ(plot_runs({(dir / "fused").string() + "/", (dir / "unfused").string()}, out), out);
    const std::string svg = read(out);
    const auto tags = balanced_tags(svg);
    EXPECT_NE(svg.find(">metrics.jsonl: fused vs unfused</text>"), std::string::npos);

    // two series per panel, one colour per run, validation loss dashed, labels in the legends
    const std::vector<Polyline> lines = polylines(svg);
    ASSERT_EQ(lines.size(), 6u);
    EXPECT_EQ(std::count(tags.begin(), tags.end(), "polyline"), 6);
    std::map<std::string, std::string> color;  // run label -> colour
    for (const Polyline& p : lines) {
        ASSERT_TRUE(p.label == "fused" || p.label == "unfused") << p.label;
        if (!color.count(p.label)) color[p.label] = p.color;
        EXPECT_EQ(p.color, color[p.label]) << p.cls << " of " << p.label;
        EXPECT_EQ(p.dashed, p.cls == "val_loss");
        const size_t n = p.points.size();
        EXPECT_EQ(n, p.cls == "val_loss" ? (p.label == "fused" ? 2u : 4u) : (p.label == "fused" ? 20u : 40u));
    }
    EXPECT_NE(color["fused"], color["unfused"]);
    for (const std::string label : {"fused", "unfused"}) {
        // a legend key in each panel: a line of the run's colour, then its label
        const std::regex key("stroke=\"" + color[label] + "\" stroke-width=\"2\"/>\n<text [^>]*>" + label + "</text>");
        EXPECT_EQ(std::distance(std::sregex_iterator(svg.begin(), svg.end(), key), std::sregex_iterator()), 2) << label;
    }

    // Shared axes: steps 0..40 (fused ends mid-way), loss ticks 3..8, every point inside its panel.
    const auto rects = panel_rects(svg);
    ASSERT_EQ(rects.size(), 2u);
    for (const Polyline& p : lines) {
        const auto& [x0, y0, w, h] = rects[p.cls == "tok_s"];
        for (const auto& [x, y] : p.points)
            EXPECT_TRUE(x >= x0 && x <= x0 + w && y >= y0 && y <= y0 + h) << p.cls << " of " << p.label << " at " << x << "," << y;
        if (p.cls == "loss") {
            EXPECT_NEAR(p.points.back().first, x0 + w * (p.label == "fused" ? 0.5 : 1.0), 0.1);
        }
    }
    for (const char* tick : {">40</text>", ">3</text>", ">8</text>", ">20k</text>", ">50k</text>"})
        EXPECT_NE(svg.find(tick), std::string::npos) << tick;
}

TEST_F(Plot, LabelsNameTheRuns) {
    // Two runs of one config (runs/<config>, the default out_dir) share a folder name: the paths
    // tell them apart.
    const fs::path a = dir / "fused" / "gpt2-tiny", b = dir / "unfused" / "gpt2-tiny";
    for (const fs::path& d : {a, b}) {
        fs::create_directories(d);
        std::ofstream(d / "metrics.jsonl") << run_metrics(10, 5.0, 4.0, 1000);
    }
    const std::string out = (dir / "both.svg").string();
    auto labels_of = [&](const std::string& svg) {
        std::set<std::string> labels;
        for (const Polyline& p : polylines(svg)) labels.insert(p.label);
        return labels;
    };
    EXPECT_EQ(labels_of(read(plot_runs({a.string(), b.string()}, out))), (std::set<std::string>{a.string(), b.string()}));
    EXPECT_EQ(labels_of(read(plot_runs({a.string(), b.string()}, out, {"coda", "un<fused>"}))),
              (std::set<std::string>{"coda", "un&lt;fused&gt;"}));
    // One run keeps its one-run figure; a label only renames it in the title.
    const std::string one = read(plot_runs({a.string()}, out, {"coda"}));
    EXPECT_NE(one.find(">coda: metrics.jsonl</text>"), std::string::npos);
    EXPECT_EQ(labels_of(one), std::set<std::string>{""});
}

TEST_F(Plot, RefusesMissingRunsAndMismatchedLabels) {
    std::ofstream(dir / "metrics.jsonl") << run_metrics(10, 5.0, 4.0, 1000);
    const std::string run = dir.string(), missing = (dir / "nope").string(), out = (dir / "both.svg").string();
    auto refused = [&](const std::vector<std::string>& dirs, const std::string& o, const std::vector<std::string>& labels,
                       const std::string& part) {
        const std::string msg = test::error_of([&] { plot_runs(dirs, o, labels); });
        EXPECT_TRUE(test::mentions(msg, part));
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    };
    refused({run, missing}, out, {}, "no run directory " + missing);
    refused({missing}, "", {}, "no run directory " + missing);
    refused({run, run}, out, {"a"}, "--labels and the run directories differ in number (1 vs 2)");
    refused({run}, out, {"a", "b"}, "differ in number (2 vs 1)");
    refused({run, run}, out, {"a", ""}, "empty label");
    refused({run, run}, "", {}, "several runs needs -o");
    EXPECT_FALSE(fs::exists(out));
    EXPECT_FALSE(fs::exists(dir / "metrics.svg"));
}
