#include "kernels/rms_adaln.h"

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
// Forward: the row (1 array). Backward: the column sum and the per-column
// multiplier (weight * (1 + scale), the same on every row of the block's
// sample) live across rows, xhat and g across one row's reduction: 4 arrays,
// 64 floats at 2 x 8 or 16 x 1.
constexpr int kMaxThreads = 512;
constexpr int kBwdItems8 = 2;
constexpr int kBwdItems1 = 16;
constexpr int kFwdItems1 = 16;
static_assert(kMaxThreads * 8 * kBwdItems8 >= kRmsAdaLNMaxCols && kMaxThreads * kBwdItems1 >= kRmsAdaLNMaxCols &&
                  kMaxThreads * kFwdItems1 >= kRmsAdaLNMaxCols,
              "the registers must cover the widest row");

int threads_per_row(int nvec, int items) { return detail::row_threads(nvec, items, kMaxThreads, "rms_adaln"); }

// One row per warp (blockDim.y rows a block) or one row per block.
template <typename TX, typename TM, typename TY, int VEC, int ITEMS>
__global__ void __launch_bounds__(kMaxThreads)
    rms_adaln_forward_kernel(const TX* __restrict__ x, const float* __restrict__ weight, const TM* __restrict__ scale,
                             int64_t scale_stride, TY* __restrict__ h, float* __restrict__ rstd_out,
                             TY* __restrict__ xhat_out, int rows, int tokens, int cols, float eps) {
  __shared__ float smem[32];
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;  // a whole warp (warp per row) or a whole block (block per row)
  const int nvec = cols / VEC;
  const int64_t off = int64_t(row) * cols;
  const int b = row / tokens;

  float v[ITEMS][VEC];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < nvec) load_vec<TX, VEC>(x + off + int64_t(c) * VEC, v[i]);
  }
  const float rstd = rms_row_rstd(v, nvec, cols, eps, smem, row, rstd_out);

  const TM* sc = scale != nullptr ? scale + int64_t(b) * scale_stride : nullptr;
  rms_modulate_store(v, nvec, rstd, weight, sc, h + off, xhat_out != nullptr ? xhat_out + off : nullptr);
}

// Block (tile, b): rows b*tokens + [tile*rows_per_tile, ...) of one sample.
// XHAT: read the normalised rows the forward kept (TY) instead of x.
template <typename TX, typename TM, typename TY, int VEC, int ITEMS, bool XHAT>
__global__ void __launch_bounds__(kMaxThreads, 1)
    rms_adaln_backward_kernel(const TY* __restrict__ dh, const TX* __restrict__ x, const TY* __restrict__ xhat,
                              const float* __restrict__ weight, const TM* __restrict__ scale, int64_t scale_stride,
                              const float* __restrict__ rstd, TX* __restrict__ dx, float* __restrict__ partials,
                              int tokens, int cols, int rows_per_tile) {
  __shared__ float smem[32];
  const int tile = blockIdx.x, b = blockIdx.y, tiles = gridDim.x;
  const int nvec = cols / VEC;
  const float inv_cols = 1.f / float(cols);
  const int t0 = tile * rows_per_tile;
  const int t1 = min(tokens, t0 + rows_per_tile);
  const TM* sc = scale != nullptr ? scale + int64_t(b) * scale_stride : nullptr;

  float acc[ITEMS][VEC], mult[ITEMS][VEC];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    fill(acc[i], 0.f);
    fill(mult[i], 1.f);
    if (c < nvec) {
      float w[VEC], a[VEC];
      if (weight != nullptr) load_vec<float, VEC>(weight + c * VEC, w); else fill(w, 1.f);
      if (sc != nullptr) load_vec<TM, VEC>(sc + c * VEC, a); else fill(a, 0.f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) mult[i][j] = w[j] * (1.f + a[j]);
    }
  }

  for (int t = t0; t < t1; ++t) {  // the same trip count for the whole block
    const int64_t row = int64_t(b) * tokens + t;
    const int64_t off = row * cols;
    const float rs = rstd[row];
    float xh[ITEMS][VEC], g[ITEMS][VEC];
    float s[1] = {0.f};  // sum g * xhat
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = threadIdx.x + i * blockDim.x;
      if (c < nvec) {
        float d[VEC];
        if constexpr (XHAT) {
          load_vec<TY, VEC>(xhat + off + int64_t(c) * VEC, xh[i]);
        } else {
          load_vec<TX, VEC>(x + off + int64_t(c) * VEC, xh[i]);
#pragma unroll
          for (int j = 0; j < VEC; ++j) xh[i][j] *= rs;
        }
        load_vec<TY, VEC>(dh + off + int64_t(c) * VEC, d);
#pragma unroll
        for (int j = 0; j < VEC; ++j) rms_grad_terms(d[j], mult[i][j], xh[i][j], g[i][j], acc[i][j], s[0]);
      }
    }
    row_sum<1>(s, smem);
    const float mgx = s[0] * inv_cols;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = threadIdx.x + i * blockDim.x;
      if (c < nvec) {
        float o[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) o[j] = rms_grad_dx(g[i][j], xh[i][j], rs, mgx);
        store_vec<TX, VEC>(dx + off + int64_t(c) * VEC, o);
      }
    }
  }

  // The sample's column sums of dh * xhat over this tile's rows.
  float* p0 = partials + (int64_t(b) * tiles + tile) * cols;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < nvec) store_vec<float, VEC>(p0 + c * VEC, acc[i]);
  }
}

