// libFuzzer entry point for the checkpoint parser (fuzz_targets.hpp); run by scripts/fuzz.sh.
#include "fuzz_targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    return codagpt::fuzz::run_one(codagpt::fuzz::checkpoint, data, size);
}
