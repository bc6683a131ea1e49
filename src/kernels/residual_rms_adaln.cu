#include "kernels/residual_rms_adaln.h"

#include "kernels/cuda_check.h"
#include "kernels/row_norm.cuh"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {
namespace {

using detail::Norm;

constexpr const char* kName = "residual_rms_adaln";

// Register budget per thread: ITEMS vectors of VEC elements of the row.
// Forward: the row (y, then x1 in the same registers). Backward: the two
// column sums and the two per-column multipliers (pre_weight * (1 + scale) and
// tanh(gate) * post_weight, the same on every row of the block's sample) live
// across rows, two row arrays (x1hat then yhat, g1 then dx1 then g2) across a
// row: 6 arrays. Rows up to kNarrowCols take one 8-element vector a thread
// (48 floats; more threads per row instead) and their inputs a row ahead (two
// rows of raw words, 40 registers more, as residual_adaln's bias path does),
// wider ones two vectors (96 floats, near the 128 registers that 512 threads a
// block allow).
constexpr int kNarrowCols = detail::kRowMaxThreads * 8;
// The forward's budget is detail::rms_forward's (16 scalar items at most).
static_assert(detail::kRowMaxThreads * 8 * 2 >= kResidualRmsAdaLNMaxCols &&
                  detail::kRowMaxThreads * 16 >= kResidualRmsAdaLNMaxCols,
              "the registers must cover the widest row");

// The backward's block size for these columns (also what the tile count assumes).
int backward_threads(int cols, bool vec8) {
  if (!vec8) return detail::row_norm_threads(cols, cols <= kNarrowCols ? 8 : 16, kName);
  return detail::row_norm_threads(cols / 8, cols <= kNarrowCols ? 1 : 2, kName);
}

}  // namespace

template <typename TX, typename TM, typename TA>
void residual_rms_adaln_forward(const TX* x, const TM* gate, int64_t gate_stride, const TA* y,
                                const float* post_weight, const float* pre_weight, const TM* scale,
                                int64_t scale_stride, TX* x1, TA* h, float* y_rstd, float* rstd, TA* xhat,
                                int batch, int tokens, int cols, float eps, cudaStream_t stream,
                                const Fp8RowOut& fp8) {
  detail::rms_forward<true, TX, TM, TA>("residual_rms_adaln_forward", kResidualRmsAdaLNMaxCols, x, gate, gate_stride,
                                        y, post_weight, pre_weight, scale, scale_stride, x1, h, y_rstd, rstd, xhat,
                                        batch, tokens, cols, eps, stream, fp8);
}

int residual_rms_adaln_backward_tiles(int batch, int tokens, int cols, int sm_count) {
  return detail::row_norm_wave_tiles(batch, tokens, backward_threads(cols, cols % 8 == 0), sm_count);
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
  const bool vec8 = cols % 8 == 0 && gate_stride % 8 == 0 && (scale == nullptr || scale_stride % 8 == 0) &&
                    detail::all_vec8_aligned(gate, scale, dx1_ext, dh, xhat, xhat != nullptr ? nullptr : x1, y,
                                             post_weight, pre_weight, dx, dy, partials);
  auto launch = [&](auto kernel) {
    const detail::RowLaunch l = detail::backward_tiles(tiles_per_sample, batch, backward_threads(cols, vec8));
    kernel<<<l.grid, l.block, 0, stream>>>(dx1_ext, dh, x1, xhat, y, post_weight, pre_weight, gate, gate_stride,
                                           scale, scale_stride, y_rstd, nullptr, rstd, dx, dy, partials, tokens,
                                           cols, rows_per_tile, plane);
    PERFTRAIN_LAUNCH_CHECK();
  };
  // tokens == 0 launches too: the tiles have no rows and write zero partials.
  // Without dh x1's norm is not differentiated and a kept (16-bit) xhat is not read.
  const bool read_xhat = xhat != nullptr && (dh != nullptr || sizeof(TA) > 2);
  detail::with_xhat<TA>("residual_rms_adaln_backward", read_xhat, [&](auto xhat_tag) {
    constexpr bool XHAT = decltype(xhat_tag)::value;
    if (vec8 && cols <= kNarrowCols)  // one vector a thread: the row's inputs loaded a row ahead (EARLY)
      launch(detail::row_norm_backward_kernel<Norm::kRms, true, TX, TM, TA, 8, 1, XHAT, false, true>);
    else if (vec8)
      launch(detail::row_norm_backward_kernel<Norm::kRms, true, TX, TM, TA, 8, 2, XHAT, false, false>);
    else if (cols <= kNarrowCols)
      launch(detail::row_norm_backward_kernel<Norm::kRms, true, TX, TM, TA, 1, 8, XHAT, false, false>);
    else
      launch(detail::row_norm_backward_kernel<Norm::kRms, true, TX, TM, TA, 1, 16, XHAT, false, false>);
  });

  const detail::RowLaunch r = detail::reduce_columns(cols, batch);
  detail::row_norm_reduce_kernel<Norm::kRms, true, TM><<<r.grid, r.block, 0, stream>>>(
      partials, plane, tiles_per_sample, cols, false, nullptr, post_weight, pre_weight, gate, gate_stride, scale,
      scale_stride, dgate, nullptr, dscale, nullptr, dpost_weight_per_sample, dpre_weight_per_sample);
  PERFTRAIN_LAUNCH_CHECK();
}

#define PERFTRAIN_RESIDUAL_RMS_ADALN_INSTANTIATE(TX, TM, TA)                                                         \
  template void residual_rms_adaln_forward<TX, TM, TA>(const TX*, const TM*, int64_t, const TA*, const float*,       \
                                                       const float*, const TM*, int64_t, TX*, TA*, float*, float*,   \
                                                       TA*, int, int, int, float, cudaStream_t, const Fp8RowOut&);                     \
  template void residual_rms_adaln_backward<TX, TM, TA>(const TX*, const TA*, const TX*, const TA*, const TA*,       \
                                                        const float*, const float*, const TM*, int64_t, const TM*,   \
                                                        int64_t, const float*, const float*, TX*, TA*, TM*, TM*,     \
                                                        float*, float*, float*, int, int, int, int, cudaStream_t);
PERFTRAIN_FOR_STORAGE_TYPES3(PERFTRAIN_RESIDUAL_RMS_ADALN_INSTANTIATE)

}  // namespace perftrain::kernels
