// The row-norm kernels' one body: adaln_layernorm, residual_adaln, rms_adaln and
// residual_rms_adaln are the two kernel templates below, instantiated on
//   the norm kind   N = Norm::kLayer: xhat = (v - mean) * rstd, mean and variance in two passes;
//                   N = Norm::kRms:   xhat = v * rstd, the mean square in one pass;
//   the residual    RESIDUAL: the row v is x1 = x + gate * branch(y), formed and written by the
//                   forward (kLayer: branch(y) = y + bias; kRms: tanh(gate), branch(y) =
//                   rms(y) * post_weight), and the backward carries dx1 on into dy;
// and each op's header states its maths, bytes and launch shape. Here: the per-element
// arithmetic of each norm kind (in one place, so every kernel sums in the same fixed
// order), the forward row kernel, the backward row-tile kernel, the column-sum reduce kernel,
// and the host side they share: launch shapes, register budgets, the kRms ops' forward. Each
// op's .cu keeps its argument checks, the choice of instantiation and the other launches.
//
// Shapes, common to all four:
//   forward   one warp per row (4 rows a block) while a warp covers the row, a block per
//             row beyond; the row held in registers from its load to the write of h.
//   backward  block (tile, b) takes a run of rows of ONE sample, so every thread owns the
//             same columns on every row and keeps its column sums in registers; they are
//             stored once to fp32 partials [planes][batch][tiles][cols].
// Everything here is inline or a template: the header goes into several .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda_check.h"
#include "kernels/fp8_cast.h"
#include "kernels/fp8_encode.cuh"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels::detail {

// The most threads a row kernel's block has: __launch_bounds__(512, 1) leaves 128 registers a thread.
constexpr int kRowMaxThreads = 512;

enum class Norm { kLayer, kRms };

struct RowStats {
  float mean;  // 0 for kRms
  float rstd;  // 1 / sqrt(variance + eps), or 1 / sqrt(mean square + eps)
};

template <int VEC>
__device__ __forceinline__ void fill(float (&f)[VEC], float v) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) f[j] = v;
}

// The value as stored in T: a norm must see x1 exactly as the residual stream keeps it.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

// ---- the norm kinds: statistics forward, per-element gradient terms backward ----
//
// A row of `cols` values is spread over the blockDim.x threads that share it: thread x
// holds vector c = x + i * blockDim.x (for c < nvec) of VEC values in v[i]. The row sums
// go through row_sum's fixed order, so every thread of the row gets the same bits; all
// threads of the row must call the statistics (row_sum's rules). Thread 0 writes the
// statistics to mean_out[row] / rstd_out[row] where those are not null.

template <Norm N>
struct NormKind;

template <>
struct NormKind<Norm::kLayer> {
  // Column sums of the backward (dy * xhat -> dscale, dy -> dshift) and row sums (g, g * xhat).
  static constexpr int kSums = 2;

  // Two passes over the registers, the mean and then the squared deviations from it
  // (exact where the one-pass E[x^2] - E[x]^2 cancels).
  template <int ITEMS, int VEC>
  __device__ __forceinline__ static RowStats stats(const float (&v)[ITEMS][VEC], int nvec, int cols, float eps,
                                                   float* smem /* [32] */, int row, float* mean_out,
                                                   float* rstd_out) {
    const float inv_cols = 1.f / float(cols);
    float s[1] = {0.f};
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      if (int(threadIdx.x + i * blockDim.x) < nvec) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) s[0] += v[i][j];
      }
    }
    row_sum<1>(s, smem);
    const float mean = s[0] * inv_cols;
    s[0] = 0.f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      if (int(threadIdx.x + i * blockDim.x) < nvec) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float d = v[i][j] - mean;
          s[0] += d * d;
        }
      }
    }
    row_sum<1>(s, smem);
    const float rstd = rsqrtf(s[0] * inv_cols + eps);
    if (threadIdx.x == 0) {
      if (mean_out != nullptr) mean_out[row] = mean;
      if (rstd_out != nullptr) rstd_out[row] = rstd;
    }
    return {mean, rstd};
  }

  __device__ __forceinline__ static float normalise(float v, float mean, float rstd) { return (v - mean) * rstd; }

  // One element's (vector i, element j of the thread's) share of the backward of
  // out = xhat * mult + shift (mult = 1 + scale), dy the gradient of out: g = dy * mult
  // (kept for dx), the column sums of dy * xhat and dy, and the row sums of g and g * xhat,
  // whose means dx needs.
  template <int ITEMS, int VEC>
  __device__ __forceinline__ static void grad_terms(float dy, float mult, float xhat, float& g,
                                                    float (&col)[2][ITEMS][VEC], int i, int j, float (&row)[2]) {
    g = dy * mult;
    col[0][i][j] += dy * xhat;
    col[1][i][j] += dy;
    row[0] += g;
    row[1] += g * xhat;
  }

  // dv once the row's means of g and g * xhat are known: rstd * (g - mean(g) - xhat * mean(g * xhat)).
  __device__ __forceinline__ static float grad_dx(float g, float xhat, float rstd, const float (&mean)[2]) {
    return rstd * (g - mean[0] - xhat * mean[1]);
  }
};

