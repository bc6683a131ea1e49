#include "ops/grad_stats.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/bucketize.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/count_nonzero.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <limits>
#include <string>

#include "base/error.h"
#include "kernels/grad_stats.h"
#include "ops/dtype_dispatch.h"

namespace perftrain::ops {

static_assert(kGradStatColumns == kernels::kGradStatCols && kGradHistLead == kernels::kGradHistLead,
              "the op's columns are the kernel's");

at::Tensor grad_stat_rows_reference(const std::vector<at::Tensor>& grads) {
  at::NoGradGuard no_grad;
  if (grads.empty()) return at::zeros({0, kGradStatColumns}, at::kFloat);
  at::TensorOptions opts;
  for (const auto& g : grads)
    if (g.defined()) opts = g.options();
  // An undefined or empty gradient counts as one zero: norms 0, no nonzero
  // element (not as an empty tensor: the max norm of one has no value, and
  // _foreach_norm's CPU path throws on it).
  std::vector<at::Tensor> g;
  g.reserve(grads.size());
  for (const auto& t : grads) g.push_back(t.defined() && t.numel() > 0 ? t : at::zeros({1}, opts));
  const auto f32 = [](const std::vector<at::Tensor>& v) { return at::stack(v).to(at::kFloat); };
  std::vector<at::Tensor> nonzero, nonfinite;
  for (const auto& t : g) {
    nonzero.push_back(at::count_nonzero(t));
    nonfinite.push_back(at::sum(at::logical_not(at::isfinite(t)), at::kFloat));
  }
  return at::stack({f32(at::_foreach_norm(g, 2)), f32(at::_foreach_norm(g, 1)),
                    f32(at::_foreach_norm(g, std::numeric_limits<double>::infinity())), f32(nonzero), f32(nonfinite)},
                   1);
}

at::Tensor grad_histogram_rows_reference(const std::vector<at::Tensor>& grads, const at::Tensor& boundaries) {
  at::NoGradGuard no_grad;
  const int64_t buckets = boundaries.numel() + 1;
  const at::TensorOptions opts = boundaries.options().dtype(at::kFloat);
  if (grads.empty()) return at::zeros({0, kGradHistLead + buckets}, opts);
  std::vector<at::Tensor> rows;
  rows.reserve(grads.size());
  for (const auto& g_in : grads) {
    if (!g_in.defined() || g_in.numel() == 0) {
      rows.push_back(at::zeros({kGradHistLead + buckets}, opts));
      continue;
    }
    const at::Tensor g = g_in.detach().reshape({-1}).to(at::kFloat);
    // Bucket i: boundaries[i-1] < g <= boundaries[i]. Each element adds its
    // finiteness (1 or 0) to its bucket, so only finite ones are counted.
    // (scatter_add_, not histc: CUDA's histc asks the driver for free memory
    // on the host, which a graph capture may refuse.)
    const at::Tensor index = at::bucketize(g, boundaries, /*out_int32=*/false, /*right=*/false);
    const at::Tensor counts = at::zeros({buckets}, opts).scatter_add_(0, index, at::isfinite(g).to(at::kFloat));
    rows.push_back(at::cat({at::stack({g.min(), g.max(), g.sum()}), counts}));
  }
  return at::stack(rows);
}

namespace {

constexpr const char* kOp = "grad_stats_into";

kernels::GradDtype kernel_dtype(at::ScalarType t) {
  return t == at::kFloat ? kernels::GradDtype::kFloat
         : t == at::kBFloat16 ? kernels::GradDtype::kBFloat16
                              : kernels::GradDtype::kHalf;
}

void check_args(const std::vector<at::Tensor>& grads, const at::Tensor& stats, const at::Tensor& hist,
                const at::Tensor& boundaries, const at::Tensor& scale) {
  const std::string o(kOp);
  const auto n = static_cast<int64_t>(grads.size());
  if (!stats.defined() || stats.scalar_type() != at::kFloat || stats.dim() != 2 || stats.size(0) != n ||
      stats.size(1) < kGradStatColumns || (n > 0 && stats.stride(1) != 1))
    throw UsageError(o + ": stats must be float32 [" + std::to_string(n) + ", >= " +
                     std::to_string(kGradStatColumns) + "] with unit column stride, got " +
                     (stats.defined() ? shape(stats) : std::string("none")));
  const at::Device device = stats.device();
  for (size_t i = 0; i < grads.size(); ++i)
    if (grads[i].defined() && grads[i].device() != device)
      throw UsageError(o + ": gradient " + std::to_string(i) + " is on " + grads[i].device().str() +
                       ", stats on " + device.str());
  if (scale.defined() && (scale.numel() != 1 || scale.scalar_type() != at::kFloat || scale.device() != device))
    throw UsageError(o + ": scale must be one float32 element on " + device.str());
  if (!hist.defined()) return;
  if (!boundaries.defined() || boundaries.scalar_type() != at::kFloat || boundaries.dim() != 1 ||
      !boundaries.is_contiguous() || boundaries.device() != device)
    throw UsageError(o + ": boundaries must be a contiguous float32 [edges] tensor on " + device.str());
  const int64_t width = kGradHistLead + boundaries.numel() + 1;
  if (hist.scalar_type() != at::kFloat || hist.dim() != 2 || hist.size(0) != n || hist.size(1) != width ||
      (n > 0 && hist.stride(1) != 1) || hist.device() != device)
    throw UsageError(o + ": hist must be float32 [" + std::to_string(n) + ", " + std::to_string(width) +
                     "] with unit column stride on " + device.str() + ", got " + shape(hist));
}

// The plain-ATen path: the reference, then the scale (as the monitor did it).
void reference_into(const std::vector<at::Tensor>& grads, const at::Tensor& stats, const at::Tensor& hist,
                    const at::Tensor& boundaries, const at::Tensor& scale) {
  at::NoGradGuard no_grad;
  const at::Tensor s = stats.narrow(1, 0, kGradStatColumns);
  s.copy_(grad_stat_rows_reference(grads));
  if (scale.defined()) s.narrow(1, 0, 3).div_(scale.reshape({}));
  if (!hist.defined()) return;
  // fp16: the gradients carry the loss scale, so the edges do too.
  hist.copy_(grad_histogram_rows_reference(grads, scale.defined() ? boundaries * scale.reshape({}) : boundaries));
  if (scale.defined()) hist.narrow(1, 0, kGradHistLead).div_(scale.reshape({}));
}

}  // namespace

void grad_stats_into(const std::vector<at::Tensor>& grads, const at::Tensor& stats, const at::Tensor& hist,
                     const at::Tensor& boundaries, const at::Tensor& scale) {
  check_args(grads, stats, hist, boundaries, scale);
  if (grads.empty()) return;
  bool fused = stats.is_cuda() && (!hist.defined() || boundaries.numel() == kernels::kGradHistEdges);
  for (const auto& g : grads) fused = fused && (!g.defined() || is_kernel_dtype(g.scalar_type()));
  if (!fused) return reference_into(grads, stats, hist, boundaries, scale);

  c10::cuda::CUDAGuard guard(stats.device());
  // Tables of up to kGradStatsMaxTensors gradients; their chunks' partial
  // rows follow one another in one workspace.
  struct Group {
    kernels::GradStatsTable table;
    int64_t offset = 0;  // first partial row
  };
  std::vector<Group> groups;
  std::vector<at::Tensor> keep;  // contiguous copies of strided gradients, alive until the launches
  int64_t total = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (groups.empty() || groups.back().table.count == kernels::kGradStatsMaxTensors) {
      groups.emplace_back();
      groups.back().table.count = 0;
      groups.back().table.chunks = 0;
      groups.back().offset = total;
    }
    Group& grp = groups.back();
    kernels::GradStatsTensor e{nullptr, 0, 0, static_cast<int>(i)};
    const at::Tensor& g = grads[i];
    if (g.defined() && g.numel() > 0) {
      const at::Tensor c = g.contiguous();
      if (!c.is_same(g)) keep.push_back(c);
      e.g = c.data_ptr();
      e.n = c.numel();
      e.dtype = static_cast<int>(kernel_dtype(c.scalar_type()));
    }
    const int64_t chunks = grp.table.chunks + (e.n + kernels::kGradStatsChunk - 1) / kernels::kGradStatsChunk;
    if (chunks > std::numeric_limits<int>::max())
      throw UsageError(std::string(kOp) + ": more than 2^31 chunks of gradients in one table");
    grp.table.chunks = static_cast<int>(chunks);
    grp.table.chunk_end[grp.table.count] = grp.table.chunks;
    grp.table.t[grp.table.count] = e;
    ++grp.table.count;
    total = grp.offset + grp.table.chunks;
  }
  const at::Tensor partials = at::empty({std::max<int64_t>(total, 1), kernels::kGradPartialColumns},
                                        stats.options().dtype(at::kFloat));
  kernels::GradStatsOut out{};
  out.stats = stats.data_ptr<float>();
  out.stats_stride = stats.stride(0);
  if (hist.defined()) {
    out.hist = hist.data_ptr<float>();
    out.hist_stride = hist.stride(0);
    out.edges = boundaries.data_ptr<float>();
  }
  out.scale = scale.defined() ? scale.data_ptr<float>() : nullptr;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream(stats.device().index()).stream();
  for (const Group& grp : groups)
    kernels::grad_stats(grp.table, out, partials.data_ptr<float>() + grp.offset * kernels::kGradPartialColumns,
                        stream);
}

}  // namespace perftrain::ops
