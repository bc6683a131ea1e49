#include "ops/multi_tensor_adamw.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <ATen/core/grad_mode.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "base/error.h"
#include "kernels/multi_tensor_adamw.h"

namespace perftrain::ops {
namespace {

using kernels::AdamWScalars;
static_assert(offsetof(AdamWScalars, loss_scale) == kSlotLossScale * sizeof(float));
static_assert(offsetof(AdamWScalars, grad_norm) == kSlotGradNorm * sizeof(float));
static_assert(offsetof(AdamWScalars, lr) == kSlotLr * sizeof(float));
static_assert(offsetof(AdamWScalars, skipped) == kSlotSkipped * sizeof(float));
static_assert(offsetof(AdamWScalars, step) == kSlotStep * sizeof(float));
static_assert(offsetof(AdamWScalars, good_steps) == kSlotGoodSteps * sizeof(float));
static_assert(offsetof(AdamWScalars, skip) == kSlotSkip * sizeof(float));
static_assert(offsetof(AdamWScalars, ema_weight) == kSlotEmaWeight * sizeof(float));
static_assert(offsetof(AdamWScalars, schedule_step) == kSlotScheduleStep * sizeof(float));

std::string label(const std::vector<std::string>& names, size_t i) {
  return i < names.size() ? "parameter '" + names[i] + "'" : "parameter " + std::to_string(i);
}

std::string sizes_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

// A clear error for a tensor that does not fit its parameter; the label is
// only built on failure (this runs for every gradient every step).
void check_like(const at::Tensor& t, const at::Tensor& param, const char* what,
                const std::vector<std::string>& names, size_t i) {
  auto fail = [&](const std::string& why) {
    throw UsageError("multi_tensor_adamw: " + std::string(what) + " of " + label(names, i) + " " + why);
  };
  if (!t.defined()) fail("is missing");
  if (t.scalar_type() != at::kFloat)
    fail("is " + std::string(c10::toString(t.scalar_type())) + ", expected float32");
  if (t.device() != param.device()) fail("is on " + t.device().str() + ", the parameter on " + param.device().str());
  if (t.sizes() != param.sizes()) fail("has sizes " + sizes_of(t) + ", the parameter " + sizes_of(param));
  if (!t.is_contiguous()) fail("is not contiguous");
}

}  // namespace

std::optional<kernels::LrShape> lr_shape_named(const std::string& name) {
  if (name == "constant") return kernels::LrShape::kConstant;
  if (name == "cosine") return kernels::LrShape::kCosine;
  if (name == "linear") return kernels::LrShape::kLinear;
  if (name == "wsd") return kernels::LrShape::kWsd;
  return std::nullopt;
}

int64_t adamw_scalar_slots() { return kernels::kAdamWScalarSlots; }

at::Tensor make_adamw_scalars(at::Device device, double loss_scale) {
  at::Tensor s = at::zeros({adamw_scalar_slots()}, at::TensorOptions().dtype(at::kFloat).device(device));
  s[kSlotLossScale].fill_(loss_scale);
  return s;
}

// Tables, grids and the partials buffer, fixed at construction.
struct MultiTensorAdamW::Plan {
  struct Group {
    kernels::AdamWTable table;
    std::vector<size_t> index;  // table.t[j] is params_[index[j]]
    int grid = 0;
    int partials_offset = 0;
  };
  std::vector<Group> groups;
  std::vector<Group> norm_groups;  // norm_only_: summed into the norm, never updated
  at::Tensor partials;  // float64 [sum of grids]
  int partials_count = 0;
  kernels::AdamWHyper hyper{};
};

MultiTensorAdamW::MultiTensorAdamW(std::vector<at::Tensor> params, std::vector<at::Tensor> exp_avgs,
                                   std::vector<at::Tensor> exp_avg_sqs, std::vector<at::Tensor> emas,
                                   at::Tensor scalars, MultiTensorAdamWOptions opts, std::vector<std::string> names,
                                   std::vector<at::Tensor> shadows, std::vector<at::Tensor> norm_only,
                                   std::vector<bool> decay)
    : params_(std::move(params)),
      exp_avgs_(std::move(exp_avgs)),
      exp_avg_sqs_(std::move(exp_avg_sqs)),
      emas_(std::move(emas)),
      shadows_(std::move(shadows)),
      norm_only_(std::move(norm_only)),
      scalars_(std::move(scalars)),
      opts_(opts),
      names_(std::move(names)),
      decay_(std::move(decay)) {
  const size_t n = params_.size();
  if (decay_.empty()) decay_.assign(n, true);
  if (decay_.size() != n)
    throw UsageError("multi_tensor_adamw: " + std::to_string(n) + " parameters but " +
                     std::to_string(decay_.size()) + " weight decay flags");
  if (!shadows_.empty() && shadows_.size() != n)
    throw UsageError("multi_tensor_adamw: " + std::to_string(n) + " parameters but " +
                     std::to_string(shadows_.size()) + " shadows");
  if (exp_avgs_.size() != n || exp_avg_sqs_.size() != n || (!emas_.empty() && emas_.size() != n))
    throw UsageError("multi_tensor_adamw: " + std::to_string(n) + " parameters but " +
                     std::to_string(exp_avgs_.size()) + " exp_avgs, " + std::to_string(exp_avg_sqs_.size()) +
                     " exp_avg_sqs and " + std::to_string(emas_.size()) + " EMA tensors");
  if (opts_.growth_interval < 1) throw UsageError("multi_tensor_adamw: growth_interval must be at least 1");
  const at::Device device = n > 0 ? params_[0].device() : scalars_.device();
  for (size_t i = 0; i < n; ++i) {
    check_like(params_[i], params_[i], "value", names_, i);
    if (params_[i].device() != device)
      throw UsageError("multi_tensor_adamw: " + label(names_, i) + " is on " + params_[i].device().str() +
                       ", " + label(names_, 0) + " on " + device.str() + " (one device for all)");
    check_like(exp_avgs_[i], params_[i], "exp_avg", names_, i);
    check_like(exp_avg_sqs_[i], params_[i], "exp_avg_sq", names_, i);
    if (!emas_.empty()) check_like(emas_[i], params_[i], "EMA tensor", names_, i);
    if (!shadows_.empty() && shadows_[i].defined() &&
        (shadows_[i].scalar_type() != at::kBFloat16 || !shadows_[i].is_contiguous() ||
         shadows_[i].sizes() != params_[i].sizes() || shadows_[i].device() != device))
      throw UsageError("multi_tensor_adamw: the shadow of " + label(names_, i) +
                       " must be a contiguous bfloat16 tensor of its sizes on its device");
  }
  for (size_t i = 0; i < norm_only_.size(); ++i) {
    const at::Tensor& t = norm_only_[i];
    if (!t.defined() || t.scalar_type() != at::kFloat || !t.is_contiguous() || t.device() != device)
      throw UsageError("multi_tensor_adamw: norm-only tensor " + std::to_string(i) +
                       " must be a contiguous float32 tensor on " + device.str());
  }
  if (!scalars_.defined() || scalars_.scalar_type() != at::kFloat || scalars_.numel() != adamw_scalar_slots() ||
      !scalars_.is_contiguous() || scalars_.device() != device)
    throw UsageError("multi_tensor_adamw: scalars must be make_adamw_scalars() on " + device.str());
  if (!opts_.grad_norm && (opts_.grad_clip > 0 || opts_.dynamic_loss_scale || opts_.skip_nonfinite))
    throw UsageError(
        "multi_tensor_adamw: clipping, the dynamic loss scale and skip_nonfinite need the gradient norm (grad_norm)");
  if (!device.is_cuda()) return;

  c10::cuda::CUDAGuard guard(device);
  plan_ = std::make_unique<Plan>();
  auto& h = plan_->hyper;
  h.lr_schedule = lr_schedule_of(opts_), h.ema = ema_schedule_of(opts_);
  h.beta1 = opts_.beta1, h.beta2 = opts_.beta2, h.eps = opts_.eps;
  h.weight_decay = opts_.weight_decay, h.grad_clip = opts_.grad_clip;
  h.growth_interval = opts_.growth_interval, h.dynamic_loss_scale = opts_.dynamic_loss_scale;
  h.skip_nonfinite = opts_.skip_nonfinite;
  auto make_groups = [](const std::vector<at::Tensor>& tensors, const std::vector<bool>& decay,
                        std::vector<Plan::Group>& groups) {
    int64_t chunks = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const int64_t numel = tensors[i].numel();
      if (numel == 0) continue;
      if (groups.empty() || groups.back().table.count == kernels::kAdamWMaxTensors) {
        groups.emplace_back();
        groups.back().table.count = 0;
        chunks = 0;
      }
      auto& g = groups.back();
      chunks += (numel + kernels::kAdamWChunk - 1) / kernels::kAdamWChunk;
      if (chunks > std::numeric_limits<int>::max())
        throw UsageError("multi_tensor_adamw: more than 2^31 chunks of parameters in one table");
      g.table.chunk_end[g.table.count] = static_cast<int>(chunks);
      g.table.t[g.table.count] = kernels::AdamWTensor{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                      numel, i < decay.size() && decay[i] ? 1 : 0};
      g.table.chunks = static_cast<int>(chunks);
      g.index.push_back(i);
      ++g.table.count;
    }
  };
  make_groups(params_, decay_, plan_->groups);
  make_groups(norm_only_, {}, plan_->norm_groups);
  for (auto* groups : {&plan_->groups, &plan_->norm_groups}) {
    for (auto& g : *groups) {
      g.grid = kernels::adamw_grid(g.table.chunks);
      g.partials_offset = plan_->partials_count;
      plan_->partials_count += g.grid;
    }
  }
  plan_->partials = at::empty({std::max(1, plan_->partials_count)},
                              at::TensorOptions().dtype(at::kDouble).device(device));
}

