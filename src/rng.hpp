// A small portable random number generator: the same seed gives the same numbers on every
// compiler and platform (std::normal_distribution and std::shuffle do not promise that), so
// initial weights and data order are reproducible everywhere, and GPU paths can start from
// exactly the weights the CPU reference uses.
#pragma once
#include <cmath>
#include <cstdint>

namespace codagpt {

class Rng {
public:
    explicit Rng(uint64_t seed) {
        // splitmix64 expands the seed into the xoshiro256** state
        for (auto& s : s_) {
            seed += 0x9E3779B97F4A7C15ull;
            uint64_t z = seed;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            s = z ^ (z >> 31);
        }
    }
    uint64_t next_u64() {  // xoshiro256**
        const uint64_t result = rotl(s_[1] * 5, 7) * 9;
        const uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0]; s_[3] ^= s_[1]; s_[1] ^= s_[2]; s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return result;
    }
    // Uniform in [0, 1) with 53 random bits.
    double uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }
    // Uniform integer in [0, n), n > 0, without modulo bias (rejection).
    uint64_t below(uint64_t n) {
        const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
        uint64_t x;
        do { x = next_u64(); } while (x >= limit);
        return x % n;
    }
    // Standard normal (Box-Muller; one value per call, the pair's partner is discarded so
    // the stream position does not depend on call history).
    double normal() {
        double u1 = uniform();
        const double u2 = uniform();
        if (u1 < 1e-300) u1 = 1e-300;
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }

private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    uint64_t s_[4];
};

}  // namespace codagpt
