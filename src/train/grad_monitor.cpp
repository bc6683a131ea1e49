#include "train/grad_monitor.h"

#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/count_nonzero.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>

#include <limits>

#include "base/error.h"

namespace perftrain::train {

at::Tensor grad_stat_rows(const std::vector<at::Tensor>& grads) {
  at::NoGradGuard no_grad;
  if (grads.empty()) return at::zeros({0, kStatColumns}, at::kFloat);
  at::TensorOptions opts;
  for (const auto& g : grads)
    if (g.defined()) opts = g.options();
  // An undefined gradient counts as an empty one: norms 0, no nonzero element.
  std::vector<at::Tensor> g;
  g.reserve(grads.size());
  for (const auto& t : grads) g.push_back(t.defined() ? t : at::empty({0}, opts));
  const auto f32 = [](const std::vector<at::Tensor>& v) { return at::stack(v).to(at::kFloat); };
  std::vector<at::Tensor> nonzero, nonfinite;
  for (const auto& t : g) {
    nonzero.push_back(at::count_nonzero(t));
    nonfinite.push_back(at::sum(at::logical_not(at::isfinite(t)), at::kFloat));
  }
  const at::Tensor zero = at::zeros({static_cast<int64_t>(g.size())}, opts.dtype(at::kFloat));
  return at::stack({f32(at::_foreach_norm(g, 2)), f32(at::_foreach_norm(g, 1)),
                    f32(at::_foreach_norm(g, std::numeric_limits<double>::infinity())), f32(nonzero), f32(nonfinite),
                    zero, zero},
                   1);
}

observe::GradHealthSample sample_from_rows(int64_t step, const std::vector<std::string>& names,
                                           const std::vector<int64_t>& numels, const at::Tensor& rows) {
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
  observe::summarize_modules(s);
  return s;
}

struct GradMonitor::Pending {
  int64_t step = 0;
  at::Tensor host;
  std::unique_ptr<at::cuda::CUDAEvent> done;  // CUDA only
};

GradMonitor::GradMonitor(std::vector<std::pair<std::string, at::Tensor>> params) : params_(std::move(params)) {
  at::TensorOptions opts = at::TensorOptions().dtype(at::kFloat);
  for (const auto& [name, p] : params_) {
    names_.push_back(name);
    numels_.push_back(p.numel());
    opts = opts.device(p.device());
  }
  rows_ = at::zeros({static_cast<int64_t>(params_.size()), kStatColumns}, opts);
}

GradMonitor::~GradMonitor() = default;

void GradMonitor::before_update(const at::Tensor& grad_scale) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads, weights;
  for (const auto& [name, p] : params_) {
    grads.push_back(p.grad());
    weights.push_back(p);
  }
  rows_.copy_(grad_stat_rows(grads));
  if (grad_scale.defined()) rows_.narrow(1, kStatNorm, kStatMaxAbs + 1).div_(grad_scale);
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
    p->host = at::empty(rows_.sizes(), rows_.options().device(at::kCPU).pinned_memory(true));
    p->host.copy_(rows_, /*non_blocking=*/true);
    p->done = std::make_unique<at::cuda::CUDAEvent>();
    p->done->record();
  } else {
    p->host = rows_.clone();
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
    out.push_back(sample_from_rows(p.step, names_, numels_, p.host));
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(i));
  return out;
}

}  // namespace perftrain::train
