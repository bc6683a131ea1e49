// The LayerNorm arithmetic of one row held in registers, shared by the row
// kernels that normalise (adaln_layernorm, residual_adaln): the statistics
// forward and the per-element terms of the gradient backward, in one place,
// so that both kernels sum them in the same fixed order.
#pragma once

#include <cuda_runtime.h>

#include "kernels/vector_io.cuh"

namespace perftrain::kernels::detail {

struct RowStats {
  float mean;
  float rstd;  // 1 / sqrt(variance + eps)
};

// The row of `cols` values is spread over the blockDim.x threads that share
// it: thread x holds vector c = x + i * blockDim.x (for c < nvec) of VEC
// values in v[i]. Two passes over the registers, the mean and then the
// squared deviations from it (exact where the one-pass E[x^2] - E[x]^2
// cancels), each summed in row_sum's fixed order, so every thread of the row
// gets the same bits. Thread 0 writes mean_out[row] and rstd_out[row] where
// they are not null. All threads of the row must call it (row_sum's rules).
template <int ITEMS, int VEC>
__device__ __forceinline__ RowStats layernorm_row_stats(const float (&v)[ITEMS][VEC], int nvec, int cols, float eps,
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

// One element's share of the LayerNorm backward of its row, with dy the
// gradient of the normalised output, scale1 = 1 + scale its modulation and
// xhat = (x - mean) * rstd: g = dy * scale1 (kept for dx), the column sums of
// dy * xhat (-> dscale) and dy (-> dshift), and the row sums of g and
// g * xhat, whose means dx needs.
__device__ __forceinline__ void layernorm_grad_terms(float dy, float scale1, float xhat, float& g, float& sum_dy_xhat,
                                                     float& sum_dy, float (&row)[2]) {
  g = dy * scale1;
  sum_dy_xhat += dy * xhat;
  sum_dy += dy;
  row[0] += g;
  row[1] += g * xhat;
}

// The element's dx once the row's means of g and g * xhat are known:
// rstd * (g - mean(g) - xhat * mean(g * xhat)).
__device__ __forceinline__ float layernorm_grad_dx(float g, float xhat, float rstd, float mean_g, float mean_gx) {
  return rstd * (g - mean_g - xhat * mean_gx);
}

}  // namespace perftrain::kernels::detail
