#include "kernels/residual_rms_adaln.h"

#include <algorithm>
#include <stdexcept>
#include <type_traits>

#include "kernels/cuda_check.h"
#include "kernels/rms_stats.cuh"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {
namespace {

using detail::fill;
using detail::from_float;
using detail::load_vec;
using detail::rms_grad_dx;
using detail::rms_grad_terms;
using detail::rms_modulate_store;
using detail::rms_row_rstd;
using detail::row_sum;
using detail::store_vec;
using detail::to_float;
using detail::vec8_aligned;

// Register budget per thread: ITEMS vectors of VEC elements of the row.
// Forward: the row (y, then x1 in the same registers). Backward: the two
// column sums and the two per-column multipliers (pre_weight * (1 + scale) and
// tanh(gate) * post_weight, the same on every row of the block's sample) live
// across rows, two row arrays (x1hat then yhat, g1 then dx1 then g2) across a
// row: 6 arrays. Rows up to kNarrowCols take one 8-element vector a thread
// (48 floats; more threads per row instead), wider ones two (96 floats, near
// the 128 registers that 512 threads a block allow).
constexpr int kMaxThreads = 512;
constexpr int kNarrowCols = kMaxThreads * 8;
constexpr int kFwdItems1 = 16;
static_assert(kMaxThreads * 8 * 2 >= kResidualRmsAdaLNMaxCols && kMaxThreads * 16 >= kResidualRmsAdaLNMaxCols &&
                  kMaxThreads * kFwdItems1 >= kResidualRmsAdaLNMaxCols,
              "the registers must cover the widest row");

int threads_per_row(int nvec, int items) {
  return detail::row_threads(nvec, items, kMaxThreads, "residual_rms_adaln");
}

// The value as stored in T: the norm must see x1 exactly as the residual stream keeps it.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

// One row per warp (blockDim.y rows a block) or one row per block.
template <typename TX, typename TM, typename TA, int VEC, int ITEMS>
__global__ void __launch_bounds__(kMaxThreads)
    residual_rms_adaln_forward_kernel(const TX* __restrict__ x, const TM* __restrict__ gate, int64_t gate_stride,
                                      const TA* __restrict__ y, const float* __restrict__ post_weight,
                                      const float* __restrict__ pre_weight, const TM* __restrict__ scale,
                                      int64_t scale_stride, TX* __restrict__ x1, TA* __restrict__ h,
                                      float* __restrict__ y_rstd_out, float* __restrict__ rstd_out,
                                      TA* __restrict__ xhat_out, int rows, int tokens, int cols, float eps) {
  __shared__ float smem[32];
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;  // a whole warp (warp per row) or a whole block (block per row)
  const int nvec = cols / VEC;
  const int64_t off = int64_t(row) * cols;
  const int b = row / tokens;

  // y's norm first, then x1 = x + tanh(gate) * yhat * post_weight in the same registers.
  float v[ITEMS][VEC];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < nvec) load_vec<TA, VEC>(y + off + int64_t(c) * VEC, v[i]);
  }
  const float ry = rms_row_rstd(v, nvec, cols, eps, smem, row, y_rstd_out);
  const TM* gt = gate + int64_t(b) * gate_stride;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < nvec) {
      float xv[VEC], g[VEC], w[VEC];
      load_vec<TX, VEC>(x + off + int64_t(c) * VEC, xv);
      load_vec<TM, VEC>(gt + c * VEC, g);
      if (post_weight != nullptr) load_vec<float, VEC>(post_weight + c * VEC, w); else fill(w, 1.f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[i][j] = round_to<TX>(xv[j] + tanhf(g[j]) * (v[i][j] * ry * w[j]));
      store_vec<TX, VEC>(x1 + off + int64_t(c) * VEC, v[i]);
    }
  }
  const float r1 = rms_row_rstd(v, nvec, cols, eps, smem, row, rstd_out);

  const TM* sc = scale != nullptr ? scale + int64_t(b) * scale_stride : nullptr;
  rms_modulate_store(v, nvec, r1, pre_weight, sc, h + off, xhat_out != nullptr ? xhat_out + off : nullptr);
}

