#include "nn/module.h"

namespace perftrain::nn {

void Module::register_parameter(std::string name, at::Tensor* tensor, bool trainable) {
  tensors_.push_back({std::move(name), tensor, trainable});
}

void Module::register_module(std::string name, Module* child) {
  children_.emplace_back(std::move(name), child);
}

template <class Fn>
void Module::visit(const std::string& prefix, Fn&& fn) const {
  for (const Slot& s : tensors_) fn(prefix + s.name, s);
  for (const auto& [name, child] : children_) child->visit(prefix + name + ".", fn);
}

NamedTensors Module::state() const {
  NamedTensors out;
  visit("", [&](const std::string& n, const Slot& s) { out.emplace_back(n, *s.tensor); });
  return out;
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  visit("", [&](const std::string& n, const Slot& s) {
    if (s.trainable) out.emplace_back(n, *s.tensor);
  });
  return out;
}

std::vector<at::Tensor> Module::parameters() const {
  std::vector<at::Tensor> out;
  visit("", [&](const std::string&, const Slot& s) {
    if (s.trainable) out.push_back(*s.tensor);
  });
  return out;
}

int64_t Module::parameter_count(bool trainable_only) const {
  int64_t n = 0;
  visit("", [&](const std::string&, const Slot& s) {
    if (s.trainable || !trainable_only) n += s.tensor->numel();
  });
  return n;
}

void Module::transform(
    const std::function<at::Tensor(const std::string&, const at::Tensor&)>& fn) {
  visit("", [&](const std::string& n, const Slot& s) {
    at::Tensor t = fn(n, *s.tensor).detach();
    if (s.trainable) t.set_requires_grad(true);
    *s.tensor = t;
  });
}

}  // namespace perftrain::nn
