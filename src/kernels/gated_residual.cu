#include "kernels/gated_residual.h"

#include <algorithm>
#include <stdexcept>

#include "kernels/cuda_check.h"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {
namespace {

using detail::from_float;
using detail::load_vec;
using detail::store_vec;
using detail::to_float;
using detail::vec8_aligned;

constexpr int kForwardThreads = 256;
constexpr int kForwardVectorsPerBlock = 8 * kForwardThreads;  // 8 vectors per thread
// Backward: 2 arrays of ITEMS*VEC live (3 with a bias), within 128 registers either way.
template <int VEC> constexpr int bwd_items() { return VEC == 8 ? 4 : 16; }
constexpr int kBackwardMaxThreads = 512;
static_assert(kBackwardMaxThreads * 8 * bwd_items<8>() >= kGatedResidualMaxCols &&
                  kBackwardMaxThreads * bwd_items<1>() >= kGatedResidualMaxCols,
              "the backward's registers must cover the widest row");

// BIAS: a separate instantiation, so that the path without one keeps its registers.
template <typename TX, typename TG, typename TY, int VEC, bool BIAS>
__global__ void __launch_bounds__(kForwardThreads)
    gated_forward_kernel(const TX* __restrict__ x, const TG* __restrict__ gate, int64_t gate_stride,
                         const TY* __restrict__ y, const float* __restrict__ bias, TX* __restrict__ out,
                         int rows, int tokens, int cols, int rows_per_block) {
  const int nvec = cols / VEC;
  const int row0 = blockIdx.x * rows_per_block;
  const int n = min(rows_per_block, rows - row0) * nvec;
#pragma unroll 2
  for (int i = threadIdx.x; i < n; i += kForwardThreads) {
    const int r = i / nvec;
    const int c = (i - r * nvec) * VEC;
    const int row = row0 + r;
    const int64_t off = int64_t(row) * cols + c;
    float a[VEC], g[VEC], v[VEC];
    load_vec<TX, VEC>(x + off, a);
    load_vec<TY, VEC>(y + off, v);
    load_vec<TG, VEC>(gate + int64_t(row / tokens) * gate_stride + c, g);
    if constexpr (BIAS) {
      float bv[VEC];
      load_vec<float, VEC>(bias + c, bv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] += bv[j];
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) a[j] += g[j] * v[j];
    store_vec<TX, VEC>(out + off, a);
  }
}

// Block (tile, b): rows b*tokens + [tile*rows_per_tile, ...) of one sample.
// SUM_DOUT: also the column sums of dout (plane 1 of the partials), for the
// bias; the bias itself only enters in the reduce kernel.
template <typename TX, typename TG, typename TY, int VEC, int ITEMS, bool SUM_DOUT>
__global__ void __launch_bounds__(kBackwardMaxThreads, 1)
    gated_backward_kernel(const TX* __restrict__ dout, const TG* __restrict__ gate, int64_t gate_stride,
                          const TY* __restrict__ y, TY* __restrict__ dy, float* __restrict__ partials, int tokens,
                          int cols, int rows_per_tile, int64_t plane) {
  const int tile = blockIdx.x, b = blockIdx.y, tiles = gridDim.x;
  const int nvec = cols / VEC;
  const int t0 = tile * rows_per_tile;
  const int t1 = min(tokens, t0 + rows_per_tile);

  float g[ITEMS][VEC], acc[ITEMS][VEC], acc_d[ITEMS][VEC];  // acc_d: only with SUM_DOUT
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
#pragma unroll
    for (int j = 0; j < VEC; ++j) g[i][j] = acc[i][j] = acc_d[i][j] = 0.f;
    if (c < nvec) load_vec<TG, VEC>(gate + int64_t(b) * gate_stride + c * VEC, g[i]);
  }
  for (int t = t0; t < t1; ++t) {
    const int64_t off = (int64_t(b) * tokens + t) * cols;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int c = threadIdx.x + i * blockDim.x;
      if (c < nvec) {
        float d[VEC], v[VEC];
        load_vec<TX, VEC>(dout + off + int64_t(c) * VEC, d);
        load_vec<TY, VEC>(y + off + int64_t(c) * VEC, v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          acc[i][j] += d[j] * v[j];
          if constexpr (SUM_DOUT) acc_d[i][j] += d[j];
          v[j] = d[j] * g[i][j];
        }
        store_vec<TY, VEC>(dy + off + int64_t(c) * VEC, v);
      }
    }
  }
  float* p = partials + (int64_t(b) * tiles + tile) * cols;
  detail::store_plane(p, acc, nvec);
  if constexpr (SUM_DOUT) detail::store_plane(p + plane, acc_d, nvec);
}

// Sums over tiles, in tile order: s = sum dout*y (plane 0) and, when plane is
// not 0, s1 = sum dout (plane 1). dgate[b, c] = s + bias[c] * s1 (the bias's
// share of sum dout*(y + bias)); dbias_per_sample[b, c] = gate[b, c] * s1.
template <typename TG>
__global__ void gated_reduce_partials_kernel(const float* __restrict__ partials, int64_t plane, int tiles, int cols,
                                             const TG* __restrict__ gate, int64_t gate_stride,
                                             const float* __restrict__ bias, TG* __restrict__ dgate,
                                             float* __restrict__ dbias_per_sample) {
  const int b = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const float* p = partials + int64_t(b) * tiles * cols + c;
  float s[2] = {0.f, 0.f};
  if (plane == 0)
    detail::sum_tiles<1>(p, plane, tiles, cols, s);
  else
    detail::sum_tiles<2>(p, plane, tiles, cols, s);
  if (bias != nullptr) s[0] = fmaf(bias[c], s[1], s[0]);
  dgate[int64_t(b) * cols + c] = from_float<TG>(s[0]);
  if (dbias_per_sample != nullptr)
    dbias_per_sample[int64_t(b) * cols + c] = to_float(gate[int64_t(b) * gate_stride + c]) * s[1];
}

}  // namespace

