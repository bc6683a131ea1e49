// The gradient monitor's per-parameter statistics and histograms in one pass
// over every gradient (ops/grad_stats.h has the definitions it reproduces),
// in two launches with no host sync and nothing sized from the data, so the
// monitored step captures in a CUDA graph:
//   (1) grad_stats_partials: a block per chunk of kGradStatsChunk elements of
//       one tensor (found by binary search in the prefix sum of chunk counts,
//       as multi_tensor_adamw does) reads the chunk once (16-byte vector loads
//       where the tensor's pointer allows; fp32, bf16 or fp16, math in fp32)
//       and writes one row of kGradPartialColumns partials: sum g^2, sum |g|,
//       max |g|, nonzero and non-finite counts, min, max, sum, and (histograms
//       on) the count of finite elements in each bucket. The bucket of g is
//       the one at::bucketize(right=false) gives: the number of edges < g.
//       It is guessed from log2|g| against the first positive edge, then
//       moved until edge[i-1] < g <= edge[i] holds, so it is exact at and
//       around the edges for any sorted edge array (the fix-up is a loop).
//       Counts go into a shared-memory histogram laid out [bucket][lane]:
//       each lane of a warp owns one bank, so a warp's atomicAdds never
//       collide however concentrated the gradient is (only warps of the same
//       lane contend, in different cycles).
//   (2) grad_stats_finalize: a block per tensor sums its chunks' partials in
//       chunk order (sums in fp64, counts in uint64, NaN-propagating min and
//       max) and writes the tensor's statistics row and histogram row.
// Both steps use fixed orders, and the histogram's integer atomics commute,
// so the result is deterministic. Per-chunk counts are at most
// kGradStatsChunk, exact in the fp32 partials; the totals are exact up to
// 2^24 per bucket in the fp32 output row (DiT-XL/2's largest gradient has
// 8M elements), rounded to the nearest float beyond.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/chunk_table.h"

namespace perftrain::kernels {

constexpr int kGradStatsChunk = 65536;     // elements per block of the first launch
constexpr int kGradStatsMaxTensors = 512;  // per table (~14 KB: a kernel parameter)
constexpr int kGradHistBuckets = 115;      // observe::grad_histogram_limits()
constexpr int kGradHistEdges = kGradHistBuckets - 1;
constexpr int kGradStatCols = 5;   // ||g||_2, sum |g|, max |g|, nonzero, non-finite
constexpr int kGradHistLead = 3;   // min, max, sum; then the bucket counts
constexpr int kGradPartialColumns = 8 + kGradHistBuckets;

enum class GradDtype : int { kFloat = 0, kBFloat16 = 1, kHalf = 2 };

// One gradient, contiguous; g == nullptr or n == 0: no elements (its rows
// are zeros). row: the output row it fills.
struct GradStatsTensor {
  const void* g;
  int64_t n;
  int dtype;  // GradDtype
  int row;
};

// Chunks of kGradStatsChunk elements: chunk_end holds the prefix sums of ceil(n / kGradStatsChunk).
using GradStatsTable = ChunkTable<GradStatsTensor, kGradStatsMaxTensors>;
static_assert(sizeof(GradStatsTable) <= 32000, "the table travels as a kernel parameter (32764 bytes at most)");

// Where the results go: row r of the statistics at stats + r * stats_stride
// (kGradStatCols floats), of the histograms at hist + r * hist_stride
// (kGradHistLead + kGradHistBuckets floats); hist == nullptr: no histograms.
// edges: kGradHistEdges sorted float32 bucket edges on the device. scale
// (device, optional): the factor the gradients carry (fp16's loss scale): the
// edges are compared as edges * scale, and the first three columns of both
// rows are divided by it.
struct GradStatsOut {
  float* stats;
  int64_t stats_stride;
  float* hist;
  int64_t hist_stride;
  const float* edges;
  const float* scale;
};

// partials: float32 [table.chunks, kGradPartialColumns] workspace.
void grad_stats(const GradStatsTable& table, const GradStatsOut& out, float* partials, cudaStream_t stream);

}  // namespace perftrain::kernels
