// The compute-dtype copies of fp32 master weights that the matrix-product ops
// read. Without them every linear layer casts its weight (and bias) on every
// call: 127-151 small cast kernels per DiT-S/2 step. With them the device
// optimizer writes a bf16 copy of each parameter as it updates it
// (ops/multi_tensor_adamw shadows), and the ops look the copy up here.
//
// The lookup is scoped: a ComputeWeightsScope on the current thread makes a
// set of copies visible while it lives (the step runner holds one around its
// forward and backward); outside any scope, or for a tensor without a copy,
// compute_weight() casts as before. So a model used elsewhere (evaluation,
// sampling, tests) never reads a copy that may be a step behind.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace perftrain::ops {

// Master tensor (by identity) -> its copy in another dtype.
class ComputeWeights {
 public:
  ComputeWeights() = default;
  // pairs of (master, copy); a copy must have its master's sizes.
  explicit ComputeWeights(const std::vector<std::pair<at::Tensor, at::Tensor>>& pairs);
  // The copy of `master` in `dtype`, or an undefined tensor.
  at::Tensor find(const at::Tensor& master, at::ScalarType dtype) const;
  size_t size() const { return copies_ ? copies_->size() : 0; }

 private:
  using Map = std::unordered_map<const void*, std::pair<at::Tensor, at::Tensor>>;  // impl -> (master, copy)
  std::shared_ptr<const Map> copies_;  // shared: a copy of the set (ops::recompute keeps one) costs nothing
};

// Makes `weights` the copies compute_weight() finds on this thread while the
// scope lives (scopes nest; null hides any outer one).
class ComputeWeightsScope {
 public:
  explicit ComputeWeightsScope(const ComputeWeights* weights);
  ~ComputeWeightsScope();
  ComputeWeightsScope(const ComputeWeightsScope&) = delete;
  ComputeWeightsScope& operator=(const ComputeWeightsScope&) = delete;

 private:
  const ComputeWeights* previous_;
};

// The set of copies the innermost scope on this thread makes visible, or
// null (none, or a null scope). ops::recompute keeps it for the backward,
// which runs on autograd's thread, outside the step's scope.
const ComputeWeights* current_compute_weights();

// `t` in `dtype`, contiguous: itself when it already is, the scope's copy
// when there is one (for a contiguous view of a whole parameter, the same
// view of its copy), else a cast (t.to(dtype).contiguous()).
at::Tensor compute_weight(const at::Tensor& t, at::ScalarType dtype);

}  // namespace perftrain::ops
