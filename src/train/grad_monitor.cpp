#include "train/grad_monitor.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include "base/error.h"
#include "ops/grad_stats.h"

namespace perftrain::train {

static_assert(kStatNorm == 0 && kStatAbsSum == 1 && kStatMaxAbs == 2 && kStatNonzero == 3 && kStatNonfinite == 4 &&
                  kStatWeightNorm == ops::kGradStatColumns && kHistLead == ops::kGradHistLead,
              "the statistics columns start with ops::grad_stats_into's");

at::Tensor grad_stat_rows(const std::vector<at::Tensor>& grads) {
  at::TensorOptions opts = at::TensorOptions().dtype(at::kFloat);
  for (const auto& g : grads)
    if (g.defined()) opts = opts.device(g.device());
  const at::Tensor rows = at::zeros({static_cast<int64_t>(grads.size()), kStatColumns}, opts);
  ops::grad_stats_into(grads, rows, {}, {});
  return rows;
}

at::Tensor grad_histogram_boundaries(const at::TensorOptions& options) {
  const std::vector<double>& limits = observe::grad_histogram_limits();
  std::vector<float> b(limits.begin(), limits.end() - 1);
  return at::tensor(b, at::TensorOptions().dtype(at::kFloat)).to(options.device());
}

at::Tensor grad_histogram_rows(const std::vector<at::Tensor>& grads, const at::Tensor& boundaries) {
  const at::TensorOptions opts = boundaries.options().dtype(at::kFloat);
  const auto n = static_cast<int64_t>(grads.size());
  const at::Tensor rows = at::zeros({n, kHistLead + boundaries.numel() + 1}, opts);
  ops::grad_stats_into(grads, at::empty({n, kStatColumns}, opts), rows, boundaries);
  return rows;
}

observe::GradHealthSample sample_from_rows(int64_t step, const std::vector<std::string>& names,
                                           const std::vector<int64_t>& numels, const at::Tensor& rows,
                                           const at::Tensor& hist_rows) {
  const at::Tensor r = rows.to(at::kCPU, at::kDouble).contiguous();
  if (r.dim() != 2 || r.size(0) != static_cast<int64_t>(names.size()) || r.size(1) != kStatColumns ||
      numels.size() != names.size())
    throw RuntimeError("gradient statistics: " + std::to_string(r.size(0)) + " rows for " +
                       std::to_string(names.size()) + " parameters");
  const auto a = r.accessor<double, 2>();
  observe::GradHealthSample s;
  s.step = step;
  for (size_t i = 0; i < names.size(); ++i) {
    observe::GradStats g;
    const auto n = static_cast<double>(numels[i]);
    g.numel = numels[i];
    g.norm = a[i][kStatNorm];
    g.mean_abs = n > 0 ? a[i][kStatAbsSum] / n : 0;
    g.max_abs = a[i][kStatMaxAbs];
    g.zero_share = n > 0 ? (n - a[i][kStatNonzero]) / n : 0;
    g.nonfinite = static_cast<int64_t>(a[i][kStatNonfinite]);
    g.weight_norm = a[i][kStatWeightNorm];
    g.update_norm = a[i][kStatUpdateNorm];
    s.params.push_back({names[i], g});
  }
  if (hist_rows.defined()) {
    const at::Tensor h = hist_rows.to(at::kCPU, at::kDouble).contiguous();
    const int64_t buckets = static_cast<int64_t>(observe::grad_histogram_limits().size());
    if (h.dim() != 2 || h.size(0) != r.size(0) || h.size(1) != kHistLead + buckets)
      throw RuntimeError("gradient histograms: a [" + std::to_string(h.size(0)) + ", " + std::to_string(h.size(1)) +
                         "] tensor for " + std::to_string(names.size()) + " parameters and " +
                         std::to_string(buckets) + " buckets");
    const auto b = h.accessor<double, 2>();
    for (size_t i = 0; i < names.size(); ++i) {
      observe::GradHistogram g;
      const observe::GradStats& st = s.params[i].stats;
      g.finite = st.nonfinite == 0;
      g.counts.resize(static_cast<size_t>(buckets));
      for (int64_t k = 0; k < buckets; ++k) {
        g.counts[static_cast<size_t>(k)] = b[i][kHistLead + k];
        g.num += b[i][kHistLead + k];
      }
      if (g.num > 0) {
        g.min = b[i][0], g.max = b[i][1], g.sum = b[i][2];
        g.sum_squares = st.norm * st.norm;
      }
      s.param_histograms.push_back({names[i], std::move(g)});
    }
  }
  observe::summarize_modules(s);
  return s;
}

struct GradMonitor::Pending {
  int64_t step = 0;
  at::Tensor host, hist_host;  // hist_host: histograms only
  std::unique_ptr<at::cuda::CUDAEvent> done;  // CUDA only
};

GradMonitor::GradMonitor(std::vector<std::pair<std::string, at::Tensor>> params, bool histograms)
    : params_(std::move(params)) {
  at::TensorOptions opts = at::TensorOptions().dtype(at::kFloat);
  for (const auto& [name, p] : params_) {
    names_.push_back(name);
    numels_.push_back(p.numel());
    opts = opts.device(p.device());
  }
  rows_ = at::zeros({static_cast<int64_t>(params_.size()), kStatColumns}, opts);
  if (histograms) {
    boundaries_ = grad_histogram_boundaries(opts);
    hist_rows_ = at::zeros({static_cast<int64_t>(params_.size()), kHistLead + boundaries_.numel() + 1}, opts);
  }
}

GradMonitor::~GradMonitor() = default;

void GradMonitor::before_update(const at::Tensor& grad_scale) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads, weights;
  for (const auto& [name, p] : params_) {
    grads.push_back(p.grad());
    weights.push_back(p);
  }
  // One fused pass over every gradient on CUDA (ops/grad_stats.h): the
  // statistics columns and the histograms; fp16's loss scale divided out,
  // the edges compared times it.
  ops::grad_stats_into(grads, rows_, hist_rows_, boundaries_, grad_scale);
  rows_.select(1, kStatUpdateNorm).zero_();  // after_update() writes it
  if (weights.empty()) return;
  rows_.select(1, kStatWeightNorm).copy_(at::stack(at::_foreach_norm(weights, 2)).to(at::kFloat));
  snapshot_ = at::_foreach_mul(weights, 1.0);  // one multi-tensor copy
}

