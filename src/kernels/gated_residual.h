// Gated residual update of a DiT block, x + gate[b] * (y + bias), and its backward:
//   out[r, :] = x[r, :] + gate[b, :] * (y[r, :] + bias),   b = r / tokens   (fp32 math, out in x's dtype)
//   dy[r, :] = dout[r, :] * gate[b, :]                       (y's dtype)
//   dgate[b, :] = sum_t dout[b*tokens + t, :] * (y[b*tokens + t, :] + bias)   (gate's dtype)
//   dbias_per_sample[b, :] = sum_t dy = gate[b, :] * sum_t dout[b*tokens + t, :]   (fp32)
// bias [cols] fp32 is the bias of the linear layer that produced y, folded in
// here so that its gradient comes from the column sums this backward takes
// anyway instead of a separate reduction over dy (null = no bias). dx = dout
// needs no kernel.
//
// Bytes per row (D = cols; sx, sy = element sizes of x and y):
//   forward   reads D*(sx + sy), writes D*sx: fp32 x, bf16 y is 10D bytes (11.5 KB at D = 1152), 2D FLOPs
//             (3D with bias; the bias row is read once per row from L1/L2)
//   backward  reads D*(sx + sy), writes D*sy: fp32 dout, bf16 y is 8D bytes, 3D FLOPs (4D with bias); plus
//             4D bytes of fp32 partials per tile and column sum (not per row)
// Pure streaming, so the shape is about moving each byte once at full width:
//   forward   each block takes a run of whole rows and walks them as a flat list of 8-element vectors
//             (16-byte loads when D % 8 == 0 and the pointers allow, scalar otherwise), so no thread
//             idles on short or odd rows and the index math stays in 32 bits.
//   backward  block (tile, b) takes a run of rows of ONE sample: gate[b] sits in registers and every
//             thread owns the same columns on every row, writes dy and keeps its column sums of
//             dout*y (and, with a bias, of dout) in registers, stored once to fp32 partials
//             [planes][batch][tiles][cols]; a second small kernel sums the tiles in a fixed order and
//             finishes dgate = sum dout*y + bias * sum dout and dbias_per_sample = gate * sum dout, so
//             the row loop never reads the bias. Deterministic, no atomics.
// With and without a bias are separate instantiations of both row kernels, so the path without
// one carries no bias load, no second sum and no registers for them.
// Everything is shape-determined (grid, scratch size), so it captures in CUDA graphs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

// The widest row the backward takes (the op checks it up front).
constexpr int kGatedResidualMaxCols = 8192;

// Forward. x, y, out [batch * tokens, cols] contiguous; gate rows of `cols`
// elements at b * gate_stride; bias [cols] fp32 or null. TX, TG, TY: float,
// __nv_bfloat16 or __half; out has x's type and must not overlap the inputs.
template <typename TX, typename TG, typename TY>
void gated_residual_forward(const TX* x, const TG* gate, int64_t gate_stride, const TY* y, const float* bias, TX* out,
                            int batch, int tokens, int cols, cudaStream_t stream);

// How many row tiles per sample the backward uses.
int gated_residual_backward_tiles(int batch, int tokens, int sm_count);

// Floats of fp32 scratch the backward needs: one plane of batch * tiles * cols
// per column sum, that is 1 plane, or 2 when `bias_sums` (the backward is given
// a bias or a dbias_per_sample).
inline int64_t gated_residual_backward_partials(int batch, int tiles_per_sample, int cols, bool bias_sums) {
  return (bias_sums ? 2 : 1) * int64_t(batch) * tiles_per_sample * cols;
}

// Backward. dout [rows, cols] (TX); gate, y and bias (null = none) as in the
// forward. Writes dy [rows, cols] (TY), dgate [batch, cols] contiguous (TG)
// and, when dbias_per_sample is not null, the per-sample column sums of dy in
// fp32 (gate[b] * sum_t dout: dy's rounding to TY does not enter) to
// dbias_per_sample [batch, cols] contiguous (the caller sums it over the batch). dbias_per_sample may be
// given without a bias (the gradient at bias = 0). `partials` is fp32 scratch
// of gated_residual_backward_partials(batch, tiles_per_sample, cols,
// bias != nullptr || dbias_per_sample != nullptr) floats, fully written before
// it is read.
template <typename TX, typename TG, typename TY>
void gated_residual_backward(const TX* dout, const TG* gate, int64_t gate_stride, const TY* y, const float* bias,
                             TY* dy, TG* dgate, float* dbias_per_sample, float* partials, int batch, int tokens,
                             int cols, int tiles_per_sample, cudaStream_t stream);

}  // namespace perftrain::kernels
