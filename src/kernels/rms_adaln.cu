#include "kernels/rms_adaln.h"

#include "kernels/cuda_check.h"
#include "kernels/row_norm.cuh"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {
namespace {

using detail::Norm;

constexpr const char* kName = "rms_adaln";

// Register budget per thread: ITEMS vectors of VEC elements of the row.
// Forward: the row (1 array). Backward: the column sum and the per-column
// multiplier (weight * (1 + scale), the same on every row of the block's
// sample) live across rows, xhat and g across one row's reduction: 4 arrays,
// 64 floats at 2 x 8 or 16 x 1.
// The forward's budget is detail::rms_forward's (16 scalar items at most).
constexpr int kBwdItems8 = 2;
constexpr int kBwdItems1 = 16;
static_assert(detail::kRowMaxThreads * 8 * kBwdItems8 >= kRmsAdaLNMaxCols &&
                  detail::kRowMaxThreads * kBwdItems1 >= kRmsAdaLNMaxCols &&
                  detail::kRowMaxThreads * 16 >= kRmsAdaLNMaxCols,
              "the registers must cover the widest row");

// The backward's block size for these columns (also what the tile count assumes).
int backward_threads(int cols, bool vec8) {
  return vec8 ? detail::row_norm_threads(cols / 8, kBwdItems8, kName)
              : detail::row_norm_threads(cols, kBwdItems1, kName);
}

}  // namespace

template <typename TX, typename TM, typename TY>
void rms_adaln_forward(const TX* x, const float* weight, const TM* scale, int64_t scale_stride, TY* h, float* rstd,
                       TY* xhat, int batch, int tokens, int cols, float eps, cudaStream_t stream,
                       const Fp8RowOut& fp8) {
  detail::rms_forward<false, TX, TM, TY>("rms_adaln_forward", kRmsAdaLNMaxCols, x, nullptr, 0, nullptr, nullptr, weight,
                                         scale, scale_stride, nullptr, h, nullptr, rstd, xhat, batch, tokens, cols,
                                         eps, stream, fp8);
}

int rms_adaln_backward_tiles(int batch, int tokens, int cols, int sm_count) {
  return detail::row_norm_wave_tiles(batch, tokens, backward_threads(cols, cols % 8 == 0), sm_count);
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
  const bool vec8 = cols % 8 == 0 && (scale == nullptr || scale_stride % 8 == 0) &&
                    detail::all_vec8_aligned(scale, dh, xhat != nullptr ? nullptr : x, xhat, weight, dx, partials);
  auto launch = [&](auto kernel) {
    const detail::RowLaunch l = detail::backward_tiles(tiles_per_sample, batch, backward_threads(cols, vec8));
    kernel<<<l.grid, l.block, 0, stream>>>(nullptr, dh, x, xhat, nullptr, nullptr, weight, nullptr, 0, scale,
                                           scale_stride, nullptr, nullptr, rstd, dx, nullptr, partials, tokens, cols,
                                           rows_per_tile, 0);
    PERFTRAIN_LAUNCH_CHECK();
  };
  // tokens == 0 launches too: the tiles have no rows and write zero partials.
  detail::with_xhat<TY>("rms_adaln_backward", xhat != nullptr, [&](auto xhat_tag) {
    constexpr bool XHAT = decltype(xhat_tag)::value;
    if (vec8)
      launch(detail::row_norm_backward_kernel<Norm::kRms, false, TX, TM, TY, 8, kBwdItems8, XHAT, false, false>);
    else
      launch(detail::row_norm_backward_kernel<Norm::kRms, false, TX, TM, TY, 1, kBwdItems1, XHAT, false, false>);
  });
  if (dscale == nullptr && dweight_per_sample == nullptr) return;
  const detail::RowLaunch r = detail::reduce_columns(cols, batch);
  detail::row_norm_reduce_kernel<Norm::kRms, false, TM><<<r.grid, r.block, 0, stream>>>(
      partials, 0, tiles_per_sample, cols, false, nullptr, nullptr, weight, nullptr, 0, scale, scale_stride, nullptr,
      nullptr, dscale, nullptr, nullptr, dweight_per_sample);
  PERFTRAIN_LAUNCH_CHECK();
}

#define PERFTRAIN_RMS_ADALN_INSTANTIATE(TX, TM, TY)                                                               \
  template void rms_adaln_forward<TX, TM, TY>(const TX*, const float*, const TM*, int64_t, TY*, float*, TY*, int, \
                                              int, int, float, cudaStream_t, const Fp8RowOut&);                                     \
  template void rms_adaln_backward<TX, TM, TY>(const TY*, const TX*, const TY*, const float*, const TM*, int64_t,  \
                                               const float*, TX*, TM*, float*, float*, int, int, int, int,         \
                                               cudaStream_t);
PERFTRAIN_FOR_STORAGE_TYPES3(PERFTRAIN_RMS_ADALN_INSTANTIATE)

}  // namespace perftrain::kernels