// Q = the sum over tiles, in tile order; dscale = weight * Q,
// dweight_per_sample = (1 + scale) * Q.
template <typename TM>
__global__ void rms_adaln_reduce_partials_kernel(const float* __restrict__ partials, int tiles, int cols,
                                                 const float* __restrict__ weight, const TM* __restrict__ scale,
                                                 int64_t scale_stride, TM* __restrict__ dscale,
                                                 float* __restrict__ dweight_per_sample) {
  const int b = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float q[1];
  detail::sum_tiles<1>(partials + int64_t(b) * tiles * cols + c, 0, tiles, cols, q);
  if (dscale != nullptr) dscale[int64_t(b) * cols + c] = from_float<TM>((weight != nullptr ? weight[c] : 1.f) * q[0]);
  if (dweight_per_sample != nullptr) {
    const float a = scale != nullptr ? to_float(scale[int64_t(b) * scale_stride + c]) : 0.f;
    dweight_per_sample[int64_t(b) * cols + c] = (1.f + a) * q[0];
  }
}

// The backward's block size for these columns (also what the tile count assumes).
int backward_threads(int cols, bool vec8) {
  return vec8 ? threads_per_row(cols / 8, kBwdItems8) : threads_per_row(cols, kBwdItems1);
}

}  // namespace

template <typename TX, typename TM, typename TY>
void rms_adaln_forward(const TX* x, const float* weight, const TM* scale, int64_t scale_stride, TY* h, float* rstd,
                       TY* xhat, int batch, int tokens, int cols, float eps, cudaStream_t stream) {
  detail::check_sizes("rms_adaln_forward", batch, tokens, cols, kRmsAdaLNMaxCols);
  const int rows = batch * tokens;
  if (rows == 0) return;
  const bool vec8 = cols % 8 == 0 && (scale == nullptr || (scale_stride % 8 == 0 && vec8_aligned(scale))) &&
                    vec8_aligned(x) && (weight == nullptr || vec8_aligned(weight)) && vec8_aligned(h) &&
                    (xhat == nullptr || vec8_aligned(xhat));
  auto launch = [&](auto kernel, int vec, int items) {
    const int per_row = threads_per_row(cols / vec, items);
    const dim3 block(per_row, per_row == 32 ? 4 : 1);  // warp per row: 4 rows per block
    const dim3 grid((rows + block.y - 1) / block.y);
    kernel<<<grid, block, 0, stream>>>(x, weight, scale, scale_stride, h, rstd, xhat, rows, tokens, cols, eps);
    PERFTRAIN_LAUNCH_CHECK();
  };
  // A warp per row up to 1536 columns (the fewest registers that cover the
  // row: 2 vectors a lane up to 512, 6 up to 1536), a block per row of 2
  // vectors a thread beyond.
  if (vec8 && cols > 8 * 2 * 32 && cols <= 8 * 6 * 32)
    launch(rms_adaln_forward_kernel<TX, TM, TY, 8, 6>, 8, 6);
  else if (vec8)
    launch(rms_adaln_forward_kernel<TX, TM, TY, 8, 2>, 8, 2);
  else
    launch(rms_adaln_forward_kernel<TX, TM, TY, 1, kFwdItems1>, 1, kFwdItems1);
}

