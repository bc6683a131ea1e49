#include "train/nan_locator.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/isinf.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/masked_select.h>
#include <torch/csrc/autograd/anomaly_mode.h>

#include <map>
#include <memory>
#include <sstream>

#include "compat/compat.h"
#include "models/diffusion_model.h"
#include "observe/grad_health.h"

namespace perftrain::train {
namespace {

bool is_float(const at::Tensor& t) { return t.defined() && at::isFloatingType(t.scalar_type()); }

bool all_finite(const at::Tensor& t) {
  if (!is_float(t) || t.numel() == 0) return true;
  at::NoGradGuard no_grad;
  return at::isfinite(t.detach()).all().item<bool>();
}

bool all_finite(at::TensorList ts) {
  for (const auto& t : ts)
    if (!all_finite(t)) return false;
  return true;
}

std::vector<TensorSummary> summaries(at::TensorList ts) {
  std::vector<TensorSummary> out;
  for (const auto& t : ts)
    if (t.defined()) out.push_back(summarize_tensor(t));
  return out;
}

// "blocks.3.mlp.fc1.weight" -> "blocks.3.mlp.fc1"
std::string owner_of(const std::string& param) {
  const auto dot = param.rfind('.');
  return dot == std::string::npos ? "" : param.substr(0, dot);
}

// Whether the module is a looped model, whose shared blocks run once per loop.
bool is_looped(const nn::Module& model) {
  const auto* m = dynamic_cast<const models::DiffusionModel*>(&model);
  return m != nullptr && m->config().looped();
}

// A looped model's shared block ("shared.<k>", not a part of one): its
// calls are its loops.
bool is_shared_block(const std::string& module) {
  return module.rfind("shared.", 0) == 0 && module.find('.', 7) == std::string::npos;
}

// The loop of a non-finite parameter of a looped model: adapters.<l>.* and
// routers.<l>.* by name, loop_embed by its first non-finite row; else -1.
int64_t loop_of_weights(const std::string& name, const at::Tensor& p) {
  if (name == "loop_embed" && p.dim() == 2) {
    const at::Tensor bad = (~at::isfinite(p.detach())).any(1).nonzero();
    return bad.numel() > 0 ? bad[0][0].item<int64_t>() : -1;
  }
  return observe::loop_of_parameter(name);
}

std::string join(const std::vector<TensorSummary>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "; " : "") + v[i].text();
  return out.empty() ? "none" : out;
}

}  // namespace

TensorSummary summarize_tensor(const at::Tensor& t_in) {
  TensorSummary s;
  if (!t_in.defined()) return s;
  at::NoGradGuard no_grad;
  const at::Tensor t = t_in.detach();
  s.shape = t.sizes().vec();
  s.numel = t.numel();
  if (!is_float(t) || s.numel == 0) return s;
  const at::Tensor f = t.to(at::kFloat);
  s.nan = at::isnan(f).sum().item<int64_t>();
  s.inf = at::isinf(f).sum().item<int64_t>();
  const at::Tensor finite = at::masked_select(f, at::isfinite(f));
  if (finite.numel() > 0) {
    s.min = finite.min().item<double>();
    s.max = finite.max().item<double>();
    s.mean_abs = at::abs(finite).mean().item<double>();
  }
  return s;
}

std::string TensorSummary::text() const {
  std::ostringstream o;
  o.precision(4);
  o << "[";
  for (size_t i = 0; i < shape.size(); ++i) o << (i ? ", " : "") << shape[i];
  o << "] " << nan << " NaN " << inf << " Inf";
  if (nan + inf < numel) o << ", finite in [" << min << ", " << max << "], mean |x| " << mean_abs;
  return o.str();
}

std::string NonFiniteSite::message() const {
  if (!found) return "no non-finite value in an eager re-run of the batch" + (detail.empty() ? "" : ": " + detail);
  std::string who = module.empty() ? "the model's own code (between its modules)" : module;
  if (loop >= 0) who += " at loop " + std::to_string(loop);
  else if (calls > 1 && call >= 0) who += " (call " + std::to_string(call + 1) + " of " + std::to_string(calls) + ")";
  std::ostringstream o;
  if (phase == "weights") {
    o << "non-finite weights: " << who << " (" << detail << ")";
    return o.str();
  }
  if (phase == "loss") {
    o << "the model's output is finite but the loss is not: " << detail;
    return o.str();
  }
  o << "first non-finite " << phase << ": " << who << (type.empty() ? "" : " (" + type + ")") << ": " << detail;
  if (phase == "forward")
    o << "\n  inputs: " << join(inputs) << "\n  outputs: " << join(outputs);
  else
    o << "\n  gradients of its outputs: " << join(inputs) << "\n  gradients of its inputs / parameter: "
      << join(outputs);
  return o.str();
}

std::string first_nonfinite_tensor(const nn::Module& module) {
  for (const auto& [name, t] : module.state())
    if (!all_finite(t)) return name;
  return "";
}

