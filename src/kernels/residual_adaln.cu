#include "kernels/residual_adaln.h"

#include <algorithm>
#include <stdexcept>
#include <type_traits>

#include "kernels/cuda_check.h"
#include "kernels/layernorm_stats.cuh"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {
namespace {

using detail::from_float;
using detail::layernorm_grad_dx;
using detail::layernorm_grad_terms;
using detail::layernorm_row_stats;
using detail::load_raw;
using detail::load_vec;
using detail::raw_to_float;
using detail::RawVec;
using detail::row_sum;
using detail::store_vec;
using detail::to_float;
using detail::vec8_aligned;

// Register budget per thread: ITEMS vectors of VEC elements of the row.
// Forward: x1 (1 array) lives across the row. Backward: the three column sums
// live across all rows and xhat, g across one row's reduction: 5 arrays, which
// at 2 x 8 stays inside the 128 registers a 512-thread block allows. With a
// bias the fourth sum (6 arrays) spills at 2 x 8 in the fp32 instantiations,
// so rows up to kNarrowBiasCols take 1 x 8 (more threads per row instead),
// wider ones 2 x 8 (a few spilled registers).
template <int VEC> constexpr int fwd_items() { return VEC == 8 ? 6 : 16; }  // warp covers D <= 1536 / 512
template <int VEC> constexpr int bwd_items() { return VEC == 8 ? 2 : 16; }
constexpr int kMaxThreads = 512;
constexpr int kNarrowBiasItems = 1;  // VEC = 8
constexpr int kNarrowBiasCols = kMaxThreads * 8 * kNarrowBiasItems;
static_assert(kMaxThreads * fwd_items<1>() >= kResidualAdaLNMaxCols &&
                  kMaxThreads * 8 * bwd_items<8>() >= kResidualAdaLNMaxCols &&
                  kMaxThreads * bwd_items<1>() >= kResidualAdaLNMaxCols,
              "the registers must cover the widest row");

int threads_per_row(int nvec, int items) { return detail::row_threads(nvec, items, kMaxThreads, "residual_adaln"); }

// The value as stored in T: LN must see x1 exactly as the residual stream keeps it.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

// BIAS: a separate instantiation, so that the path without one keeps its registers.
template <typename TX, typename TM, typename TA, int VEC, int ITEMS, bool BIAS>
__global__ void __launch_bounds__(kMaxThreads, 1)
    residual_adaln_forward_kernel(const TX* __restrict__ x, const TM* __restrict__ gate, int64_t gate_stride,
                                  const TA* __restrict__ y, const float* __restrict__ bias,
                                  const TM* __restrict__ shift, int64_t shift_stride,
                                  const TM* __restrict__ scale, int64_t scale_stride, TX* __restrict__ x1,
                                  TA* __restrict__ h, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                  TA* __restrict__ xhat_out, int rows, int tokens, int cols, float eps) {
  __shared__ float smem[32];
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;  // a whole warp (warp per row) or a whole block (block per row)
  const int nvec = cols / VEC;
  const int64_t off = int64_t(row) * cols;
  const int b = row / tokens;
  const TM* gt = gate + int64_t(b) * gate_stride;

  // x1 = x + gate * (y + bias), written out and kept (as stored) for the statistics.
  float v[ITEMS][VEC];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < nvec) {
      float yv[VEC], g[VEC];
      load_vec<TX, VEC>(x + off + int64_t(c) * VEC, v[i]);
      load_vec<TA, VEC>(y + off + int64_t(c) * VEC, yv);
      load_vec<TM, VEC>(gt + c * VEC, g);
      if constexpr (BIAS) {
        float bv[VEC];
        load_vec<float, VEC>(bias + c * VEC, bv);
#pragma unroll
        for (int j = 0; j < VEC; ++j) yv[j] += bv[j];
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[i][j] = round_to<TX>(v[i][j] + g[j] * yv[j]);
      store_vec<TX, VEC>(x1 + off + int64_t(c) * VEC, v[i]);
    }
  }
  const auto [mean, rstd] = layernorm_row_stats(v, nvec, cols, eps, smem, row, mean_out, rstd_out);

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
      for (int j = 0; j < VEC; ++j) v[i][j] = (v[i][j] - mean) * rstd;  // xhat
#pragma unroll
      for (int j = 0; j < VEC; ++j) out[j] = v[i][j] * (1.f + a[j]) + m[j];
      store_vec<TA, VEC>(h + off + int64_t(c) * VEC, out);
      if (xhat_out != nullptr) store_vec<TA, VEC>(xhat_out + off + int64_t(c) * VEC, v[i]);
    }
  }
}

