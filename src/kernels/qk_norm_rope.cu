#include "kernels/qk_norm_rope.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {

namespace {

using detail::load_vec;
using detail::store_vec;
using detail::warp_sum;

constexpr int kWarps = 8;  // warps per block: one (row, head) each at a time
constexpr int kThreads = 32 * kWarps;
constexpr int kBlocksPerSm = 8;  // the backward's tiles: 2048 resident threads / kThreads

// The pairs of one head this lane owns: x[i] = elements (2k, 2k+1), k = lane + 32 i;
// pairs past the head's end read as zero (they add nothing to the sums).
template <typename T, int P>
__device__ __forceinline__ void load_pairs(const T* __restrict__ p, int lane, int half, float (&x)[P][2]) {
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int k = lane + 32 * i;
    if (k < half) {
      load_vec<T, 2>(p + 2 * k, x[i]);
    } else {
      x[i][0] = 0.f;
      x[i][1] = 0.f;
    }
  }
}

template <typename T, int P>
__device__ __forceinline__ void store_pairs(T* __restrict__ p, int lane, int half, const float (&x)[P][2]) {
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int k = lane + 32 * i;
    if (k < half) store_vec<T, 2>(p + 2 * k, x[i]);
  }
}

// One head of q or k, in place: x -> rope(x * rstd * w). Returns rstd.
// c, s: the token's cos, sin rows.
template <int P>
__device__ __forceinline__ float norm_rope(float (&x)[P][2], const float* __restrict__ w, const float* __restrict__ c,
                                           const float* __restrict__ s, int lane, int half, int hd, float eps) {
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < P; ++i) ss += x[i][0] * x[i][0] + x[i][1] * x[i][1];
  const float r = rsqrtf(warp_sum(ss) / float(hd) + eps);
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int k = lane + 32 * i;
    if (k < half) {
      const float w0 = w ? w[2 * k] : 1.f, w1 = w ? w[2 * k + 1] : 1.f;
      const float y0 = x[i][0] * r * w0, y1 = x[i][1] * r * w1;
      const float ck = c[k], sk = s[k];
      x[i][0] = y0 * ck - y1 * sk;
      x[i][1] = y0 * sk + y1 * ck;
    }
  }
  return r;
}

// One head's backward, in place on g: g (the gradient of the rotated output)
// -> dx. x: the forward's input, r: its rstd. Adds gy * xh to acc (the
// weight gradient) when kWeights.
template <int P, bool kWeights>
__device__ __forceinline__ void norm_rope_backward(float (&g)[P][2], const float (&x)[P][2], float r,
                                                   const float* __restrict__ w, const float* __restrict__ c,
                                                   const float* __restrict__ s, float (&acc)[P][2], int lane,
                                                   int half, int hd) {
  float xh[P][2];
  float dot = 0.f;
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int k = lane + 32 * i;
    xh[i][0] = x[i][0] * r;
    xh[i][1] = x[i][1] * r;
    if (k < half) {
      const float ck = c[k], sk = s[k];
      const float gy0 = g[i][0] * ck + g[i][1] * sk, gy1 = g[i][1] * ck - g[i][0] * sk;
      if (kWeights) {
        acc[i][0] += gy0 * xh[i][0];
        acc[i][1] += gy1 * xh[i][1];
      }
      const float w0 = w ? w[2 * k] : 1.f, w1 = w ? w[2 * k + 1] : 1.f;
      g[i][0] = gy0 * w0;  // dxh
      g[i][1] = gy1 * w1;
      dot += g[i][0] * xh[i][0] + g[i][1] * xh[i][1];
    }
  }
  const float m = warp_sum(dot) / float(hd);
#pragma unroll
  for (int i = 0; i < P; ++i) {
    g[i][0] = r * (g[i][0] - xh[i][0] * m);
    g[i][1] = r * (g[i][1] - xh[i][1] * m);
  }
}

