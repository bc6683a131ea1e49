// RMSNorm with a per-column weight, followed by the adaLN scale (no shift):
// the pre-norm of each branch of a single-stream DiT block,
//   h[r, :] = x[r, :] * rstd_r * w * (1 + scale[b, :]),  rstd_r = rsqrt(mean_D(x[r, :]^2) + eps),  b = r / tokens
// statistics in fp32, and its backward (xhat = x * rstd, g = dh * w * (1 + scale)):
//   dx = rstd * (g - xhat * mean_D(g * xhat))
//   Q[b, :] = sum_t dh * xhat                  (one per-sample column sum)
//   dscale[b, :] = w * Q[b, :],  dweight_per_sample[b, :] = (1 + scale[b, :]) * Q[b, :]   (fp32)
// so one plane of column sums serves both the scale's and the weight's
// gradient; the caller sums dweight_per_sample over the batch.
//
// Bytes and FLOPs per row (D = cols; sx, sy = element sizes of x and h):
//   forward   reads D*sx, writes D*sy + 4 (rstd) (+ D*sy with the kept xhat): fp32 x -> bf16 h
//             is 6D bytes (8D with xhat), ~6D FLOPs. weight and scale are re-read per row from L1/L2.
//   backward  reads D*sy (dh) + D*sx or D*sy (x or xhat) + 4, writes D*sx: fp32 x, bf16 dh, bf16 xhat
//             is 8D bytes, ~10D FLOPs; plus 4D bytes of fp32 partials per tile (not per row).
// Memory-bound, shaped like adaln_layernorm:
//   forward   one warp per row (4 rows a block) while a warp covers the row, a block per row
//             beyond; the row held in registers between the sum of squares and the write;
//             16-byte vectors when D % 8 == 0 and the pointers allow, scalar otherwise.
//   backward  block (tile, b) takes a run of rows of ONE sample, so every thread owns the same
//             columns on every row and keeps its column sum in registers; stored once to fp32
//             partials [batch][tiles][cols]; a second small kernel adds the tiles in a fixed
//             order and forms dscale and dweight_per_sample. Deterministic, no atomics.
// Both row kernels are kernels/row_norm.cuh's templates (Norm::kRms, no residual), shared with
// residual_rms_adaln, adaln_layernorm and residual_adaln. Everything is shape-determined (grid,
// scratch size), so it captures in CUDA graphs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/fp8_cast.h"

namespace perftrain::kernels {

// The widest row either kernel takes (the op checks it up front).
constexpr int kRmsAdaLNMaxCols = 8192;

// Forward. x, h [batch * tokens, cols] contiguous; weight [cols] fp32 (null =
// ones); scale rows of `cols` elements at b * scale_stride (null = zero).
// rstd [rows] fp32 (may be null). xhat [rows, cols] (null = none): the
// normalised rows x * rstd rounded to TY, for a backward that keeps them
// instead of x. TX: x; TM: scale; TY: h and xhat; each float, __nv_bfloat16
// or __half. Outputs must not overlap inputs. fp8 (kernels/fp8_cast.h): h's
// E4M3 codes and their amax in the same pass (+D bytes a row, one atomic a
// warp at most); h may then be null (D * sy bytes a row fewer).
template <typename TX, typename TM, typename TY>
void rms_adaln_forward(const TX* x, const float* weight, const TM* scale, int64_t scale_stride, TY* h, float* rstd,
                       TY* xhat, int batch, int tokens, int cols, float eps, cudaStream_t stream,
                       const Fp8RowOut& fp8 = {});

// How many row tiles per sample the backward uses.
int rms_adaln_backward_tiles(int batch, int tokens, int cols, int sm_count);

// Floats of fp32 scratch the backward needs: one plane of batch * tiles * cols.
inline int64_t rms_adaln_backward_partials(int batch, int tiles_per_sample, int cols) {
  return int64_t(batch) * tiles_per_sample * cols;
}

// Backward. dh [rows, cols] (TY); either xhat as the forward wrote it (TY
// 16-bit only; x is then not read and may be null) or x; weight, scale,
// scale_stride, rstd as in forward. Writes dx [rows, cols] (TX); dscale
// [batch, cols] contiguous (TM) when not null (needs scale); the per-sample
// fp32 column sums of the weight's gradient to dweight_per_sample [batch,
// cols] contiguous when not null (the caller sums it over the batch).
// `partials` is fp32 scratch of rms_adaln_backward_partials(batch,
// tiles_per_sample, cols) floats, fully written before it is read.
template <typename TX, typename TM, typename TY>
void rms_adaln_backward(const TY* dh, const TX* x, const TY* xhat, const float* weight, const TM* scale,
                        int64_t scale_stride, const float* rstd, TX* dx, TM* dscale, float* dweight_per_sample,
                        float* partials, int batch, int tokens, int cols, int tiles_per_sample, cudaStream_t stream);

}  // namespace perftrain::kernels
