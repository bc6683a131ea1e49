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
// GELU runs on the same kernel (gemm_dgelu_sm90, below) where that timed
// fastest.
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
//
// The same kernel (its main loop and pipeline; the epilogue a template
// parameter) also runs the single-stream FFN's gate-up product with SwiGLU
// in its epilogue, gemm_swiglu_sm90:
//   gate_up = A W_gu^T        [M, 2F] bf16, W_gu = [gate.weight; up.weight]
//                             [2F, K]; kept for SwiGLU's backward
//   h = silu(gate) * up       [M, F] bf16, silu(g) = g / (1 + exp(-g)),
//                             gate = gate_up[:, :F], up = gate_up[:, F:]
// A tile is 128 rows x 128 product columns: its B tile is W_gu's gate rows
// [n0, n0 + 64) and up rows [F + n0, F + n0 + 64) (two TMA boxes a k-step,
// laid out as one 128-row box), so each thread's accumulators hold gate
// column c and up column c of the same rows (wgmma's f32 layout: columns
// 0-63 and 64-127 of the tile). The epilogue writes both 64-column pieces
// of gate_up and the 64 columns of h. h comes from the fp32 accumulators
// before rounding, where ops::swiglu computes it from the bf16-rounded
// gate_up: the two differ by up to about one bf16 step of h (h is rounded
// once here; there, gate and up are rounded first). gate_up is the fp32
// product rounded once, as cuBLASLt's (the bits may differ by the order of
// accumulation).
// Bytes: reads A and W_gu as the plain product does, writes 3F bf16 a row
// (gate_up and h), where product + ops::swiglu writes 2F, reads 2F back and
// writes F: 4F bf16 a row and one launch less. Why: ~4 ms a step at SS-B/2
// b256 (docs/PERFORMANCE.md). No bias (the single-stream linears have
// none): the function takes none. Shapes: M % 128 == 0, F % 64 == 0,
// K % 64 == 0, pointers 16-byte aligned (gemm_swiglu_sm90_supported).
// Launch as fc1's: one CTA of 384 threads per SM over (M / 128) x (2F / 128)
// tiles.
// The same main loop with B MN-major (W [K, N] row-major, read as the
// transposed operand: TMA boxes of 64 rows of K x 64 columns of N, the two
// 64-column atoms of a 128-column tile 8 KB apart) runs fc2's backward
// product through GELU, gemm_dgelu_sm90:
//   dpre = (dY W2) * gelu_tanh'(pre)   bf16 [M, N], fc1's output gradient
//   partials[i, :] = column sums of dpre (as stored) over rows
//                    [128 i, 128 i + 128)   fp32 [M / 128, N], for fc1's
//                    bias gradient (kernels/column_sums.h's
//                    column_sums_reduce adds the rows in a fixed order)
// dY [M, K] (fc2's output gradient), W2 [K, N] (fc2.weight as nn.Linear
// keeps it: [out, in] with K = D, N = 4D), pre [M, N] (fc1's pre-
// activation), all bf16 row-major. gelu_tanh' is kernels/gelu_tanh.cuh's,
// on the fp32 product before it is rounded once (the split form rounds
// dY W2 to bf16 first, then multiplies).
// Why: the split form (plain product, then GELU's backward pass) writes
// dY W2, reads it back with pre and writes dpre: 6 bytes an element more
// than this kernel's read of pre and write of dpre; cuBLASLt's DGELU
// epilogue gives no fp32 bias gradient with a bf16 output, so fc1's bias
// gradient costs one more read of dpre there. The tile's pre comes by TMA
// into the consumer warpgroup's four epilogue buffers while its products
// run (each 64 x 64 box where that block of dpre will be staged: a thread
// reads its pre pair and writes its dpre pair at the same address); the
// column sums go over shuffles within a warp and a 1 KB hand-over between
// the warpgroup's warps. Shapes as fc1's.
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

bool gemm_dgelu_sm90_supported(int64_t m, int64_t n, int64_t k);

// dy [m, k], w2 [k, n], pre and dpre [m, n], bf16 row-major; partials
// [m / 128, n] fp32 or null (no column sums). Throws as gemm_bias_gelu_sm90.
void gemm_dgelu_sm90(const __nv_bfloat16* dy, const __nv_bfloat16* w2, const __nv_bfloat16* pre, __nv_bfloat16* dpre,
                     float* partials, int64_t m, int64_t n, int64_t k, cudaStream_t stream);

bool gemm_swiglu_sm90_supported(int64_t m, int64_t f, int64_t k);

// a [m, k], w_gu [2f, k] (gate rows then up rows), gate_up [m, 2f], h [m, f],
// all bf16 row-major. Throws as gemm_bias_gelu_sm90 does.
void gemm_swiglu_sm90(const __nv_bfloat16* a, const __nv_bfloat16* w_gu, __nv_bfloat16* gate_up, __nv_bfloat16* h,
                      int64_t m, int64_t f, int64_t k, cudaStream_t stream);

}  // namespace perftrain::kernels
