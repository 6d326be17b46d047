// The fp32 master weights stored as two 16-bit halves: the bf16 weight the kernels read (hi) and
// the low 16 bits of the fp32 pattern (lo). Together they are the fp32 weight exactly, so the
// trainer keeps no separate fp32 copy: 2 bytes a parameter less than bf16 weights beside fp32
// masters (3.0 GB on GPT-2 1.5B), with the same AdamW arithmetic in fp32.
//
// The bf16 weight is the master rounded to nearest with ties away from zero: hi = (bits + 0x8000)
// >> 16, i.e. the truncated high half T plus one exactly when lo >= 0x8000. That rule makes the
// pair decodable (T = hi - (lo >= 0x8000), bits = T << 16 | lo) for every finite value, carries
// into the exponent included. Round-to-nearest-even would not be: at a tie (lo = 0x8000) an even hi
// comes both from T = hi rounded down and from T = hi - 1 rounded up. The two roundings differ
// only at ties, one value in 65,536. NaN is kept as a quiet NaN (hi 0x7fc0 with its sign, lo 0).
//
// Host and device code (plain integers: no bf16 type needed), for the optimizer's kernels, the
// weights' upload and download, and CPU tests.
#pragma once
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define MASTER_HD __host__ __device__
#else
#define MASTER_HD
#endif

namespace codagpt {

// The float's bit pattern and back.
MASTER_HD inline uint32_t master_bits(float x) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
#endif
}
MASTER_HD inline float master_float(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, 4);
    return x;
#endif
}

// The bf16 bits of the weight the kernels read.
MASTER_HD inline uint16_t master_hi(float x) {
    const uint32_t u = master_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) & 0x8000u) | 0x7fc0u;  // NaN
    return (uint16_t)((u + 0x8000u) >> 16);
}

// The low half kept beside it.
MASTER_HD inline uint16_t master_lo(float x) {
    const uint32_t u = master_bits(x);
    return (u & 0x7fffffffu) > 0x7f800000u ? 0 : (uint16_t)(u & 0xffffu);
}

// The fp32 master weight from its halves.
MASTER_HD inline float master_join(uint16_t hi, uint16_t lo) {
    return master_float(((uint32_t)(uint16_t)(hi - (lo >= 0x8000u ? 1 : 0)) << 16) | lo);
}

}  // namespace codagpt

#undef MASTER_HD