// The block's weight-gradient sums of q and k (two planes, one row per warp, in shared
// memory) added in warp order and stored as this block's partials [2][grid][hd]. After a
// __syncthreads; all threads of the block take part.
__device__ __forceinline__ void store_block_partials(const float (&sums)[2][kWarps][kQkNormRopeMaxHeadDim], int hd,
                                                     float* __restrict__ partials) {
  for (int j = threadIdx.x; j < 2 * hd; j += kThreads) {
    const int plane = j / hd, col = j - plane * hd;
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) acc += sums[plane][w][col];
    partials[(int64_t(plane) * gridDim.x + blockIdx.x) * hd + col] = acc;
  }
}

template <typename T, int P>
__global__ void __launch_bounds__(kThreads)
    qk_norm_rope_forward_kernel(QkRows<const T> x, const float* __restrict__ qw, const float* __restrict__ kw,
                                const float* __restrict__ cos, const float* __restrict__ sin, QkRows<T> out,
                                float* __restrict__ rstd, int64_t items, int tokens, int heads, int hd, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= items) return;  // the whole warp at once
  const int64_t row = item / heads;
  const int h = int(item - row * heads), t = int(row % tokens), half = hd >> 1;
  const int64_t col = int64_t(h) * hd;
  float q[P][2], k[P][2];
  load_pairs<T, P>(x.q + row * x.row_stride + col, lane, half, q);
  load_pairs<T, P>(x.k + row * x.row_stride + col, lane, half, k);
  const float* c = cos + int64_t(t) * half;
  const float* s = sin + int64_t(t) * half;
  const float rq = norm_rope<P>(q, qw, c, s, lane, half, hd, eps);
  const float rk = norm_rope<P>(k, kw, c, s, lane, half, hd, eps);
  store_pairs<T, P>(out.q + row * out.row_stride + col, lane, half, q);
  store_pairs<T, P>(out.k + row * out.row_stride + col, lane, half, k);
  if (lane == 0) {
    rstd[row * 2 * heads + h] = rq;
    rstd[row * 2 * heads + heads + h] = rk;
  }
}

// Block = tile: items [tile * per_tile, min(+per_tile, items)), warp w takes
// every kWarps-th from the w-th on (neighbouring warps, neighbouring heads).
template <typename T, int P, bool kWeights>
__global__ void __launch_bounds__(kThreads)
    qk_norm_rope_backward_kernel(QkRows<const T> dout, QkRows<const T> x, const float* __restrict__ rstd,
                                 const float* __restrict__ qw, const float* __restrict__ kw,
                                 const float* __restrict__ cos, const float* __restrict__ sin, QkRows<T> dx,
                                 float* __restrict__ partials, int64_t items, int64_t per_tile, int tokens, int heads,
                                 int hd) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half = hd >> 1;
  const int64_t i0 = int64_t(blockIdx.x) * per_tile, i1 = min(i0 + per_tile, items);
  float aq[P][2], ak[P][2];
#pragma unroll
  for (int i = 0; i < P; ++i) aq[i][0] = aq[i][1] = ak[i][0] = ak[i][1] = 0.f;
  for (int64_t item = i0 + warp; item < i1; item += kWarps) {
    const int64_t row = item / heads;
    const int h = int(item - row * heads), t = int(row % tokens);
    const int64_t col = int64_t(h) * hd;
    float gq[P][2], gk[P][2], xq[P][2], xk[P][2];
    load_pairs<T, P>(dout.q + row * dout.row_stride + col, lane, half, gq);
    load_pairs<T, P>(dout.k + row * dout.row_stride + col, lane, half, gk);
    load_pairs<T, P>(x.q + row * x.row_stride + col, lane, half, xq);
    load_pairs<T, P>(x.k + row * x.row_stride + col, lane, half, xk);
    const float rq = rstd[row * 2 * heads + h], rk = rstd[row * 2 * heads + heads + h];
    const float* c = cos + int64_t(t) * half;
    const float* s = sin + int64_t(t) * half;
    norm_rope_backward<P, kWeights>(gq, xq, rq, qw, c, s, aq, lane, half, hd);
    norm_rope_backward<P, kWeights>(gk, xk, rk, kw, c, s, ak, lane, half, hd);
    store_pairs<T, P>(dx.q + row * dx.row_stride + col, lane, half, gq);
    store_pairs<T, P>(dx.k + row * dx.row_stride + col, lane, half, gk);
  }
  if constexpr (kWeights) {
    // The tile's partial row: the 8 warps' sums added in warp order.
    __shared__ float sums[2][kWarps][kQkNormRopeMaxHeadDim];
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int k = lane + 32 * i;
      if (k < half) {
        sums[0][warp][2 * k] = aq[i][0];
        sums[0][warp][2 * k + 1] = aq[i][1];
        sums[1][warp][2 * k] = ak[i][0];
        sums[1][warp][2 * k + 1] = ak[i][1];
      }
    }
    __syncthreads();
    store_block_partials(sums, hd, partials);
  }
}

