#include "kernels/adaln_layernorm.h"

#include "kernels/cuda_check.h"
#include "kernels/row_norm.cuh"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {
namespace {

using detail::Norm;
using detail::row_norm_backward_kernel;
using detail::row_norm_forward_kernel;

constexpr const char* kName = "adaln_layernorm";

// Register budget per thread: ITEMS vectors of VEC elements of the row.
// With at most kRowMaxThreads threads per row they cover kAdaLNMaxCols.
template <int VEC> constexpr int fwd_items() { return VEC == 8 ? 6 : 16; }  // warp covers D <= 1536 / 512
// 5 arrays of ITEMS*VEC live in the backward; the scalar path (odd widths,
// misaligned views) spills a few registers at 16 items, which is acceptable there.
template <int VEC> constexpr int bwd_items() { return VEC == 8 ? 2 : 16; }
static_assert(detail::kRowMaxThreads * 8 * bwd_items<8>() >= kAdaLNMaxCols &&
                  detail::kRowMaxThreads * bwd_items<1>() >= kAdaLNMaxCols,
              "the backward's registers must cover the widest row");

// dscale[b, c] = sum over tiles of plane 0, dshift[b, c] of plane 1, in tile order.
template <typename TM>
__global__ void adaln_reduce_partials_kernel(const float* __restrict__ partials, int64_t plane, int tiles, int cols,
                                             TM* __restrict__ dscale, TM* __restrict__ dshift) {
  const int b = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s[2];
  detail::sum_tiles<2>(partials + int64_t(b) * tiles * cols + c, plane, tiles, cols, s);
  dscale[int64_t(b) * cols + c] = detail::from_float<TM>(s[0]);
  dshift[int64_t(b) * cols + c] = detail::from_float<TM>(s[1]);
}

}  // namespace

template <typename TX, typename TM, typename TY>
void adaln_layernorm_forward(const TX* x, const TM* shift, int64_t shift_stride, const TM* scale,
                             int64_t scale_stride, TY* y, float* mean, float* rstd, int batch, int tokens,
                             int cols, float eps, cudaStream_t stream) {
  detail::check_sizes("adaln_layernorm_forward", batch, tokens, cols, kAdaLNMaxCols);
  const int rows = batch * tokens;
  if (rows == 0) return;
  const bool vec8 = cols % 8 == 0 && shift_stride % 8 == 0 && scale_stride % 8 == 0 &&
                    detail::all_vec8_aligned(x, shift, scale, y);
  auto launch = [&](auto kernel, int vec, int items) {
    const detail::RowLaunch l = detail::forward_rows(rows, cols / vec, items, kName);
    kernel<<<l.grid, l.block, 0, stream>>>(x, nullptr, 0, nullptr, nullptr, nullptr, nullptr, shift, shift_stride,
                                           scale, scale_stride, nullptr, y, nullptr, mean, rstd, nullptr, rows,
                                           tokens, cols, eps);
    PERFTRAIN_LAUNCH_CHECK();
  };
  if (vec8)
    launch(row_norm_forward_kernel<Norm::kLayer, false, false, TX, TM, TY, 8, fwd_items<8>()>, 8, fwd_items<8>());
  else
    launch(row_norm_forward_kernel<Norm::kLayer, false, false, TX, TM, TY, 1, fwd_items<1>()>, 1, fwd_items<1>());
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
  const bool vec8 = cols % 8 == 0 && scale_stride % 8 == 0 && detail::all_vec8_aligned(x, dy, dx, scale, partials);
  auto launch = [&](auto kernel, int vec, int items) {
    const detail::RowLaunch l =
        detail::backward_tiles(tiles_per_sample, batch, detail::row_norm_threads(cols / vec, items, kName));
    kernel<<<l.grid, l.block, 0, stream>>>(nullptr, dy, x, nullptr, nullptr, nullptr, nullptr, nullptr, 0, scale,
                                           scale_stride, nullptr, mean, rstd, dx, nullptr, partials, tokens, cols,
                                           rows_per_tile, plane);
    PERFTRAIN_LAUNCH_CHECK();
  };
  if (vec8)
    launch(row_norm_backward_kernel<Norm::kLayer, false, TX, TM, TY, 8, bwd_items<8>(), false, false, false>, 8,
           bwd_items<8>());
  else
    launch(row_norm_backward_kernel<Norm::kLayer, false, TX, TM, TY, 1, bwd_items<1>(), false, false, false>, 1,
           bwd_items<1>());

  const detail::RowLaunch r = detail::reduce_columns(cols, batch);
  adaln_reduce_partials_kernel<TM><<<r.grid, r.block, 0, stream>>>(partials, plane, tiles_per_sample, cols, dscale,
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