template <>
struct NormKind<Norm::kRms> {
  // One column sum (dy * xhat: the caller turns it into the weight's and the modulation's
  // gradients) and one row sum (g * xhat).
  static constexpr int kSums = 1;

  // One pass (a sum of squares cancels nothing).
  template <int ITEMS, int VEC>
  __device__ __forceinline__ static RowStats stats(const float (&v)[ITEMS][VEC], int nvec, int cols, float eps,
                                                   float* smem /* [32] */, int row, float* /* no mean */,
                                                   float* rstd_out) {
    float s[1] = {0.f};
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      if (int(threadIdx.x + i * blockDim.x) < nvec) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) s[0] = fmaf(v[i][j], v[i][j], s[0]);
      }
    }
    row_sum<1>(s, smem);
    const float rstd = rsqrtf(s[0] * (1.f / float(cols)) + eps);
    if (threadIdx.x == 0 && rstd_out != nullptr) rstd_out[row] = rstd;
    return {0.f, rstd};
  }

  __device__ __forceinline__ static float normalise(float v, float /* mean */, float rstd) { return v * rstd; }

  // One element's share of the backward of out = xhat * mult (mult = weight * (1 + scale)).
  template <int ITEMS, int VEC>
  __device__ __forceinline__ static void grad_terms(float dy, float mult, float xhat, float& g,
                                                    float (&col)[1][ITEMS][VEC], int i, int j, float (&row)[1]) {
    g = dy * mult;
    col[0][i][j] = fmaf(dy, xhat, col[0][i][j]);
    row[0] = fmaf(g, xhat, row[0]);
  }

  // dv once the row's mean of g * xhat is known: rstd * (g - xhat * mean(g * xhat)).
  __device__ __forceinline__ static float grad_dx(float g, float xhat, float rstd, const float (&mean)[1]) {
    return rstd * (g - xhat * mean[0]);
  }
};

// The E4M3 codes of one vector of h (Fp8RowOut's rule: out rounded to TY as h stores it,
// then saturate(. * scale)) at q (8-byte aligned for VEC 8), |.|'s bits max-ed into bits.
template <typename TY, int VEC>
__device__ __forceinline__ void store_fp8_vec(const float (&out)[VEC], uint8_t* __restrict__ q, float scale,
                                              unsigned& bits) {
  uint8_t codes[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float stored = round_to<TY>(out[j]);
    bits = max(bits, fp8_abs_bits(stored));
    codes[j] = fp8_encode<Fp8Format::kE4M3>(stored, scale);
  }
  if constexpr (VEC == 8) {
    uint2 packed;
    auto* b = reinterpret_cast<uint8_t*>(&packed);
#pragma unroll
    for (int j = 0; j < 8; ++j) b[j] = codes[j];
    *reinterpret_cast<uint2*>(q) = packed;
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) q[j] = codes[j];
  }
}

// The kRms forward's last step for the thread's vectors of one row: v becomes xhat =
// v * rstd, and out = xhat * weight * (1 + scale) is stored at h_row, its E4M3 codes at
// q_row (store_fp8_vec), xhat at xhat_row, each where not null. weight (float) and scale
// (the row's sample) may be null: ones, zeros.
template <typename TM, typename TY, int ITEMS, int VEC>
__device__ __forceinline__ void rms_modulate_store(float (&v)[ITEMS][VEC], int nvec, float rstd,
                                                   const float* __restrict__ weight, const TM* __restrict__ scale,
                                                   TY* __restrict__ h_row, TY* __restrict__ xhat_row,
                                                   uint8_t* __restrict__ q_row, float q_scale, unsigned& bits) {
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < nvec) {
      float w[VEC], a[VEC], out[VEC];
      if (weight != nullptr) load_vec<float, VEC>(weight + c * VEC, w); else fill(w, 1.f);
      if (scale != nullptr) load_vec<TM, VEC>(scale + c * VEC, a); else fill(a, 0.f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        v[i][j] = NormKind<Norm::kRms>::normalise(v[i][j], 0.f, rstd);
        out[j] = v[i][j] * w[j] * (1.f + a[j]);
      }
      if (h_row != nullptr) store_vec<TY, VEC>(h_row + int64_t(c) * VEC, out);
      if (q_row != nullptr) store_fp8_vec<TY, VEC>(out, q_row + int64_t(c) * VEC, q_scale, bits);
      if (xhat_row != nullptr) store_vec<TY, VEC>(xhat_row + int64_t(c) * VEC, v[i]);
    }
  }
}

// f(i, c) for each of the thread's vectors of a row: vector c = threadIdx.x +
// i * blockDim.x, for c < nvec (i a constant once unrolled).
template <int ITEMS, typename F>
__device__ __forceinline__ void for_each_vector(int nvec, F&& f) {
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < nvec) f(i, c);
  }
}

