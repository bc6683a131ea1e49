// Gradient statistics and histograms (see the header for the two launches).
// Reference: ops::grad_stat_rows_reference and grad_histogram_rows_reference
// (plain ATen: _foreach_norm, count_nonzero, isfinite, bucketize,
// scatter_add_, min/max/sum), which this reproduces column for column.
#include "kernels/grad_stats.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/chunk_table.cuh"
#include "kernels/cuda_check.h"
#include "kernels/vector_io.cuh"

namespace perftrain::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kFinalThreads = 128;  // >= kGradPartialColumns: a thread per column
static_assert(kFinalThreads >= kGradPartialColumns, "one finalize thread per partial column");
constexpr int kMidBucket = kGradHistEdges / 2;  // (-edge0, +edge0]: the zero bucket

// Partial columns (per chunk; the first eight also name the finalize sums).
enum : int { kSumSq = 0, kSumAbs, kMaxAbs, kNonzero, kNonfinite, kMin, kMax, kSum, kCounts };
static_assert(kCounts + kGradHistBuckets == kGradPartialColumns, "partial row layout");

// NaN-propagating max and min, as torch's max()/min() and _foreach_norm's
// inf norm: once a NaN is in, it stays.
__device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ float min_nan(float a, float b) { return (a < b || a != a) ? a : b; }

// One thread's running statistics over its elements of a chunk.
struct Acc {
  float sq = 0.f, abs = 0.f, amax = 0.f, mn = INFINITY, mx = -INFINITY, sum = 0.f;
  int nonzero = 0, nonfinite = 0;
};

// The bucket at::bucketize(x, edges, right=false) gives: the number of edges
// below x, i.e. the i with edges[i-1] < x <= edges[i]. The positive edges are
// about edges[mid] * 10^(k/4), so about 4 log10(|x| / edges[mid]) of them lie
// below |x| (and as many negative ones above -|x|); the two loops then move
// the guess until the defining inequalities hold, which makes it exact
// whatever the rounding of log2f or of the (scaled) edges. x is finite.
__device__ __forceinline__ int bucket_of(float x, const float* e, float log2_first) {
  float t = (log2f(fabsf(x)) - log2_first) * 1.2041199826559248f;  // 4 / log2(10)
  t = fminf(fmaxf(t, 0.f), float(kMidBucket));  // also |x| == 0 (-inf) and a NaN guess
  const int j = static_cast<int>(ceilf(t));
  int i = x > 0.f ? kMidBucket + j : kMidBucket - j;
  while (i > 0 && !(e[i - 1] < x)) --i;
  while (i < kGradHistEdges && e[i] < x) ++i;
  return i;
}

template <bool kHist>
__device__ __forceinline__ void add(Acc& a, float x, const float* e, float log2_first, unsigned* hist_lane) {
  const float ax = fabsf(x);
  a.sq = fmaf(x, x, a.sq);
  a.abs += ax;
  a.amax = max_nan(a.amax, ax);
  a.mn = min_nan(a.mn, x);
  a.mx = max_nan(a.mx, x);
  a.sum += x;
  a.nonzero += x != 0.f;  // NaN counts, as count_nonzero
  const bool finite = ax <= 3.402823466e38f;  // false for Inf and NaN
  a.nonfinite += !finite;
  if (kHist && finite) atomicAdd(hist_lane + bucket_of(x, e, log2_first) * 32, 1u);
}

template <typename T, bool kHist>
__device__ __forceinline__ void chunk_pass(const T* g, int len, Acc& a, const float* e, float log2_first,
                                           unsigned* hist_lane) {
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte load
  int tail = 0;
  if ((reinterpret_cast<uintptr_t>(g) & 15) == 0) {
    const int nv = len / V;
    for (int i = threadIdx.x; i < nv; i += kThreads) {
      float f[V];
      detail::load_vec<T, V>(g + i * V, f);
#pragma unroll
      for (int k = 0; k < V; ++k) add<kHist>(a, f[k], e, log2_first, hist_lane);
    }
    tail = nv * V;
  }
  for (int i = tail + threadIdx.x; i < len; i += kThreads) add<kHist>(a, detail::to_float(g[i]), e, log2_first, hist_lane);
}