// ---- the vector path: V consecutive elements a lane, 2^lanes_log2 lanes a head ----

// N fp32 values (N even) from p, in 16-byte words when N is a multiple of 4
// (p then 16-byte aligned), else 8-byte ones.
template <int N>
__device__ __forceinline__ void load_f32(const float* __restrict__ p, float (&f)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 w = reinterpret_cast<const float4*>(p)[i];
      f[4 * i] = w.x, f[4 * i + 1] = w.y, f[4 * i + 2] = w.z, f[4 * i + 3] = w.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float2 w = reinterpret_cast<const float2*>(p)[i];
      f[2 * i] = w.x, f[2 * i + 1] = w.y;
    }
  }
}

// Two sums over the aligned group of `lanes` lanes (a power of two <= 32), by
// butterfly: every lane of the group gets the same bits. Every lane of the
// warp must call it.
__device__ __forceinline__ void group_sum2(float& a, float& b, int lanes) {
  for (int o = lanes >> 1; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
}

// A lane's V weights from column j0 (ones when w is null): from L1, per item,
// rather than held in registers across the loop.
template <int V>
__device__ __forceinline__ void load_weights(const float* __restrict__ w, int j0, float (&wv)[V]) {
  if (w) {
    load_f32<V>(w + j0, wv);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) wv[e] = 1.f;
  }
}

// x (V elements of a head, from column j0 = j * V) -> rope(x * r * w), as norm_rope.
template <int V>
__device__ __forceinline__ void rope_vec(float (&x)[V], float r, const float* __restrict__ w, const float (&c)[V / 2],
                                         const float (&s)[V / 2], int j0) {
  float wv[V];
  load_weights<V>(w, j0, wv);
#pragma unroll
  for (int e = 0; e < V / 2; ++e) {
    const float y0 = x[2 * e] * r * wv[2 * e], y1 = x[2 * e + 1] * r * wv[2 * e + 1];
    x[2 * e] = y0 * c[e] - y1 * s[e];
    x[2 * e + 1] = y0 * s[e] + y1 * c[e];
  }
}

// The row and head of `item` (a (row, head) pair) and the column of its
// head's element col in a row's q (or k) heads.
// 32-bit division: check_shape keeps rows * 2D, so items, below 2^31.
__device__ __forceinline__ void head_pos(int64_t item, int heads, int hd, int col, int64_t& row, int& h,
                                         int64_t& c) {
  const int r = int(item) / heads;
  row = r;
  h = int(item) - r * heads;
  c = int64_t(h) * hd + col;
}