void GradMonitor::after_update() {
  at::NoGradGuard no_grad;
  if (snapshot_.empty()) return;
  std::vector<at::Tensor> weights;
  for (const auto& [name, p] : params_) weights.push_back(p);
  at::_foreach_sub_(snapshot_, weights);
  rows_.select(1, kStatUpdateNorm).copy_(at::stack(at::_foreach_norm(snapshot_, 2)).to(at::kFloat));
  snapshot_.clear();
}

void GradMonitor::queue_readback(int64_t step) {
  auto p = std::make_unique<Pending>();
  p->step = step;
  if (rows_.is_cuda()) {
    const auto pinned = rows_.options().device(at::kCPU).pinned_memory(true);
    p->host = at::empty(rows_.sizes(), pinned);
    p->host.copy_(rows_, /*non_blocking=*/true);
    if (hist_rows_.defined()) {
      p->hist_host = at::empty(hist_rows_.sizes(), pinned);
      p->hist_host.copy_(hist_rows_, /*non_blocking=*/true);
    }
    p->done = std::make_unique<at::cuda::CUDAEvent>();
    p->done->record();
  } else {
    p->host = rows_.clone();
    if (hist_rows_.defined()) p->hist_host = hist_rows_.clone();
  }
  pending_.push_back(std::move(p));
}

std::vector<observe::GradHealthSample> GradMonitor::take_ready(bool wait) {
  std::vector<observe::GradHealthSample> out;
  size_t i = 0;
  for (; i < pending_.size(); ++i) {
    Pending& p = *pending_[i];
    if (p.done) {
      if (!wait && !p.done->query()) break;
      p.done->synchronize();
    }
    out.push_back(sample_from_rows(p.step, names_, numels_, p.host, p.hist_host));
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(i));
  return out;
}

}  // namespace perftrain::train
