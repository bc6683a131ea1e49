#include "ops/compute_weights.h"

#include "base/error.h"

namespace perftrain::ops {
namespace {

thread_local const ComputeWeights* g_current = nullptr;

}  // namespace

ComputeWeights::ComputeWeights(const std::vector<std::pair<at::Tensor, at::Tensor>>& pairs) {
  auto copies = std::make_shared<Map>();
  for (const auto& [master, copy] : pairs) {
    if (!master.defined() || !copy.defined()) continue;
    if (master.sizes() != copy.sizes())
      throw UsageError("ComputeWeights: a copy must have its master's sizes");
    (*copies)[master.unsafeGetTensorImpl()] = {master, copy};
  }
  copies_ = std::move(copies);
}

at::Tensor ComputeWeights::find(const at::Tensor& master, at::ScalarType dtype) const {
  if (!copies_) return at::Tensor();
  auto it = copies_->find(master.unsafeGetTensorImpl());
  if (it == copies_->end() || it->second.second.scalar_type() != dtype) return at::Tensor();
  return it->second.second;
}

const ComputeWeights* current_compute_weights() { return g_current; }

ComputeWeightsScope::ComputeWeightsScope(const ComputeWeights* weights) : previous_(g_current) {
  g_current = weights;
}

ComputeWeightsScope::~ComputeWeightsScope() { g_current = previous_; }

at::Tensor compute_weight(const at::Tensor& t, at::ScalarType dtype) {
  if (!t.defined() || (t.scalar_type() == dtype && t.is_contiguous())) return t;
  if (g_current != nullptr) {
    at::Tensor copy = g_current->find(t, dtype);
    if (copy.defined()) return copy;
    // A reshaping view of a whole parameter (a conv weight seen as a
    // matrix): the same view of the parameter's copy.
    if (t.is_view() && t.is_contiguous()) {
      const at::Tensor base(t._base());
      if (base.is_contiguous() && t.storage_offset() == base.storage_offset() && t.numel() == base.numel()) {
        copy = g_current->find(base, dtype);
        if (copy.defined()) return copy.view(t.sizes());
      }
    }
  }
  return t.to(dtype).contiguous();
}

}  // namespace perftrain::ops