// Block (tile, b): rows b*tokens + [tile*rows_per_tile, ...) of one sample.
// XHAT: read the normalised rows the forward kept (TA) instead of x1 and mean.
// Phase 1 of a row needs x1, dh, scale (the LN backward's two row sums);
// phase 2 reads dx1_ext, y, gate only after the sums (unless EARLY), so they
// take no registers across the reduction. SUM_DX1: also the column sums of dx1
// (plane 3), for the bias; the bias itself only enters in the reduce kernel.
// EARLY: all four row inputs (xhat or x1, dh, dx1_ext, y) are loaded as raw
// words one row ahead, so each row costs one memory round trip instead of
// two and the next row's loads are in flight during this row's block
// reduction (one row per block at a time otherwise leaves few bytes in
// flight per SM). It holds two rows' inputs in registers across the
// reduction, so only the one-vector (ITEMS = 1) instantiations take it.
template <typename TX, typename TM, typename TA, int VEC, int ITEMS, bool SUM_DX1, bool XHAT, bool EARLY>
__global__ void __launch_bounds__(kMaxThreads, 1)
    residual_adaln_backward_kernel(const TX* __restrict__ dx1_ext, const TA* __restrict__ dh,
                                   const TX* __restrict__ x1, const TA* __restrict__ xhat,
                                   const TA* __restrict__ y, const TM* __restrict__ gate,
                                   int64_t gate_stride, const TM* __restrict__ scale, int64_t scale_stride,
                                   const float* __restrict__ mean, const float* __restrict__ rstd,
                                   TX* __restrict__ dx, TA* __restrict__ dy, float* __restrict__ partials, int tokens,
                                   int cols, int rows_per_tile, int64_t plane) {
  __shared__ float smem[64];
  const int tile = blockIdx.x, b = blockIdx.y, tiles = gridDim.x;
  const int nvec = cols / VEC;
  const float inv_cols = 1.f / float(cols);
  const int t0 = tile * rows_per_tile;
  const int t1 = min(tokens, t0 + rows_per_tile);
  const TM* gt = gate + int64_t(b) * gate_stride;
  const TM* sc = scale + int64_t(b) * scale_stride;

  float acc_dgate[ITEMS][VEC], acc_dscale[ITEMS][VEC], acc_dshift[ITEMS][VEC];
  float acc_dx1[ITEMS][VEC];  // only with SUM_DX1
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc_dgate[i][j] = acc_dscale[i][j] = acc_dshift[i][j] = acc_dx1[i][j] = 0.f;
  }

  // EARLY's raw row inputs: this row's (cur) and the next one's.
  using TXH = std::conditional_t<XHAT, TA, TX>;
  struct RowInputs {
    RawVec<TXH, VEC> xh[ITEMS];
    RawVec<TA, VEC> d[ITEMS], y[ITEMS];
    RawVec<TX, VEC> e[ITEMS];
    float mu, rs;
  };
  RowInputs cur, next;
  auto load_row = [&](int t, RowInputs& in) {
    const int64_t row = int64_t(b) * tokens + t, off = row * cols;
    in.mu = XHAT ? 0.f : mean[row];
    in.rs = rstd[row];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = threadIdx.x + i * blockDim.x;
      if (c < nvec) {
        if constexpr (XHAT) {
          load_raw<TA, VEC>(xhat + off + int64_t(c) * VEC, in.xh[i]);
        } else {
          load_raw<TX, VEC>(x1 + off + int64_t(c) * VEC, in.xh[i]);
        }
        load_raw<TA, VEC>(dh + off + int64_t(c) * VEC, in.d[i]);
        if (dx1_ext != nullptr) load_raw<TX, VEC>(dx1_ext + off + int64_t(c) * VEC, in.e[i]);
        load_raw<TA, VEC>(y + off + int64_t(c) * VEC, in.y[i]);
      }
    }
  };
  if constexpr (EARLY) {
    if (t0 < t1) load_row(t0, cur);
  }

  for (int t = t0; t < t1; ++t) {  // the same trip count for the whole block
    const int64_t row = int64_t(b) * tokens + t;
    const int64_t off = row * cols;
    if constexpr (EARLY) {
      if (t + 1 < t1) load_row(t + 1, next);
    }
    const float mu = EARLY ? cur.mu : XHAT ? 0.f : mean[row];
    const float rs = EARLY ? cur.rs : rstd[row];
    float xh[ITEMS][VEC], g[ITEMS][VEC];
    float e[ITEMS][VEC], yv[ITEMS][VEC];  // dx1_ext (then dx1) and y
    auto load_phase2 = [&](int i, int c) {
      if constexpr (EARLY) {
        if (dx1_ext != nullptr) {
          raw_to_float<TX, VEC>(cur.e[i], e[i]);
        } else {
#pragma unroll
          for (int j = 0; j < VEC; ++j) e[i][j] = 0.f;
        }
        raw_to_float<TA, VEC>(cur.y[i], yv[i]);
      } else {
        if (dx1_ext != nullptr) {
          load_vec<TX, VEC>(dx1_ext + off + int64_t(c) * VEC, e[i]);
        } else {
#pragma unroll
          for (int j = 0; j < VEC; ++j) e[i][j] = 0.f;
        }
        load_vec<TA, VEC>(y + off + int64_t(c) * VEC, yv[i]);
      }
    };
    float s[2] = {0.f, 0.f};  // sum g, sum g*xhat
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = threadIdx.x + i * blockDim.x;
      if (c < nvec) {
        float d[VEC], a[VEC];
        if constexpr (EARLY) {
          raw_to_float<TXH, VEC>(cur.xh[i], xh[i]);
          raw_to_float<TA, VEC>(cur.d[i], d);
        } else if constexpr (XHAT) {
          load_vec<TA, VEC>(xhat + off + int64_t(c) * VEC, xh[i]);
          load_vec<TA, VEC>(dh + off + int64_t(c) * VEC, d);
        } else {
          load_vec<TX, VEC>(x1 + off + int64_t(c) * VEC, xh[i]);
          load_vec<TA, VEC>(dh + off + int64_t(c) * VEC, d);
        }
        load_vec<TM, VEC>(sc + c * VEC, a);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          if constexpr (!XHAT) xh[i][j] = (xh[i][j] - mu) * rs;
          layernorm_grad_terms(d[j], 1.f + a[j], xh[i][j], g[i][j], acc_dscale[i][j], acc_dshift[i][j], s);
        }
      }
    }
    row_sum<2>(s, smem);
    const float mg = s[0] * inv_cols, mgx = s[1] * inv_cols;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = threadIdx.x + i * blockDim.x;
      if (c < nvec) {
        float gv[VEC];
        load_phase2(i, c);
        load_vec<TM, VEC>(gt + c * VEC, gv);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          e[i][j] += layernorm_grad_dx(g[i][j], xh[i][j], rs, mg, mgx);  // dx1
          acc_dgate[i][j] += e[i][j] * yv[i][j];
          if constexpr (SUM_DX1) acc_dx1[i][j] += e[i][j];
          yv[i][j] = e[i][j] * gv[j];  // dy
        }
        store_vec<TX, VEC>(dx + off + int64_t(c) * VEC, e[i]);
        store_vec<TA, VEC>(dy + off + int64_t(c) * VEC, yv[i]);
      }
    }
    if constexpr (EARLY) cur = next;
  }

  // Plane 0: sum dx1*y (-> dgate); plane 1: sum dh*xhat (-> dscale); plane 2: sum dh (-> dshift);
  // plane 3: sum dx1 (-> the bias's share of dgate, and dbias).
  float* p0 = partials + (int64_t(b) * tiles + tile) * cols;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    if (c < nvec) {
      store_vec<float, VEC>(p0 + c * VEC, acc_dgate[i]);
      store_vec<float, VEC>(p0 + plane + c * VEC, acc_dscale[i]);
      store_vec<float, VEC>(p0 + 2 * plane + c * VEC, acc_dshift[i]);
      if constexpr (SUM_DX1) store_vec<float, VEC>(p0 + 3 * plane + c * VEC, acc_dx1[i]);
    }
  }
}

