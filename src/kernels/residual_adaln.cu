#include "kernels/residual_adaln.h"

#include <type_traits>

#include "kernels/cuda_check.h"
#include "kernels/row_norm.cuh"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {
namespace {

using detail::Norm;

// The kLayer register budgets (row_norm.cuh): vectors a thread, forward and backward.
constexpr int kFwd8 = detail::layer_fwd_items<8>(), kFwd1 = detail::layer_fwd_items<1>();
constexpr int kBwd8 = detail::layer_bwd_items<8>(), kBwd1 = detail::layer_bwd_items<1>();

constexpr const char* kName = "residual_adaln";

// Register budget per thread (detail::layer_fwd_items / layer_bwd_items): the backward's
// three column sums live across all rows and xhat, g across one row's reduction: 5
// arrays, which at 2 x 8 stays inside the 128 registers a 512-thread block allows. With a
// bias the fourth sum (6 arrays) spills at 2 x 8 in the fp32 instantiations, so rows up
// to kNarrowBiasCols take 1 x 8 (more threads per row instead), wider ones 2 x 8 (a few
// spilled registers). The forward takes the fewest vectors a lane that cover the row.
constexpr int kNarrowBiasItems = 1;  // VEC = 8
constexpr int kNarrowBiasCols = detail::kRowMaxThreads * 8 * kNarrowBiasItems;
static_assert(detail::kRowMaxThreads * kFwd1 >= kResidualAdaLNMaxCols &&
                  detail::kRowMaxThreads * 8 * kBwd8 >= kResidualAdaLNMaxCols &&
                  detail::kRowMaxThreads * kBwd1 >= kResidualAdaLNMaxCols,
              "the registers must cover the widest row");

}  // namespace

template <typename TX, typename TM, typename TA>
void residual_adaln_forward(const TX* x, const TM* gate, int64_t gate_stride, const TA* y, const float* bias,
                            const TM* shift, int64_t shift_stride, const TM* scale, int64_t scale_stride, TX* x1,
                            TA* h, float* mean, float* rstd, TA* xhat, int batch, int tokens, int cols, float eps,
                            cudaStream_t stream, const Fp8RowOut& fp8) {
  detail::check_sizes("residual_adaln_forward", batch, tokens, cols, kResidualAdaLNMaxCols);
  const int rows = batch * tokens;
  if (rows == 0) return;  // no rows: nothing written, h may be an empty tensor's null pointer
  detail::check_fp8_out("residual_adaln_forward", h, fp8);
  const bool vec8 = cols % 8 == 0 && gate_stride % 8 == 0 && shift_stride % 8 == 0 && scale_stride % 8 == 0 &&
                    detail::all_vec8_aligned(x, gate, y, shift, scale, x1, h, bias, xhat, fp8.q);
  auto launch = [&](auto kernel, int vec, int items) {
    const detail::RowLaunch l = detail::forward_rows(rows, cols / vec, items, kName);
    kernel<<<l.grid, l.block, 0, stream>>>(x, gate, gate_stride, y, bias, nullptr, nullptr, shift, shift_stride,
                                           scale, scale_stride, x1, h, nullptr, mean, rstd, xhat, rows, tokens,
                                           cols, eps, fp8);
    PERFTRAIN_LAUNCH_CHECK();
  };
  // A warp per row takes 8 x ITEMS x 32 columns: the fewest ITEMS that cover
  // the row. Fewer registers, so more rows in flight per SM: at D = 384, 2
  // vectors a thread take 56 registers where 6 took 94. D = 1152 (XL/2)
  // takes 5 (4.5 a lane).
  auto row_kernels = [&](auto bias_tag) {
    constexpr bool B = decltype(bias_tag)::value;
    if (!vec8)
      launch(detail::row_norm_forward_kernel<Norm::kLayer, true, B, TX, TM, TA, 1, kFwd1>, 1, kFwd1);
    else if (cols <= 8 * 2 * 32)
      launch(detail::row_norm_forward_kernel<Norm::kLayer, true, B, TX, TM, TA, 8, 2>, 8, 2);
    else if (cols <= 8 * 3 * 32)
      launch(detail::row_norm_forward_kernel<Norm::kLayer, true, B, TX, TM, TA, 8, 3>, 8, 3);
    else if (cols <= 8 * 4 * 32)
      launch(detail::row_norm_forward_kernel<Norm::kLayer, true, B, TX, TM, TA, 8, 4>, 8, 4);
    else if (cols <= 8 * 5 * 32)
      launch(detail::row_norm_forward_kernel<Norm::kLayer, true, B, TX, TM, TA, 8, 5>, 8, 5);
    else
      launch(detail::row_norm_forward_kernel<Norm::kLayer, true, B, TX, TM, TA, 8, kFwd8>, 8, kFwd8);
  };
  if (bias != nullptr)
    row_kernels(std::true_type{});
  else
    row_kernels(std::false_type{});
}

// The backward's block size for these columns (also what the tile count assumes).
static int backward_threads(int cols, bool vec8, bool bias_sums) {
  if (!vec8) return detail::row_norm_threads(cols, kBwd1, kName);
  if (bias_sums && cols <= kNarrowBiasCols) return detail::row_norm_threads(cols / 8, kNarrowBiasItems, kName);
  return detail::row_norm_threads(cols / 8, kBwd8, kName);
}

