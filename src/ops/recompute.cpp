#include "ops/recompute.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

#include "compat/compat.h"
#include "ops/compute_weights.h"

namespace perftrain::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs besides tensors: the block, the autocast state the
// forward ran under and the weight copies it read (backward runs on the
// autograd thread, without either: the re-run would cast every weight again).
struct RecomputeState : torch::CustomClassHolder {
  BlockFn fn;
  at::DeviceType device = at::kCPU;
  std::optional<at::ScalarType> autocast;
  std::optional<ComputeWeights> weights;  // none: the forward ran outside any scope
};

struct RecomputeFunction : torch::autograd::Function<RecomputeFunction> {
  static at::Tensor forward(AutogradContext* ctx, const BlockFn& fn, const at::Tensor& x, const at::Tensor& c) {
    auto state = c10::make_intrusive<RecomputeState>();
    state->fn = fn;
    state->device = x.device().type();
    state->autocast = compat::autocast_dtype(state->device);
    if (const ComputeWeights* w = current_compute_weights()) state->weights = *w;
    ctx->saved_data["state"] = at::IValue::make_capsule(state);
    ctx->save_for_backward({x, c});
    return fn(x, c);  // grad mode is off inside Function::forward: nothing is kept
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = c10::static_intrusive_pointer_cast<RecomputeState>(ctx->saved_data["state"].toCapsule());
    auto saved = ctx->get_saved_variables();
    at::Tensor x = saved[0].detach().requires_grad_(true);
    at::Tensor c = saved[1].detach().requires_grad_(true);
    {
      at::AutoGradMode grad_on(true);
      compat::AutocastGuard autocast(state->device, state->autocast.value_or(at::kBFloat16),
                                     state->autocast.has_value());
      const ComputeWeightsScope weights(state->weights ? &*state->weights : nullptr);
      at::Tensor y = state->fn(x, c);
      torch::autograd::backward({y}, {grads[0]});  // weights' gradients accumulate here
    }
    return {at::Tensor(), x.grad(), c.grad()};
  }
};

}  // namespace

at::Tensor recompute(const BlockFn& fn, const at::Tensor& x, const at::Tensor& c) {
  return RecomputeFunction::apply(fn, x, c);
}

}  // namespace perftrain::ops
