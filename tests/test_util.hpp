// Small helpers shared by the CPU test suites.
#pragma once
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.hpp"

namespace codagpt::test {

// The same floats bit for bit (what "bit-identical" runs and resumes promise).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// x rounded to bf16 (as a float) by the nearer of the two bf16 values around it, ties away from
// zero, in double: an independent route to the rounding of the trainer's bf16 weights
// (master_weights.cuh). Past the largest bf16 value it rounds to infinity as IEEE does.
inline float nearest_bf16_ties_away(float x) {
    uint32_t u, t, up;
    std::memcpy(&u, &x, 4);
    if (std::isnan(x) || std::isinf(x) || (u & 0xffffu) == 0) return x;
    t = u & 0xffff0000u;
    up = t + 0x10000u;
    float below, above;
    std::memcpy(&below, &t, 4);
    std::memcpy(&above, &up, 4);
    const double above_d = std::isinf(above) ? std::copysign(std::ldexp(1.0, 128), x) : above;
    return std::fabs(above_d - x) <= std::fabs((double)x - below) ? above : below;
}

// A file's bytes ("" where it cannot be read).
inline std::string read_bytes(const std::filesystem::path& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The message of the codagpt::Error that f throws; a test failure (and "") when it throws none.
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    ADD_FAILURE() << "no codagpt::Error thrown";
    return "";
}

// EXPECT_TRUE(mentions(msg, "part")) reports both strings when the part is missing.
inline testing::AssertionResult mentions(const std::string& message, const std::string& part) {
    if (message.find(part) != std::string::npos) return testing::AssertionSuccess();
    return testing::AssertionFailure() << "\"" << message << "\" does not mention \"" << part << "\"";
}

// A fresh folder under /tmp, removed with everything in it at the end of the test.
struct TempDir {
    std::filesystem::path path;
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "codagpt_test_XXXXXX").string();
        if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
        path = tmpl;
    }
    ~TempDir() { std::filesystem::remove_all(path); }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string operator/(const std::string& name) const { return (path / name).string(); }
    // Writes text to a file in the folder and returns its path.
    std::string write(const std::string& name, const std::string& text) const {
        std::ofstream(path / name, std::ios::binary) << text;
        return (path / name).string();
    }
};

// Sets an environment variable for the life of the object, then restores its earlier value (or unsets it).
class ScopedEnv {
public:
    ScopedEnv(const char* name, const std::string& value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        setenv(name, value.c_str(), 1);
    }
    ~ScopedEnv() {
        if (old_) setenv(name_, old_->c_str(), 1);
        else unsetenv(name_);
    }
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

private:
    const char* name_;
    std::optional<std::string> old_;
};

}  // namespace codagpt::test