int residual_adaln_backward_tiles(int batch, int tokens, int cols, bool bias_sums, int sm_count) {
  return detail::row_norm_wave_tiles(batch, tokens, backward_threads(cols, cols % 8 == 0, bias_sums), sm_count);
}

template <typename TX, typename TM, typename TA>
void residual_adaln_backward(const TX* dx1_ext, const TA* dh, const TX* x1, const TA* xhat, const TA* y,
                             const float* bias, const TM* gate, int64_t gate_stride, const TM* scale,
                             int64_t scale_stride, const float* mean, const float* rstd, TX* dx, TA* dy, TM* dgate,
                             TM* dshift, TM* dscale, float* dbias_per_sample, float* partials, int batch, int tokens,
                             int cols, int tiles_per_sample, cudaStream_t stream) {
  detail::check_sizes("residual_adaln_backward", batch, tokens, cols, kResidualAdaLNMaxCols);
  if (batch == 0) return;
  if (xhat == nullptr && (x1 == nullptr || mean == nullptr))
    throw std::invalid_argument("residual_adaln_backward: needs xhat, or x1 and mean");
  detail::check_tiles("residual_adaln_backward", tiles_per_sample, tokens);
  const int rows_per_tile = (tokens + tiles_per_sample - 1) / tiles_per_sample;
  const int64_t plane = int64_t(batch) * tiles_per_sample * cols;
  // The bias needs the column sums of dx1 (a fourth plane); without it the
  // row loop is the one without that sum.
  const bool sum_dx1 = bias != nullptr || dbias_per_sample != nullptr;
  const bool vec8 = cols % 8 == 0 && gate_stride % 8 == 0 && scale_stride % 8 == 0 &&
                    detail::all_vec8_aligned(dx1_ext, dh, xhat, xhat != nullptr ? nullptr : x1, y, gate, scale, dx,
                                             dy, partials);
  auto launch = [&](auto kernel) {
    const detail::RowLaunch l = detail::backward_tiles(tiles_per_sample, batch, backward_threads(cols, vec8, sum_dx1));
    kernel<<<l.grid, l.block, 0, stream>>>(dx1_ext, dh, x1, xhat, y, nullptr, nullptr, gate, gate_stride, scale,
                                           scale_stride, nullptr, mean, rstd, dx, dy, partials, tokens, cols,
                                           rows_per_tile, plane);
    PERFTRAIN_LAUNCH_CHECK();
  };
  // Rows up to kNarrowBiasCols with the bias's sums: one vector a thread, inputs a row ahead (EARLY).
  detail::with_xhat<TA>("residual_adaln_backward", xhat != nullptr, [&](auto xhat_tag) {
    constexpr bool XHAT = decltype(xhat_tag)::value;
    if (vec8 && sum_dx1 && cols <= kNarrowBiasCols)
      launch(detail::row_norm_backward_kernel<Norm::kLayer, true, TX, TM, TA, 8, kNarrowBiasItems, XHAT, true, true>);
    else if (vec8 && sum_dx1)
      launch(detail::row_norm_backward_kernel<Norm::kLayer, true, TX, TM, TA, 8, kBwd8, XHAT, true, false>);
    else if (vec8)
      launch(detail::row_norm_backward_kernel<Norm::kLayer, true, TX, TM, TA, 8, kBwd8, XHAT, false, false>);
    else if (sum_dx1)
      launch(detail::row_norm_backward_kernel<Norm::kLayer, true, TX, TM, TA, 1, kBwd1, XHAT, true, false>);
    else
      launch(detail::row_norm_backward_kernel<Norm::kLayer, true, TX, TM, TA, 1, kBwd1, XHAT, false, false>);
  });

  const detail::RowLaunch r = detail::reduce_columns(cols, batch);
  detail::row_norm_reduce_kernel<Norm::kLayer, true, TM><<<r.grid, r.block, 0, stream>>>(
      partials, plane, tiles_per_sample, cols, sum_dx1, bias, nullptr, nullptr, gate, gate_stride, nullptr, 0, dgate,
      dshift, dscale, dbias_per_sample, nullptr, nullptr);
  PERFTRAIN_LAUNCH_CHECK();
}

#define PERFTRAIN_RESIDUAL_ADALN_INSTANTIATE(TX, TM, TA)                                                         \
  template void residual_adaln_forward<TX, TM, TA>(const TX*, const TM*, int64_t, const TA*, const float*,       \
                                                   const TM*, int64_t, const TM*, int64_t, TX*, TA*, float*,      \
                                                   float*, TA*, int, int, int, float, cudaStream_t,               \
                                                   const Fp8RowOut&);                                             \
  template void residual_adaln_backward<TX, TM, TA>(const TX*, const TA*, const TX*, const TA*, const TA*,       \
                                                    const float*, const TM*, int64_t, const TM*, int64_t,         \
                                                    const float*, const float*, TX*, TA*, TM*, TM*, TM*, float*,  \
                                                    float*, int, int, int, int, cudaStream_t);
PERFTRAIN_FOR_STORAGE_TYPES3(PERFTRAIN_RESIDUAL_ADALN_INSTANTIATE)

}  // namespace perftrain::kernels
