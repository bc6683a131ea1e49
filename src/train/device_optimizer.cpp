#include "train/device_optimizer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>
#include <map>

#include "base/error.h"
#include "ops/multi_tensor_adamw.h"
#include "train/weight_decay.h"

namespace perftrain::train {
namespace {

void check_options(const DeviceOptimizerOptions& o) {
  auto bad = [](const std::string& what) { throw UsageError("optimizer: " + what); };
  if (!(o.lr >= 0) || !std::isfinite(o.lr)) bad("lr must be a finite number >= 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1)) bad("beta1 and beta2 must be in [0, 1)");
  if (!(o.eps > 0)) bad("eps must be > 0");
  if (!(o.weight_decay >= 0)) bad("weight_decay must be >= 0");
  if (!(o.grad_clip >= 0)) bad("grad_clip must be >= 0 (0: off)");
  if (!(o.ema_decay >= 0 && o.ema_decay <= 1)) bad("ema_decay must be in [0, 1]");
  if (o.warmup_steps < 0) bad("warmup_steps must be >= 0");
  if (!(o.lr_min >= 0 && o.lr_min <= o.lr)) bad("lr_min must be in [0, lr]");
  if (!(o.decay_fraction >= 0 && o.decay_fraction <= 1)) bad("decay_fraction must be in [0, 1]");
  if (o.ema_start < 0) bad("ema_start must be >= 0");
  if (o.dynamic_loss_scale && !(o.initial_loss_scale > 0 && std::isfinite(o.initial_loss_scale)))
    bad("initial_loss_scale must be a finite number > 0");
  if (o.growth_interval < 1) bad("growth_interval must be >= 1");
}

// Uninitialised copies of `params` in `dtype`, carved from one buffer with
// the copies of one shape adjacent, in parameter order within a shape. Each
// starts at a multiple of kAlign elements (vector loads, cuBLASLt's 16-byte
// alignment); copies of one shape stay back to back when their size is a
// multiple of it (DiT's [6D, D] for D a multiple of 8).
std::vector<at::Tensor> grouped_copies(const std::vector<at::Tensor>& params, at::ScalarType dtype) {
  constexpr int64_t kAlign = 64;
  auto aligned = [](int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; };
  std::map<std::vector<int64_t>, std::vector<size_t>> by_shape;
  std::vector<std::vector<int64_t>> shapes;  // in order of first appearance
  int64_t total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    auto sizes = params[i].sizes().vec();
    auto& group = by_shape[sizes];
    if (group.empty()) shapes.push_back(sizes);
    group.push_back(i);
    total += aligned(params[i].numel());
  }
  std::vector<at::Tensor> copies(params.size());
  if (params.empty()) return copies;
  const at::Tensor buffer = at::empty({total}, params[0].options().dtype(dtype));
  int64_t offset = 0;
  for (const auto& sizes : shapes) {
    for (const size_t i : by_shape[sizes]) {
      const int64_t n = params[i].numel();
      copies[i] = buffer.narrow(0, offset, n).view(sizes);
      offset += aligned(n);
    }
  }
  return copies;
}

}  // namespace

DeviceOptimizer::DeviceOptimizer(std::vector<std::pair<std::string, at::Tensor>> named_params,
                                 std::vector<at::Tensor> ema_params, DeviceOptimizerOptions opts,
                                 std::vector<bool> owned)
    : params_(std::move(named_params)), owned_(std::move(owned)), ema_(std::move(ema_params)), opts_(opts) {
  check_options(opts_);
  if (!ema_.empty() && ema_.size() != params_.size())
    throw UsageError("optimizer: " + std::to_string(params_.size()) + " parameters but " +
                     std::to_string(ema_.size()) + " EMA parameters");
  if (owned_.empty()) owned_.assign(params_.size(), true);
  if (owned_.size() != params_.size())
    throw UsageError("optimizer: " + std::to_string(params_.size()) + " parameters but " +
                     std::to_string(owned_.size()) + " ownership flags");
  std::vector<at::Tensor> p;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, t] = params_[i];
    if (!t.defined()) throw UsageError("optimizer: parameter '" + name + "' is undefined");
    p.push_back(t);
    exp_avg_.push_back(owned_[i] ? at::zeros_like(t, at::MemoryFormat::Contiguous) : at::Tensor());
    exp_avg_sq_.push_back(owned_[i] ? at::zeros_like(t, at::MemoryFormat::Contiguous) : at::Tensor());
  }
  if (opts_.bf16_shadows) shadows_ = grouped_copies(p, at::kBFloat16);
  refresh_shadows();
  // The kernel's table: the owned parameters; the others' gradients count in the norm.
  std::vector<at::Tensor> op_p, op_m, op_v, op_ema, op_shadows, norm_only;
  std::vector<std::string> names;
  std::vector<bool> op_decay;
  const std::vector<bool> decay = decay_flags(params_, opts_.decay_all);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!owned_[i]) {
      norm_only.push_back(p[i]);
      continue;
    }
    op_p.push_back(p[i]);
    op_m.push_back(exp_avg_[i]);
    op_v.push_back(exp_avg_sq_[i]);
    if (!ema_.empty()) op_ema.push_back(ema_[i]);
    if (!shadows_.empty()) op_shadows.push_back(shadows_[i]);
    names.push_back(params_[i].first);
    op_decay.push_back(decay[i]);
  }
  const at::Device device = p.empty() ? at::Device(at::kCPU) : p[0].device();
  scalars_ = ops::make_adamw_scalars(device, opts_.dynamic_loss_scale ? opts_.initial_loss_scale : 1.0);
  loss_scale_ = scalars_.select(0, ops::kSlotLossScale);
  grad_norm_ = scalars_.select(0, ops::kSlotGradNorm);
  lr_ = scalars_.select(0, ops::kSlotLr);
  skipped_ = scalars_.select(0, ops::kSlotSkipped);
  step_ = scalars_.select(0, ops::kSlotStep);
  good_steps_ = scalars_.select(0, ops::kSlotGoodSteps);
  schedule_step_ = scalars_.select(0, ops::kSlotScheduleStep);

  op_ = std::make_unique<ops::MultiTensorAdamW>(std::move(op_p), std::move(op_m), std::move(op_v), std::move(op_ema),
                                                scalars_, static_cast<const ops::MultiTensorAdamWOptions&>(opts_),
                                                std::move(names), std::move(op_shadows), std::move(norm_only),
                                                std::move(op_decay));
}