// The thread's vectors of one row (as the statistics take them) from src_row.
template <typename T, int ITEMS, int VEC>
__device__ __forceinline__ void load_row(const T* __restrict__ src_row, float (&v)[ITEMS][VEC], int nvec) {
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < nvec) load_vec<T, VEC>(src_row + int64_t(c) * VEC, v[i]);
  }
}

// The norm's dv = NormKind<N>::grad_dx of the thread's vectors of one row, stored at dst_row.
template <Norm N, typename T, int ITEMS, int VEC>
__device__ __forceinline__ void store_grad_dx(T* __restrict__ dst_row, const float (&g)[ITEMS][VEC],
                                              const float (&xhat)[ITEMS][VEC], float rstd,
                                              const float (&mean)[NormKind<N>::kSums], int nvec) {
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < nvec) {
      float out[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) out[j] = NormKind<N>::grad_dx(g[i][j], xhat[i][j], rstd, mean);
      store_vec<T, VEC>(dst_row + int64_t(c) * VEC, out);
    }
  }
}

// ---- the forward ----

// One row per warp (blockDim.y rows a block) or one row per block:
//   v = x, or with RESIDUAL x1 = x + gate * (y + bias)                (kLayer; BIAS: with a bias)
//                           x1 = x + tanh(gate) * rms(y) * post_weight (kRms; y's rstd to y_rstd_out)
//   (rounded to TX, written to x1); then the row statistics (mean_out, rstd_out) and
//   h = xhat * (1 + scale) + shift (kLayer) or xhat * weight * (1 + scale) (kRms), xhat to
//   xhat_out where not null (kLayer: the residual op only). With fp8.q: h's E4M3 codes
//   (kernels/fp8_cast.h, Fp8RowOut) too, and a warp's atomic max of their amax; h may then
//   be null (not written).
// The pointers an instantiation does not use are null (kLayer: weight, post_weight, y_rstd_out;
// kRms: shift, bias, mean_out; without RESIDUAL: gate, y, bias, post_weight, x1, y_rstd_out).
// BIAS: a separate instantiation, so that the path without one keeps its registers.
template <Norm N, bool RESIDUAL, bool BIAS, typename TX, typename TM, typename TY, int VEC, int ITEMS>
__global__ void __launch_bounds__(kRowMaxThreads, N == Norm::kLayer ? 1 : 0)
    row_norm_forward_kernel(const TX* __restrict__ x, const TM* __restrict__ gate, int64_t gate_stride,
                            const TY* __restrict__ y, const float* __restrict__ bias,
                            const float* __restrict__ post_weight, const float* __restrict__ weight,
                            const TM* __restrict__ shift, int64_t shift_stride, const TM* __restrict__ scale,
                            int64_t scale_stride, TX* __restrict__ x1, TY* __restrict__ h,
                            float* __restrict__ y_rstd_out, float* __restrict__ mean_out,
                            float* __restrict__ rstd_out, TY* __restrict__ xhat_out, int rows, int tokens, int cols,
                            float eps, Fp8RowOut fp8) {
  using K = NormKind<N>;
  __shared__ float smem[32];
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;  // a whole warp (warp per row) or a whole block (block per row)
  const int nvec = cols / VEC;
  const int64_t off = int64_t(row) * cols;
  const int b = row / tokens;
  const float q_scale = fp8.q != nullptr ? *fp8.scale : 0.f;
  unsigned q_bits = 0;  // the row's amax bits (fp8.q)

  float v[ITEMS][VEC];
  if constexpr (!RESIDUAL) {
    load_row(x + off, v, nvec);
  } else if constexpr (N == Norm::kLayer) {
    // x1 = x + gate * (y + bias), written out and kept (as stored) for the statistics.
    const TM* gt = gate + int64_t(b) * gate_stride;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = threadIdx.x + i * blockDim.x;
      if (c < nvec) {
        float yv[VEC], g[VEC];
        load_vec<TX, VEC>(x + off + int64_t(c) * VEC, v[i]);
        load_vec<TY, VEC>(y + off + int64_t(c) * VEC, yv);
        load_vec<TM, VEC>(gt + c * VEC, g);
        if constexpr (BIAS) {
          float bv[VEC];
          load_vec<float, VEC>(bias + c * VEC, bv);
#pragma unroll
          for (int j = 0; j < VEC; ++j) yv[j] += bv[j];
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[i][j] = round_to<TX>(v[i][j] + g[j] * yv[j]);
        store_vec<TX, VEC>(x1 + off + int64_t(c) * VEC, v[i]);
      }
    }
  } else {
    // y's norm first, then x1 = x + tanh(gate) * yhat * post_weight in the same registers.
    load_row(y + off, v, nvec);
    const float ry = K::stats(v, nvec, cols, eps, smem, row, nullptr, y_rstd_out).rstd;
    const TM* gt = gate + int64_t(b) * gate_stride;
    for_each_vector<ITEMS>(nvec, [&](int i, int c) {
      float xv[VEC], g[VEC], w[VEC];
      load_vec<TX, VEC>(x + off + int64_t(c) * VEC, xv);
      load_vec<TM, VEC>(gt + c * VEC, g);
      if (post_weight != nullptr) load_vec<float, VEC>(post_weight + c * VEC, w); else fill(w, 1.f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[i][j] = round_to<TX>(xv[j] + tanhf(g[j]) * (v[i][j] * ry * w[j]));
      store_vec<TX, VEC>(x1 + off + int64_t(c) * VEC, v[i]);
    });
  }
  const RowStats st = K::stats(v, nvec, cols, eps, smem, row, mean_out, rstd_out);

  if constexpr (N == Norm::kLayer) {
    // h = xhat * (1 + scale) + shift; only the residual op keeps xhat.
    const TM* sh = shift + int64_t(b) * shift_stride;
    const TM* sc = scale + int64_t(b) * scale_stride;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = threadIdx.x + i * blockDim.x;
      if (c < nvec) {
        float a[VEC], m[VEC], out[VEC];
        load_vec<TM, VEC>(sc + c * VEC, a);
        load_vec<TM, VEC>(sh + c * VEC, m);
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[i][j] = K::normalise(v[i][j], st.mean, st.rstd);  // xhat
#pragma unroll
        for (int j = 0; j < VEC; ++j) out[j] = v[i][j] * (1.f + a[j]) + m[j];
        if (h != nullptr) store_vec<TY, VEC>(h + off + int64_t(c) * VEC, out);
        if (fp8.q != nullptr) store_fp8_vec<TY, VEC>(out, fp8.q + off + int64_t(c) * VEC, q_scale, q_bits);
        if constexpr (RESIDUAL) {
          if (xhat_out != nullptr) store_vec<TY, VEC>(xhat_out + off + int64_t(c) * VEC, v[i]);
        }
      }
    }
  } else {
    // h = xhat * weight * (1 + scale).
    const TM* sc = scale != nullptr ? scale + int64_t(b) * scale_stride : nullptr;
    rms_modulate_store(v, nvec, st.rstd, weight, sc, h != nullptr ? h + off : nullptr,
                       xhat_out != nullptr ? xhat_out + off : nullptr, fp8.q != nullptr ? fp8.q + off : nullptr,
                       q_scale, q_bits);
  }
  if (fp8.q != nullptr) fp8_warp_amax(q_bits, fp8.amax);
}