NonFiniteSite locate_nonfinite(const nn::Module& model, const std::function<at::Tensor()>& loss_fn,
                               bool anomaly_mode) {
  NonFiniteSite site;
  const auto params = model.named_parameters();
  for (const auto& [name, p] : params) {
    if (all_finite(p)) continue;
    site.found = true;
    site.phase = "weights";
    site.module = name;
    site.loop = loop_of_weights(name, p);
    site.detail = summarize_tensor(p).text();
    return site;
  }
  std::unique_ptr<torch::autograd::DetectAnomalyGuard> anomaly;
  if (anomaly_mode) anomaly = std::make_unique<torch::autograd::DetectAnomalyGuard>();

  // Backward: gradients of each module's outputs, then of its inputs, and of
  // each parameter, in the order autograd computes them. The module hook
  // goes on before the forward, which places the tensor hooks it needs.
  std::map<std::string, bool> grad_out_finite;  // module -> all gradients of its outputs finite so far
  std::map<std::string, std::vector<TensorSummary>> grad_outs;
  // Forward calls per module, and the gradients of outputs seen in backward
  // (the last call's first): which call a backward hook is about.
  std::map<std::string, int64_t> forward_calls, outputs_seen;
  const bool looped = is_looped(model);
  auto name_call = [&](NonFiniteSite& s, int64_t call) {
    s.calls = forward_calls[s.module];
    if (s.calls <= 1) {
      s.call = -1;
      return;
    }
    s.call = call;
    if (looped && is_shared_block(s.module)) s.loop = call;
  };
  auto consider = [&](const std::string& module, const std::string& type, const std::string& what,
                      const at::Tensor& grad) {
    if (site.found || all_finite(grad)) return;
    auto it = grad_out_finite.find(module);
    if (it != grad_out_finite.end() && !it->second) return;  // inherited from its output's gradient
    site.found = true;
    site.phase = "backward";
    site.module = module;
    site.type = type;
    site.detail = what + " non-finite while the gradients of its outputs were finite";
    site.inputs = grad_outs[module];
    site.outputs = {summarize_tensor(grad)};
    name_call(site, forward_calls[module] - outputs_seen[module]);
  };
  nn::HookHandle bwd = model.add_backward_hook(
      [&](const std::string& name, const nn::Module& m, nn::GradOf which, size_t index, const at::Tensor& grad) {
        if (which == nn::GradOf::kOutput) {
          const bool ok = all_finite(grad);
          auto [it, fresh] = grad_out_finite.emplace(name, ok);
          if (!fresh) it->second = it->second && ok;
          grad_outs[name].push_back(summarize_tensor(grad));
          ++outputs_seen[name];
          return;
        }
        consider(name, m.type_name(), "the gradient of input " + std::to_string(index), grad);
      });

  // Forward: hooks fire as each module returns, innermost first.
  NonFiniteSite first_any;  // the first non-finite output at all, when no module made one from finite inputs
  at::Tensor loss;
  {
    nn::HookHandle count = model.add_forward_pre_hook(
        [&](const std::string& name, const nn::Module&, at::TensorList) { ++forward_calls[name]; });
    nn::HookHandle fwd = model.add_forward_hook([&](const std::string& name, const nn::Module& m,
                                                    at::TensorList in, at::TensorList out) {
      if (site.found || all_finite(out)) return;
      const bool inputs_finite = all_finite(in);
      NonFiniteSite s;
      s.found = true;
      s.phase = "forward";
      s.module = name;
      s.type = m.type_name();
      s.inputs = summaries(in);
      s.outputs = summaries(out);
      s.detail = inputs_finite ? "finite inputs, non-finite output" : "output non-finite, its inputs already were";
      s.call = forward_calls[name] - 1;  // the calls so far; name_call below once all are known
      if (inputs_finite) site = s;
      else if (!first_any.found) first_any = s;
    });
    loss = loss_fn();
  }
  if (site.found) name_call(site, site.call);
  if (first_any.found) name_call(first_any, first_any.call);
  if (site.found) return site;
  if (!all_finite(loss)) {
    if (first_any.found) return first_any;
    site.found = true;
    site.phase = "loss";
    site.detail = "loss " + summarize_tensor(loss).text();
    return site;
  }
  if (!loss.requires_grad()) return site;

  {
    double largest = -1;  // the largest |gradient| element, for a norm that overflows from finite parts
    std::string largest_name;
    std::vector<std::pair<at::Tensor, unsigned>> param_hooks;
    for (const auto& [name, p] : params) {
      if (!p.requires_grad()) continue;
      const std::string pname = name;
      param_hooks.emplace_back(p, p.register_hook([&, pname](const at::Tensor& grad) {
                                 const bool before = site.found;
                                 consider(owner_of(pname), "", "the gradient of parameter " + pname, grad);
                                 if (!before && site.found) site.loop = observe::loop_of_parameter(pname);
                                 if (!site.found && grad.numel() > 0) {
                                   const double m = grad.detach().abs().max().item<double>();
                                   if (m > largest) largest = m, largest_name = pname;
                                 }
                               }));
    }
    try {
      loss.backward();
    } catch (const std::exception& e) {
      if (!site.found) site.detail = "backward threw: " + compat::error_message(e);
    }
    for (auto& [p, h] : param_hooks) p.remove_hook(h);
    if (!site.found && site.detail.empty() && largest >= 0) {
      std::ostringstream o;
      o << "every module's output and gradient was finite; the largest |gradient| is " << largest << " in "
        << largest_name << " (a norm of such gradients can overflow float32, whose largest value is 3.4e38)";
      site.detail = o.str();
    }
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : params) p.mutable_grad() = at::Tensor();
  return site;
}

}  // namespace perftrain::train
