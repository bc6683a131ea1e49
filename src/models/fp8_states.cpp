#include "models/fp8_states.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>

#include "base/error.h"
#include "ops/fp8_linear.h"
#include "ops/fp8_linear_gelu.h"
#include "ops/fp8_linear_swiglu.h"
#include "ops/linear.h"
#include "ops/stacked_linear.h"

namespace perftrain::models {

Fp8States::Fp8States(int64_t history_len, int margin) : history_len_(history_len), margin_(margin) {
  ops::make_fp8_linear_scaling(history_len, at::kCPU);  // checks the length once, here
  if (margin < 0 || margin > kFp8MaxMargin)
    throw UsageError("fp8: the scaling margin must be in [0, " + std::to_string(kFp8MaxMargin) + "], got " +
                     std::to_string(margin));
}

const ops::Fp8Scaling& Fp8States::state(const std::string& name, const at::Device& device) {
  const auto found = states_.find(name);
  if (found != states_.end()) return found->second;
  if (frozen_)
    throw RuntimeError("fp8: the linear " + name + " has no scaling state and new ones are no longer made "
                       "(the step is captured); its first step must run eagerly");
  ops::Fp8Scaling s = ops::make_fp8_linear_scaling(history_len_, device);
  const auto saved = loaded_.find(name);
  if (saved != loaded_.end()) {
    for (const auto& [what, t] : s.named_tensors()) {
      const auto v = saved->second.find(what);
      if (v == saved->second.end() || v->second.sizes() != t.sizes())
        throw UsageError("fp8: the checkpoint's scaling state of " + name + " has no " + what +
                         " of the shape this run makes (resume with the same model)");
      at::Tensor dst = t;
      dst.copy_(v->second);
    }
    loaded_.erase(saved);
  }
  return states_.emplace(name, std::move(s)).first->second;
}

void Fp8States::freeze() {
  frozen_ = true;
  if (states_.empty() || amax_flat_.defined()) return;
  int64_t total = 0;
  for (const auto& [name, s] : states_) total += s.slots();
  amax_flat_ = at::empty({total}, states_.begin()->second.amax.options());
  int64_t offset = 0;
  for (auto& [name, s] : states_) {
    at::Tensor slice = amax_flat_.narrow(0, offset, s.slots());
    slice.copy_(s.amax);
    s.amax = slice;
    offset += s.slots();
  }
}

std::vector<at::Tensor> Fp8States::amax_tensors() const {
  if (amax_flat_.defined()) return {amax_flat_};
  std::vector<at::Tensor> out;
  for (const auto& [name, s] : states_) out.push_back(s.amax);
  return out;
}

void Fp8States::update() const {
  std::vector<const ops::Fp8Scaling*> all;
  for (const auto& [name, s] : states_) all.push_back(&s);
  ops::fp8_scaling_update(all, margin_);
}

std::vector<std::pair<std::string, at::Tensor>> Fp8States::named_tensors() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.emplace_back("history_len", at::scalar_tensor(double(history_len_), at::kFloat));
  for (const auto& [name, s] : states_)
    for (const auto& [what, t] : s.named_tensors()) out.emplace_back(name + "." + what, t);
  for (const auto& [name, tensors] : loaded_)
    for (const auto& [what, t] : tensors) out.emplace_back(name + "." + what, t);
  return out;
}

void Fp8States::load(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  for (const auto& [full, t] : tensors) {
    if (full == "history_len") {
      const int64_t h = int64_t(t.item<double>());
      if (h != history_len_)
        throw UsageError("fp8: the checkpoint's amax history has " + std::to_string(h) + " entries, this run " +
                         std::to_string(history_len_) + " (resume with the same amax history length)");
      continue;
    }
    const size_t dot = full.rfind('.');
    if (dot == std::string::npos || dot == 0) throw UsageError("fp8: a checkpoint tensor named " + full);
    loaded_[full.substr(0, dot)][full.substr(dot + 1)] = t;
  }
}

