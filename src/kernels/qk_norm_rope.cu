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

template <typename T, int P>
__global__ void __launch_bounds__(kThreads)
    qk_norm_rope_forward_kernel(const T* __restrict__ qkv, const float* __restrict__ qw, const float* __restrict__ kw,
                                const float* __restrict__ cos, const float* __restrict__ sin, T* __restrict__ out,
                                float* __restrict__ rstd, int64_t items, int tokens, int heads, int hd, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= items) return;  // the whole warp at once
  const int64_t row = item / heads;
  const int h = int(item - row * heads), t = int(row % tokens), half = hd >> 1;
  const int64_t d = int64_t(heads) * hd, base = row * 3 * d + int64_t(h) * hd;
  float q[P][2], k[P][2], v[P][2];
  load_pairs<T, P>(qkv + base, lane, half, q);
  load_pairs<T, P>(qkv + base + d, lane, half, k);
  load_pairs<T, P>(qkv + base + 2 * d, lane, half, v);
  const float* c = cos + int64_t(t) * half;
  const float* s = sin + int64_t(t) * half;
  const float rq = norm_rope<P>(q, qw, c, s, lane, half, hd, eps);
  const float rk = norm_rope<P>(k, kw, c, s, lane, half, hd, eps);
  store_pairs<T, P>(out + base, lane, half, q);
  store_pairs<T, P>(out + base + d, lane, half, k);
  store_pairs<T, P>(out + base + 2 * d, lane, half, v);
  if (lane == 0) {
    rstd[row * 2 * heads + h] = rq;
    rstd[row * 2 * heads + heads + h] = rk;
  }
}

// Block = tile: items [tile * per_tile, min(+per_tile, items)), warp w takes
// every kWarps-th from the w-th on (neighbouring warps, neighbouring heads).
template <typename T, int P, bool kWeights>
__global__ void __launch_bounds__(kThreads)
    qk_norm_rope_backward_kernel(const T* __restrict__ dout, const T* __restrict__ qkv,
                                 const float* __restrict__ rstd, const float* __restrict__ qw,
                                 const float* __restrict__ kw, const float* __restrict__ cos,
                                 const float* __restrict__ sin, T* __restrict__ dqkv, float* __restrict__ partials,
                                 int64_t items, int64_t per_tile, int tokens, int heads, int hd) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half = hd >> 1;
  const int64_t d = int64_t(heads) * hd;
  const int64_t i0 = int64_t(blockIdx.x) * per_tile, i1 = min(i0 + per_tile, items);
  float aq[P][2], ak[P][2];
#pragma unroll
  for (int i = 0; i < P; ++i) aq[i][0] = aq[i][1] = ak[i][0] = ak[i][1] = 0.f;
  for (int64_t item = i0 + warp; item < i1; item += kWarps) {
    const int64_t row = item / heads;
    const int h = int(item - row * heads), t = int(row % tokens);
    const int64_t base = row * 3 * d + int64_t(h) * hd;
    float gq[P][2], gk[P][2], gv[P][2], xq[P][2], xk[P][2];
    load_pairs<T, P>(dout + base, lane, half, gq);
    load_pairs<T, P>(dout + base + d, lane, half, gk);
    load_pairs<T, P>(dout + base + 2 * d, lane, half, gv);
    load_pairs<T, P>(qkv + base, lane, half, xq);
    load_pairs<T, P>(qkv + base + d, lane, half, xk);
    const float rq = rstd[row * 2 * heads + h], rk = rstd[row * 2 * heads + heads + h];
    const float* c = cos + int64_t(t) * half;
    const float* s = sin + int64_t(t) * half;
    norm_rope_backward<P, kWeights>(gq, xq, rq, qw, c, s, aq, lane, half, hd);
    norm_rope_backward<P, kWeights>(gk, xk, rk, kw, c, s, ak, lane, half, hd);
    store_pairs<T, P>(dqkv + base, lane, half, gq);
    store_pairs<T, P>(dqkv + base + d, lane, half, gk);
    store_pairs<T, P>(dqkv + base + 2 * d, lane, half, gv);
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
    for (int j = threadIdx.x; j < 2 * hd; j += kThreads) {
      const int plane = j / hd, col = j - plane * hd;
      float acc = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) acc += sums[plane][w][col];
      partials[(int64_t(plane) * gridDim.x + blockIdx.x) * hd + col] = acc;
    }
  }
}