// The per-sample column sums over tiles, in tile order: three, or four when
// sum_dx1 (plane 3). dgate = sum dx1*y + bias * sum dx1 (the bias's share of
// sum dx1*(y + bias)); dbias_per_sample = gate * sum dx1.
template <typename TM>
__global__ void residual_adaln_reduce_partials_kernel(const float* __restrict__ partials, int64_t plane, int tiles,
                                                      int cols, bool sum_dx1, const TM* __restrict__ gate,
                                                      int64_t gate_stride, const float* __restrict__ bias,
                                                      TM* __restrict__ dgate, TM* __restrict__ dscale,
                                                      TM* __restrict__ dshift, float* __restrict__ dbias_per_sample) {
  const int b = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const float* p = partials + int64_t(b) * tiles * cols + c;
  float s[4] = {0.f, 0.f, 0.f, 0.f};
  if (sum_dx1)
    detail::sum_tiles<4>(p, plane, tiles, cols, s);
  else
    detail::sum_tiles<3>(p, plane, tiles, cols, s);
  if (bias != nullptr) s[0] = fmaf(bias[c], s[3], s[0]);
  if (dbias_per_sample != nullptr)
    dbias_per_sample[int64_t(b) * cols + c] = to_float(gate[int64_t(b) * gate_stride + c]) * s[3];
  dgate[int64_t(b) * cols + c] = from_float<TM>(s[0]);
  dscale[int64_t(b) * cols + c] = from_float<TM>(s[1]);
  dshift[int64_t(b) * cols + c] = from_float<TM>(s[2]);
}

}  // namespace

