// Small helpers shared by the CPU test suites.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "common.hpp"

namespace codagpt::test {

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

}  // namespace codagpt::test