MultiTensorAdamW::~MultiTensorAdamW() = default;

int MultiTensorAdamW::launches_per_step() const {
  if (!plan_) return 0;
  const int groups = static_cast<int>(plan_->groups.size());
  return (opts_.grad_norm ? 2 * groups : groups) + 1;
}

void MultiTensorAdamW::step(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& norm_grads) {
  if (grads.size() != params_.size())
    throw UsageError("multi_tensor_adamw: " + std::to_string(grads.size()) + " gradients for " +
                     std::to_string(params_.size()) + " parameters");
  if (norm_grads.size() != norm_only_.size())
    throw UsageError("multi_tensor_adamw: " + std::to_string(norm_grads.size()) + " norm-only gradients for " +
                     std::to_string(norm_only_.size()) + " norm-only tensors");
  for (size_t i = 0; i < norm_grads.size(); ++i)
    if (norm_grads[i].defined()) check_like(norm_grads[i], norm_only_[i], "norm-only gradient", {}, i);
  if (!plan_) {
    for (size_t i = 0; i < grads.size(); ++i)
      if (grads[i].defined()) check_like(grads[i], params_[i], "gradient", names_, i);
    multi_tensor_adamw_reference(params_, grads, exp_avgs_, exp_avg_sqs_, emas_, scalars_, opts_, norm_grads, decay_);
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < shadows_.size(); ++i)
      if (shadows_[i].defined()) shadows_[i].copy_(params_[i]);
    return;
  }
  // Pointers are read afresh each step (grads are new tensors every backward;
  // under capture they are the graph pool's fixed addresses).
  for (auto& g : plan_->groups) {
    for (int j = 0; j < g.table.count; ++j) {
      const size_t i = g.index[j];
      const at::Tensor& grad = grads[i];
      if (grad.defined()) check_like(grad, params_[i], "gradient", names_, i);
      auto& t = g.table.t[j];
      t.p = params_[i].data_ptr<float>();
      params_[i].unsafeGetTensorImpl()->bump_version();  // as an in-place ATen op would
      t.g = grad.defined() ? grad.data_ptr<float>() : nullptr;
      t.m = exp_avgs_[i].data_ptr<float>();
      t.v = exp_avg_sqs_[i].data_ptr<float>();
      t.ema = emas_.empty() ? nullptr : emas_[i].data_ptr<float>();
      const bool shadowed = !shadows_.empty() && shadows_[i].defined();
      t.shadow = shadowed ? reinterpret_cast<__nv_bfloat16*>(shadows_[i].data_ptr()) : nullptr;
      if (shadowed) shadows_[i].unsafeGetTensorImpl()->bump_version();
    }
  }
  for (auto& g : plan_->norm_groups)
    for (int j = 0; j < g.table.count; ++j) {
      const at::Tensor& grad = norm_grads[g.index[j]];
      g.table.t[j].g = grad.defined() ? grad.data_ptr<float>() : nullptr;
    }
  c10::cuda::CUDAGuard guard(scalars_.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream(scalars_.device().index()).stream();
  double* partials = plan_->partials.data_ptr<double>();
  auto* scalars = reinterpret_cast<kernels::AdamWScalars*>(scalars_.data_ptr<float>());
  if (opts_.grad_norm) {
    for (const auto* groups : {&plan_->groups, &plan_->norm_groups})
      for (const auto& g : *groups) kernels::adamw_sum_squares(g.table, partials + g.partials_offset, g.grid, stream);
  }
  // Without the norm no partial sums are read (count -1): the kernel writes NaN.
  kernels::adamw_prepare(partials, opts_.grad_norm ? plan_->partials_count : -1, scalars, plan_->hyper, stream);
  for (const auto& g : plan_->groups) kernels::adamw_update(g.table, scalars, plan_->hyper, g.grid, stream);
}