// Launch 1: a block per chunk, a row of kGradPartialColumns partials each.
template <bool kHist>
__global__ void __launch_bounds__(kThreads)
grad_stats_partials_kernel(const __grid_constant__ GradStatsTable table, const GradStatsOut out,
                           float* __restrict__ partials) {
  __shared__ unsigned hist[kHist ? kGradHistBuckets * 32 : 1];  // [bucket][lane]
  __shared__ float edges[kGradHistEdges];
  __shared__ float warp_part[kWarps][8];
  const int c = blockIdx.x;
  const int tensor = detail::tensor_of_chunk(table, c);
  const GradStatsTensor& t = table.t[tensor];
  const int first = tensor == 0 ? 0 : table.chunk_end[tensor - 1];
  const int64_t start = static_cast<int64_t>(c - first) * kGradStatsChunk;
  const int64_t left = t.n - start;
  const int len = left < kGradStatsChunk ? static_cast<int>(left) : kGradStatsChunk;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  if (kHist) {
    for (int i = threadIdx.x; i < kGradHistBuckets * 32; i += kThreads) hist[i] = 0u;
    const float s = out.scale != nullptr ? *out.scale : 1.f;
    for (int i = threadIdx.x; i < kGradHistEdges; i += kThreads)
      edges[i] = out.scale != nullptr ? out.edges[i] * s : out.edges[i];  // as boundaries * scale in fp32
    __syncthreads();
  }
  const float log2_first = kHist ? log2f(edges[kMidBucket]) : 0.f;

  Acc a;
  switch (static_cast<GradDtype>(t.dtype)) {
    case GradDtype::kFloat:
      chunk_pass<float, kHist>(static_cast<const float*>(t.g) + start, len, a, edges, log2_first, hist + lane);
      break;
    case GradDtype::kBFloat16:
      chunk_pass<__nv_bfloat16, kHist>(static_cast<const __nv_bfloat16*>(t.g) + start, len, a, edges, log2_first,
                                       hist + lane);
      break;
    case GradDtype::kHalf:
      chunk_pass<__half, kHist>(static_cast<const __half*>(t.g) + start, len, a, edges, log2_first, hist + lane);
      break;
  }

  // Block reduction in a fixed order: a butterfly in each warp (every lane
  // ends with the same bits), then thread 0 over the warps in order.
  float v[8] = {a.sq, a.abs, a.amax, float(a.nonzero), float(a.nonfinite), a.mn, a.mx, a.sum};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float w[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = __shfl_xor_sync(0xffffffffu, v[k], o);
    v[kSumSq] += w[kSumSq];
    v[kSumAbs] += w[kSumAbs];
    v[kMaxAbs] = max_nan(v[kMaxAbs], w[kMaxAbs]);
    v[kNonzero] += w[kNonzero];  // integers below 2^24: exact
    v[kNonfinite] += w[kNonfinite];
    v[kMin] = min_nan(v[kMin], w[kMin]);
    v[kMax] = max_nan(v[kMax], w[kMax]);
    v[kSum] += w[kSum];
  }
  if (lane == 0)
    for (int k = 0; k < 8; ++k) warp_part[warp][k] = v[k];
  __syncthreads();  // also: every histogram atomic is done
  float* row = partials + static_cast<int64_t>(c) * kGradPartialColumns;
  if (threadIdx.x == 0) {
    float r[8];
    for (int k = 0; k < 8; ++k) r[k] = warp_part[0][k];
    for (int w = 1; w < kWarps; ++w) {
      r[kSumSq] += warp_part[w][kSumSq];
      r[kSumAbs] += warp_part[w][kSumAbs];
      r[kMaxAbs] = max_nan(r[kMaxAbs], warp_part[w][kMaxAbs]);
      r[kNonzero] += warp_part[w][kNonzero];
      r[kNonfinite] += warp_part[w][kNonfinite];
      r[kMin] = min_nan(r[kMin], warp_part[w][kMin]);
      r[kMax] = max_nan(r[kMax], warp_part[w][kMax]);
      r[kSum] += warp_part[w][kSum];
    }
    for (int k = 0; k < 8; ++k) row[k] = r[k];
  }
  if (kHist && threadIdx.x < kGradHistBuckets) {
    // Bucket b's 32 lane counters; thread b starts at lane b % 32 so that a
    // warp's 32 reads fall in 32 different banks.
    const unsigned* h = hist + threadIdx.x * 32;
    unsigned n = 0;
    for (int l = 0; l < 32; ++l) n += h[(l + threadIdx.x) & 31];
    row[kCounts + threadIdx.x] = static_cast<float>(n);  // <= kGradStatsChunk: exact
  }
}

