#include "op_support.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/autograd.h>
#include <ATen/core/grad_mode.h>

#include <string>

#include "base/error.h"
#include "ops/compute_weights.h"
#include "ops/dtype_dispatch.h"  // shape()

namespace perftrain::python {

Tensors grads_through(const std::function<Tensors(const Tensors&)>& fn, const Tensors& inputs,
                      const Tensors& grad_outputs) {
  // The dispatcher reached this kernel below autograd (its keys excluded,
  // grad mode off in a backward): switch both back on for fn.
  c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  keys.excluded_ = keys.excluded_ - c10::autograd_dispatch_keyset_with_ADInplaceOrView;
  const c10::impl::ForceDispatchKeyGuard key_guard(keys);
  const at::AutoGradMode grad_mode(true);

  Tensors leaves, wanted;
  for (const at::Tensor& t : inputs) {
    if (t.defined() && t.is_floating_point()) {
      leaves.push_back(t.detach().requires_grad_(true));
      wanted.push_back(leaves.back());
    } else {
      leaves.push_back(t);
    }
  }
  const Tensors outputs = fn(leaves);
  Tensors outs, grads;
  for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
    if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
      outs.push_back(outputs[i]);
      grads.push_back(grad_outputs[i].to(outputs[i].scalar_type()));
    }
  }
  Tensors found;
  if (!outs.empty() && !wanted.empty())
    found = torch::autograd::grad(outs, wanted, grads, /*retain_graph=*/false, /*create_graph=*/false,
                                  /*allow_unused=*/true);
  Tensors result;
  size_t k = 0;
  for (const at::Tensor& t : inputs) {
    if (!(t.defined() && t.is_floating_point())) {
      result.emplace_back();
      continue;
    }
    const at::Tensor g = k < found.size() ? found[k] : at::Tensor();
    ++k;
    result.push_back(g.defined() ? g.to(t.scalar_type()).contiguous() : at::zeros_like(t, at::MemoryFormat::Contiguous));
  }
  return result;
}

std::vector<at::Tensor> backward_through(const std::function<Tensors(const Tensors&)>& forward,
                                         const std::vector<at::Tensor>& grads,
                                         const c10::List<std::optional<at::Tensor>>& inputs) {
  Tensors in;
  for (const std::optional<at::Tensor>& t : inputs) in.push_back(t.has_value() ? *t : at::Tensor());
  Tensors result = grads_through(forward, in, grads);
  at::Tensor like;
  for (const at::Tensor& t : in)
    if (t.defined() && !like.defined()) like = t;
  for (size_t i = 0; i < result.size(); ++i) {
    if (!result[i].defined()) {  // an absent (or integer) input
      result[i] = no_grad_slot(like);
      continue;
    }
    // A backward that passes a gradient through (a residual's dx) hands back
    // the incoming tensor; an operator's output must be its own.
    for (const at::Tensor& g : grads)
      if (g.defined() && result[i].is_alias_of(g)) result[i] = result[i].clone();
  }
  return result;
}

at::Tensor no_grad_slot(const at::Tensor& like) { return at::empty({0}, like.options().dtype(at::kFloat)); }

at::Tensor grad_or_slot(const at::Tensor& g, const at::Tensor& like) { return g.defined() ? g : no_grad_slot(like); }

void check_weight_copy(const char* op, const char* what, const at::Tensor& weight,
                       const std::optional<at::Tensor>& copy, at::ScalarType dtype) {
  if (!copy.has_value()) return;
  const at::Tensor& c = *copy;
  if (c.sizes() != weight.sizes() || c.scalar_type() != dtype || c.device() != weight.device())
    throw UsageError(std::string(op) + ": " + what + " must be the weight's copy " + ops::shape(weight) + " in " +
                     c10::toString(dtype) + " on " + weight.device().str() + ", got " + ops::shape(c) + " " +
                     c10::toString(c.scalar_type()) + " on " + c.device().str());
}

at::Tensor product_weight(const char* op, const char* what, const at::Tensor& weight,
                          const std::optional<at::Tensor>& copy, at::ScalarType dtype) {
  check_weight_copy(op, what, weight, copy, dtype);
  return copy.has_value() ? copy->contiguous() : ops::compute_weight(weight, dtype);
}

}  // namespace perftrain::python
