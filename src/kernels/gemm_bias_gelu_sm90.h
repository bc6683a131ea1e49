// The two products of a DiT MLP that carry GELU, in one Hopper (sm_90a)
// kernel of our own with two epilogues:
//   fc1:  pre = A W^T + bias       bf16, GELU's input, kept for the backward
//         act = gelu_tanh(pre)     bf16, from the fp32 value before rounding
//   fc2's input gradient through GELU (A = dy, W = w2^T):
//         dpre = (A W^T) * gelu_tanh'(pre)
// A [M, K] and W [N, K] bf16 row-major (W as nn.Linear keeps it), bias [N]
// (float or bf16), pre, act and dpre [M, N] bf16 row-major.
//
// Why: on the H200, cuBLASLt runs these with its GELU_AUX_BIAS and DGELU
// epilogues at 481 and 524 TFLOP/s (DiT-B/2 b256; 520 and 614 at XL/2),
// where its plain products in the same step run at ~700 (~640 at XL/2):
// 5.5% of a B/2 step (docs/PERFORMANCE.md, tenth pass).
//
// How, DGELU and fc1 with PERFTRAIN_FC1_SCHEDULE=cooperative (one persistent
// CTA per SM looping over 128 x 256 output tiles, 384 threads):
//   - warpgroup 0, one thread: TMA copies of the A and W tiles (64 of K a
//     step, 128-byte swizzle) into a ring of stages (4 for fc1, 3 for
//     DGELU), each with a "full" and an "empty" mbarrier;
//   - warpgroups 1 and 2: 64 rows each, wgmma m64n256k16 from shared memory
//     into 128 fp32 accumulators a thread, releasing a stage once the
//     products that read it are done (one group of products kept in flight);
//   - the epilogue through shared memory: each 64 x 64 chunk of an output is
//     written into a 128-byte-swizzled buffer and stored by TMA, while the
//     producer already loads the next tile's first stages. fc1 alternates two
//     buffers; DGELU has four, which a TMA load fills with the tile's pre
//     during the mainloop, and writes dpre over pre in place.
// fc1 by default runs "ping-pong": the same producer and ring, but each
// consumer warpgroup owns whole 128 x 128 tiles (wgmma m64n128k16 twice a
// step, two sets of 64 accumulators), the CTA's even tiles on one and odd
// on the other, so one warpgroup's epilogue (four buffers) overlaps the
// other's products; an mbarrier hand-off keeps their main loops in turn.
// Measured (H200, 2026-12-01, docs/PERFORMANCE.md): fc1 at DiT-B/2 b256
// (65536 x 3072 x 768) 0.53-0.57 ms cooperative against cuBLASLt
// GELU_AUX_BIAS's 0.58 (as fast as its BIAS product, which writes one
// output), at XL/2 1.20-1.24 against 1.29; ping-pong gives the same bits,
// ~1.5% faster than cooperative at S/2 and B/2, ~0.5% slower at XL/2
// (twelve pairs); DGELU 0.61 against cuBLASLt's 0.51 (tuned) at B/2, so
// the training path takes only fc1.
// Shapes: M % 128 == 0, N % 256 == 0, K % 64 == 0, pointers 16-byte
// aligned (gemm_bias_gelu_sm90_supported). DiT's fc1 fits: M = batch x
// tokens, N = 4D, K = D with D a multiple of 64.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

bool gemm_bias_gelu_sm90_supported(int64_t m, int64_t n, int64_t k);

// fc1's schedule from PERFTRAIN_FC1_SCHEDULE, read once: ping-pong (true)
// unless it says cooperative; std::invalid_argument for another value.
bool fc1_pingpong_schedule();

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
