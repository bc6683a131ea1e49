// A minimal module: named parameters and child modules with PyTorch's
// state_dict naming ("blocks.3.attn.qkv.weight"), so that a checkpoint written
// here loads into the reference PyTorch model unchanged. Modules hold their
// tensors as members and register pointers to them, so a module is neither
// copied nor moved once built (hold it by unique_ptr).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace perftrain::nn {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
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

 protected:
  void register_parameter(std::string name, at::Tensor* tensor, bool trainable = true);
  void register_module(std::string name, Module* child);

 private:
  struct Slot {
    std::string name;
    at::Tensor* tensor;
    bool trainable;
  };
  template <class Fn>
  void visit(const std::string& prefix, Fn&& fn) const;

  std::vector<Slot> tensors_;
  std::vector<std::pair<std::string, Module*>> children_;
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
