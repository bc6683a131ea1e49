#include "kernels/adaln_layernorm.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/layernorm_stats.cuh"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {
namespace {

using detail::from_float;
using detail::layernorm_grad_dx;
using detail::layernorm_grad_terms;
using detail::layernorm_row_stats;
using detail::load_vec;
using detail::row_sum;
using detail::store_vec;
using detail::vec8_aligned;

// Register budget per thread: ITEMS vectors of VEC elements of the row.
// With at most kMaxThreads threads per row they cover kAdaLNMaxCols.
template <int VEC> constexpr int fwd_items() { return VEC == 8 ? 6 : 16; }  // warp covers D <= 1536 / 512
// 5 arrays of ITEMS*VEC live in the backward; the scalar path (odd widths,
// misaligned views) spills a few registers at 16 items, which is acceptable there.
template <int VEC> constexpr int bwd_items() { return VEC == 8 ? 2 : 16; }
constexpr int kMaxThreads = 512;
static_assert(kMaxThreads * 8 * bwd_items<8>() >= kAdaLNMaxCols && kMaxThreads * bwd_items<1>() >= kAdaLNMaxCols,
              "the backward's registers must cover the widest row");

int threads_per_row(int nvec, int items) { return detail::row_threads(nvec, items, kMaxThreads, "adaln_layernorm"); }

template <typename TX, typename TM, typename TY, int VEC, int ITEMS>
__global__ void __launch_bounds__(kMaxThreads, 1)
    adaln_forward_kernel(const TX* __restrict__ x, const TM* __restrict__ shift, int64_t shift_stride,
                         const TM* __restrict__ scale, int64_t scale_stride, TY* __restrict__ y,
                         float* __restrict__ mean_out, float* __restrict__ rstd_out, int rows, int tokens, int cols,
                         float eps) {
  __shared__ float smem[32];
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;  // a whole warp (warp per row) or a whole block (block per row)
  const int nvec = cols / VEC;
  const int64_t off = int64_t(row) * cols;

  float v[ITEMS][VEC];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < nvec) load_vec<TX, VEC>(x + off + int64_t(c) * VEC, v[i]);
  }
  const auto [mean, rstd] = layernorm_row_stats(v, nvec, cols, eps, smem, row, mean_out, rstd_out);

  const int b = row / tokens;
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
      for (int j = 0; j < VEC; ++j) out[j] = (v[i][j] - mean) * rstd * (1.f + a[j]) + m[j];
      store_vec<TY, VEC>(y + off + int64_t(c) * VEC, out);
    }
  }
}

// Block (tile, b): rows b*tokens + [tile*rows_per_tile, ...) of one sample.
template <typename TX, typename TM, typename TY, int VEC, int ITEMS>
__global__ void __launch_bounds__(kMaxThreads, 1)
    adaln_backward_kernel(const TY* __restrict__ dy, const TX* __restrict__ x, const TM* __restrict__ scale,
                          int64_t scale_stride, const float* __restrict__ mean, const float* __restrict__ rstd,
                          TX* __restrict__ dx, float* __restrict__ partials, int tokens, int cols, int rows_per_tile,
                          int64_t plane) {
  __shared__ float smem[64];
  const int tile = blockIdx.x, b = blockIdx.y, tiles = gridDim.x;
  const int nvec = cols / VEC;
  const float inv_cols = 1.f / float(cols);
  const int t0 = tile * rows_per_tile;
  const int t1 = min(tokens, t0 + rows_per_tile);

  float scale1[ITEMS][VEC], acc_dyxh[ITEMS][VEC], acc_dy[ITEMS][VEC];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc_dyxh[i][j] = acc_dy[i][j] = scale1[i][j] = 0.f;
    if (c < nvec) {
      load_vec<TM, VEC>(scale + int64_t(b) * scale_stride + c * VEC, scale1[i]);
#pragma unroll
      for (int j = 0; j < VEC; ++j) scale1[i][j] += 1.f;
    }
  }

  for (int t = t0; t < t1; ++t) {  // the same trip count for the whole block
    const int64_t row = int64_t(b) * tokens + t;
    const int64_t off = row * cols;
    const float mu = mean[row], rs = rstd[row];
    float xh[ITEMS][VEC], g[ITEMS][VEC];
    float s[2] = {0.f, 0.f};  // sum g, sum g*xhat
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = threadIdx.x + i * blockDim.x;
      if (c < nvec) {
        float d[VEC];
        load_vec<TX, VEC>(x + off + int64_t(c) * VEC, xh[i]);
        load_vec<TY, VEC>(dy + off + int64_t(c) * VEC, d);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          xh[i][j] = (xh[i][j] - mu) * rs;
          layernorm_grad_terms(d[j], scale1[i][j], xh[i][j], g[i][j], acc_dyxh[i][j], acc_dy[i][j], s);
        }
      }
    }
    row_sum<2>(s, smem);
    const float mg = s[0] * inv_cols, mgx = s[1] * inv_cols;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = threadIdx.x + i * blockDim.x;
      if (c < nvec) {
        float out[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) out[j] = layernorm_grad_dx(g[i][j], xh[i][j], rs, mg, mgx);
        store_vec<TX, VEC>(dx + off + int64_t(c) * VEC, out);
      }
    }
  }

  // Plane 0: sum dy*xhat (-> dscale); plane 1: sum dy (-> dshift).
  float* p0 = partials + (int64_t(b) * tiles + tile) * cols;
  float* p1 = p0 + plane;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < nvec) {
      store_vec<float, VEC>(p0 + c * VEC, acc_dyxh[i]);
      store_vec<float, VEC>(p1 + c * VEC, acc_dy[i]);
    }
  }
}