void multi_tensor_adamw_reference(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                                  const std::vector<at::Tensor>& exp_avgs,
                                  const std::vector<at::Tensor>& exp_avg_sqs, const std::vector<at::Tensor>& emas,
                                  const at::Tensor& scalars, const MultiTensorAdamWOptions& o,
                                  const std::vector<at::Tensor>& norm_grads, const std::vector<bool>& decay) {
  at::NoGradGuard no_grad;
  at::Tensor host = scalars.to(at::kCPU, at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  float* s = host.data_ptr<float>();
  std::vector<at::Tensor> p, g, m, v, decayed;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined()) continue;
    if (decay.empty() || decay[i]) decayed.push_back(params[i]);
    p.push_back(params[i]);
    g.push_back(grads[i]);
    m.push_back(exp_avgs[i]);
    v.push_back(exp_avg_sqs[i]);
  }

  const float scale = s[kSlotLossScale];
  std::vector<at::Tensor> counted = g;  // the norm's gradients: the updated ones, then the norm-only ones
  for (const auto& t : norm_grads)
    if (t.defined()) counted.push_back(t);
  const double raw = !o.grad_norm    ? std::nan("")
                     : counted.empty() ? 0.0
                                       : at::stack(at::_foreach_norm(counted, 2)).norm(2).item<double>();
  const double norm = raw / scale;
  s[kSlotGradNorm] = static_cast<float>(norm);
  bool skip = false;
  if (o.dynamic_loss_scale) {
    if (!std::isfinite(static_cast<float>(norm))) {
      s[kSlotLossScale] = scale * 0.5f;
      s[kSlotGoodSteps] = 0;
      s[kSlotSkipped] += 1;
      skip = true;
    } else if (s[kSlotGoodSteps] + 1 >= static_cast<float>(o.growth_interval)) {
      if (std::isfinite(scale * 2.f)) s[kSlotLossScale] = scale * 2.f;
      s[kSlotGoodSteps] = 0;
    } else {
      s[kSlotGoodSteps] += 1;
    }
  } else if (o.skip_nonfinite && !std::isfinite(static_cast<float>(norm))) {
    s[kSlotSkipped] += 1;
    skip = true;
  }
  s[kSlotSkip] = skip ? 1.f : 0.f;
  const double schedule_step = s[kSlotScheduleStep] + 1.0;
  s[kSlotScheduleStep] = static_cast<float>(schedule_step);
  const double lr = kernels::lr_at(lr_schedule_of(o), schedule_step);
  s[kSlotLr] = static_cast<float>(lr);
  if (!skip) {
    const double step = s[kSlotStep] + 1.0;
    s[kSlotStep] = static_cast<float>(step);
    double clip = 1;
    if (o.grad_clip > 0) {  // clamp_max(max_norm / (norm + 1e-6), 1), NaN passing through
      const float q = static_cast<float>(o.grad_clip) / (static_cast<float>(norm) + 1e-6f);
      clip = q < 1.f || std::isnan(q) ? q : 1.f;
    }
    const double coef = static_cast<float>(clip / scale);
    const double d = kernels::ema_decay_at(ema_schedule_of(o), step - 1);
    s[kSlotEmaWeight] = static_cast<float>(1 - d);
    // The scalars rounded to float as the kernel sees them.
    const double step_size = static_cast<float>(lr / (1 - std::pow(o.beta1, step)));
    const double bc2_sqrt = static_cast<float>(std::sqrt(1 - std::pow(o.beta2, step)));
    const double lr_wd = static_cast<float>(lr * o.weight_decay);
    if (!p.empty()) {
      auto gs = at::_foreach_mul(g, coef);
      if (!decayed.empty()) at::_foreach_add_(decayed, decayed, -lr_wd);
      at::_foreach_mul_(m, o.beta1);
      at::_foreach_add_(m, gs, 1 - o.beta1);
      at::_foreach_mul_(v, o.beta2);
      at::_foreach_addcmul_(v, gs, gs, 1 - o.beta2);
      auto denom = at::_foreach_sqrt(v);
      at::_foreach_div_(denom, bc2_sqrt);
      at::_foreach_add_(denom, o.eps);
      at::_foreach_addcdiv_(p, m, denom, -step_size);
    }
    if (!emas.empty()) at::_foreach_lerp_(emas, params, static_cast<float>(1 - d));
  }
  scalars.copy_(host);
}

}  // namespace perftrain::ops
