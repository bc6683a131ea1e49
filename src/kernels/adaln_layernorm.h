// LayerNorm (no affine) followed by adaLN modulation, the first thing each
// half of a DiT block does:
//   y[r, :] = (x[r, :] - mean_r) * rstd_r * (1 + scale[b, :]) + shift[b, :],   b = r / tokens
// over rows r of x [rows = batch * tokens, cols], statistics in fp32, and its
// backward (xhat = (x - mean) * rstd, g = dy * (1 + scale)):
//   dx = rstd * (g - mean_D(g) - xhat * mean_D(g * xhat))
//   dscale[b, :] = sum_t dy * xhat,  dshift[b, :] = sum_t dy
//
// Bytes and FLOPs per row (D = cols; sx, sy = element sizes of x and y):
//   forward   reads D*sx, writes D*sy + 8 (mean, rstd): fp32 x -> bf16 y is 6D bytes
//             (6.9 KB at D = 1152), ~8D FLOPs. shift/scale (2D per sample) are
//             read by every row of the sample but stay in L1/L2.
//   backward  reads D*sx + D*sy + 8, writes D*sx: fp32 x, bf16 dy is 10D bytes,
//             ~14D FLOPs; plus 8D bytes of fp32 partials per tile (not per row).
// Both are memory-bound by two orders of magnitude, so the shape is chosen to
// move each byte once:
//   forward   one warp per row (a block per row when D > 1536), the row held in
//             registers between the mean pass, the variance pass (two-pass,
//             exact) and the write; 16-byte vector loads/stores when D % 8 == 0
//             and the pointers allow, scalar otherwise.
//   backward  block (tile, b) takes a run of rows of ONE sample, so (1 + scale[b])
//             sits in registers and every thread owns the same columns on every
//             row: it writes dx rows and keeps per-column sums of dy*xhat and dy
//             in registers, then stores them once to fp32 partials
//             [2][batch][tiles][cols]; a second small kernel sums the tiles in a
//             fixed order into dscale/dshift. Deterministic, no atomics.
// Both row kernels are kernels/row_norm.cuh's templates (Norm::kLayer, no residual),
// shared with residual_adaln, rms_adaln and residual_rms_adaln.
// Everything is shape-determined (grid, scratch size), so it captures in CUDA graphs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/fp8_cast.h"

namespace perftrain::kernels {

// The widest row either kernel takes (the op checks it up front).
constexpr int kAdaLNMaxCols = 8192;

// Forward. x [rows, cols] contiguous; shift/scale rows of `cols` elements at
// b * shift_stride / b * scale_stride; y [rows, cols]. mean/rstd [rows] fp32
// (either may be null, e.g. for inference). fp8 (kernels/fp8_cast.h): y's
// E4M3 codes and their amax in the same pass (+D bytes a row, one atomic a
// warp at most); y may then be null (D * sy bytes a row fewer: fp32 x -> fp8
// codes is 5D bytes against 6D + the cast's 3D). TX, TM, TY: float, __nv_bfloat16
// or __half.
template <typename TX, typename TM, typename TY>
void adaln_layernorm_forward(const TX* x, const TM* shift, int64_t shift_stride, const TM* scale,
                             int64_t scale_stride, TY* y, float* mean, float* rstd, int batch, int tokens,
                             int cols, float eps, cudaStream_t stream, const Fp8RowOut& fp8 = {});

// How many row tiles per sample the backward uses: sized so that the grid
// has several blocks per SM. The caller allocates partials of
// 2 * batch * tiles * cols floats.
int adaln_layernorm_backward_tiles(int batch, int tokens, int sm_count);

// Backward. dy [rows, cols] (TY), x as in forward, mean/rstd from forward;
// writes dx [rows, cols] (TX) and dshift, dscale [batch, cols] contiguous (TM).
// `partials` is fp32 scratch of 2 * batch * tiles_per_sample * cols floats; it
// is fully written before it is read.
template <typename TX, typename TM, typename TY>
void adaln_layernorm_backward(const TY* dy, const TX* x, const TM* scale, int64_t scale_stride,
                              const float* mean, const float* rstd, TX* dx, TM* dshift, TM* dscale,
                              float* partials, int batch, int tokens, int cols, int tiles_per_sample,
                              cudaStream_t stream);

}  // namespace perftrain::kernels
