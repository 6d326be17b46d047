// Token + position embedding (GPT-2's "encoder"), forward and backward. Backward is deterministic:
// no float atomics; every gradient element is summed by one thread in a fixed order.
#pragma once
#include "common.cuh"

namespace codagpt {

// out[b,t,:] = wte[inputs[b,t],:] + wpe[t,:]     (inputs on the device, B*T ints)
void encoder_forward(bf16* out, const int* inputs, const bf16* wte, const bf16* wpe, int B, int T, int C,
                     cudaStream_t stream);

// Per micro-batch bucketing of positions by token id, built on the host from the host copy of the
// inputs (which the trainer has anyway) and uploaded once; lets dwte be summed without atomics.
struct EncoderBuckets;  // defined in encoder.cu: owns its device buffers
EncoderBuckets* encoder_buckets_create(int max_tokens);  // max_tokens = B*T
void encoder_buckets_destroy(EncoderBuckets*);
void encoder_buckets_build(EncoderBuckets*, const int* inputs_host, int B, int T, cudaStream_t stream);

// dwte[token,:] += sum over positions p with inputs[p] == token of dout[p,:];  dwpe[t,:] += sum_b dout[b,t,:]
// (fp32 gradients, accumulated: the trainer zeroes them once per optimizer step)
void encoder_backward(float* dwte, float* dwpe, const bf16* dout, const EncoderBuckets* buckets, int B, int T,
                      int C, cudaStream_t stream);

}  // namespace codagpt
