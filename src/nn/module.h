// A minimal module: named parameters and child modules with PyTorch's
// state_dict naming ("blocks.3.attn.qkv.weight"), so that a checkpoint written
// here loads into the reference PyTorch model unchanged. Modules hold their
// tensors as members and register pointers to them, so a module is neither
// copied nor moved once built (hold it by unique_ptr).
//
// Hooks: libtorch's C++ modules have none, so Module gives one hook point
// that the gradient monitor, the NaN localiser and `perftrain summary` share.
// A hook registered on a module applies to it and to every module under it
// (children registered before the hook), and is called with the module's
// name relative to that module ("" for itself, "blocks.3.attn"):
//   forward pre  (name, module, inputs)           before the module's forward
//   forward      (name, module, inputs, outputs)  after it
//   backward     (name, module, which, index, grad): the gradient of the
//                loss with respect to output `index` (which = kOutput) or to
//                input `index` as this module used it (kInput), from tensor
//                hooks placed on the outputs and on an alias of each input
//                that requires grad; called by autograd during backward.
// add_*_hook returns a HookHandle; the hook stays until the handle is removed
// or destroyed. With no hook registered, a forward pays one empty-vector test.
// Which forwards fire: every module's forward() on the plain (eager) path.
// The fused path (models::DiTExecution::fused_kernels) runs blocks through
// src/ops directly: see docs/guide/model-views.md for the modules it fires.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace perftrain::nn {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

class Module;
struct HookSet;

enum class GradOf { kOutput, kInput };
using ForwardPreHook = std::function<void(const std::string& name, const Module& module, at::TensorList inputs)>;
using ForwardHook = std::function<void(const std::string& name, const Module& module, at::TensorList inputs,
                                       at::TensorList outputs)>;
using BackwardHook = std::function<void(const std::string& name, const Module& module, GradOf which,
                                        size_t index, const at::Tensor& grad)>;

// Removes its hook when remove() is called or when it is destroyed (so keep
// it for as long as the hook should run). Move-only.
class [[nodiscard]] HookHandle {
 public:
  HookHandle() = default;
  HookHandle(std::shared_ptr<HookSet> set, uint64_t id) : set_(std::move(set)), id_(id) {}
  HookHandle(HookHandle&& o) noexcept : set_(std::move(o.set_)), id_(o.id_) {}
  HookHandle& operator=(HookHandle&& o) noexcept;
  HookHandle(const HookHandle&) = delete;
  HookHandle& operator=(const HookHandle&) = delete;
  ~HookHandle() { remove(); }
  void remove();
  bool active() const { return set_ != nullptr; }

 private:
  std::shared_ptr<HookSet> set_;
  uint64_t id_ = 0;
};

class Module {
 public:
  Module() = default;
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every registered tensor, trainable or not, in state_dict order: a
  // module's own tensors first, then each child's, depth first.
  NamedTensors state() const;
  // Trainable tensors only, in the same order.
  NamedTensors named_parameters() const;
  std::vector<at::Tensor> parameters() const;
  int64_t parameter_count(bool trainable_only = false) const;

  // Replaces every tensor t by fn(name, t) (e.g. move to a device, load from a
  // file); requires_grad is set again afterwards for trainable tensors.
  void transform(const std::function<at::Tensor(const std::string&, const at::Tensor&)>& fn);

  // The structure, for views of the model (perftrain summary/graph): the
  // direct children in registration order; this module's own tensors (not
  // its children's) with their trainable flag; the class name without
  // namespaces ("Linear", "DiTBlock").
  const std::vector<std::pair<std::string, Module*>>& named_children() const { return children_; }
  std::vector<std::tuple<std::string, at::Tensor, bool>> own_tensors() const;
  std::string type_name() const;

  // Hooks (see the top of this file). Registering on a module attaches the
  // hook to the module and its subtree as it is now.
  // Const: hooks observe, they change no tensor of the module.
  HookHandle add_forward_pre_hook(ForwardPreHook hook) const;
  HookHandle add_forward_hook(ForwardHook hook) const;
  HookHandle add_backward_hook(BackwardHook hook) const;
  bool has_hooks() const { return !hook_attachments_.empty(); }

 protected:
  void register_parameter(std::string name, at::Tensor* tensor, bool trainable = true);
  void register_module(std::string name, Module* child);

  // A forward runs its body through this: body(inputs) with no hook
  // attached; otherwise the pre hooks, the body (on aliases of the inputs
  // when a backward hook wants their gradients), the forward hooks and the
  // tensor hooks for backward.
  template <class Body>
  at::Tensor hooked(std::initializer_list<at::Tensor> inputs, Body&& body) const {
    if (hook_attachments_.empty()) return body(at::TensorList(inputs));
    return hooked_call(at::TensorList(inputs), std::function<at::Tensor(at::TensorList)>(std::forward<Body>(body)));
  }

 private:
  friend struct HookSet;
  friend class HookHandle;
  struct Slot {
    std::string name;
    at::Tensor* tensor;
    bool trainable;
  };
  struct HookAttachment {
    std::shared_ptr<HookSet> set;
    std::string name;  // relative to the set's root
  };
  template <class Fn>
  void visit(const std::string& prefix, Fn&& fn) const;
  at::Tensor hooked_call(at::TensorList inputs, const std::function<at::Tensor(at::TensorList)>& body) const;
  std::shared_ptr<HookSet> own_hook_set() const;
  void attach(const std::shared_ptr<HookSet>& set, const std::string& name) const;
  void detach(const HookSet* set) const;

  std::vector<Slot> tensors_;
  std::vector<std::pair<std::string, Module*>> children_;
  mutable std::vector<HookAttachment> hook_attachments_;
};

// A list of modules named 0, 1, 2, ... (like torch.nn.ModuleList).
template <class M>
class ModuleList : public Module {
 public:
  M& add(std::unique_ptr<M> m) {
    items_.push_back(std::move(m));
    register_module(std::to_string(items_.size() - 1), items_.back().get());
    return *items_.back();
  }
  size_t size() const { return items_.size(); }
  M& operator[](size_t i) { return *items_[i]; }
  const M& operator[](size_t i) const { return *items_[i]; }

 private:
  std::vector<std::unique_ptr<M>> items_;
};

}  // namespace perftrain::nn
