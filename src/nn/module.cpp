#include "nn/module.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Type.h>

#include <algorithm>
#include <regex>

namespace perftrain::nn {

// The hooks registered on one module (its root), shared with every module of
// its subtree through their attachments and with the tensor hooks a forward
// places (so a backward after the module is gone finds the set, not a
// dangling pointer).
struct HookSet {
  const Module* root = nullptr;  // null once the root is destroyed
  uint64_t next_id = 1;
  std::vector<std::pair<uint64_t, ForwardPreHook>> pre;
  std::vector<std::pair<uint64_t, ForwardHook>> post;
  std::vector<std::pair<uint64_t, BackwardHook>> backward;

  bool empty() const { return pre.empty() && post.empty() && backward.empty(); }
  void remove(uint64_t id) {
    auto drop = [id](auto& v) {
      v.erase(std::remove_if(v.begin(), v.end(), [id](const auto& e) { return e.first == id; }), v.end());
    };
    drop(pre);
    drop(post);
    drop(backward);
  }
};

HookHandle& HookHandle::operator=(HookHandle&& o) noexcept {
  if (this != &o) {
    remove();
    set_ = std::move(o.set_);
    id_ = o.id_;
  }
  return *this;
}

void HookHandle::remove() {
  if (!set_) return;
  set_->remove(id_);
  if (set_->empty() && set_->root) set_->root->detach(set_.get());
  set_.reset();
}

Module::~Module() {
  for (const HookAttachment& a : hook_attachments_) {
    if (a.set->root == this) a.set->root = nullptr;
  }
}

std::vector<std::tuple<std::string, at::Tensor, bool>> Module::own_tensors() const {
  std::vector<std::tuple<std::string, at::Tensor, bool>> out;
  for (const Slot& s : tensors_) out.emplace_back(s.name, *s.tensor, s.trainable);
  return out;
}

std::string Module::type_name() const {
  // "perftrain::nn::ModuleList<perftrain::models::DiTBlock>" -> "ModuleList<DiTBlock>"
  static const std::regex ns("([A-Za-z_][A-Za-z_0-9]*|\\(anonymous namespace\\))::");
  return std::regex_replace(c10::demangle(typeid(*this).name()), ns, "");
}

std::shared_ptr<HookSet> Module::own_hook_set() const {
  for (const HookAttachment& a : hook_attachments_) {
    if (a.set->root == this) return a.set;
  }
  auto set = std::make_shared<HookSet>();
  set->root = this;
  attach(set, "");
  return set;
}

void Module::attach(const std::shared_ptr<HookSet>& set, const std::string& name) const {
  hook_attachments_.push_back({set, name});
  for (const auto& [child_name, child] : children_) child->attach(set, name.empty() ? child_name : name + "." + child_name);
}

void Module::detach(const HookSet* set) const {
  hook_attachments_.erase(std::remove_if(hook_attachments_.begin(), hook_attachments_.end(),
                                         [set](const HookAttachment& a) { return a.set.get() == set; }),
                          hook_attachments_.end());
  for (const auto& child : children_) child.second->detach(set);
}

HookHandle Module::add_forward_pre_hook(ForwardPreHook hook) const {
  auto set = own_hook_set();
  const uint64_t id = set->next_id++;
  set->pre.emplace_back(id, std::move(hook));
  return HookHandle(set, id);
}

HookHandle Module::add_forward_hook(ForwardHook hook) const {
  auto set = own_hook_set();
  const uint64_t id = set->next_id++;
  set->post.emplace_back(id, std::move(hook));
  return HookHandle(set, id);
}

HookHandle Module::add_backward_hook(BackwardHook hook) const {
  auto set = own_hook_set();
  const uint64_t id = set->next_id++;
  set->backward.emplace_back(id, std::move(hook));
  return HookHandle(set, id);
}

at::Tensor Module::hooked_call(at::TensorList inputs, const std::function<at::Tensor(at::TensorList)>& body) const {
  // Copies: a hook may add or remove hooks while it runs.
  const std::vector<HookAttachment> attachments = hook_attachments_;
  for (const HookAttachment& a : attachments) {
    const auto pre = a.set->pre;
    for (const auto& h : pre) h.second(a.name, *this, inputs);
  }
  const bool want_grads =
      at::GradMode::is_enabled() &&
      std::any_of(attachments.begin(), attachments.end(), [](const HookAttachment& a) { return !a.set->backward.empty(); });
  // The gradient of one tensor, passed to every backward hook of every set
  // attached now (those still registered when backward runs).
  auto watch = [&](const at::Tensor& t, GradOf which, size_t index) {
    for (const HookAttachment& a : attachments) {
      if (a.set->backward.empty()) continue;
      t.register_hook([set = a.set, name = a.name, module = this, which, index](const at::Tensor& grad) {
        const auto hooks = set->backward;
        for (const auto& h : hooks) h.second(name, *module, which, index, grad);
      });
    }
  };
  std::vector<at::Tensor> in(inputs.begin(), inputs.end());
  if (want_grads) {
    for (size_t i = 0; i < in.size(); ++i) {
      if (!in[i].defined() || !in[i].requires_grad()) continue;
      in[i] = in[i].view_as(in[i]);  // this module's use of the input, apart from other readers
      watch(in[i], GradOf::kInput, i);
    }
  }
  at::Tensor out = body(in);
  for (const HookAttachment& a : attachments) {
    const auto post = a.set->post;
    for (const auto& h : post) h.second(a.name, *this, in, out);
  }
  if (want_grads && out.defined() && out.requires_grad()) watch(out, GradOf::kOutput, 0);
  return out;
}

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