// Launch 2: a block per tensor; thread k sums partial column k over the
// tensor's chunks in chunk order and writes its output column.
template <bool kHist>
__global__ void __launch_bounds__(kFinalThreads)
grad_stats_finalize_kernel(const __grid_constant__ GradStatsTable table, const GradStatsOut out,
                           const float* __restrict__ partials) {
  const int k = threadIdx.x;
  if (k >= (kHist ? kGradPartialColumns : kCounts)) return;
  const int tensor = blockIdx.x;
  const int c0 = tensor == 0 ? 0 : table.chunk_end[tensor - 1], c1 = table.chunk_end[tensor];
  const float* col = partials + k;
  float value = 0.f;  // no elements: a row of zeros, as the reference's
  if (c1 > c0) {
    if (k == kMaxAbs || k == kMax || k == kMin) {
      float m = col[static_cast<int64_t>(c0) * kGradPartialColumns];
      for (int c = c0 + 1; c < c1; ++c) {
        const float x = col[static_cast<int64_t>(c) * kGradPartialColumns];
        m = k == kMin ? min_nan(m, x) : max_nan(m, x);
      }
      value = m;
    } else if (k == kSumSq || k == kSumAbs || k == kSum) {
      double s = 0;
      for (int c = c0; c < c1; ++c) s += col[static_cast<int64_t>(c) * kGradPartialColumns];
      value = static_cast<float>(k == kSumSq ? sqrt(s) : s);
    } else {  // counts: exact in uint64, rounded to float once
      unsigned long long n = 0;
      for (int c = c0; c < c1; ++c) n += static_cast<unsigned>(col[static_cast<int64_t>(c) * kGradPartialColumns]);
      value = static_cast<float>(n);
    }
  }
  const int row = table.t[tensor].row;
  const float s = out.scale != nullptr ? *out.scale : 1.f;
  float* stats = out.stats + static_cast<int64_t>(row) * out.stats_stride;
  float* hist = kHist ? out.hist + static_cast<int64_t>(row) * out.hist_stride : nullptr;
  switch (k) {
    case kSumSq: stats[0] = value / s; break;
    case kSumAbs: stats[1] = value / s; break;
    case kMaxAbs: stats[2] = value / s; break;
    case kNonzero: stats[3] = value; break;
    case kNonfinite: stats[4] = value; break;
    case kMin: if (kHist) hist[0] = value / s; break;
    case kMax: if (kHist) hist[1] = value / s; break;
    case kSum: if (kHist) hist[2] = value / s; break;
    default: hist[kGradHistLead + k - kCounts] = value; break;
  }
}

}  // namespace

void grad_stats(const GradStatsTable& table, const GradStatsOut& out, float* partials, cudaStream_t stream) {
  if (table.count == 0) return;
  const bool hist = out.hist != nullptr;
  if (table.chunks > 0) {
    if (hist) grad_stats_partials_kernel<true><<<table.chunks, kThreads, 0, stream>>>(table, out, partials);
    else grad_stats_partials_kernel<false><<<table.chunks, kThreads, 0, stream>>>(table, out, partials);
    PERFTRAIN_LAUNCH_CHECK();
  }
  if (hist) grad_stats_finalize_kernel<true><<<table.count, kFinalThreads, 0, stream>>>(table, out, partials);
  else grad_stats_finalize_kernel<false><<<table.count, kFinalThreads, 0, stream>>>(table, out, partials);
  PERFTRAIN_LAUNCH_CHECK();
}

}  // namespace perftrain::kernels
