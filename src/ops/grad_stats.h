// The gradient monitor's per-parameter statistics and histograms
// (train/grad_monitor.h uses them inside the captured training step).
//
// For each gradient g (one per parameter; undefined or empty: a row of zeros):
//   statistics row: ||g||_2, sum |g|, max |g|, the count of elements != 0
//                   (NaN included) and of non-finite elements;
//   histogram row:  min, max and sum over all of g (a NaN or Inf is in them),
//                   then one count per bucket of `boundaries` (edges e, sorted):
//                   bucket i holds e[i-1] < g <= e[i] (at::bucketize,
//                   right=false), finite elements only.
// scale (0-d, optional): the factor the gradients carry (fp16's loss scale):
// the edges are compared as e * scale, and the first three columns of both
// rows are divided by it.
//
// CUDA with fp32, bf16 or fp16 gradients and the monitor's 114 edges: one
// fused pass over every gradient (kernels/grad_stats.h), two launches, no host
// sync, nothing sized from the data; sums in fp32 within a chunk and fp64
// across chunks, counts exact, deterministic. Its norms are fp32 for every
// gradient dtype (the reference rounds a bf16/fp16 gradient's norms to that
// dtype). Otherwise, and on the CPU: the reference below, plain ATen.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace perftrain::ops {

constexpr int64_t kGradStatColumns = 5;  // the statistics row's columns, in the order above
constexpr int64_t kGradHistLead = 3;     // min, max, sum before the counts

// Writes stats[i, 0:5] and, where hist is defined, hist[i, :] for grads[i].
// stats: float32 [n, >= 5], unit column stride; hist: float32
// [n, kGradHistLead + boundaries.numel() + 1], unit column stride;
// boundaries: float32 [edges] contiguous; scale: one float32 element or
// undefined; all on the gradients' device. Other columns of stats are left alone.
void grad_stats_into(const std::vector<at::Tensor>& grads, const at::Tensor& stats, const at::Tensor& hist,
                     const at::Tensor& boundaries, const at::Tensor& scale = {});

// The reference, plain ATen per gradient (count_nonzero, isfinite + sum,
// _foreach_norm for L2, L1 and max; bucketize + scatter_add_ of the
// finiteness, min, max, sum), without the scale:
// [n, kGradStatColumns] float32 on the gradients' device (the CPU when none is defined).
at::Tensor grad_stat_rows_reference(const std::vector<at::Tensor>& grads);
// [n, kGradHistLead + boundaries.numel() + 1] float32 on boundaries' device.
at::Tensor grad_histogram_rows_reference(const std::vector<at::Tensor>& grads, const at::Tensor& boundaries);

}  // namespace perftrain::ops
