// libFuzzer entry point for the weights-file readers, load_weights (fuzz_targets.hpp); run by scripts/fuzz.sh.
#include "fuzz_targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    return codagpt::fuzz::run_one(codagpt::fuzz::weights, data, size);
}