// ---- the backward ----

// Block (tile, b): rows b*tokens + [tile*rows_per_tile, ...) of one sample. Per row:
//   phase 1, the norm's backward: xhat (read as the forward kept it with XHAT, else formed
//     from x, or x1, and the saved statistics), dh and the per-column multiplier give g, the
//     norm's column sums and, after the row sums, the norm's dv. The multiplier is (1 + scale)
//     for kLayer, weight * (1 + scale) for kRms; it is held in registers across rows, except
//     for the residual kLayer, which re-reads scale per row from L1 and leaves the registers
//     to its column sums.
//   without RESIDUAL: dx = dv.
//   with RESIDUAL: dx1 = dx1_ext (null = zero) + dv, written as dx, and the branch's backward:
//     kLayer: dy = dx1 * gate, column sums of dx1 * y (-> dgate) and, SUM_DX1, of dx1
//       (-> the bias's share); dx1_ext and y are read only after the row sums, so that they
//       take no registers across the reduction (unless EARLY).
//     kRms:   y's norm: g2 = dx1 * tanh(gate) * post_weight, the column sum of dx1 * yhat
//       and dy = ry * (g2 - yhat * mean(g2 * yhat)); phase 1 only where dh is not null.
// EARLY (residual, one vector a thread): the row inputs (xhat or x1, dh, dx1_ext, y) are
// loaded as raw words one row ahead, so each row costs one memory round trip instead of two
// (kRms too: its dx1_ext and y were read after the first row sum) and the next row's loads
// are in flight during this row's block reductions.
// Partial planes: the norm's column sums first (kLayer: dh * xhat, dh; kRms: dh * xhat), then
// the branch's (kLayer: dx1 * y, and dx1 with SUM_DX1; kRms: dx1 * yhat).
template <Norm N, bool RESIDUAL, typename TX, typename TM, typename TY, int VEC, int ITEMS, bool XHAT, bool SUM_DX1,
          bool EARLY>