std::vector<std::string> Fp8States::unused_loaded() const {
  std::vector<std::string> out;
  for (const auto& [name, tensors] : loaded_) out.push_back(name);
  return out;
}

at::Tensor block_linear(const Fp8Block& f, const char* layer, const at::Tensor& x, const at::Tensor& weight,
                        const at::Tensor& bias) {
  if (f.states == nullptr) return ops::linear(x, weight, bias);
  const std::string name = f.key + "." + layer;
  if (!ops::fp8_linear_supported(x, weight)) {
    f.states->note_fallback(name);
    return ops::linear(x, weight, bias);
  }
  return ops::fp8_linear(x, weight, bias, f.states->state(name, x.device()));
}

at::Tensor block_linear(const Fp8Block& f, const char* layer, const ops::Fp8Operand& x, const at::Tensor& weight,
                        const at::Tensor& bias) {
  if (!x.codes.defined()) return block_linear(f, layer, x.x, weight, bias);
  return ops::fp8_linear(x, weight, bias, f.states->state(f.key + "." + layer, x.x.device()));
}

at::Tensor block_linear(const Fp8Block& f, const char* layer, const at::Tensor& x,
                        const std::vector<at::Tensor>& weights) {
  if (f.states == nullptr || weights.empty()) return ops::stacked_linear(x, weights);
  const std::string name = f.key + "." + layer;
  int64_t n = 0;
  for (const at::Tensor& w : weights) n += w.size(0);
  if (!ops::fp8_linear_supported(x, n)) {
    f.states->note_fallback(name);
    return ops::stacked_linear(x, weights);
  }
  return ops::fp8_linear(x, weights, f.states->state(name, x.device()));
}

at::Tensor block_linear(const Fp8Block& f, const char* layer, const ops::Fp8Operand& x,
                        const std::vector<at::Tensor>& weights) {
  if (!x.codes.defined()) return block_linear(f, layer, x.x, weights);
  return ops::fp8_linear(x, weights, f.states->state(f.key + "." + layer, x.x.device()));
}

std::optional<ops::Fp8Operand> block_linear_gelu(const Fp8Block& f, const char* layer, const ops::Fp8Operand& x,
                                                 const at::Tensor& weight, const at::Tensor& bias,
                                                 const char* next_layer, int64_t next_out_features) {
  if (f.states == nullptr || !f.states->fused_casts() ||
      !ops::fp8_linear_gelu_supported(x.x, weight.size(0), next_out_features))
    return std::nullopt;
  const ops::Fp8Scaling& state = f.states->state(f.key + "." + layer, x.x.device());
  const ops::Fp8Scaling& next = f.states->state(f.key + "." + next_layer, x.x.device());
  return ops::fp8_linear_gelu(x, weight, bias, state, ops::fp8_linear_input_target(next));
}

std::optional<ops::Fp8Operand> block_linear_swiglu(const Fp8Block& f, const char* layer, const ops::Fp8Operand& x,
                                                   const std::vector<at::Tensor>& weights, const char* next_layer,
                                                   int64_t next_out_features) {
  if (f.states == nullptr || !f.states->fused_casts() || weights.size() != 2 ||
      !ops::fp8_linear_swiglu_supported(x.x, weights[0].size(0), next_out_features))
    return std::nullopt;
  const ops::Fp8Scaling& state = f.states->state(f.key + "." + layer, x.x.device());
  const ops::Fp8Scaling& next = f.states->state(f.key + "." + next_layer, x.x.device());
  return ops::fp8_linear_swiglu(x, weights, state, ops::fp8_linear_input_target(next));
}

std::optional<ops::Fp8Target> block_linear_target(const Fp8Block& f, const char* layer, const at::Tensor& x,
                                                  int64_t out_features) {
  if (f.states == nullptr || !f.states->fused_casts() || !ops::fp8_linear_supported(x, out_features))
    return std::nullopt;
  return ops::fp8_linear_input_target(f.states->state(f.key + "." + layer, x.device()));
}

}  // namespace perftrain::models