void DeviceOptimizer::set_schedule_step(int64_t steps) {
  if (steps < 0) throw UsageError("optimizer: the schedule step must be >= 0");
  schedule_step_.fill_(static_cast<double>(steps));
}

ops::ComputeWeights DeviceOptimizer::compute_weights() const {
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
  for (size_t i = 0; i < shadows_.size(); ++i) pairs.emplace_back(params_[i].second, shadows_[i]);
  return ops::ComputeWeights(pairs);
}

void DeviceOptimizer::refresh_shadows() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < shadows_.size(); ++i) shadows_[i].copy_(params_[i].second);
}

DeviceOptimizer::~DeviceOptimizer() = default;

void DeviceOptimizer::step() {
  std::vector<at::Tensor> grads, norm_grads;
  grads.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) (owned_[i] ? grads : norm_grads).push_back(params_[i].second.grad());
  op_->step(grads, norm_grads);
  for (auto& [name, p] : params_) p.mutable_grad() = at::Tensor();  // set_to_none
}

void DeviceOptimizer::follow_others() {
  at::NoGradGuard no_grad;
  at::Tensor weight;  // the step's lerp weight, 0 when it was skipped
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owned_[i]) continue;
    const at::Tensor& p = params_[i].second;
    if (!ema_.empty()) {
      if (!weight.defined())
        weight = scalars_.select(0, ops::kSlotEmaWeight).mul(scalars_.select(0, ops::kSlotSkip).neg().add(1));
      ema_[i].lerp_(p, weight);
    }
    if (!shadows_.empty()) shadows_[i].copy_(p);
  }
}

std::vector<std::pair<std::string, at::Tensor>> DeviceOptimizer::state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!owned_[i]) continue;
    out.emplace_back("exp_avg." + params_[i].first, exp_avg_[i]);
    out.emplace_back("exp_avg_sq." + params_[i].first, exp_avg_sq_[i]);
    out.emplace_back("step." + params_[i].first, step_);
  }
  out.emplace_back("loss_scale", loss_scale_);
  return out;
}

void DeviceOptimizer::load_state(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> byname(state.begin(), state.end());
  auto find = [&](const std::string& key, const at::Tensor& like) -> const at::Tensor& {
    auto it = byname.find(key);
    if (it == byname.end()) throw RuntimeError("optimizer state has no tensor '" + key + "'");
    if (it->second.sizes() != like.sizes()) throw RuntimeError("optimizer state '" + key + "' has the wrong shape");
    return it->second;
  };
  // Check everything before changing anything.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!owned_[i]) continue;
    find("exp_avg." + params_[i].first, exp_avg_[i]);
    find("exp_avg_sq." + params_[i].first, exp_avg_sq_[i]);
    find("step." + params_[i].first, step_);
  }
  auto scale = byname.find("loss_scale");
  if (scale != byname.end() && scale->second.numel() != 1)
    throw RuntimeError("optimizer state 'loss_scale' has the wrong shape");
  if (!params_.empty()) find("step." + params_[0].first, step_);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!owned_[i]) continue;
    exp_avg_[i].copy_(find("exp_avg." + params_[i].first, exp_avg_[i]));
    exp_avg_sq_[i].copy_(find("exp_avg_sq." + params_[i].first, exp_avg_sq_[i]));
  }
  if (!params_.empty()) step_.copy_(find("step." + params_[0].first, step_));
  if (opts_.dynamic_loss_scale && scale != byname.end()) loss_scale_.copy_(scale->second.reshape({}));
  good_steps_.zero_();  // the growth count restarts (as GradScaler's does without its own state)
}

}  // namespace perftrain::train