// Block (tile, b): rows b*tokens + [tile*rows_per_tile, ...) of one sample.
// XHAT: read x1's normalised rows the forward kept (TA) instead of x1.
// Per row: phase 1 (only with dh) x1's norm, the row sum of g1 * x1hat;
// phase 2 dx1 = dx1_ext + the norm's share, written as dx, then y's norm
// terms, the row sum of g2 * yhat; phase 3 dy.
template <typename TX, typename TM, typename TA, int VEC, int ITEMS, bool XHAT>
__global__ void __launch_bounds__(kMaxThreads, 1)
    residual_rms_adaln_backward_kernel(const TX* __restrict__ dx1_ext, const TA* __restrict__ dh,
                                       const TX* __restrict__ x1, const TA* __restrict__ xhat,
                                       const TA* __restrict__ y, const float* __restrict__ post_weight,
                                       const float* __restrict__ pre_weight, const TM* __restrict__ gate,
                                       int64_t gate_stride, const TM* __restrict__ scale, int64_t scale_stride,
                                       const float* __restrict__ y_rstd, const float* __restrict__ rstd,
                                       TX* __restrict__ dx, TA* __restrict__ dy, float* __restrict__ partials,
                                       int tokens, int cols, int rows_per_tile, int64_t plane) {
  __shared__ float smem[32];
  const int tile = blockIdx.x, b = blockIdx.y, tiles = gridDim.x;
  const int nvec = cols / VEC;
  const float inv_cols = 1.f / float(cols);
  const int t0 = tile * rows_per_tile;
  const int t1 = min(tokens, t0 + rows_per_tile);
  const bool has_dh = dh != nullptr;  // the same for the whole block
  const TM* gt = gate + int64_t(b) * gate_stride;
  const TM* sc = scale != nullptr ? scale + int64_t(b) * scale_stride : nullptr;

  // m1 = pre_weight * (1 + scale), m2 = tanh(gate) * post_weight; q1, q2 the column sums.
  float m1[ITEMS][VEC], m2[ITEMS][VEC], q1[ITEMS][VEC], q2[ITEMS][VEC];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    fill(q1[i], 0.f);
    fill(q2[i], 0.f);
    fill(m1[i], 1.f);
    fill(m2[i], 0.f);
    if (c < nvec) {
      float qw[VEC], a[VEC], g[VEC], pw[VEC];
      if (pre_weight != nullptr) load_vec<float, VEC>(pre_weight + c * VEC, qw); else fill(qw, 1.f);
      if (sc != nullptr) load_vec<TM, VEC>(sc + c * VEC, a); else fill(a, 0.f);
      load_vec<TM, VEC>(gt + c * VEC, g);
      if (post_weight != nullptr) load_vec<float, VEC>(post_weight + c * VEC, pw); else fill(pw, 1.f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        m1[i][j] = qw[j] * (1.f + a[j]);
        m2[i][j] = tanhf(g[j]) * pw[j];
      }
    }
  }

  for (int t = t0; t < t1; ++t) {  // the same trip count for the whole block
    const int64_t row = int64_t(b) * tokens + t;
    const int64_t off = row * cols;
    const float ry = y_rstd[row];
    float u[ITEMS][VEC], g[ITEMS][VEC];  // x1hat then yhat; g1 then g2
    float r1 = 0.f, mg1 = 0.f;
    if (has_dh) {
      r1 = rstd[row];
      float s[1] = {0.f};  // sum g1 * x1hat
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c < nvec) {
          float d[VEC];
          if constexpr (XHAT) {
            load_vec<TA, VEC>(xhat + off + int64_t(c) * VEC, u[i]);
          } else {
            load_vec<TX, VEC>(x1 + off + int64_t(c) * VEC, u[i]);
#pragma unroll
            for (int j = 0; j < VEC; ++j) u[i][j] *= r1;
          }
          load_vec<TA, VEC>(dh + off + int64_t(c) * VEC, d);
#pragma unroll
          for (int j = 0; j < VEC; ++j) rms_grad_terms(d[j], m1[i][j], u[i][j], g[i][j], q1[i][j], s[0]);
        }
      }
      row_sum<1>(s, smem);
      mg1 = s[0] * inv_cols;
    }
    float s2[1] = {0.f};  // sum g2 * yhat
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = threadIdx.x + i * blockDim.x;
      if (c < nvec) {
        float e[VEC];  // dx1
        if (dx1_ext != nullptr) load_vec<TX, VEC>(dx1_ext + off + int64_t(c) * VEC, e); else fill(e, 0.f);
        if (has_dh) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) e[j] += rms_grad_dx(g[i][j], u[i][j], r1, mg1);
        }
        store_vec<TX, VEC>(dx + off + int64_t(c) * VEC, e);
        load_vec<TA, VEC>(y + off + int64_t(c) * VEC, u[i]);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          u[i][j] *= ry;  // yhat
          rms_grad_terms(e[j], m2[i][j], u[i][j], g[i][j], q2[i][j], s2[0]);
        }
      }
    }
    row_sum<1>(s2, smem);
    const float mg2 = s2[0] * inv_cols;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = threadIdx.x + i * blockDim.x;
      if (c < nvec) {
        float o[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) o[j] = rms_grad_dx(g[i][j], u[i][j], ry, mg2);
        store_vec<TA, VEC>(dy + off + int64_t(c) * VEC, o);
      }
    }
  }

  // Plane 0: sum dh * x1hat (zero without dh); plane 1: sum dx1 * yhat.
  float* p0 = partials + (int64_t(b) * tiles + tile) * cols;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < nvec) {
      store_vec<float, VEC>(p0 + c * VEC, q1[i]);
      store_vec<float, VEC>(p0 + plane + c * VEC, q2[i]);
    }
  }
}

