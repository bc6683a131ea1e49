// QK-norm + rotary embedding on the q and k of a single-stream block, and its
// backward. Each operand is a QkRows: row r = (b, t) has its q heads at
// q + r * row_stride and its k heads at k + r * row_stride, each H heads of hd
// (D = H * hd) contiguous; so the projection's packed [rows, 3D] is read in
// place (q = base, k = base + D, row stride 3D, v not touched), the output is
// a dense [rows, 2D] q | k, and cuDNN's separate dq, dk (row stride D) are
// read as they are. For each head h of q (and likewise k, with its weight):
//   rstd        = rsqrt(mean_j x[j]^2 + eps)                 x = the head's hd values
//   y[j]        = x[j] * rstd * w[j]                         (w = ones when null)
//   out[2k]     = y[2k] * c - y[2k+1] * s,  out[2k+1] = y[2k] * s + y[2k+1] * c,   c, s = cos, sin[t, k]
// fp32 math, one rounding to T. The forward also writes rstd
// [rows, 2, H] (q heads, then k heads) for the backward, which takes the
// incoming gradient g of out and the forward's input x:
//   gy[2k] = g[2k] * c + g[2k+1] * s,  gy[2k+1] = g[2k+1] * c - g[2k] * s   (the inverse rotation)
//   xh = x * rstd,  dxh = gy * w,  dx = rstd * (dxh - xh * mean_j(dxh[j] * xh[j]))
//   dw[j] = sum over rows and heads of gy[j] * xh[j]                (fp32 partials, see below)
// v is no operand of either: it stays where the projection wrote it, and its
// gradient where attention wrote it.
//
// Bytes per row (s = sizeof(T)): forward reads 2D*s + hd*4 (cos/sin, from L2),
// writes 2D*s + 8H; backward reads 2D*s (g) + 2D*s (x) + 8H, writes 2D*s.
// About 10 FLOPs per q/k element each way: streaming, so the shape is about
// keeping enough bytes in flight to move each byte once at full bandwidth.
//
// Vector path (the usual one): a lane owns V consecutive elements of a head
// (V = 8: 16-byte words in 16-bit storage; V = 4 where hd is not a multiple
// of 8), so q, k and v are three V-element loads a lane, the pairs it rotates
// are inside its own vector and its cos/sin are one or two float4/float2
// reads. A head takes 2^n >= hd / V lanes (hd 64: 8 lanes, 4 heads a warp; hd
// 72: 16 lanes of which 9 work), the sums of squares are butterflies over the
// group (every lane of it gets the same bits), no shared memory in the
// forward. It needs hd % 4 == 0 (and hd / 4 <= 32 for V = 4), every row's
// q and k (pointers and row strides) aligned to min(16, V*s) bytes and the fp32 tables/weights to 16;
// otherwise (and with vector = false) the pair kernel below runs: one warp per
// (row, head), lanes own pairs k = lane + 32 i, i < ceil(hd / 64), one 4- or
// 8-byte word a lane a tensor. Both use fp32 math in the same order per
// element; the sum of squares is added in a different tree, so the two paths
// may differ in the last bits.
//
// The backward takes a fixed run of (row, head) items per block (its tile),
// so that each lane keeps its columns' weight-gradient sums in registers
// across the run, and writes one fp32 partial row per tile after adding its
// groups (butterfly) and then its 8 warps in order: partials [2][tiles][hd]
// (q weight, k weight), which the caller sums over tiles in a fixed order
// (ops::batch_sums_into). Deterministic, no atomics; grid and scratch follow
// from the shape and the SM count, so it captures in CUDA graphs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace perftrain::kernels {

// The widest head the kernels take.
constexpr int kQkNormRopeMaxHeadDim = 256;

// The q and k of `rows` rows: row r's heads [heads * head_dim] contiguous at
// q + r * row_stride and k + r * row_stride (elements).
template <typename T>
struct QkRows {
  T* q;
  T* k;
  int64_t row_stride;
};

// Forward. x (read) and out (written) as QkRows (rows = batch * tokens; the
// row's token is row % tokens), T: float, __nv_bfloat16 or __half, every
// row's q and k aligned to two elements; head_dim even, 2..256; q_weight,
// k_weight [head_dim] fp32 or null (= ones); cos, sin [tokens, head_dim / 2]
// fp32 contiguous; rstd [rows, 2, heads] fp32 (written). out must not overlap
// x. std::invalid_argument for a shape or alignment it cannot take.
template <typename T>
void qk_norm_rope_forward(QkRows<const T> x, const float* q_weight, const float* k_weight, const float* cos,
                          const float* sin, QkRows<T> out, float* rstd, int rows, int tokens, int heads, int head_dim,
                          float eps, cudaStream_t stream, bool vector = true);

// Tiles (blocks) of the backward: about 8 blocks per SM, at least one (row,
// head) per warp; shape and SM count only, as it fixes the summation order.
int qk_norm_rope_backward_tiles(int rows, int heads, int sm_count);

// Floats of the backward's weight-gradient partials: [2][tiles][head_dim].
inline int64_t qk_norm_rope_backward_partials(int tiles, int head_dim) { return 2 * int64_t(tiles) * head_dim; }

// Backward. dout (the gradient of out), x (the forward's input) and dx (its
// gradient, written: the q and k heads of every row, nothing else) as QkRows,
// every row two-element aligned; rstd, weights, cos, sin as the forward had
// them; dx must not overlap the inputs. weight_partials: fp32
// [2][tiles][head_dim] (written whole), or null when no weight gradient is
// wanted.
template <typename T>
void qk_norm_rope_backward(QkRows<const T> dout, QkRows<const T> x, const float* rstd, const float* q_weight,
                           const float* k_weight, const float* cos, const float* sin, QkRows<T> dx,
                           float* weight_partials, int rows, int tokens, int heads, int head_dim, int tiles,
                           cudaStream_t stream, bool vector = true);

// The elements a lane moves at once on the vector path for this head dim,
// storage size and addresses (8 or 4), or 0 where the pair kernel runs.
// data_addrs: the T pointers' addresses and the row strides in bytes OR-ed
// together; table_addrs: those of
// the weights (null counts as aligned), cos and sin. vector = false above
// forces the pair kernel (benchmarks, tests).
int qk_norm_rope_vector_elems(int head_dim, int elem_bytes, uintptr_t data_addrs, uintptr_t table_addrs);

}  // namespace perftrain::kernels
