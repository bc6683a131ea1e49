// The multi-tensor AdamW + EMA + clip + unscale step (ops::MultiTensorAdamW)
// as a PyTorch operator that mutates its tensor lists in place, with the
// per-step scalars (loss scale, LR, step, norm) in a device tensor: no host
// sync, capture-safe. The launch plan of one list of tensors is made on its
// first step and kept (the plan keeps references to the tensors).
#include <ATen/core/grad_mode.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "base/error.h"
#include "op_support.h"
#include "ops/multi_tensor_adamw.h"

namespace perftrain::python {
namespace {

kernels::LrShape lr_shape_of(const std::string& name) {
  if (const std::optional<kernels::LrShape> shape = ops::lr_shape_named(name)) return *shape;
  throw UsageError("multi_tensor_adamw_: lr_schedule must be constant, cosine, linear or wsd, got \"" + name + "\"");
}

// What identifies a plan: the tensors' storage and every option.
std::string plan_key(const std::vector<std::vector<at::Tensor>>& lists, const at::Tensor& scalars,
                     const ops::MultiTensorAdamWOptions& o, const std::vector<bool>& decay) {
  std::string key;
  for (const auto& list : lists) {
    for (const at::Tensor& t : list) key += std::to_string(reinterpret_cast<uintptr_t>(t.data_ptr())) + ",";
    key += "|";
  }
  key += std::to_string(reinterpret_cast<uintptr_t>(scalars.data_ptr())) + "|";
  for (bool d : decay) key += d ? '1' : '0';
  for (double v : {o.lr, double(o.warmup_steps), double(o.lr_shape), o.lr_min, double(o.total_steps),
                   o.decay_fraction, o.beta1, o.beta2, o.eps, o.weight_decay, o.grad_clip, o.ema_decay,
                   double(o.ema_warmup), double(o.ema_start), double(o.dynamic_loss_scale),
                   double(o.growth_interval)})
    key += "|" + std::to_string(v);
  return key;
}

// The plans made so far; a program steps one or two optimizers, so a few are
// kept and the oldest dropped past that.
constexpr size_t kMaxPlans = 8;

ops::MultiTensorAdamW& plan_for(const std::string& key, const std::function<ops::MultiTensorAdamW*()>& make) {
  static std::mutex mutex;
  static std::map<std::string, std::pair<uint64_t, std::unique_ptr<ops::MultiTensorAdamW>>> plans;
  static uint64_t uses = 0;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = plans.find(key);
  if (it == plans.end()) {
    if (plans.size() >= kMaxPlans) {
      auto oldest = plans.begin();
      for (auto p = plans.begin(); p != plans.end(); ++p)
        if (p->second.first < oldest->second.first) oldest = p;
      plans.erase(oldest);
    }
    it = plans.emplace(key, std::make_pair(uses, std::unique_ptr<ops::MultiTensorAdamW>(make()))).first;
  }
  it->second.first = ++uses;
  return *it->second.second;
}

// One tensor per entry of an optional list (undefined where None).
std::vector<at::Tensor> defined_or_empty(const c10::List<std::optional<at::Tensor>>& list) {
  std::vector<at::Tensor> out;
  for (const std::optional<at::Tensor>& t : list) out.push_back(t.has_value() ? *t : at::Tensor());
  return out;
}

// One step; the arguments in the schema's order.
void multi_tensor_adamw_(at::TensorList params, const c10::List<std::optional<at::Tensor>>& grads,
                         at::TensorList exp_avgs, at::TensorList exp_avg_sqs, at::TensorList emas,
                         at::TensorList shadows, const at::Tensor& scalars, c10::List<bool> decay, double lr,
                         double beta1, double beta2, double eps, double weight_decay, double grad_clip,
                         int64_t warmup_steps, c10::string_view lr_schedule, double lr_min, int64_t total_steps,
                         double decay_fraction, double ema_decay, bool ema_warmup, int64_t ema_start,
                         bool dynamic_loss_scale, int64_t growth_interval) {
  const at::NoGradGuard no_grad;
  ops::MultiTensorAdamWOptions o;
  o.lr = lr, o.beta1 = beta1, o.beta2 = beta2, o.eps = eps, o.weight_decay = weight_decay, o.grad_clip = grad_clip;
  o.warmup_steps = warmup_steps, o.lr_shape = lr_shape_of(std::string(lr_schedule)), o.lr_min = lr_min;
  o.total_steps = total_steps, o.decay_fraction = decay_fraction;
  o.ema_decay = ema_decay, o.ema_warmup = ema_warmup, o.ema_start = ema_start;
  o.dynamic_loss_scale = dynamic_loss_scale, o.growth_interval = growth_interval;
  const std::vector<at::Tensor> p = params.vec(), m = exp_avgs.vec(), v = exp_avg_sqs.vec(), e = emas.vec(),
                                s = shadows.vec();
  const std::vector<bool> flags(decay.begin(), decay.end());
  if (grads.size() != p.size())
    throw UsageError("multi_tensor_adamw_: " + std::to_string(grads.size()) + " gradients for " +
                     std::to_string(p.size()) + " parameters");
  ops::MultiTensorAdamW& step = plan_for(plan_key({p, m, v, e, s}, scalars, o, flags), [&] {
    return new ops::MultiTensorAdamW(p, m, v, e, scalars, o, {}, s, {}, flags);
  });
  step.step(defined_or_empty(grads));
}

at::Tensor adamw_scalars(c10::Device device, double loss_scale) { return ops::make_adamw_scalars(device, loss_scale); }

}  // namespace
}  // namespace perftrain::python

TORCH_LIBRARY_FRAGMENT(perftrain, m) {
  m.def("multi_tensor_adamw_(Tensor(a!)[] params, Tensor?[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs,"
        " Tensor(d!)[] emas, Tensor(e!)[] shadows, Tensor(f!) scalars, bool[] decay, float lr, float beta1,"
        " float beta2, float eps, float weight_decay, float grad_clip, int warmup_steps, str lr_schedule,"
        " float lr_min, int total_steps, float decay_fraction, float ema_decay, bool ema_warmup, int ema_start,"
        " bool dynamic_loss_scale, int growth_interval) -> ()");
  // The state tensor of a new optimizer (no tensor argument: one kernel for every device).
  m.def("adamw_scalars(Device device, float loss_scale) -> Tensor", perftrain::python::kernel<&perftrain::python::adamw_scalars>);
}

// The same kernels for CPU and CUDA (each kernel picks its path by device).
static void register_optim_kernels(torch::Library& m) {
  m.impl("multi_tensor_adamw_", perftrain::python::kernel<&perftrain::python::multi_tensor_adamw_>);
}

TORCH_LIBRARY_IMPL(perftrain, CPU, m) { register_optim_kernels(m); }

TORCH_LIBRARY_IMPL(perftrain, CUDA, m) { register_optim_kernels(m); }
