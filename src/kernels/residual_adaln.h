// The gated residual of one DiT sub-block fused with the adaLN LayerNorm that
// opens the next one (b = r / tokens, fp32 math):
//   x1[r, :] = x[r, :] + gate[b, :] * y[r, :]                                 (x's type: the residual stream)
//   h[r, :]  = (x1[r, :] - mean_r) * rstd_r * (1 + scale[b, :]) + shift[b, :]  (the next matmul's operand)
// LN statistics are taken over x1 as stored (rounded to x's type), so the
// result is gated_residual followed by adaln_layernorm. Backward, with
// dx1_ext the gradient reaching x1 from elsewhere (null = zero), dh that of h,
// xhat = (x1 - mean) * rstd and g = dh * (1 + scale):
//   dx1 = dx1_ext + rstd * (g - mean_D(g) - xhat * mean_D(g * xhat))
//   dx = dx1,  dy = dx1 * gate[b]
//   dgate[b, :] = sum_t dx1 * y,  dscale[b, :] = sum_t dh * xhat,  dshift[b, :] = sum_t dh
//
// Bytes per row (D = cols; sx = x's element size, sa = y's and h's):
//   forward   reads D*(sx + sa), writes D*(sx + sa) + 8: fp32 x, bf16 y/h is 12D bytes, against
//             16D for gated_residual then adaln_layernorm (x1 is not read back). ~10D FLOPs.
//   backward  reads D*(2 sx + 2 sa) + 8, writes D*(sx + sa): fp32 x, bf16 y/h is 18D bytes,
//             against 30D for the two backwards plus autograd's sum of the two fp32 gradients
//             of x1; ~20D FLOPs; plus 12D bytes of fp32 partials per tile (not per row).
// Memory-bound like its two parents, and shaped like adaln_layernorm:
//   forward   one warp per row (a block per row when D > 1536), x1 held in registers between
//             the mean pass, the variance pass (two-pass, exact) and the write of h; 16-byte
//             vectors when D % 8 == 0 and the pointers allow, scalar otherwise.
//   backward  block (tile, b) takes a run of rows of ONE sample, so every thread owns the same
//             columns on every row and keeps its three column sums in registers (gate and
//             scale are re-read per row from L1, which leaves the registers to the sums); they
//             are stored once to fp32 partials [3][batch][tiles][cols] and a second small
//             kernel adds the tiles in a fixed order. Deterministic, no atomics.
// Everything is shape-determined (grid, scratch size), so it captures in CUDA graphs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

// The widest row either kernel takes (the op checks it up front).
constexpr int kResidualAdaLNMaxCols = 8192;

// Forward. x, y, x1, h [batch * tokens, cols] contiguous; gate, shift, scale
// rows of `cols` elements at b * <name>_stride. mean/rstd [rows] fp32 (either
// may be null). TX: x and x1; TM: gate, shift, scale; TA: y and h; each float,
// __nv_bfloat16 or __half. Outputs must not overlap inputs.
template <typename TX, typename TM, typename TA>
void residual_adaln_forward(const TX* x, const TM* gate, int64_t gate_stride, const TA* y, const TM* shift,
                            int64_t shift_stride, const TM* scale, int64_t scale_stride, TX* x1, TA* h, float* mean,
                            float* rstd, int batch, int tokens, int cols, float eps, cudaStream_t stream);

// How many row tiles per sample the backward uses; the caller allocates
// partials of 3 * batch * tiles * cols floats.
int residual_adaln_backward_tiles(int batch, int tokens, int sm_count);

// Backward. dx1_ext [rows, cols] (TX, null when x1 had no other consumer),
// dh [rows, cols] (TA); x1, y, gate, scale, mean, rstd as in forward. Writes
// dx [rows, cols] (TX), dy [rows, cols] (TA) and dgate, dshift, dscale
// [batch, cols] contiguous (TM). `partials` is fp32 scratch of
// 3 * batch * tiles_per_sample * cols floats, fully written before it is read.
template <typename TX, typename TM, typename TA>
void residual_adaln_backward(const TX* dx1_ext, const TA* dh, const TX* x1, const TA* y, const TM* gate,
                             int64_t gate_stride, const TM* scale, int64_t scale_stride, const float* mean,
                             const float* rstd, TX* dx, TA* dy, TM* dgate, TM* dshift, TM* dscale, float* partials,
                             int batch, int tokens, int cols, int tiles_per_sample, cudaStream_t stream);

}  // namespace perftrain::kernels
