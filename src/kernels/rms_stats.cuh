// The RMSNorm arithmetic of one row held in registers, shared by the row
// kernels that RMS-normalise (rms_adaln, residual_rms_adaln): the statistic
// forward and the per-element terms of the gradient backward, in one place,
// so that both kernels sum them in the same fixed order. The LayerNorm
// counterpart is layernorm_stats.cuh; RMSNorm has no mean, so the statistic is
// one pass (a sum of squares cancels nothing) and the gradient one row sum.
#pragma once

#include <cuda_runtime.h>

#include "kernels/vector_io.cuh"

namespace perftrain::kernels::detail {

// rstd = 1 / sqrt(mean(v^2) + eps) of the row of `cols` values spread over the
// blockDim.x threads that share it (thread x holds vector c = x + i *
// blockDim.x, for c < nvec, of VEC values in v[i]), summed in row_sum's fixed
// order so every thread of the row gets the same bits. Thread 0 writes
// rstd_out[row] where it is not null. All threads of the row must call it
// (row_sum's rules).
template <int ITEMS, int VEC>
__device__ __forceinline__ float rms_row_rstd(const float (&v)[ITEMS][VEC], int nvec, int cols, float eps,
                                              float* smem /* [32] */, int row, float* rstd_out) {
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
  return rstd;
}

// One element's share of the backward of out = xhat * mult (xhat = v * rstd,
// mult the element's weight times its modulation), with dy the gradient of
// out: g = dy * mult (the gradient of xhat, kept for dx), the column sum of
// dy * xhat (the caller turns it into the weight's and the modulation's
// gradients) and the row sum of g * xhat, whose mean dx needs.
__device__ __forceinline__ void rms_grad_terms(float dy, float mult, float xhat, float& g, float& col_dy_xhat,
                                               float& row_g_xhat) {
  g = dy * mult;
  col_dy_xhat = fmaf(dy, xhat, col_dy_xhat);
  row_g_xhat = fmaf(g, xhat, row_g_xhat);
}

// The element's dv once the row's mean of g * xhat is known:
// rstd * (g - xhat * mean(g * xhat)).
__device__ __forceinline__ float rms_grad_dx(float g, float xhat, float rstd, float mean_gx) {
  return rstd * (g - xhat * mean_gx);
}

template <int VEC>
__device__ __forceinline__ void fill(float (&f)[VEC], float v) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) f[j] = v;
}

// The forward's last step for the thread's vectors of one row (as in
// rms_row_rstd): v becomes xhat = v * rstd, and out = xhat * weight *
// (1 + scale) is stored at h_row, xhat at xhat_row where that is not null.
// weight (float) and scale (the row's sample) may be null: ones, zeros.
template <typename TM, typename TY, int ITEMS, int VEC>
__device__ __forceinline__ void rms_modulate_store(float (&v)[ITEMS][VEC], int nvec, float rstd,
                                                   const float* __restrict__ weight, const TM* __restrict__ scale,
                                                   TY* __restrict__ h_row, TY* __restrict__ xhat_row) {
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < nvec) {
      float w[VEC], a[VEC], out[VEC];
      if (weight != nullptr) load_vec<float, VEC>(weight + c * VEC, w); else fill(w, 1.f);
      if (scale != nullptr) load_vec<TM, VEC>(scale + c * VEC, a); else fill(a, 0.f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        v[i][j] *= rstd;
        out[j] = v[i][j] * w[j] * (1.f + a[j]);
      }
      store_vec<TY, VEC>(h_row + int64_t(c) * VEC, out);
      if (xhat_row != nullptr) store_vec<TY, VEC>(xhat_row + int64_t(c) * VEC, v[i]);
    }
  }
}

}  // namespace perftrain::kernels::detail