__global__ void __launch_bounds__(kRowMaxThreads, 1)
    row_norm_backward_kernel(const TX* __restrict__ dx1_ext, const TY* __restrict__ dh, const TX* __restrict__ x,
                             const TY* __restrict__ xhat, const TY* __restrict__ y,
                             const float* __restrict__ post_weight, const float* __restrict__ weight,
                             const TM* __restrict__ gate, int64_t gate_stride, const TM* __restrict__ scale,
                             int64_t scale_stride, const float* __restrict__ y_rstd, const float* __restrict__ mean,
                             const float* __restrict__ rstd, TX* __restrict__ dx, TY* __restrict__ dy,
                             float* __restrict__ partials, int tokens, int cols, int rows_per_tile, int64_t plane) {
  using K = NormKind<N>;
  using R = NormKind<Norm::kRms>;  // the residual kRms's branch norm
  constexpr int S = K::kSums;
  constexpr bool kLayerResidual = N == Norm::kLayer && RESIDUAL;
  constexpr bool kRmsResidual = N == Norm::kRms && RESIDUAL;
  __shared__ float smem[32 * S];
  const int tile = blockIdx.x, b = blockIdx.y, tiles = gridDim.x;
  const int nvec = cols / VEC;
  const float inv_cols = 1.f / float(cols);
  const int t0 = tile * rows_per_tile;
  const int t1 = min(tokens, t0 + rows_per_tile);
  const bool has_dh = !kRmsResidual || dh != nullptr;  // the same for the whole block
  const TM* gt = RESIDUAL ? gate + int64_t(b) * gate_stride : nullptr;
  const TM* sc = (N == Norm::kLayer || scale != nullptr) ? scale + int64_t(b) * scale_stride : nullptr;

  // The column sums: the norm's S, and the branch's (kLayer: dx1 * y, dx1; kRms: dx1 * yhat).
  float acc[S][ITEMS][VEC], acc_b[1][ITEMS][VEC], acc_dx1[ITEMS][VEC];
  // The per-column multipliers held across rows: the norm's, and the kRms branch's tanh(gate) * post_weight.
  float mult[ITEMS][VEC], mult_b[ITEMS][VEC];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
#pragma unroll
      for (int k = 0; k < S; ++k) acc[k][i][j] = 0.f;
      acc_b[0][i][j] = acc_dx1[i][j] = 0.f;
      mult[i][j] = 1.f;
      mult_b[i][j] = 0.f;
    }
    if (!kLayerResidual && c < nvec) {
      float w[VEC], a[VEC];
      if (N == Norm::kRms && weight != nullptr) load_vec<float, VEC>(weight + c * VEC, w); else fill(w, 1.f);
      if (N == Norm::kLayer || sc != nullptr) load_vec<TM, VEC>(sc + c * VEC, a); else fill(a, 0.f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) mult[i][j] = w[j] * (1.f + a[j]);
      if constexpr (kRmsResidual) {
        float g[VEC], pw[VEC];
        load_vec<TM, VEC>(gt + c * VEC, g);
        if (post_weight != nullptr) load_vec<float, VEC>(post_weight + c * VEC, pw); else fill(pw, 1.f);
#pragma unroll
        for (int j = 0; j < VEC; ++j) mult_b[i][j] = tanhf(g[j]) * pw[j];
      }
    }
  }

  // EARLY's raw row inputs: this row's (cur) and the next one's.
  using TXH = std::conditional_t<XHAT, TY, TX>;
  struct RowInputs {
    RawVec<TXH, VEC> xh[ITEMS];
    RawVec<TY, VEC> d[ITEMS], y[ITEMS];
    RawVec<TX, VEC> e[ITEMS];
    float mu, rs;
  };
  RowInputs cur, next;
  // (kRms residual without dh: the norm's inputs are neither given nor read.)
  auto load_row = [&](int t, RowInputs& in) {
    const int64_t row = int64_t(b) * tokens + t, off = row * cols;
    in.mu = (N == Norm::kRms || XHAT) ? 0.f : mean[row];
    in.rs = has_dh ? rstd[row] : 0.f;  // see above: without dh, rstd may be null
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = threadIdx.x + i * blockDim.x;
      if (c < nvec) {
        if (has_dh) {
          if constexpr (XHAT) {
            load_raw<TY, VEC>(xhat + off + int64_t(c) * VEC, in.xh[i]);
          } else {
            load_raw<TX, VEC>(x + off + int64_t(c) * VEC, in.xh[i]);
          }
          load_raw<TY, VEC>(dh + off + int64_t(c) * VEC, in.d[i]);
        }
        if (dx1_ext != nullptr) load_raw<TX, VEC>(dx1_ext + off + int64_t(c) * VEC, in.e[i]);
        load_raw<TY, VEC>(y + off + int64_t(c) * VEC, in.y[i]);
      }
    }
  };
  if constexpr (EARLY) {
    if (t0 < t1) load_row(t0, cur);
  }

  for (int t = t0; t < t1; ++t) {  // the same trip count for the whole block
    const int64_t row = int64_t(b) * tokens + t;
    const int64_t off = row * cols;
    if constexpr (EARLY) {
      if (t + 1 < t1) load_row(t + 1, next);
    }
    const float ry = kRmsResidual ? y_rstd[row] : 0.f;
    float xh[ITEMS][VEC], g[ITEMS][VEC];  // kRms residual: x1hat then yhat, g1 then g2
    float rs = 0.f, mg[S] = {};

    // Phase 1: the norm's backward.
    if (has_dh) {
      const float mu = EARLY ? cur.mu : (N == Norm::kRms || XHAT) ? 0.f : mean[row];
      rs = EARLY ? cur.rs : rstd[row];
      float s[S] = {};  // the row sums
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c < nvec) {
          float d[VEC];
          if constexpr (EARLY) {
            raw_to_float<TXH, VEC>(cur.xh[i], xh[i]);
            raw_to_float<TY, VEC>(cur.d[i], d);
          } else if constexpr (XHAT) {
            load_vec<TY, VEC>(xhat + off + int64_t(c) * VEC, xh[i]);
            load_vec<TY, VEC>(dh + off + int64_t(c) * VEC, d);
          } else {
            load_vec<TX, VEC>(x + off + int64_t(c) * VEC, xh[i]);
            load_vec<TY, VEC>(dh + off + int64_t(c) * VEC, d);
          }
          if constexpr (kLayerResidual) {
            float a[VEC];
            load_vec<TM, VEC>(sc + c * VEC, a);
#pragma unroll
            for (int j = 0; j < VEC; ++j) mult[i][j] = 1.f + a[j];
          }
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            if constexpr (!XHAT) xh[i][j] = K::normalise(xh[i][j], mu, rs);
            K::grad_terms(d[j], mult[i][j], xh[i][j], g[i][j], acc, i, j, s);
          }
        }
      }
      row_sum<S>(s, smem);