// Forward, vector path: warp w of the grid takes the 32 >> lanes_log2 items
// from w << (5 - lanes_log2) on, one per group of 2^lanes_log2 lanes; lane j
// of a group owns columns [j V, j V + V) of its head (idle when j V >= hd).
// The warp stays whole up to its last shuffle.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    qk_norm_rope_forward_vec_kernel(QkRows<const T> x, const float* __restrict__ qw, const float* __restrict__ kw,
                                    const float* __restrict__ cos, const float* __restrict__ sin, QkRows<T> out,
                                    float* __restrict__ rstd, int64_t items, int tokens, int heads, int hd,
                                    int lanes_log2, float eps) {
  const int lane = threadIdx.x & 31, lanes = 1 << lanes_log2, j = lane & (lanes - 1);
  const int64_t item =
      ((int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5)) << (5 - lanes_log2)) + (lane >> lanes_log2);
  const bool active = item < items && j * V < hd;
  int64_t row = 0, col = 0;
  int h = 0;
  float q[V], k[V];
  if (active) {
    head_pos(item, heads, hd, j * V, row, h, col);
    load_vec<T, V>(x.q + row * x.row_stride + col, q);
    load_vec<T, V>(x.k + row * x.row_stride + col, k);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) q[e] = k[e] = 0.f;
  }
  float sq = 0.f, sk = 0.f;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    sq += q[e] * q[e];
    sk += k[e] * k[e];
  }
  group_sum2(sq, sk, lanes);
  if (!active) return;
  const float rq = rsqrtf(sq / float(hd) + eps), rk = rsqrtf(sk / float(hd) + eps);
  const int t = int(row) % tokens, half = hd >> 1;
  float c[V / 2], s[V / 2];
  load_f32<V / 2>(cos + int64_t(t) * half + j * (V / 2), c);
  load_f32<V / 2>(sin + int64_t(t) * half + j * (V / 2), s);
  rope_vec<V>(q, rq, qw, c, s, j * V);
  rope_vec<V>(k, rk, kw, c, s, j * V);
  store_vec<T, V>(out.q + row * out.row_stride + col, q);
  store_vec<T, V>(out.k + row * out.row_stride + col, k);
  if (j == 0) {
    rstd[row * 2 * heads + h] = rq;
    rstd[row * 2 * heads + heads + h] = rk;
  }
}

// One head's backward on a lane's V columns (from j0), in place on g, as
// norm_rope_backward: g -> dxh. Returns the lane's part of sum(dxh * xh); the
// caller sums it over the group and calls rope_backward_finish, which forms
// xh = x * r again (the same bits) rather than keeping it in registers.
template <int V, bool kWeights>
__device__ __forceinline__ float rope_backward_vec(float (&g)[V], const float (&x)[V], float r,
                                                   const float* __restrict__ w, int j0, const float (&c)[V / 2],
                                                   const float (&s)[V / 2], float (&acc)[V]) {
  float wv[V];
  load_weights<V>(w, j0, wv);
  float dot = 0.f;
#pragma unroll
  for (int e = 0; e < V / 2; ++e) {
    const float xh0 = x[2 * e] * r, xh1 = x[2 * e + 1] * r;
    const float gy0 = g[2 * e] * c[e] + g[2 * e + 1] * s[e], gy1 = g[2 * e + 1] * c[e] - g[2 * e] * s[e];
    if (kWeights) {
      acc[2 * e] += gy0 * xh0;
      acc[2 * e + 1] += gy1 * xh1;
    }
    g[2 * e] = gy0 * wv[2 * e];  // dxh
    g[2 * e + 1] = gy1 * wv[2 * e + 1];
    dot += g[2 * e] * xh0 + g[2 * e + 1] * xh1;
  }
  return dot;
}

template <int V>
__device__ __forceinline__ void rope_backward_finish(float (&g)[V], const float (&x)[V], float r, float m) {
#pragma unroll
  for (int e = 0; e < V; ++e) g[e] = r * (g[e] - (x[e] * r) * m);
}

// Backward, vector path. Block = tile as in the pair kernel: items [tile *
// per_tile, min(+per_tile, items)); each round the block's warps take
// 8 << (5 - lanes_log2) consecutive items (warp w the w-th run of 32 >>
// lanes_log2, a group each). A lane keeps its columns' weight-gradient sums
// across the tile; at the end the groups of a warp are added by butterfly,
// then the warps in warp order (fixed order: deterministic). At least 3 blocks
// an SM: at V = 8 with weight sums it fits 80 registers without spilling (97
// unbounded: 2 blocks).
template <typename T, int V, bool kWeights>
__global__ void __launch_bounds__(kThreads, 3)
    qk_norm_rope_backward_vec_kernel(QkRows<const T> dout, QkRows<const T> x, const float* __restrict__ rstd,
                                     const float* __restrict__ qw, const float* __restrict__ kw,
                                     const float* __restrict__ cos, const float* __restrict__ sin, QkRows<T> dx,
                                     float* __restrict__ partials, int64_t items, int64_t per_tile, int tokens,
                                     int heads, int hd, int lanes_log2) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, lanes = 1 << lanes_log2, j = lane & (lanes - 1);
  const int groups = 32 >> lanes_log2, half = hd >> 1;
  const bool cols = j * V < hd;
  const int64_t i0 = int64_t(blockIdx.x) * per_tile, i1 = min(i0 + per_tile, items);
  float aq[V], ak[V];