int rms_adaln_backward_tiles(int batch, int tokens, int cols, int sm_count) {
  // Slots: 512 / threads blocks per SM (the register budget of __launch_bounds__(512, 1)).
  const int threads = backward_threads(cols, cols % 8 == 0);
  const int64_t slots = int64_t(std::max(1, kMaxThreads / threads)) * std::max(sm_count, 1);
  return detail::wave_row_tiles(batch, tokens, slots, /*overhead_rows=*/2);
}

template <typename TX, typename TM, typename TY>
void rms_adaln_backward(const TY* dh, const TX* x, const TY* xhat, const float* weight, const TM* scale,
                        int64_t scale_stride, const float* rstd, TX* dx, TM* dscale, float* dweight_per_sample,
                        float* partials, int batch, int tokens, int cols, int tiles_per_sample, cudaStream_t stream) {
  detail::check_sizes("rms_adaln_backward", batch, tokens, cols, kRmsAdaLNMaxCols);
  if (batch == 0) return;
  // With no tokens nothing is read (an op's empty x or xhat has no data pointer): the sums are zero.
  if (tokens > 0 && xhat == nullptr && x == nullptr) throw std::invalid_argument("rms_adaln_backward: needs xhat or x");
  if (dscale != nullptr && scale == nullptr) throw std::invalid_argument("rms_adaln_backward: dscale needs scale");
  detail::check_tiles("rms_adaln_backward", tiles_per_sample, tokens);
  const int rows_per_tile = (tokens + tiles_per_sample - 1) / tiles_per_sample;
  const bool vec8 = cols % 8 == 0 && (scale == nullptr || (scale_stride % 8 == 0 && vec8_aligned(scale))) &&
                    vec8_aligned(dh) && (xhat != nullptr ? vec8_aligned(xhat) : vec8_aligned(x)) &&
                    (weight == nullptr || vec8_aligned(weight)) && vec8_aligned(dx) && vec8_aligned(partials);
  auto launch = [&](auto kernel) {
    const dim3 block(backward_threads(cols, vec8));
    const dim3 grid(tiles_per_sample, batch);
    kernel<<<grid, block, 0, stream>>>(dh, x, xhat, weight, scale, scale_stride, rstd, dx, partials, tokens, cols,
                                       rows_per_tile);
    PERFTRAIN_LAUNCH_CHECK();
  };
  // tokens == 0 launches too: the tiles have no rows and write zero partials.
  auto row_kernels = [&](auto xhat_tag) {
    constexpr bool XHAT = decltype(xhat_tag)::value;
    if (vec8)
      launch(rms_adaln_backward_kernel<TX, TM, TY, 8, kBwdItems8, XHAT>);
    else
      launch(rms_adaln_backward_kernel<TX, TM, TY, 1, kBwdItems1, XHAT>);
  };
  // A kept xhat saves memory only in a 16-bit TY: only those instantiate the XHAT kernels.
  if constexpr (sizeof(TY) == 2) {
    if (xhat != nullptr)
      row_kernels(std::true_type{});
    else
      row_kernels(std::false_type{});
  } else {
    if (xhat != nullptr) throw std::invalid_argument("rms_adaln_backward: xhat is kept only in a 16-bit type");
    row_kernels(std::false_type{});
  }
  if (dscale == nullptr && dweight_per_sample == nullptr) return;
  const dim3 grid((cols + 255) / 256, batch);
  rms_adaln_reduce_partials_kernel<TM><<<grid, 256, 0, stream>>>(partials, tiles_per_sample, cols, weight, scale,
                                                                  scale_stride, dscale, dweight_per_sample);
  PERFTRAIN_LAUNCH_CHECK();
}

#define PERFTRAIN_RMS_ADALN_INSTANTIATE(TX, TM, TY)                                                               \
  template void rms_adaln_forward<TX, TM, TY>(const TX*, const float*, const TM*, int64_t, TY*, float*, TY*, int, \
                                              int, int, float, cudaStream_t);                                     \
  template void rms_adaln_backward<TX, TM, TY>(const TY*, const TX*, const TY*, const float*, const TM*, int64_t,  \
                                               const float*, TX*, TM*, float*, float*, int, int, int, int,         \
                                               cudaStream_t);
PERFTRAIN_FOR_STORAGE_TYPES3(PERFTRAIN_RMS_ADALN_INSTANTIATE)

}  // namespace perftrain::kernels