#pragma unroll
      for (int k = 0; k < S; ++k) mg[k] = s[k] * inv_cols;
    }

    if constexpr (!RESIDUAL) {
      store_grad_dx<N>(dx + off, g, xh, rs, mg, nvec);
    } else if constexpr (N == Norm::kLayer) {
      // Phase 2: dx1, dy = dx1 * gate and the branch's column sums.
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c < nvec) {
          float e[VEC], yv[VEC], gv[VEC];  // dx1_ext (then dx1), y, gate
          if constexpr (EARLY) {
            if (dx1_ext != nullptr) raw_to_float<TX, VEC>(cur.e[i], e); else fill(e, 0.f);
            raw_to_float<TY, VEC>(cur.y[i], yv);
          } else {
            if (dx1_ext != nullptr) load_vec<TX, VEC>(dx1_ext + off + int64_t(c) * VEC, e); else fill(e, 0.f);
            load_vec<TY, VEC>(y + off + int64_t(c) * VEC, yv);
          }
          load_vec<TM, VEC>(gt + c * VEC, gv);
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            e[j] += K::grad_dx(g[i][j], xh[i][j], rs, mg);  // dx1
            acc_b[0][i][j] += e[j] * yv[j];
            if constexpr (SUM_DX1) acc_dx1[i][j] += e[j];
            yv[j] = e[j] * gv[j];  // dy
          }
          store_vec<TX, VEC>(dx + off + int64_t(c) * VEC, e);
          store_vec<TY, VEC>(dy + off + int64_t(c) * VEC, yv);
        }
      }
      if constexpr (EARLY) cur = next;
    } else {
      // Phase 2: dx1, then y's norm terms; phase 3: dy.
      float s2[1] = {0.f};  // sum g2 * yhat
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c < nvec) {
          float e[VEC];  // dx1
          if constexpr (EARLY) {
            if (dx1_ext != nullptr) raw_to_float<TX, VEC>(cur.e[i], e); else fill(e, 0.f);
          } else {
            if (dx1_ext != nullptr) load_vec<TX, VEC>(dx1_ext + off + int64_t(c) * VEC, e); else fill(e, 0.f);
          }
          if (has_dh) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) e[j] += K::grad_dx(g[i][j], xh[i][j], rs, mg);
          }
          store_vec<TX, VEC>(dx + off + int64_t(c) * VEC, e);
          if constexpr (EARLY) {
            raw_to_float<TY, VEC>(cur.y[i], xh[i]);
          } else {
            load_vec<TY, VEC>(y + off + int64_t(c) * VEC, xh[i]);
          }
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            xh[i][j] = R::normalise(xh[i][j], 0.f, ry);  // yhat
            R::grad_terms(e[j], mult_b[i][j], xh[i][j], g[i][j], acc_b, i, j, s2);
          }
        }
      }
      row_sum<1>(s2, smem);
      const float mg2[1] = {s2[0] * inv_cols};
      store_grad_dx<Norm::kRms>(dy + off, g, xh, ry, mg2, nvec);
      if constexpr (EARLY) cur = next;
    }
  }

  // The partial planes, stored once.
  float* p0 = partials + (int64_t(b) * tiles + tile) * cols;
#pragma unroll
  for (int k = 0; k < S; ++k) store_plane(p0 + k * plane, acc[k], nvec);
  if constexpr (RESIDUAL) store_plane(p0 + S * plane, acc_b[0], nvec);
  if constexpr (SUM_DX1) store_plane(p0 + (S + 1) * plane, acc_dx1, nvec);
}

// ---- the per-sample column sums ----