// The per-sample column sums over tiles, in tile order (Q1, Q2), and what
// each gradient takes of them: dgate = (1 - tg^2) * post_weight * Q2,
// dpost_weight_per_sample = tg * Q2, dscale = pre_weight * Q1,
// dpre_weight_per_sample = (1 + scale) * Q1.
template <typename TM>
__global__ void residual_rms_adaln_reduce_partials_kernel(
    const float* __restrict__ partials, int64_t plane, int tiles, int cols, const float* __restrict__ post_weight,
    const float* __restrict__ pre_weight, const TM* __restrict__ gate, int64_t gate_stride,
    const TM* __restrict__ scale, int64_t scale_stride, TM* __restrict__ dgate, TM* __restrict__ dscale,
    float* __restrict__ dpost_weight_per_sample, float* __restrict__ dpre_weight_per_sample) {
  const int b = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float q[2];
  detail::sum_tiles<2>(partials + int64_t(b) * tiles * cols + c, plane, tiles, cols, q);
  const int64_t o = int64_t(b) * cols + c;
  const float tg = tanhf(to_float(gate[int64_t(b) * gate_stride + c]));
  const float pw = post_weight != nullptr ? post_weight[c] : 1.f;
  dgate[o] = from_float<TM>((1.f - tg * tg) * pw * q[1]);
  if (dpost_weight_per_sample != nullptr) dpost_weight_per_sample[o] = tg * q[1];
  if (dscale != nullptr) dscale[o] = from_float<TM>((pre_weight != nullptr ? pre_weight[c] : 1.f) * q[0]);
  if (dpre_weight_per_sample != nullptr) {
    const float a = scale != nullptr ? to_float(scale[int64_t(b) * scale_stride + c]) : 0.f;
    dpre_weight_per_sample[o] = (1.f + a) * q[0];
  }
}

// The backward's block size for these columns (also what the tile count assumes).
int backward_threads(int cols, bool vec8) {
  if (!vec8) return threads_per_row(cols, cols <= kNarrowCols ? 8 : 16);
  return threads_per_row(cols / 8, cols <= kNarrowCols ? 1 : 2);
}

}  // namespace