template <typename T>
bool pair_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (2 * sizeof(T)) == 0;
}

void check_shape(const char* what, int rows, int tokens, int heads, int head_dim) {
  if (rows < 0 || tokens < 1 || heads < 1 || head_dim < 2 || head_dim % 2 != 0 ||
      head_dim > kQkNormRopeMaxHeadDim || int64_t(rows) * 3 * heads * head_dim > INT32_MAX)
    throw std::invalid_argument(std::string(what) + ": unsupported sizes rows=" + std::to_string(rows) +
                                " tokens=" + std::to_string(tokens) + " heads=" + std::to_string(heads) +
                                " head_dim=" + std::to_string(head_dim));
}

// Pairs per lane for a head dim: 1 up to 64, 2 up to 128, ... 4 up to 256.
int pairs_per_lane(int head_dim) { return (head_dim / 2 + 31) / 32; }

}  // namespace

template <typename T>
void qk_norm_rope_forward(const T* qkv, const float* q_weight, const float* k_weight, const float* cos,
                          const float* sin, T* out, float* rstd, int rows, int tokens, int heads, int head_dim,
                          float eps, cudaStream_t stream) {
  check_shape("qk_norm_rope_forward", rows, tokens, heads, head_dim);
  if (!pair_aligned(qkv) || !pair_aligned(out))
    throw std::invalid_argument("qk_norm_rope_forward: qkv and out must be aligned to two elements");
  const int64_t items = int64_t(rows) * heads;
  if (items == 0) return;
  const dim3 grid(unsigned((items + kWarps - 1) / kWarps));
  auto launch = [&](auto kernel) {
    kernel<<<grid, kThreads, 0, stream>>>(qkv, q_weight, k_weight, cos, sin, out, rstd, items, tokens, heads,
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
void qk_norm_rope_backward(const T* dout, const T* qkv, const float* rstd, const float* q_weight,
                           const float* k_weight, const float* cos, const float* sin, T* dqkv,
                           float* weight_partials, int rows, int tokens, int heads, int head_dim, int tiles,
                           cudaStream_t stream) {
  check_shape("qk_norm_rope_backward", rows, tokens, heads, head_dim);
  if (!pair_aligned(dout) || !pair_aligned(qkv) || !pair_aligned(dqkv))
    throw std::invalid_argument("qk_norm_rope_backward: dout, qkv and dqkv must be aligned to two elements");
  const int64_t items = int64_t(rows) * heads;
  if (tiles < 1 || tiles > std::max<int64_t>(items, 1))
    throw std::invalid_argument("qk_norm_rope_backward: tiles=" + std::to_string(tiles) + " for " +
                                std::to_string(items) + " (row, head) items");
  const int64_t per_tile = std::max<int64_t>(1, (items + tiles - 1) / tiles);
  auto launch = [&](auto kernel) {
    kernel<<<tiles, kThreads, 0, stream>>>(dout, qkv, rstd, q_weight, k_weight, cos, sin, dqkv, weight_partials,
                                           items, per_tile, tokens, heads, head_dim);
    PERFTRAIN_LAUNCH_CHECK();
  };
  const bool weights = weight_partials != nullptr;
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
  template void qk_norm_rope_forward<T>(const T*, const float*, const float*, const float*, const float*, T*,     \
                                        float*, int, int, int, int, float, cudaStream_t);                          \
  template void qk_norm_rope_backward<T>(const T*, const T*, const float*, const float*, const float*,            \
                                         const float*, const float*, T*, float*, int, int, int, int, int,          \
                                         cudaStream_t);
PERFTRAIN_QK_NORM_ROPE_INSTANTIATE(float)
PERFTRAIN_QK_NORM_ROPE_INSTANTIATE(__nv_bfloat16)
PERFTRAIN_QK_NORM_ROPE_INSTANTIATE(__half)

}  // namespace perftrain::kernels
