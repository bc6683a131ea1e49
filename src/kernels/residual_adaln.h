// The gated residual of one DiT sub-block fused with the adaLN LayerNorm that
// opens the next one (b = r / tokens, fp32 math):
//   x1[r, :] = x[r, :] + gate[b, :] * (y[r, :] + bias)                        (x's type: the residual stream)
//   h[r, :]  = (x1[r, :] - mean_r) * rstd_r * (1 + scale[b, :]) + shift[b, :]  (the next matmul's operand)
// LN statistics are taken over x1 as stored (rounded to x's type), so the
// result is gated_residual followed by adaln_layernorm. Backward, with
// dx1_ext the gradient reaching x1 from elsewhere (null = zero), dh that of h,
// xhat = (x1 - mean) * rstd and g = dh * (1 + scale):
//   dx1 = dx1_ext + rstd * (g - mean_D(g) - xhat * mean_D(g * xhat))
//   dx = dx1,  dy = dx1 * gate[b]
//   dgate[b, :] = sum_t dx1 * (y + bias),  dscale[b, :] = sum_t dh * xhat,  dshift[b, :] = sum_t dh
//   dbias_per_sample[b, :] = sum_t dy = gate[b, :] * sum_t dx1                (fp32)
// bias [cols] fp32 (null = none) is the bias of the linear layer that produced
// y, folded in here so that its gradient comes from the column sums this
// backward takes anyway instead of a separate reduction over dy.
//
// Bytes per row (D = cols; sx = x's element size, sa = y's and h's):
//   forward   reads D*(sx + sa), writes D*(sx + sa) + 8: fp32 x, bf16 y/h is 12D bytes, against
//             16D for gated_residual then adaln_layernorm (x1 is not read back). ~10D FLOPs.
//   backward  reads D*(2 sx + 2 sa) + 8, writes D*(sx + sa): fp32 x, bf16 y/h is 18D bytes,
//             against 30D for the two backwards plus autograd's sum of the two fp32 gradients
//             of x1; ~20D FLOPs; plus 12D bytes of fp32 partials per tile (16D with a bias; not per row).
// Memory-bound like its two parents, and shaped like adaln_layernorm:
//   forward   one warp per row (a block per row when D > 1536), x1 held in registers between
//             the mean pass, the variance pass (two-pass, exact) and the write of h; 16-byte
//             vectors when D % 8 == 0 and the pointers allow, scalar otherwise.
//   backward  block (tile, b) takes a run of rows of ONE sample, so every thread owns the same
//             columns on every row and keeps its three column sums in registers (gate and
//             scale are re-read per row from L1, which leaves the registers to the sums); they
//             are stored once to fp32 partials [3][batch][tiles][cols] and a second small
//             kernel adds the tiles in a fixed order. Deterministic, no atomics. With a bias
//             a fourth sum, of dx1, takes a fourth plane, and the reduce kernel finishes
//             dgate = sum dx1*y + bias * sum dx1 and dbias_per_sample = gate * sum dx1, so the
//             row loop never reads the bias; rows up to 4096 wide then take one 8-element
//             vector per thread instead of two (more threads per row), which keeps the four
//             sums in registers without spilling, and load each row's inputs one row ahead,
//             so that they are in flight during the row before's block reduction. The tiles
//             per sample are chosen by waves of the blocks an SM holds at that block size
//             (detail::wave_row_tiles).
// With and without a bias are separate instantiations of both row kernels, so the path without
// one carries no bias load, no fourth sum and no registers for them.
// Both row kernels are kernels/row_norm.cuh's templates (Norm::kLayer with the residual), shared
// with adaln_layernorm, rms_adaln and residual_rms_adaln.
// Everything is shape-determined (grid, scratch size), so it captures in CUDA graphs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/fp8_cast.h"

namespace perftrain::kernels {

// The widest row either kernel takes (the op checks it up front).
constexpr int kResidualAdaLNMaxCols = 8192;

// Forward. x, y, x1, h [batch * tokens, cols] contiguous; gate, shift, scale
// rows of `cols` elements at b * <name>_stride; bias [cols] fp32 or null.
// mean/rstd [rows] fp32 (either may be null). xhat [rows, cols] (null =
// none): the normalised rows (x1 - mean) * rstd rounded to TA, for a backward
// that keeps them instead of x1 (a bf16 xhat is half an fp32 x1's memory; the
// forward writes 2 bytes more per element, the backward reads 2 fewer).
// TX: x and x1; TM: gate, shift, scale; TA: y, h and xhat; each float,
// __nv_bfloat16 or __half. Outputs must not overlap inputs. fp8
// (kernels/fp8_cast.h): h's E4M3 codes and their amax in the same pass (+D
// bytes a row, one atomic a warp at most); h may then be null (D * sa bytes a
// row fewer: fp32 x, bf16 y -> fp8 codes is 11D bytes against 12D + the cast's 3D).
template <typename TX, typename TM, typename TA>
void residual_adaln_forward(const TX* x, const TM* gate, int64_t gate_stride, const TA* y, const float* bias,
                            const TM* shift, int64_t shift_stride, const TM* scale, int64_t scale_stride, TX* x1,
                            TA* h, float* mean, float* rstd, TA* xhat, int batch, int tokens, int cols, float eps,
                            cudaStream_t stream, const Fp8RowOut& fp8 = {});

// How many row tiles per sample the backward uses; bias_sums as for the
// partials below (it picks the block size).
int residual_adaln_backward_tiles(int batch, int tokens, int cols, bool bias_sums, int sm_count);

// Floats of fp32 scratch the backward needs: one plane of batch * tiles * cols
// per column sum, that is 3 planes, or 4 when `bias_sums` (the backward is given
// a bias or a dbias_per_sample).
inline int64_t residual_adaln_backward_partials(int batch, int tiles_per_sample, int cols, bool bias_sums) {
  return (bias_sums ? 4 : 3) * int64_t(batch) * tiles_per_sample * cols;
}

// Backward. dx1_ext [rows, cols] (TX, null when x1 had no other consumer),
// dh [rows, cols] (TA); x1, y, bias (null = none), gate, scale, mean, rstd as
// in forward; either xhat as the forward wrote it (TA 16-bit only; then x1 and
// mean are not read and may be null) or x1 and mean. Writes dx [rows, cols] (TX), dy [rows, cols] (TA), dgate, dshift,
// dscale [batch, cols] contiguous (TM) and, when dbias_per_sample is not null,
// the per-sample column sums of dy in fp32 (gate[b] * sum_t dx1: dy's rounding
// to TA does not enter) to dbias_per_sample [batch, cols] contiguous (the
// caller sums it over the batch). dbias_per_sample may be given without a
// bias (the gradient at bias = 0). `partials` is fp32 scratch of
// residual_adaln_backward_partials(batch, tiles_per_sample, cols,
// bias != nullptr || dbias_per_sample != nullptr) floats, fully written before
// it is read.
template <typename TX, typename TM, typename TA>
void residual_adaln_backward(const TX* dx1_ext, const TA* dh, const TX* x1, const TA* xhat, const TA* y,
                             const float* bias, const TM* gate, int64_t gate_stride, const TM* scale,
                             int64_t scale_stride, const float* mean, const float* rstd, TX* dx, TA* dy, TM* dgate,
                             TM* dshift, TM* dscale, float* dbias_per_sample, float* partials, int batch, int tokens,
                             int cols, int tiles_per_sample, cudaStream_t stream);

}  // namespace perftrain::kernels
