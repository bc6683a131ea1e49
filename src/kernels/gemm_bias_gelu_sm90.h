// The two products of a DiT MLP that carry GELU, as Hopper (sm_90a)
// kernels of our own:
//   fc1:  pre = A W^T + bias       bf16, GELU's input, kept for the backward
//         act = gelu_tanh(pre)     bf16, from the fp32 value before rounding
//   fc2's input gradient through GELU (A = dy, W = w2^T):
//         dpre = (A W^T) * gelu_tanh'(pre)
// A [M, K] and W [N, K] bf16 row-major (W as nn.Linear keeps it), bias [N]
// (float or bf16), pre, act and dpre [M, N] bf16 row-major.
//
// Why: cuBLASLt runs these with its GELU_AUX_BIAS and DGELU epilogues well
// below the rate of its plain products in the same step. Our fc1 takes about
// 5% less time than GELU_AUX_BIAS at DiT-B/2 b256 on the H200 (as fast as
// cuBLASLt's BIAS product, which writes one output), so gelu_mlp runs it;
// our DGELU is slower than cuBLASLt's tuned DGELU, so the training step does
// not (it stays GPU-tested and benchmarked).
//
// How: one persistent CTA per SM loops over output tiles with 384 threads.
//   - warpgroup 0, one thread: TMA copies of the A and W tiles (64 of K a
//     step, 128-byte swizzle) into a ring of stages, each with a "full" and
//     an "empty" mbarrier;
//   - warpgroups 1 and 2: wgmma from shared memory into fp32 accumulators,
//     releasing a stage once the products that read it are done;
//   - the epilogue through shared memory: each 64 x 64 chunk of an output is
//     written into a 128-byte-swizzled buffer and stored by TMA, while the
//     producer already loads the next tile's first stages.
// fc1 runs "ping-pong": each consumer warpgroup owns whole 128 x 128 tiles
// in turn, so one warpgroup's epilogue (two outputs) overlaps the other's
// products. DGELU runs "cooperative": both warpgroups share a 128 x 256
// tile, and a TMA load brings the tile's pre into the epilogue buffers
// during the main loop.
// Shapes: M % 128 == 0, N % 256 == 0, K % 64 == 0, pointers 16-byte
// aligned (gemm_bias_gelu_sm90_supported). DiT's fc1 fits: M = batch x
// tokens, N = 4D, K = D with D a multiple of 64.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

bool gemm_bias_gelu_sm90_supported(int64_t m, int64_t n, int64_t k);

// TB: float or __nv_bfloat16. Both throw std::invalid_argument for a shape
// that gemm_bias_gelu_sm90_supported refuses, a missing or misaligned
// pointer or a GPU other than sm_90, std::runtime_error for a CUDA error.
template <typename TB>
void gemm_bias_gelu_sm90(const __nv_bfloat16* a, const __nv_bfloat16* w, const TB* bias, __nv_bfloat16* pre,
                         __nv_bfloat16* act, int64_t m, int64_t n, int64_t k, cudaStream_t stream);

// dpre = (a w^T) * gelu_tanh'(pre); the same shapes and refusals.
void gemm_dgelu_sm90(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* pre, __nv_bfloat16* dpre,
                     int64_t m, int64_t n, int64_t k, cudaStream_t stream);

}  // namespace perftrain::kernels
