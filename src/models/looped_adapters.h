// The looped model's per-loop modules (models/looped.h): the low-rank
// adapter of one shared linear (depth-wise LoRA, peft's names and
// convention), the adapters of one shared block, and a loop's router.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/dit_config.h"
#include "nn/module.h"

namespace perftrain::models {

// W' = W + scale * B A for a shared weight W [out, in], plus an optional bias
// delta: lora_A [rank, in] (kaiming-uniform as peft: U(+-1/sqrt(in))),
// lora_B [out, rank] and bias [out] zero, so a fresh adapter changes nothing.
class LoRAAdapter : public nn::Module {
 public:
  LoRAAdapter(int64_t in, int64_t out, int64_t rank, double scale, bool bias, at::Generator& gen);
  // The merged weight W + scale * B A, computed in float32 whatever autocast
  // says (exact: the activations then meet one product), and the bias b +
  // delta (b may be undefined: then the delta alone, or undefined).
  std::pair<at::Tensor, at::Tensor> merged(const at::Tensor& W, const at::Tensor& b) const;
  double scale() const { return scale_; }

  at::Tensor lora_A;  // [rank, in]
  at::Tensor lora_B;  // [out, rank]
  at::Tensor bias;    // [out] or undefined

 private:
  double scale_;
};

// A module that only holds children (an adapter path's inner names).
class ModuleNode : public nn::Module {
 public:
  void add(const std::string& name, nn::Module* child) { register_module(name, child); }
};

// The adapters of one shared block, at the linears' paths in the block
// ("attn.qkv", "adaLN_modulation.1"): state-dict names
// "<path>.lora_A", as peft names them under the block.
class BlockAdapters : public nn::Module {
 public:
  BlockAdapters(const std::vector<LinearShape>& linears, int64_t rank, double scale, bool bias, at::Generator& gen);
  // The adapter at `path`, or nullptr when that linear has none.
  const LoRAAdapter* find(const std::string& path) const;
  // (W, b) merged with the adapter at `path`, or unchanged without one.
  std::pair<at::Tensor, at::Tensor> merged(const std::string& path, const at::Tensor& W, const at::Tensor& b) const;

 private:
  // Registers the adapter at `path`: under this block, or under a ModuleNode
  // for its first name (made on first use).
  void attach(const std::string& path, std::unique_ptr<LoRAAdapter> adapter);

  std::vector<std::pair<std::string, std::unique_ptr<ModuleNode>>> nodes_;
  std::vector<std::pair<std::string, std::unique_ptr<LoRAAdapter>>> adapters_;
};

// Modules registered under names of our choosing (a loop's index), unlike
// ModuleList's 0..n-1: the routers of the routed loops only.
template <class M>
class ModuleMap : public nn::Module {
 public:
  M& add(const std::string& name, std::unique_ptr<M> m) {
    items_.emplace_back(name, std::move(m));
    register_module(name, items_.back().second.get());
    return *items_.back().second;
  }
  const M* find(const std::string& name) const {
    for (const auto& [n, m] : items_)
      if (n == name) return m.get();
    return nullptr;
  }
  size_t size() const { return items_.size(); }

 private:
  std::vector<std::pair<std::string, std::unique_ptr<M>>> items_;
};

}  // namespace perftrain::models
