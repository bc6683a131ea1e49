#include "models/looped_adapters.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cmath>

#include "nn/init.h"

namespace perftrain::models {

LoRAAdapter::LoRAAdapter(int64_t in, int64_t out, int64_t rank, double scale, bool has_bias, at::Generator& gen)
    : scale_(scale) {
  const auto options = nn::param_options(gen);
  lora_A = at::empty({rank, in}, options);
  {
    // peft's kaiming_uniform_(a = sqrt(5)): U(-1/sqrt(in), 1/sqrt(in)).
    at::NoGradGuard no_grad;
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    lora_A.uniform_(-bound, bound, gen);
  }
  lora_B = at::zeros({out, rank}, options);
  register_parameter("lora_A", &lora_A);
  register_parameter("lora_B", &lora_B);
  if (has_bias) {
    bias = at::zeros({out}, options);
    register_parameter("bias", &bias);
  }
}

std::pair<at::Tensor, at::Tensor> LoRAAdapter::merged(const at::Tensor& W, const at::Tensor& b) const {
  // In float32 even under autocast (which would run addmm in 16 bits): the
  // merge is the weight, and autocast casts it for the product that reads it.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor w = at::addmm(W, lora_B, lora_A, 1.0, scale_);
  if (!bias.defined()) return {w, b};
  return {w, b.defined() ? b + bias : bias};
}

BlockAdapters::BlockAdapters(const std::vector<LinearShape>& linears, int64_t rank, double scale, bool bias,
                             at::Generator& gen) {
  for (const LinearShape& l : linears) attach(l.path, std::make_unique<LoRAAdapter>(l.in, l.out, rank, scale, bias, gen));
}

void BlockAdapters::attach(const std::string& path, std::unique_ptr<LoRAAdapter> adapter) {
  const auto dot = path.rfind('.');
  LoRAAdapter* a = adapter.get();
  adapters_.emplace_back(path, std::move(adapter));
  if (dot == std::string::npos) {
    register_module(path, a);
    return;
  }
  // One level of nesting is all a block's linears have ("attn.qkv").
  const std::string parent = path.substr(0, dot);
  ModuleNode* node = nullptr;
  for (auto& [name, n] : nodes_)
    if (name == parent) node = n.get();
  if (node == nullptr) {
    nodes_.emplace_back(parent, std::make_unique<ModuleNode>());
    node = nodes_.back().second.get();
    register_module(parent, node);
  }
  node->add(path.substr(dot + 1), a);
}

const LoRAAdapter* BlockAdapters::find(const std::string& path) const {
  for (const auto& [p, a] : adapters_)
    if (p == path) return a.get();
  return nullptr;
}

std::pair<at::Tensor, at::Tensor> BlockAdapters::merged(const std::string& path, const at::Tensor& W,
                                                        const at::Tensor& b) const {
  const LoRAAdapter* a = find(path);
  return a ? a->merged(W, b) : std::pair<at::Tensor, at::Tensor>{W, b};
}

}  // namespace perftrain::models