#pragma unroll
  for (int e = 0; e < V; ++e) aq[e] = ak[e] = 0.f;
  // The loop bound is the warp's first item: the same for its 32 lanes.
  for (int64_t first = i0 + int64_t(warp) * groups; first < i1; first += int64_t(kWarps) * groups) {
    const int64_t item = first + (lane >> lanes_log2);
    const bool active = cols && item < i1;
    int64_t row = 0, col = 0;
    int h = 0;
    float gq[V], gk[V], xq[V], xk[V];
    float rq = 0.f, rk = 0.f, dq = 0.f, dk = 0.f;
    if (active) {
      head_pos(item, heads, hd, j * V, row, h, col);
      load_vec<T, V>(dout.q + row * dout.row_stride + col, gq);
      load_vec<T, V>(dout.k + row * dout.row_stride + col, gk);
      load_vec<T, V>(x.q + row * x.row_stride + col, xq);
      load_vec<T, V>(x.k + row * x.row_stride + col, xk);
      rq = rstd[row * 2 * heads + h];
      rk = rstd[row * 2 * heads + heads + h];
      const int t = int(row) % tokens;
      float c[V / 2], s[V / 2];
      load_f32<V / 2>(cos + int64_t(t) * half + j * (V / 2), c);
      load_f32<V / 2>(sin + int64_t(t) * half + j * (V / 2), s);
      dq = rope_backward_vec<V, kWeights>(gq, xq, rq, qw, j * V, c, s, aq);
      dk = rope_backward_vec<V, kWeights>(gk, xk, rk, kw, j * V, c, s, ak);
    }
    group_sum2(dq, dk, lanes);
    if (active) {
      rope_backward_finish<V>(gq, xq, rq, dq / float(hd));
      rope_backward_finish<V>(gk, xk, rk, dk / float(hd));
      store_vec<T, V>(dx.q + row * dx.row_stride + col, gq);
      store_vec<T, V>(dx.k + row * dx.row_stride + col, gk);
    }
  }
  if constexpr (kWeights) {
    // The warp's groups hold the same columns: add them (lanes j, j + lanes, ...).
    for (int o = lanes; o < 32; o <<= 1) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        aq[e] += __shfl_xor_sync(0xffffffffu, aq[e], o);
        ak[e] += __shfl_xor_sync(0xffffffffu, ak[e], o);
      }
    }
    __shared__ float sums[2][kWarps][kQkNormRopeMaxHeadDim];
    if (lane < lanes && cols) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        sums[0][warp][j * V + e] = aq[e];
        sums[1][warp][j * V + e] = ak[e];
      }
    }
    __syncthreads();
    store_block_partials(sums, hd, partials);
  }
}

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// The addresses of r's first rows and its row stride in bytes, OR-ed: aligned
// to a word exactly when every row's q and k are.
template <typename T>
uintptr_t row_addrs(const QkRows<T>& r) {
  return addr(r.q) | addr(r.k) | uintptr_t(r.row_stride * int64_t(sizeof(T)));
}

// Whether every row of r starts two-element aligned.
template <typename T>
bool pair_aligned(const QkRows<T>& r) {
  return row_addrs(r) % (2 * sizeof(T)) == 0;
}

void check_shape(const char* what, int rows, int tokens, int heads, int head_dim) {
  if (rows < 0 || tokens < 1 || heads < 1 || head_dim < 2 || head_dim % 2 != 0 ||
      head_dim > kQkNormRopeMaxHeadDim || int64_t(rows) * 2 * heads * head_dim > INT32_MAX)
    throw std::invalid_argument(std::string(what) + ": unsupported sizes rows=" + std::to_string(rows) +
                                " tokens=" + std::to_string(tokens) + " heads=" + std::to_string(heads) +
                                " head_dim=" + std::to_string(head_dim));
}