template <typename TX, typename TM, typename TA>
void residual_rms_adaln_forward(const TX* x, const TM* gate, int64_t gate_stride, const TA* y,
                                const float* post_weight, const float* pre_weight, const TM* scale,
                                int64_t scale_stride, TX* x1, TA* h, float* y_rstd, float* rstd, TA* xhat,
                                int batch, int tokens, int cols, float eps, cudaStream_t stream) {
  detail::check_sizes("residual_rms_adaln_forward", batch, tokens, cols, kResidualRmsAdaLNMaxCols);
  const int rows = batch * tokens;
  if (rows == 0) return;
  const bool vec8 = cols % 8 == 0 && gate_stride % 8 == 0 && vec8_aligned(gate) &&
                    (scale == nullptr || (scale_stride % 8 == 0 && vec8_aligned(scale))) && vec8_aligned(x) &&
                    vec8_aligned(y) && (post_weight == nullptr || vec8_aligned(post_weight)) &&
                    (pre_weight == nullptr || vec8_aligned(pre_weight)) && vec8_aligned(x1) && vec8_aligned(h) &&
                    (xhat == nullptr || vec8_aligned(xhat));
  auto launch = [&](auto kernel, int vec, int items) {
    const int per_row = threads_per_row(cols / vec, items);
    const dim3 block(per_row, per_row == 32 ? 4 : 1);  // warp per row: 4 rows per block
    const dim3 grid((rows + block.y - 1) / block.y);
    kernel<<<grid, block, 0, stream>>>(x, gate, gate_stride, y, post_weight, pre_weight, scale, scale_stride, x1, h,
                                       y_rstd, rstd, xhat, rows, tokens, cols, eps);
    PERFTRAIN_LAUNCH_CHECK();
  };
  // A warp per row up to 1536 columns (2 vectors a lane up to 512, 6 up to
  // 1536), a block per row of 2 vectors a thread beyond.
  if (vec8 && cols > 8 * 2 * 32 && cols <= 8 * 6 * 32)
    launch(residual_rms_adaln_forward_kernel<TX, TM, TA, 8, 6>, 8, 6);
  else if (vec8)
    launch(residual_rms_adaln_forward_kernel<TX, TM, TA, 8, 2>, 8, 2);
  else
    launch(residual_rms_adaln_forward_kernel<TX, TM, TA, 1, kFwdItems1>, 1, kFwdItems1);
}

int residual_rms_adaln_backward_tiles(int batch, int tokens, int cols, int sm_count) {
  // Slots: 512 / threads blocks per SM (the register budget of __launch_bounds__(512, 1)).
  const int threads = backward_threads(cols, cols % 8 == 0);
  const int64_t slots = int64_t(std::max(1, kMaxThreads / threads)) * std::max(sm_count, 1);
  return detail::wave_row_tiles(batch, tokens, slots, /*overhead_rows=*/2);
}

