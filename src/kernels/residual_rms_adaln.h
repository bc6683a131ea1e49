// The single-stream DiT's sandwich post-norm + tanh-gated residual + the next
// branch's pre-norm, one pass over the rows (b = r / tokens, fp32 math,
// rms(v) = v * rsqrt(mean_D(v^2) + eps)):
//   yhat = y * ry,   ry = rsqrt(mean_D(y^2) + eps)
//   x1[r, :] = x[r, :] + tanh(gate[b, :]) * yhat * pw         (x's type: the residual stream)
//   h[r, :]  = x1[r, :] * r1 * qw * (1 + scale[b, :])         (the next product's operand)
// with pw, qw the post- and pre-norm weights and r1 = rsqrt(mean_D(x1^2) + eps)
// taken over x1 as stored (rounded to x's type). Backward, with dx1_ext the
// gradient reaching x1 from elsewhere (null = zero), dh that of h (null = h
// unused), tg = tanh(gate), x1hat = x1 * r1, g1 = dh * qw * (1 + scale),
// g2 = dx1 * tg * pw:
//   dx1 = dx1_ext + r1 * (g1 - x1hat * mean_D(g1 * x1hat)),   dx = dx1
//   dy  = ry * (g2 - yhat * mean_D(g2 * yhat))
//   Q1[b, :] = sum_t dh * x1hat,  Q2[b, :] = sum_t dx1 * yhat   (two per-sample column sums)
//   dscale = qw * Q1,  dgate = (1 - tg^2) * pw * Q2,
//   dpre_weight_per_sample = (1 + scale) * Q1,  dpost_weight_per_sample = tg * Q2   (fp32)
//
// Bytes per row (D = cols; sx = x's element size, sa = y's and h's):
//   forward   reads D*(sx + sa), writes D*(sx + 2 sa) + 8 (x1, h, the kept xhat, two rstd):
//             fp32 x, bf16 y/h is 14D bytes against ~22D for rms_norm, the gated residual and
//             rms_adaln as three kernels. ~14D FLOPs.
//   backward  reads D*(sx + 3 sa) + 8 (dx1_ext, dh, xhat, y), writes D*(sx + sa): fp32 x, bf16
//             rest is 16D bytes; ~24D FLOPs; plus 8D bytes of fp32 partials per tile.
// Memory-bound, shaped like residual_adaln:
//   forward   one warp per row (4 rows a block) while a warp covers the row, a block per row
//             beyond. y's sum of squares first, then x1 is formed in the same registers,
//             written, and its sum of squares taken; 16-byte vectors when D % 8 == 0 and the
//             pointers allow, scalar otherwise.
//   backward  block (tile, b) takes a run of rows of ONE sample: per row, phase 1 (x1's norm:
//             dh, xhat, scale -> the row sum of g1 * x1hat), phase 2 (dx1, then y's norm: the row
//             sum of g2 * yhat), phase 3 (dy). The two column sums stay in registers across
//             rows and are stored once to fp32 partials [2][batch][tiles][cols]; a second small
//             kernel adds the tiles in a fixed order. Deterministic, no atomics.
// Both row kernels are kernels/row_norm.cuh's templates (Norm::kRms with the residual), shared
// with rms_adaln, adaln_layernorm and residual_adaln.
// Everything is shape-determined (grid, scratch size), so it captures in CUDA graphs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/fp8_cast.h"

namespace perftrain::kernels {

// The widest row either kernel takes (the op checks it up front).
constexpr int kResidualRmsAdaLNMaxCols = 8192;

// Forward. x, y, x1, h [batch * tokens, cols] contiguous; gate, scale rows of
// `cols` elements at b * <name>_stride (scale null = zero); post_weight,
// pre_weight [cols] fp32 (null = ones). y_rstd, rstd [rows] fp32 (the norms of
// y and x1; either may be null). xhat [rows, cols] (null = none): x1 * rstd
// rounded to TA, for a backward that keeps it instead of x1. TX: x and x1; TM:
// gate, scale; TA: y, h and xhat; each float, __nv_bfloat16 or __half.
// Outputs must not overlap inputs. fp8 (kernels/fp8_cast.h): h's E4M3 codes
// and their amax in the same pass (+D bytes a row, one atomic a warp at most);
// h may then be null (D * sa bytes a row fewer).
template <typename TX, typename TM, typename TA>
void residual_rms_adaln_forward(const TX* x, const TM* gate, int64_t gate_stride, const TA* y,
                                const float* post_weight, const float* pre_weight, const TM* scale,
                                int64_t scale_stride, TX* x1, TA* h, float* y_rstd, float* rstd, TA* xhat,
                                int batch, int tokens, int cols, float eps, cudaStream_t stream,
                                const Fp8RowOut& fp8 = {});

// How many row tiles per sample the backward uses.
int residual_rms_adaln_backward_tiles(int batch, int tokens, int cols, int sm_count);

// Floats of fp32 scratch the backward needs: two planes of batch * tiles * cols.
inline int64_t residual_rms_adaln_backward_partials(int batch, int tiles_per_sample, int cols) {
  return 2 * int64_t(batch) * tiles_per_sample * cols;
}

// Backward. dx1_ext [rows, cols] (TX, null = zero), dh [rows, cols] (TA, null
// = h unused: then dscale and dpre_weight_per_sample must be null); y,
// post_weight, pre_weight, gate, scale, y_rstd, rstd as in forward; either
// xhat as the forward wrote it (TA 16-bit only; x1 is then not read and may be
// null) or x1. Writes dx [rows, cols] (TX), dy [rows, cols] (TA), dgate
// [batch, cols] contiguous (TM) and, where not null, dscale [batch, cols]
// contiguous (TM; needs scale) and the per-sample fp32 column sums of the two
// weights' gradients [batch, cols] contiguous (the caller sums them over the
// batch). `partials` is fp32 scratch of
// residual_rms_adaln_backward_partials(batch, tiles_per_sample, cols) floats,
// fully written before it is read.
template <typename TX, typename TM, typename TA>
void residual_rms_adaln_backward(const TX* dx1_ext, const TA* dh, const TX* x1, const TA* xhat, const TA* y,
                                 const float* post_weight, const float* pre_weight, const TM* gate,
                                 int64_t gate_stride, const TM* scale, int64_t scale_stride, const float* y_rstd,
                                 const float* rstd, TX* dx, TA* dy, TM* dgate, TM* dscale,
                                 float* dpost_weight_per_sample, float* dpre_weight_per_sample, float* partials,
                                 int batch, int tokens, int cols, int tiles_per_sample, cudaStream_t stream);

}  // namespace perftrain::kernels