// A thread per (column c, sample b): the planes' partial sums over tiles, in tile order,
// and what each gradient takes of them:
//   kLayer:           dscale = sum dh * xhat, dshift = sum dh;
//   kLayer residual:  dgate = sum dx1 * y + bias * sum dx1 (the bias's share of
//                     sum dx1 * (y + bias); plane 3 with sum_dx1), dbias_per_sample = gate * sum dx1;
//   kRms:             Q = sum dh * xhat: dscale = weight * Q, dweight_per_sample = (1 + scale) * Q;
//   kRms residual:    and Q2 = sum dx1 * yhat: dgate = (1 - tg^2) * post_weight * Q2,
//                     dpost_weight_per_sample = tg * Q2 (tg = tanh(gate)).
// Outputs that are null are not written (kLayer: dgate, dshift and dscale are always given).
template <Norm N, bool RESIDUAL, typename TM>
__global__ void row_norm_reduce_kernel(const float* __restrict__ partials, int64_t plane, int tiles, int cols,
                                       bool sum_dx1, const float* __restrict__ bias,
                                       const float* __restrict__ post_weight, const float* __restrict__ weight,
                                       const TM* __restrict__ gate, int64_t gate_stride, const TM* __restrict__ scale,
                                       int64_t scale_stride, TM* __restrict__ dgate, TM* __restrict__ dshift,
                                       TM* __restrict__ dscale, float* __restrict__ dbias_per_sample,
                                       float* __restrict__ dpost_weight_per_sample,
                                       float* __restrict__ dweight_per_sample) {
  const int b = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const float* p = partials + int64_t(b) * tiles * cols + c;
  const int64_t o = int64_t(b) * cols + c;
  if constexpr (N == Norm::kLayer && !RESIDUAL) {
    float s[2];
    sum_tiles<2>(p, plane, tiles, cols, s);
    dscale[o] = from_float<TM>(s[0]);
    dshift[o] = from_float<TM>(s[1]);
  } else if constexpr (N == Norm::kLayer) {
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    if (sum_dx1)
      sum_tiles<4>(p, plane, tiles, cols, s);
    else
      sum_tiles<3>(p, plane, tiles, cols, s);
    if (bias != nullptr) s[2] = fmaf(bias[c], s[3], s[2]);
    if (dbias_per_sample != nullptr) dbias_per_sample[o] = to_float(gate[int64_t(b) * gate_stride + c]) * s[3];
    dgate[o] = from_float<TM>(s[2]);
    dscale[o] = from_float<TM>(s[0]);
    dshift[o] = from_float<TM>(s[1]);
  } else {
    float q[RESIDUAL ? 2 : 1];
    sum_tiles<RESIDUAL ? 2 : 1>(p, plane, tiles, cols, q);
    if constexpr (RESIDUAL) {
      const float tg = tanhf(to_float(gate[int64_t(b) * gate_stride + c]));
      const float pw = post_weight != nullptr ? post_weight[c] : 1.f;
      dgate[o] = from_float<TM>((1.f - tg * tg) * pw * q[1]);
      if (dpost_weight_per_sample != nullptr) dpost_weight_per_sample[o] = tg * q[1];
    }
    if (dscale != nullptr) dscale[o] = from_float<TM>((weight != nullptr ? weight[c] : 1.f) * q[0]);
    if (dweight_per_sample != nullptr) {
      const float a = scale != nullptr ? to_float(scale[int64_t(b) * scale_stride + c]) : 0.f;
      dweight_per_sample[o] = (1.f + a) * q[0];
    }
  }
}

// ---- host side: the launch shapes ----

// Threads per row: the fewest whole warps that cover nvec vectors at `items` a thread.
inline int row_norm_threads(int nvec, int items, const char* what) {
  return row_threads(nvec, items, kRowMaxThreads, what);
}

// 16-byte vectors for every pointer given (null ones are absent arguments).
template <typename... T>
bool all_vec8_aligned(const T*... p) {
  return ((p == nullptr || vec8_aligned(p)) && ...);
}

struct RowLaunch {
  dim3 grid, block;
};

// The forward's: a warp per row (4 rows a block) where one covers the row, a block per row beyond.
inline RowLaunch forward_rows(int rows, int nvec, int items, const char* what) {
  const int per_row = row_norm_threads(nvec, items, what);
  const dim3 block(per_row, per_row == 32 ? 4 : 1);
  return {dim3((rows + block.y - 1) / block.y), block};
}

// The backward's: a block of `threads` per (tile, sample).
inline RowLaunch backward_tiles(int tiles_per_sample, int batch, int threads) {
  return {dim3(tiles_per_sample, batch), dim3(threads)};
}

// The reduce kernel's: a thread per (column, sample), 256 a block.
inline RowLaunch reduce_columns(int cols, int batch) { return {dim3((cols + 255) / 256, batch), dim3(256)}; }

// The kLayer ops' register budgets (both take the same): ITEMS vectors of VEC elements a
// thread. Forward: the row (x, or x1) lives across it; a warp covers D <= 1536 (VEC 8) or
// 512 (VEC 1). Backward: 5 arrays of ITEMS * VEC live in the row loop (6 with the
// residual's bias sums); the scalar path (odd widths, misaligned views) spills a few
// registers at 16 items, which is acceptable there.
template <int VEC> constexpr int layer_fwd_items() { return VEC == 8 ? 6 : 16; }
template <int VEC> constexpr int layer_bwd_items() { return VEC == 8 ? 2 : 16; }

