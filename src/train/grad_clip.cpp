#include "train/grad_clip.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/clamp_max.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>

namespace perftrain::train {
namespace {
std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> g;
  for (const auto& p : params)
    if (p.grad().defined()) g.push_back(p.grad());
  return g;
}
}  // namespace

at::Tensor global_grad_norm(const std::vector<at::Tensor>& params) {
  auto g = grads_of(params);
  if (g.empty()) return at::zeros({}, at::kFloat);
  auto norms = at::_foreach_norm(g, 2);
  return at::stack(norms).to(at::kFloat).norm(2);
}

at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm) {
  auto total = global_grad_norm(params);
  auto g = grads_of(params);
  if (g.empty()) return total;
  auto scale = at::clamp_max(max_norm / (total + 1e-6), 1.0);
  at::_foreach_mul_(g, scale);
  return total;
}

}  // namespace perftrain::train