template <typename TX, typename TM, typename TA>
void residual_adaln_forward(const TX* x, const TM* gate, int64_t gate_stride, const TA* y, const float* bias,
                            const TM* shift, int64_t shift_stride, const TM* scale, int64_t scale_stride, TX* x1,
                            TA* h, float* mean, float* rstd, TA* xhat, int batch, int tokens, int cols, float eps,
                            cudaStream_t stream) {
  detail::check_sizes("residual_adaln_forward", batch, tokens, cols, kResidualAdaLNMaxCols);
  const int rows = batch * tokens;
  if (rows == 0) return;
  const bool vec8 = cols % 8 == 0 && gate_stride % 8 == 0 && shift_stride % 8 == 0 && scale_stride % 8 == 0 &&
                    vec8_aligned(x) && vec8_aligned(gate) && vec8_aligned(y) && vec8_aligned(shift) &&
                    vec8_aligned(scale) && vec8_aligned(x1) && vec8_aligned(h) &&
                    (bias == nullptr || vec8_aligned(bias)) && (xhat == nullptr || vec8_aligned(xhat));
  auto launch = [&](auto kernel, int vec, int items) {
    const int per_row = threads_per_row(cols / vec, items);
    const dim3 block(per_row, per_row == 32 ? 4 : 1);  // warp per row: 4 rows per block
    const dim3 grid((rows + block.y - 1) / block.y);
    kernel<<<grid, block, 0, stream>>>(x, gate, gate_stride, y, bias, shift, shift_stride, scale, scale_stride, x1,
                                       h, mean, rstd, xhat, rows, tokens, cols, eps);
    PERFTRAIN_LAUNCH_CHECK();
  };
  // A warp per row takes 8 x ITEMS x 32 columns: the fewest ITEMS that cover
  // the row. Fewer registers, so more rows in flight per SM: at D = 384, 2
  // vectors a thread take 56 registers where 6 took 94. D = 1152 (XL/2)
  // takes 5 (4.5 a lane).
  auto vec8_launch = [&](auto bias_tag) {
    constexpr bool B = decltype(bias_tag)::value;
    if (cols <= 8 * 2 * 32)
      launch(residual_adaln_forward_kernel<TX, TM, TA, 8, 2, B>, 8, 2);
    else if (cols <= 8 * 3 * 32)
      launch(residual_adaln_forward_kernel<TX, TM, TA, 8, 3, B>, 8, 3);
    else if (cols <= 8 * 4 * 32)
      launch(residual_adaln_forward_kernel<TX, TM, TA, 8, 4, B>, 8, 4);
    else if (cols <= 8 * 5 * 32)
      launch(residual_adaln_forward_kernel<TX, TM, TA, 8, 5, B>, 8, 5);
    else
      launch(residual_adaln_forward_kernel<TX, TM, TA, 8, fwd_items<8>(), B>, 8, fwd_items<8>());
  };
  if (vec8 && bias != nullptr)
    vec8_launch(std::true_type{});
  else if (vec8)
    vec8_launch(std::false_type{});
  else if (bias != nullptr)
    launch(residual_adaln_forward_kernel<TX, TM, TA, 1, fwd_items<1>(), true>, 1, fwd_items<1>());
  else
    launch(residual_adaln_forward_kernel<TX, TM, TA, 1, fwd_items<1>(), false>, 1, fwd_items<1>());
}

