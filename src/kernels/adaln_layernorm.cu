#include "kernels/adaln_layernorm.h"

#include "kernels/cuda_check.h"
#include "kernels/row_norm.cuh"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {
namespace {

using detail::Norm;

// The kLayer register budgets (row_norm.cuh): vectors a thread, forward and backward.
constexpr int kFwd8 = detail::layer_fwd_items<8>(), kFwd1 = detail::layer_fwd_items<1>();
constexpr int kBwd8 = detail::layer_bwd_items<8>(), kBwd1 = detail::layer_bwd_items<1>();

constexpr const char* kName = "adaln_layernorm";

// The register budgets are detail::layer_fwd_items / layer_bwd_items; with at most
// kRowMaxThreads threads per row they cover kAdaLNMaxCols.
static_assert(detail::kRowMaxThreads * 8 * kBwd8 >= kAdaLNMaxCols &&
                  detail::kRowMaxThreads * kBwd1 >= kAdaLNMaxCols,
              "the backward's registers must cover the widest row");

}  // namespace

template <typename TX, typename TM, typename TY>
void adaln_layernorm_forward(const TX* x, const TM* shift, int64_t shift_stride, const TM* scale,
                             int64_t scale_stride, TY* y, float* mean, float* rstd, int batch, int tokens,
                             int cols, float eps, cudaStream_t stream, const Fp8RowOut& fp8) {
  detail::check_sizes("adaln_layernorm_forward", batch, tokens, cols, kAdaLNMaxCols);
  const int rows = batch * tokens;
  if (rows == 0) return;  // no rows: nothing written, y may be an empty tensor's null pointer
  detail::check_fp8_out("adaln_layernorm_forward", y, fp8);
  const bool vec8 = cols % 8 == 0 && shift_stride % 8 == 0 && scale_stride % 8 == 0 &&
                    detail::all_vec8_aligned(x, shift, scale, y, fp8.q);
  auto launch = [&](auto kernel, int vec, int items) {
    const detail::RowLaunch l = detail::forward_rows(rows, cols / vec, items, kName);
    kernel<<<l.grid, l.block, 0, stream>>>(x, nullptr, 0, nullptr, nullptr, nullptr, nullptr, shift, shift_stride,
                                           scale, scale_stride, nullptr, y, nullptr, mean, rstd, nullptr, rows,
                                           tokens, cols, eps, fp8);
    PERFTRAIN_LAUNCH_CHECK();
  };
  if (vec8)
    launch(detail::row_norm_forward_kernel<Norm::kLayer, false, false, TX, TM, TY, 8, kFwd8>, 8, kFwd8);
  else
    launch(detail::row_norm_forward_kernel<Norm::kLayer, false, false, TX, TM, TY, 1, kFwd1>, 1, kFwd1);
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
    launch(detail::row_norm_backward_kernel<Norm::kLayer, false, TX, TM, TY, 8, kBwd8, false, false, false>, 8, kBwd8);
  else
    launch(detail::row_norm_backward_kernel<Norm::kLayer, false, TX, TM, TY, 1, kBwd1, false, false, false>, 1, kBwd1);

  const detail::RowLaunch r = detail::reduce_columns(cols, batch);
  detail::row_norm_reduce_kernel<Norm::kLayer, false, TM><<<r.grid, r.block, 0, stream>>>(
      partials, plane, tiles_per_sample, cols, false, nullptr, nullptr, nullptr, nullptr, 0, nullptr, 0, nullptr,
      dshift, dscale, nullptr, nullptr, nullptr);
  PERFTRAIN_LAUNCH_CHECK();
}

#define PERFTRAIN_ADALN_INSTANTIATE(TX, TM, TY)                                                                   \
  template void adaln_layernorm_forward<TX, TM, TY>(const TX*, const TM*, int64_t, const TM*, int64_t, TY*,      \
                                                    float*, float*, int, int, int, float, cudaStream_t,          \
                                                    const Fp8RowOut&);                                           \
  template void adaln_layernorm_backward<TX, TM, TY>(const TY*, const TX*, const TM*, int64_t, const float*,     \
                                                     const float*, TX*, TM*, TM*, float*, int, int, int, int,     \
                                                     cudaStream_t);
PERFTRAIN_FOR_STORAGE_TYPES3(PERFTRAIN_ADALN_INSTANTIATE)

}  // namespace perftrain::kernels