// dscale[b, c] = sum over tiles of plane 0, dshift[b, c] of plane 1, in tile order.
template <typename TM>
__global__ void adaln_reduce_partials_kernel(const float* __restrict__ partials, int64_t plane, int tiles, int cols,
                                             TM* __restrict__ dscale, TM* __restrict__ dshift) {
  const int b = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s[2];
  detail::sum_tiles<2>(partials + int64_t(b) * tiles * cols + c, plane, tiles, cols, s);
  dscale[int64_t(b) * cols + c] = from_float<TM>(s[0]);
  dshift[int64_t(b) * cols + c] = from_float<TM>(s[1]);
}

}  // namespace

template <typename TX, typename TM, typename TY>
void adaln_layernorm_forward(const TX* x, const TM* shift, int64_t shift_stride, const TM* scale,
                             int64_t scale_stride, TY* y, float* mean, float* rstd, int batch, int tokens,
                             int cols, float eps, cudaStream_t stream) {
  detail::check_sizes("adaln_layernorm_forward", batch, tokens, cols, kAdaLNMaxCols);
  const int rows = batch * tokens;
  if (rows == 0) return;
  const bool vec8 = cols % 8 == 0 && shift_stride % 8 == 0 && scale_stride % 8 == 0 && vec8_aligned(x) &&
                    vec8_aligned(shift) && vec8_aligned(scale) && vec8_aligned(y);
  auto launch = [&](auto kernel, int vec, int items) {
    const int per_row = threads_per_row(cols / vec, items);
    const dim3 block(per_row, per_row == 32 ? 4 : 1);  // warp per row: 4 rows per block
    const dim3 grid((rows + block.y - 1) / block.y);
    kernel<<<grid, block, 0, stream>>>(x, shift, shift_stride, scale, scale_stride, y, mean, rstd, rows, tokens,
                                       cols, eps);
    PERFTRAIN_LAUNCH_CHECK();
  };
  if (vec8)
    launch(adaln_forward_kernel<TX, TM, TY, 8, fwd_items<8>()>, 8, fwd_items<8>());
  else
    launch(adaln_forward_kernel<TX, TM, TY, 1, fwd_items<1>()>, 1, fwd_items<1>());
}

int adaln_layernorm_backward_tiles(int batch, int tokens, int sm_count) {
  return detail::sample_row_tiles(batch, tokens, sm_count);
}

template <typename TX, typename TM, typename TY>
void adaln_layernorm_backward(const TY* dy, const TX* x, const TM* scale, int64_t scale_stride,
                              const float* mean, const float* rstd, TX* dx, TM* dshift, TM* dscale,
                              float* partials, int batch, int tokens, int cols, int tiles_per_sample,
                              cudaStream_t stream) {
  detail::check_sizes("adaln_layernorm_backward", batch, tokens, cols, kAdaLNMaxCols);
  if (batch == 0) return;
  detail::check_tiles("adaln_layernorm_backward", tiles_per_sample, tokens);
  const int rows_per_tile = (tokens + tiles_per_sample - 1) / tiles_per_sample;
  const int64_t plane = int64_t(batch) * tiles_per_sample * cols;
  const bool vec8 = cols % 8 == 0 && scale_stride % 8 == 0 && vec8_aligned(x) && vec8_aligned(dy) &&
                    vec8_aligned(dx) && vec8_aligned(scale) && vec8_aligned(partials);
  auto launch = [&](auto kernel, int vec, int items) {
    const dim3 block(threads_per_row(cols / vec, items));
    const dim3 grid(tiles_per_sample, batch);
    kernel<<<grid, block, 0, stream>>>(dy, x, scale, scale_stride, mean, rstd, dx, partials, tokens, cols,
                                       rows_per_tile, plane);
    PERFTRAIN_LAUNCH_CHECK();
  };
  if (vec8)
    launch(adaln_backward_kernel<TX, TM, TY, 8, bwd_items<8>()>, 8, bwd_items<8>());
  else
    launch(adaln_backward_kernel<TX, TM, TY, 1, bwd_items<1>()>, 1, bwd_items<1>());

  const dim3 block(256);
  const dim3 grid((cols + 255) / 256, batch);
  adaln_reduce_partials_kernel<TM><<<grid, block, 0, stream>>>(partials, plane, tiles_per_sample, cols, dscale,
                                                                dshift);
  PERFTRAIN_LAUNCH_CHECK();
}

#define PERFTRAIN_ADALN_INSTANTIATE(TX, TM, TY)                                                                   \
  template void adaln_layernorm_forward<TX, TM, TY>(const TX*, const TM*, int64_t, const TM*, int64_t, TY*,      \
                                                    float*, float*, int, int, int, float, cudaStream_t);         \
  template void adaln_layernorm_backward<TX, TM, TY>(const TY*, const TX*, const TM*, int64_t, const float*,     \
                                                     const float*, TX*, TM*, TM*, float*, int, int, int, int,     \
                                                     cudaStream_t);
PERFTRAIN_FOR_STORAGE_TYPES3(PERFTRAIN_ADALN_INSTANTIATE)

}  // namespace perftrain::kernels