int residual_adaln_backward_tiles(int batch, int tokens, int cols, bool bias_sums, int sm_count) {
  // Slots from the block size the launch below picks for these columns, at
  // the 128 registers per thread that __launch_bounds__(512, 1) allows and the
  // row-ahead kernel takes: 512 / threads blocks per SM.
  const int threads = cols % 8 != 0 ? threads_per_row(cols, bwd_items<1>())
                      : bias_sums && cols <= kNarrowBiasCols ? threads_per_row(cols / 8, kNarrowBiasItems)
                                                             : threads_per_row(cols / 8, bwd_items<8>());
  const int64_t slots = int64_t(std::max(1, kMaxThreads / threads)) * std::max(sm_count, 1);
  return detail::wave_row_tiles(batch, tokens, slots, /*overhead_rows=*/2);
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
                    (dx1_ext == nullptr || vec8_aligned(dx1_ext)) && vec8_aligned(dh) &&
                    (xhat != nullptr ? vec8_aligned(xhat) : vec8_aligned(x1)) &&
                    vec8_aligned(y) && vec8_aligned(gate) && vec8_aligned(scale) && vec8_aligned(dx) &&
                    vec8_aligned(dy) && vec8_aligned(partials);
  auto launch = [&](auto kernel, int vec, int items) {
    const dim3 block(threads_per_row(cols / vec, items));
    const dim3 grid(tiles_per_sample, batch);
    kernel<<<grid, block, 0, stream>>>(dx1_ext, dh, x1, xhat, y, gate, gate_stride, scale, scale_stride, mean, rstd,
                                       dx, dy, partials, tokens, cols, rows_per_tile, plane);
    PERFTRAIN_LAUNCH_CHECK();
  };
  auto row_kernels = [&](auto xhat_tag) {
    constexpr bool XHAT = decltype(xhat_tag)::value;
    if (vec8 && sum_dx1 && cols <= kNarrowBiasCols)
      launch(residual_adaln_backward_kernel<TX, TM, TA, 8, kNarrowBiasItems, true, XHAT, true>, 8, kNarrowBiasItems);
    else if (vec8 && sum_dx1)
      launch(residual_adaln_backward_kernel<TX, TM, TA, 8, bwd_items<8>(), true, XHAT, false>, 8, bwd_items<8>());
    else if (vec8)
      launch(residual_adaln_backward_kernel<TX, TM, TA, 8, bwd_items<8>(), false, XHAT, false>, 8, bwd_items<8>());
    else if (sum_dx1)
      launch(residual_adaln_backward_kernel<TX, TM, TA, 1, bwd_items<1>(), true, XHAT, false>, 1, bwd_items<1>());
    else
      launch(residual_adaln_backward_kernel<TX, TM, TA, 1, bwd_items<1>(), false, XHAT, false>, 1, bwd_items<1>());
  };
  // A kept xhat saves memory only in a 16-bit TA (in fp32 it is x1's size):
  // only those instantiate the XHAT kernels.
  if constexpr (sizeof(TA) == 2) {
    if (xhat != nullptr) {
      row_kernels(std::true_type{});
    } else {
      row_kernels(std::false_type{});
    }
  } else {
    if (xhat != nullptr) throw std::invalid_argument("residual_adaln_backward: xhat is kept only in a 16-bit type");
    row_kernels(std::false_type{});
  }

  const dim3 grid((cols + 255) / 256, batch);
  residual_adaln_reduce_partials_kernel<TM><<<grid, 256, 0, stream>>>(partials, plane, tiles_per_sample, cols,
                                                                       sum_dx1, gate, gate_stride, bias, dgate,
                                                                       dscale, dshift, dbias_per_sample);
  PERFTRAIN_LAUNCH_CHECK();
}

#define PERFTRAIN_RESIDUAL_ADALN_INSTANTIATE(TX, TM, TA)                                                         \
  template void residual_adaln_forward<TX, TM, TA>(const TX*, const TM*, int64_t, const TA*, const float*,       \
                                                   const TM*, int64_t, const TM*, int64_t, TX*, TA*, float*,      \
                                                   float*, TA*, int, int, int, float, cudaStream_t);              \
  template void residual_adaln_backward<TX, TM, TA>(const TX*, const TA*, const TX*, const TA*, const TA*,       \
                                                    const float*, const TM*, int64_t, const TM*, int64_t,         \
                                                    const float*, const float*, TX*, TA*, TM*, TM*, TM*, float*,  \
                                                    float*, int, int, int, int, cudaStream_t);
PERFTRAIN_FOR_STORAGE_TYPES3(PERFTRAIN_RESIDUAL_ADALN_INSTANTIATE)

}  // namespace perftrain::kernels
