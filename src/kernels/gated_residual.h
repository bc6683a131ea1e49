// Gated residual update of a DiT block, x + gate[b] * y, and its backward:
//   out[r, :] = x[r, :] + gate[b, :] * y[r, :],   b = r / tokens   (fp32 math, out in x's dtype)
//   dy[r, :] = dout[r, :] * gate[b, :]            (y's dtype)
//   dgate[b, :] = sum_t dout[b*tokens + t, :] * y[b*tokens + t, :]   (gate's dtype)
// (dx = dout needs no kernel.)
//
// Bytes per row (D = cols; sx, sy = element sizes of x and y):
//   forward   reads D*(sx + sy), writes D*sx: fp32 x, bf16 y is 10D bytes (11.5 KB at D = 1152), 2D FLOPs
//   backward  reads D*(sx + sy), writes D*sy: fp32 dout, bf16 y is 8D bytes, 3D FLOPs; plus 4D bytes of
//             fp32 partials per tile (not per row)
// Pure streaming, so the shape is about moving each byte once at full width:
//   forward   each block takes a run of whole rows and walks them as a flat list of 8-element vectors
//             (16-byte loads when D % 8 == 0 and the pointers allow, scalar otherwise), so no thread
//             idles on short or odd rows and the index math stays in 32 bits.
//   backward  block (tile, b) takes a run of rows of ONE sample: gate[b] sits in registers and every
//             thread owns the same columns on every row, writes dy and keeps its column sums of
//             dout*y in registers, stored once to fp32 partials [batch][tiles][cols]; a second small
//             kernel sums the tiles in a fixed order into dgate. Deterministic, no atomics.
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
// elements at b * gate_stride. TX, TG, TY: float, __nv_bfloat16 or __half;
// out has x's type and must not overlap the inputs.
template <typename TX, typename TG, typename TY>
void gated_residual_forward(const TX* x, const TG* gate, int64_t gate_stride, const TY* y, TX* out, int batch,
                            int tokens, int cols, cudaStream_t stream);

// How many row tiles per sample the backward uses; the caller allocates
// partials of batch * tiles * cols floats.
int gated_residual_backward_tiles(int batch, int tokens, int sm_count);

// Backward. dout [rows, cols] (TX); writes dy [rows, cols] (TY) and dgate
// [batch, cols] contiguous (TG). `partials` is fp32 scratch of
// batch * tiles_per_sample * cols floats, fully written before it is read.
template <typename TX, typename TG, typename TY>
void gated_residual_backward(const TX* dout, const TG* gate, int64_t gate_stride, const TY* y, TY* dy, TG* dgate,
                             float* partials, int batch, int tokens, int cols, int tiles_per_sample,
                             cudaStream_t stream);

}  // namespace perftrain::kernels
