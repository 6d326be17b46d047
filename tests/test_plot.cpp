// `codagpt plot`: metrics.jsonl to a two-panel SVG, and clear refusals of missing, empty and
// garbled metrics files.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
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

// Number of points of the polyline of class `name`, or -1 when there is none.
int polyline_points(const std::string& svg, const std::string& name) {
    std::smatch m;
    if (!std::regex_search(svg, m, std::regex("<polyline class=\"" + name + "\"[^>]* points=\"([^\"]*)\"")))
        return -1;
    const std::string pts = m[1];
    int n = 0;
    const std::regex point("-?[0-9.]+,-?[0-9.]+");
    for (std::sregex_iterator it(pts.begin(), pts.end(), point), e; it != e; ++it) n++;
    return n;
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
        text += "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(10.0 - step * 0.15) +
                ",\"lr\":0.001,\"grad_norm\":1.5,\"ms\":12.5,\"tok_s\":" + std::to_string(20000 + 100 * step) + "}\n";
    }
    text += "{\"step\":40,\"val_loss\":5.1}\n";
    write_metrics(text);
    const std::string out = plot_run(dir.string(), (dir / "p.svg").string());
    EXPECT_EQ(out, (dir / "p.svg").string());
    const std::string svg = read(out);
    ASSERT_FALSE(svg.empty());
    EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
    const auto tags = balanced_tags(svg);
    EXPECT_EQ(tags.front(), "svg");
    EXPECT_EQ(polyline_points(svg, "loss"), 39);      // 40 steps, one skipped
    EXPECT_EQ(polyline_points(svg, "val_loss"), 5);   // steps 0, 10, 20, 30, 40
    EXPECT_EQ(polyline_points(svg, "tok_s"), 39);
    EXPECT_EQ(std::count(tags.begin(), tags.end(), "polyline"), 3);
    // two panels, axis labels, tick labels, legends
    EXPECT_EQ(std::count(tags.begin(), tags.end(), "g"), 2);
    EXPECT_NE(svg.find(">step</text>"), std::string::npos);
    EXPECT_NE(svg.find(">tokens/s</text>"), std::string::npos);
    EXPECT_NE(svg.find(">val_loss</text>"), std::string::npos);
    EXPECT_NE(svg.find(">24k</text>"), std::string::npos);  // a throughput tick
    // Default output: RUN_DIR/metrics.svg
    EXPECT_EQ(plot_run(dir.string()), (dir / "metrics.svg").string());
    EXPECT_TRUE(fs::exists(dir / "metrics.svg"));
}

TEST_F(Plot, OnePointAndNoValidationStillDraw) {
    write_metrics("{\"step\":1,\"loss\":3.5,\"tok_s\":100}\n");
    const std::string svg = read(plot_run(dir.string()));
    balanced_tags(svg);
    EXPECT_EQ(polyline_points(svg, "loss"), 1);
    EXPECT_EQ(polyline_points(svg, "val_loss"), -1);
}

TEST_F(Plot, RefusesMissingEmptyAndGarbledMetrics) {
    auto refused = [&](const std::string& part) {
        const std::string msg = test::error_of([&] { plot_run(dir.string()); });
        EXPECT_TRUE(test::mentions(msg, part));
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    };
    refused("cannot read metrics file");
    write_metrics("");
    refused("is empty");
    write_metrics("{\"step\":1,\"loss\":3.5}\n{\"step\":2,\"lo");
    refused("metrics.jsonl:2: not a metrics record");
    write_metrics("[1,2]\n");
    refused("metrics.jsonl:1: not a metrics record");
    write_metrics("{\"step\":\"one\",\"loss\":1}\n");
    refused("metrics.jsonl:1");
    write_metrics("{\"step\":3,\"skipped\":\"non-finite loss\"}\n");
    refused("no loss records");
    EXPECT_FALSE(fs::exists(dir / "metrics.svg"));
}