template <typename TX, typename TG, typename TY>
void gated_residual_forward(const TX* x, const TG* gate, int64_t gate_stride, const TY* y, const float* bias, TX* out,
                            int batch, int tokens, int cols, cudaStream_t stream) {
  detail::check_sizes("gated_residual_forward", batch, tokens, cols, kGatedResidualMaxCols);
  const int rows = batch * tokens;
  if (rows == 0) return;
  const bool vec8 = cols % 8 == 0 && gate_stride % 8 == 0 && vec8_aligned(x) && vec8_aligned(gate) &&
                    vec8_aligned(y) && vec8_aligned(out) && (bias == nullptr || vec8_aligned(bias));
  auto launch = [&](auto kernel, int vec) {
    const int rows_per_block = std::max(1, kForwardVectorsPerBlock / (cols / vec));
    const dim3 grid((rows + rows_per_block - 1) / rows_per_block);
    kernel<<<grid, kForwardThreads, 0, stream>>>(x, gate, gate_stride, y, bias, out, rows, tokens, cols,
                                                 rows_per_block);
    PERFTRAIN_LAUNCH_CHECK();
  };
  if (vec8 && bias != nullptr)
    launch(gated_forward_kernel<TX, TG, TY, 8, true>, 8);
  else if (vec8)
    launch(gated_forward_kernel<TX, TG, TY, 8, false>, 8);
  else if (bias != nullptr)
    launch(gated_forward_kernel<TX, TG, TY, 1, true>, 1);
  else
    launch(gated_forward_kernel<TX, TG, TY, 1, false>, 1);
}

int gated_residual_backward_tiles(int batch, int tokens, int sm_count) {
  return detail::sample_row_tiles(batch, tokens, sm_count);
}

template <typename TX, typename TG, typename TY>
void gated_residual_backward(const TX* dout, const TG* gate, int64_t gate_stride, const TY* y, const float* bias,
                             TY* dy, TG* dgate, float* dbias_per_sample, float* partials, int batch, int tokens,
                             int cols, int tiles_per_sample, cudaStream_t stream) {
  detail::check_sizes("gated_residual_backward", batch, tokens, cols, kGatedResidualMaxCols);
  if (batch == 0) return;
  detail::check_tiles("gated_residual_backward", tiles_per_sample, tokens);
  const int rows_per_tile = (tokens + tiles_per_sample - 1) / tiles_per_sample;
  // The bias needs the column sums of dout (a second plane); without it the
  // row loop is the one without that sum.
  const bool sum_dout = bias != nullptr || dbias_per_sample != nullptr;
  const int64_t plane = sum_dout ? int64_t(batch) * tiles_per_sample * cols : 0;
  const bool vec8 = cols % 8 == 0 && gate_stride % 8 == 0 && vec8_aligned(dout) && vec8_aligned(gate) &&
                    vec8_aligned(y) && vec8_aligned(dy) && vec8_aligned(partials);
  auto launch = [&](auto kernel, int vec, int items) {
    const dim3 block(detail::row_threads(cols / vec, items, kBackwardMaxThreads, "gated_residual_backward"));
    const dim3 grid(tiles_per_sample, batch);
    kernel<<<grid, block, 0, stream>>>(dout, gate, gate_stride, y, dy, partials, tokens, cols, rows_per_tile, plane);
    PERFTRAIN_LAUNCH_CHECK();
  };
  if (vec8 && sum_dout)
    launch(gated_backward_kernel<TX, TG, TY, 8, bwd_items<8>(), true>, 8, bwd_items<8>());
  else if (vec8)
    launch(gated_backward_kernel<TX, TG, TY, 8, bwd_items<8>(), false>, 8, bwd_items<8>());
  else if (sum_dout)
    launch(gated_backward_kernel<TX, TG, TY, 1, bwd_items<1>(), true>, 1, bwd_items<1>());
  else
    launch(gated_backward_kernel<TX, TG, TY, 1, bwd_items<1>(), false>, 1, bwd_items<1>());

  const dim3 grid((cols + 255) / 256, batch);
  gated_reduce_partials_kernel<TG><<<grid, 256, 0, stream>>>(partials, plane, tiles_per_sample, cols, gate,
                                                             gate_stride, bias, dgate, dbias_per_sample);
  PERFTRAIN_LAUNCH_CHECK();
}

#define PERFTRAIN_GATED_INSTANTIATE(TX, TG, TY)                                                                  \
  template void gated_residual_forward<TX, TG, TY>(const TX*, const TG*, int64_t, const TY*, const float*, TX*,  \
                                                   int, int, int, cudaStream_t);                                 \
  template void gated_residual_backward<TX, TG, TY>(const TX*, const TG*, int64_t, const TY*, const float*, TY*, \
                                                    TG*, float*, float*, int, int, int, int, cudaStream_t);
PERFTRAIN_FOR_STORAGE_TYPES3(PERFTRAIN_GATED_INSTANTIATE)

}  // namespace perftrain::kernels