// A row kernel's fp8 output (Fp8RowOut): its scale and amax with q; h left out only for it.
inline void check_fp8_out(const char* what, const void* h, const Fp8RowOut& fp8) {
  if (fp8.q != nullptr && (fp8.scale == nullptr || fp8.amax == nullptr))
    throw std::invalid_argument(std::string(what) + ": an fp8 output needs its scale and amax");
  if (h == nullptr && fp8.q == nullptr)
    throw std::invalid_argument(std::string(what) + ": h may be left out (null) only for an fp8 output");
}

// The kRms ops' forward, rms_adaln (RESIDUAL false: gate, y, post_weight, x1 and y_rstd
// null) and residual_rms_adaln: the sizes, the vector width and the launch. Both take the
// same register budget: a warp per row up to 1536 columns with the fewest vectors a lane
// that cover the row (2 up to 512 columns, then 3, 4, 5, 6 by 256: fewer registers, more
// rows in flight per SM, as residual_adaln's forward measured), a block per row of 2
// vectors a thread beyond, and 16 elements a thread unvectorised.
template <bool RESIDUAL, typename TX, typename TM, typename TY>
void rms_forward(const char* what, int max_cols, const TX* x, const TM* gate, int64_t gate_stride, const TY* y,
                 const float* post_weight, const float* weight, const TM* scale, int64_t scale_stride, TX* x1, TY* h,
                 float* y_rstd, float* rstd, TY* xhat, int batch, int tokens, int cols, float eps,
                 cudaStream_t stream, const Fp8RowOut& fp8) {
  check_sizes(what, batch, tokens, cols, max_cols);
  const int rows = batch * tokens;
  if (rows == 0) return;  // no rows: nothing written, h may be an empty tensor's null pointer
  check_fp8_out(what, h, fp8);
  const bool vec8 = cols % 8 == 0 && gate_stride % 8 == 0 && (scale == nullptr || scale_stride % 8 == 0) &&
                    all_vec8_aligned(gate, scale, x, y, post_weight, weight, x1, h, xhat, fp8.q);
  auto launch = [&](auto kernel, int vec, int items) {
    const RowLaunch l = forward_rows(rows, cols / vec, items, what);
    kernel<<<l.grid, l.block, 0, stream>>>(x, gate, gate_stride, y, nullptr, post_weight, weight, nullptr, 0, scale,
                                           scale_stride, x1, h, y_rstd, nullptr, rstd, xhat, rows, tokens, cols, eps, fp8);
    PERFTRAIN_LAUNCH_CHECK();
  };
  if (!vec8)
    launch(row_norm_forward_kernel<Norm::kRms, RESIDUAL, false, TX, TM, TY, 1, 16>, 1, 16);
  else if (cols <= 8 * 2 * 32 || cols > 8 * 6 * 32)
    launch(row_norm_forward_kernel<Norm::kRms, RESIDUAL, false, TX, TM, TY, 8, 2>, 8, 2);
  else if (cols <= 8 * 3 * 32)
    launch(row_norm_forward_kernel<Norm::kRms, RESIDUAL, false, TX, TM, TY, 8, 3>, 8, 3);
  else if (cols <= 8 * 4 * 32)
    launch(row_norm_forward_kernel<Norm::kRms, RESIDUAL, false, TX, TM, TY, 8, 4>, 8, 4);
  else if (cols <= 8 * 5 * 32)
    launch(row_norm_forward_kernel<Norm::kRms, RESIDUAL, false, TX, TM, TY, 8, 5>, 8, 5);
  else
    launch(row_norm_forward_kernel<Norm::kRms, RESIDUAL, false, TX, TM, TY, 8, 6>, 8, 6);
}

// Tiles per sample by waves (wave_row_tiles) of the blocks of `threads` that an SM holds
// at the register budget of __launch_bounds__(512, 1): 512 / threads.
inline int row_norm_wave_tiles(int batch, int tokens, int threads, int sm_count) {
  const int64_t slots = int64_t(std::max(1, kRowMaxThreads / threads)) * std::max(sm_count, 1);
  return wave_row_tiles(batch, tokens, slots, /*overhead_rows=*/2);
}

// f(std::true_type) where the backward reads a kept xhat, f(std::false_type) otherwise. A
// kept xhat saves memory only in a 16-bit TY: only those instantiate the XHAT kernels.
template <typename TY, typename F>
void with_xhat(const char* what, bool xhat, F&& f) {
  if constexpr (sizeof(TY) == 2) {
    if (xhat)
      f(std::true_type{});
    else
      f(std::false_type{});
  } else {
    if (xhat) throw std::invalid_argument(std::string(what) + ": xhat is kept only in a 16-bit type");
    f(std::false_type{});
  }
}

}  // namespace perftrain::kernels::detail