// Pairs per lane for a head dim: 1 up to 64, 2 up to 128, ... 4 up to 256.
int pairs_per_lane(int head_dim) { return (head_dim / 2 + 31) / 32; }

// log2 of the lanes a head takes on the vector path: the power of two >= hd / V.
int lanes_log2_for(int head_dim, int v) {
  int l = 0;
  while ((1 << l) * v < head_dim) ++l;
  return l;
}

}  // namespace

int qk_norm_rope_vector_elems(int head_dim, int elem_bytes, uintptr_t data_addrs, uintptr_t table_addrs) {
  if (head_dim < 4 || head_dim > kQkNormRopeMaxHeadDim || table_addrs % 16 != 0) return 0;
  for (const int v : {8, 4}) {
    const uintptr_t word = uintptr_t(std::min(16, v * elem_bytes));
    if (head_dim % v == 0 && head_dim / v <= 32 && data_addrs % word == 0) return v;
  }
  return 0;
}

template <typename T>
void qk_norm_rope_forward(QkRows<const T> x, const float* q_weight, const float* k_weight, const float* cos,
                          const float* sin, QkRows<T> out, float* rstd, int rows, int tokens, int heads, int head_dim,
                          float eps, cudaStream_t stream, bool vector) {
  check_shape("qk_norm_rope_forward", rows, tokens, heads, head_dim);
  if (!pair_aligned(x) || !pair_aligned(out))
    throw std::invalid_argument("qk_norm_rope_forward: the rows of x and out must be aligned to two elements");
  const int64_t items = int64_t(rows) * heads;
  if (items == 0) return;
  const int v = vector ? qk_norm_rope_vector_elems(head_dim, int(sizeof(T)), row_addrs(x) | row_addrs(out),
                                                   addr(q_weight) | addr(k_weight) | addr(cos) | addr(sin))
                       : 0;
  if (v != 0) {
    const int ll = lanes_log2_for(head_dim, v);
    const int64_t per_block = int64_t(kWarps) << (5 - ll);
    const dim3 vgrid(unsigned((items + per_block - 1) / per_block));
    auto launch_vec = [&](auto kernel) {
      kernel<<<vgrid, kThreads, 0, stream>>>(x, q_weight, k_weight, cos, sin, out, rstd, items, tokens, heads,
                                             head_dim, ll, eps);
      PERFTRAIN_LAUNCH_CHECK();
    };
    if (v == 8) return launch_vec(qk_norm_rope_forward_vec_kernel<T, 8>);
    return launch_vec(qk_norm_rope_forward_vec_kernel<T, 4>);
  }
  const dim3 grid(unsigned((items + kWarps - 1) / kWarps));
  auto launch = [&](auto kernel) {
    kernel<<<grid, kThreads, 0, stream>>>(x, q_weight, k_weight, cos, sin, out, rstd, items, tokens, heads,
                                          head_dim, eps);
    PERFTRAIN_LAUNCH_CHECK();
  };
  switch (pairs_per_lane(head_dim)) {
    case 1: return launch(qk_norm_rope_forward_kernel<T, 1>);
    case 2: return launch(qk_norm_rope_forward_kernel<T, 2>);
    case 3: return launch(qk_norm_rope_forward_kernel<T, 3>);
    default: return launch(qk_norm_rope_forward_kernel<T, 4>);
  }
}

int qk_norm_rope_backward_tiles(int rows, int heads, int sm_count) {
  const int64_t items = int64_t(std::max(rows, 0)) * std::max(heads, 1);
  const int64_t want = int64_t(kBlocksPerSm) * std::max(sm_count, 1);
  const int64_t tiles = std::max<int64_t>(1, std::min<int64_t>(want, (items + kWarps - 1) / kWarps));
  const int64_t per_tile = (items + tiles - 1) / tiles;
  return per_tile > 0 ? int((items + per_tile - 1) / per_tile) : 1;  // no empty tile
}

