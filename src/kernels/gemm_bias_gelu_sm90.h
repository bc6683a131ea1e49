// fc1 of a DiT MLP, the product that carries GELU, as a Hopper (sm_90a)
// kernel of our own:
//   pre = A W^T + bias       bf16, GELU's input, kept for the backward
//   act = gelu_tanh(pre)     bf16, from the fp32 value before rounding
// A [M, K] and W [N, K] bf16 row-major (W as nn.Linear keeps it), bias [N]
// (float or bf16), pre and act [M, N] bf16 row-major.
//
// Why: cuBLASLt's GELU_AUX_BIAS epilogue runs well below the rate of its
// plain products; this kernel takes about 5% less time than it at DiT-B/2
// b256 on the H200, so gelu_mlp runs it. The backward's product through
// GELU stays with cuBLASLt's DGELU epilogue.
//
// How: one persistent CTA per SM loops over 128 x 128 output tiles with 384
// threads.
//   - warpgroup 0, one thread: TMA copies of the A and W tiles (64 of K a
//     step, 128-byte swizzle) into a ring of stages, each with a "full" and
//     an "empty" mbarrier;
//   - warpgroups 1 and 2, "ping-pong": each owns whole tiles in turn, wgmma
//     from shared memory into fp32 accumulators, releasing a stage once the
//     products that read it are done, so one warpgroup's epilogue (two
//     outputs) overlaps the other's products;
//   - the epilogue through shared memory: each 64 x 64 chunk of an output is
//     written into a 128-byte-swizzled buffer and stored by TMA, while the
//     producer already loads the next tile's first stages.
// Shapes: M % 128 == 0, N % 256 == 0, K % 64 == 0, pointers 16-byte
// aligned (gemm_bias_gelu_sm90_supported). DiT's fc1 fits: M = batch x
// tokens, N = 4D, K = D with D a multiple of 64.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

bool gemm_bias_gelu_sm90_supported(int64_t m, int64_t n, int64_t k);

// TB: float or __nv_bfloat16. Throws std::invalid_argument for a shape that
// gemm_bias_gelu_sm90_supported refuses, a missing or misaligned pointer or
// a GPU other than sm_90, std::runtime_error for a CUDA error.
template <typename TB>
void gemm_bias_gelu_sm90(const __nv_bfloat16* a, const __nv_bfloat16* w, const TB* bias, __nv_bfloat16* pre,
                         __nv_bfloat16* act, int64_t m, int64_t n, int64_t k, cudaStream_t stream);

}  // namespace perftrain::kernels
