// QK-norm + rotary embedding on the packed qkv of a single-stream block, and
// its backward. Row r = (b, t) of qkv [rows, 3D] holds q | k | v, each H heads
// of hd (D = H * hd); for each head h of q (and likewise k, with its weight):
//   rstd        = rsqrt(mean_j x[j]^2 + eps)                 x = the head's hd values
//   y[j]        = x[j] * rstd * w[j]                         (w = ones when null)
//   out[2k]     = y[2k] * c - y[2k+1] * s,  out[2k+1] = y[2k] * s + y[2k+1] * c,   c, s = cos, sin[t, k]
// v is copied. fp32 math, one rounding to T. The forward also writes rstd
// [rows, 2, H] (q heads, then k heads) for the backward, which takes the
// incoming gradient g of out and the forward's input x:
//   gy[2k] = g[2k] * c + g[2k+1] * s,  gy[2k+1] = g[2k+1] * c - g[2k] * s   (the inverse rotation)
//   xh = x * rstd,  dxh = gy * w,  dx = rstd * (dxh - xh * mean_j(dxh[j] * xh[j]))
//   dw[j] = sum over rows and heads of gy[j] * xh[j]                (fp32 partials, see below)
// and the v part of dqkv is g's.
//
// Bytes per row (s = sizeof(T)): forward reads 3D*s + hd*4 (cos/sin, from L2),
// writes 3D*s + 8H; backward reads 3D*s (g) + 2D*s (x) + 8H, writes 3D*s.
// About 10 FLOPs per q/k element each way: streaming, so the shape is about
// moving each byte once.
//
// Shape: one warp per (row, head): q, k and v of the head are loaded at once
// (pairs, one 4- or 8-byte word per lane per pair, so that a lane holds the
// two elements it rotates), the sum of squares is a butterfly over the warp
// (every lane gets the same bits), no shared memory and no block-wide sync.
// Lanes own pairs k = lane + 32 i, i < ceil(hd / 64) (a template: 1..4, hd up
// to 256). Blocks of 8 warps; the forward takes one (row, head) per warp, the
// backward a fixed run of them per block (its tile) so that each lane keeps
// its pairs' weight-gradient sums in registers across the run, and writes one
// fp32 partial row per tile after adding its 8 warps in order:
// partials [2][tiles][hd] (q weight, k weight), which the caller sums over
// tiles in a fixed order (ops::batch_sums_into). Deterministic, no atomics;
// grid and scratch follow from the shape and the SM count, so it captures in
// CUDA graphs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

// The widest head the kernels take.
constexpr int kQkNormRopeMaxHeadDim = 256;

// Forward. qkv, out [rows, 3 * heads * head_dim] contiguous (rows = batch *
// tokens; the row's token is row % tokens), T: float, __nv_bfloat16 or __half,
// both pointers aligned to two elements; head_dim even, 2..256; q_weight,
// k_weight [head_dim] fp32 or null (= ones); cos, sin [tokens, head_dim / 2]
// fp32 contiguous; rstd [rows, 2, heads] fp32 (written). out must not overlap
// qkv. std::invalid_argument for a shape it cannot take.
template <typename T>
void qk_norm_rope_forward(const T* qkv, const float* q_weight, const float* k_weight, const float* cos,
                          const float* sin, T* out, float* rstd, int rows, int tokens, int heads, int head_dim,
                          float eps, cudaStream_t stream);

// Tiles (blocks) of the backward: about 8 blocks per SM, at least one (row,
// head) per warp; shape and SM count only, as it fixes the summation order.
int qk_norm_rope_backward_tiles(int rows, int heads, int sm_count);

// Floats of the backward's weight-gradient partials: [2][tiles][head_dim].
inline int64_t qk_norm_rope_backward_partials(int tiles, int head_dim) { return 2 * int64_t(tiles) * head_dim; }

// Backward. dout (the gradient of out), qkv (the forward's input), dqkv
// [rows, 3D] contiguous and two-element aligned; rstd, weights, cos, sin as the
// forward had them; dqkv is written whole (its v part = dout's) and must not
// overlap the inputs. weight_partials: fp32 [2][tiles][head_dim] (written
// whole), or null when no weight gradient is wanted.
template <typename T>
void qk_norm_rope_backward(const T* dout, const T* qkv, const float* rstd, const float* q_weight,
                           const float* k_weight, const float* cos, const float* sin, T* dqkv,
                           float* weight_partials, int rows, int tokens, int heads, int head_dim, int tiles,
                           cudaStream_t stream);

}  // namespace perftrain::kernels