template <typename T>
void qk_norm_rope_backward(QkRows<const T> dout, QkRows<const T> x, const float* rstd, const float* q_weight,
                           const float* k_weight, const float* cos, const float* sin, QkRows<T> dx,
                           float* weight_partials, int rows, int tokens, int heads, int head_dim, int tiles,
                           cudaStream_t stream, bool vector) {
  check_shape("qk_norm_rope_backward", rows, tokens, heads, head_dim);
  if (!pair_aligned(dout) || !pair_aligned(x) || !pair_aligned(dx))
    throw std::invalid_argument("qk_norm_rope_backward: the rows of dout, x and dx must be aligned to two elements");
  const int64_t items = int64_t(rows) * heads;
  if (tiles < 1 || tiles > std::max<int64_t>(items, 1))
    throw std::invalid_argument("qk_norm_rope_backward: tiles=" + std::to_string(tiles) + " for " +
                                std::to_string(items) + " (row, head) items");
  const int64_t per_tile = std::max<int64_t>(1, (items + tiles - 1) / tiles);
  const bool weights = weight_partials != nullptr;
  const int v = vector ? qk_norm_rope_vector_elems(head_dim, int(sizeof(T)), row_addrs(dout) | row_addrs(x) | row_addrs(dx),
                                                   addr(q_weight) | addr(k_weight) | addr(cos) | addr(sin))
                       : 0;
  if (v != 0) {
    const int ll = lanes_log2_for(head_dim, v);
    auto launch_vec = [&](auto kernel) {
      kernel<<<tiles, kThreads, 0, stream>>>(dout, x, rstd, q_weight, k_weight, cos, sin, dx, weight_partials,
                                             items, per_tile, tokens, heads, head_dim, ll);
      PERFTRAIN_LAUNCH_CHECK();
    };
    switch (v * 2 + (weights ? 1 : 0)) {
      case 16: return launch_vec(qk_norm_rope_backward_vec_kernel<T, 8, false>);
      case 17: return launch_vec(qk_norm_rope_backward_vec_kernel<T, 8, true>);
      case 8: return launch_vec(qk_norm_rope_backward_vec_kernel<T, 4, false>);
      default: return launch_vec(qk_norm_rope_backward_vec_kernel<T, 4, true>);
    }
  }
  auto launch = [&](auto kernel) {
    kernel<<<tiles, kThreads, 0, stream>>>(dout, x, rstd, q_weight, k_weight, cos, sin, dx, weight_partials,
                                           items, per_tile, tokens, heads, head_dim);
    PERFTRAIN_LAUNCH_CHECK();
  };
  switch (pairs_per_lane(head_dim) * 2 + (weights ? 1 : 0)) {
    case 2: return launch(qk_norm_rope_backward_kernel<T, 1, false>);
    case 3: return launch(qk_norm_rope_backward_kernel<T, 1, true>);
    case 4: return launch(qk_norm_rope_backward_kernel<T, 2, false>);
    case 5: return launch(qk_norm_rope_backward_kernel<T, 2, true>);
    case 6: return launch(qk_norm_rope_backward_kernel<T, 3, false>);
    case 7: return launch(qk_norm_rope_backward_kernel<T, 3, true>);
    case 8: return launch(qk_norm_rope_backward_kernel<T, 4, false>);
    default: return launch(qk_norm_rope_backward_kernel<T, 4, true>);
  }
}

#define PERFTRAIN_QK_NORM_ROPE_INSTANTIATE(T)                                                                     \
  template void qk_norm_rope_forward<T>(QkRows<const T>, const float*, const float*, const float*, const float*, \
                                        QkRows<T>, float*, int, int, int, int, float, cudaStream_t, bool);         \
  template void qk_norm_rope_backward<T>(QkRows<const T>, QkRows<const T>, const float*, const float*,           \
                                         const float*, const float*, const float*, QkRows<T>, float*, int, int,    \
                                         int, int, int, cudaStream_t, bool);
PERFTRAIN_QK_NORM_ROPE_INSTANTIATE(float)
PERFTRAIN_QK_NORM_ROPE_INSTANTIATE(__nv_bfloat16)
PERFTRAIN_QK_NORM_ROPE_INSTANTIATE(__half)

}  // namespace perftrain::kernels