template <typename TX, typename TM, typename TA>
void residual_rms_adaln_backward(const TX* dx1_ext, const TA* dh, const TX* x1, const TA* xhat, const TA* y,
                                 const float* post_weight, const float* pre_weight, const TM* gate,
                                 int64_t gate_stride, const TM* scale, int64_t scale_stride, const float* y_rstd,
                                 const float* rstd, TX* dx, TA* dy, TM* dgate, TM* dscale,
                                 float* dpost_weight_per_sample, float* dpre_weight_per_sample, float* partials,
                                 int batch, int tokens, int cols, int tiles_per_sample, cudaStream_t stream) {
  detail::check_sizes("residual_rms_adaln_backward", batch, tokens, cols, kResidualRmsAdaLNMaxCols);
  if (batch == 0) return;
  // With no tokens nothing is read (an op's empty dh, x1 or xhat has no data pointer): the sums are zero.
  if (tokens > 0 && dh != nullptr && xhat == nullptr && x1 == nullptr)
    throw std::invalid_argument("residual_rms_adaln_backward: needs xhat or x1");
  if (tokens > 0 && dh == nullptr && (dscale != nullptr || dpre_weight_per_sample != nullptr))
    throw std::invalid_argument("residual_rms_adaln_backward: dscale and dpre_weight need dh");
  if (dscale != nullptr && scale == nullptr)
    throw std::invalid_argument("residual_rms_adaln_backward: dscale needs scale");
  detail::check_tiles("residual_rms_adaln_backward", tiles_per_sample, tokens);
  const int rows_per_tile = (tokens + tiles_per_sample - 1) / tiles_per_sample;
  const int64_t plane = int64_t(batch) * tiles_per_sample * cols;
  const bool vec8 = cols % 8 == 0 && gate_stride % 8 == 0 && vec8_aligned(gate) &&
                    (scale == nullptr || (scale_stride % 8 == 0 && vec8_aligned(scale))) &&
                    (dx1_ext == nullptr || vec8_aligned(dx1_ext)) && (dh == nullptr || vec8_aligned(dh)) &&
                    (xhat != nullptr ? vec8_aligned(xhat) : (x1 == nullptr || vec8_aligned(x1))) &&
                    vec8_aligned(y) && (post_weight == nullptr || vec8_aligned(post_weight)) &&
                    (pre_weight == nullptr || vec8_aligned(pre_weight)) && vec8_aligned(dx) && vec8_aligned(dy) &&
                    vec8_aligned(partials);
  auto launch = [&](auto kernel) {
    const dim3 block(backward_threads(cols, vec8));
    const dim3 grid(tiles_per_sample, batch);
    kernel<<<grid, block, 0, stream>>>(dx1_ext, dh, x1, xhat, y, post_weight, pre_weight, gate, gate_stride, scale,
                                       scale_stride, y_rstd, rstd, dx, dy, partials, tokens, cols, rows_per_tile,
                                       plane);
    PERFTRAIN_LAUNCH_CHECK();
  };
  // tokens == 0 launches too: the tiles have no rows and write zero partials.
  auto row_kernels = [&](auto xhat_tag) {
    constexpr bool XHAT = decltype(xhat_tag)::value;
    if (vec8 && cols <= kNarrowCols)
      launch(residual_rms_adaln_backward_kernel<TX, TM, TA, 8, 1, XHAT>);
    else if (vec8)
      launch(residual_rms_adaln_backward_kernel<TX, TM, TA, 8, 2, XHAT>);
    else if (cols <= kNarrowCols)
      launch(residual_rms_adaln_backward_kernel<TX, TM, TA, 1, 8, XHAT>);
    else
      launch(residual_rms_adaln_backward_kernel<TX, TM, TA, 1, 16, XHAT>);
  };
  // A kept xhat saves memory only in a 16-bit TA: only those instantiate the XHAT kernels.
  if constexpr (sizeof(TA) == 2) {
    if (dh != nullptr && xhat != nullptr)
      row_kernels(std::true_type{});
    else
      row_kernels(std::false_type{});
  } else {
    if (xhat != nullptr)
      throw std::invalid_argument("residual_rms_adaln_backward: xhat is kept only in a 16-bit type");
    row_kernels(std::false_type{});
  }

  const dim3 grid((cols + 255) / 256, batch);
  residual_rms_adaln_reduce_partials_kernel<TM><<<grid, 256, 0, stream>>>(
      partials, plane, tiles_per_sample, cols, post_weight, pre_weight, gate, gate_stride, scale, scale_stride, dgate,
      dscale, dpost_weight_per_sample, dpre_weight_per_sample);
  PERFTRAIN_LAUNCH_CHECK();
}

#define PERFTRAIN_RESIDUAL_RMS_ADALN_INSTANTIATE(TX, TM, TA)                                                         \
  template void residual_rms_adaln_forward<TX, TM, TA>(const TX*, const TM*, int64_t, const TA*, const float*,       \
                                                       const float*, const TM*, int64_t, TX*, TA*, float*, float*,   \
                                                       TA*, int, int, int, float, cudaStream_t);                     \
  template void residual_rms_adaln_backward<TX, TM, TA>(const TX*, const TA*, const TX*, const TA*, const TA*,       \
                                                        const float*, const float*, const TM*, int64_t, const TM*,   \
                                                        int64_t, const float*, const float*, TX*, TA*, TM*, TM*,     \
                                                        float*, float*, float*, int, int, int, int, cudaStream_t);
PERFTRAIN_FOR_STORAGE_TYPES3(PERFTRAIN_RESIDUAL_RMS_ADALN_INSTANTIATE)

}  // namespace perftrain::kernels
