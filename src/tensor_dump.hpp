// CODAGPT_DUMP=DIR:L[,L...] - a debugging aid for finding where two paths part: the CPU reference,
// the unfused and the fused GPU model write, for each listed layer, the activations and gradients
// that every path has in the same layout (the layer's input x, qkv, the attention output y; in
// backward the gradients of the layer's output, of y and of qkv) as raw little-endian fp32,
// DIR/<name>_<layer>.f32, row-major [tokens, width]. A file that exists is not written again, so a
// run leaves its first forward's and backward's values (the first forward is an evaluation's where
// the run starts with one). scripts/compare_dumps.py compares the directories row by row.
#pragma once
#include <cstddef>

namespace codagpt {

// Whether CODAGPT_DUMP is set; throws Error (one line) where it is malformed or names no
// directory. The trainer calls it before it loads anything.
bool check_dump_env();
// Whether CODAGPT_DUMP lists this layer.
bool dump_layer(int layer);
// Writes n floats as DIR/<name>_<layer>.f32 (whole or not at all) unless the file exists.
void dump_tensor(const char* name, int layer, const float* data, size_t n);

}  // namespace codagpt
