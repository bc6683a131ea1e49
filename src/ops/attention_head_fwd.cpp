#include "ops/attention_head_fwd.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>

#include <atomic>
#include <cmath>

#include "compat/compat.h"
#include "kernels/attention_head_fwd_sm90.h"
#include "ops/attention_head_bwd.h"

namespace perftrain::ops {
namespace {

std::atomic<bool> own_forward{true};

}  // namespace

bool whole_head_attention_forward() { return own_forward.load(std::memory_order_relaxed); }
void set_whole_head_attention_forward(bool on) { own_forward.store(on, std::memory_order_relaxed); }

bool whole_head_attention_applies(const at::Tensor& qkv, int64_t heads) {
  return whole_head_attention_forward() && whole_head_attention_backward() && detail::whole_head_dim(qkv, heads) > 0 &&
         compat::current_device_is_sm90();
}

std::pair<at::Tensor, at::Tensor> try_attention_head_fwd(const at::Tensor& qkv, int64_t heads) {
  if (!whole_head_attention_applies(qkv, heads)) return {};
  const int64_t head_dim = detail::whole_head_dim(qkv, heads);
  const int64_t B = qkv.size(0), T = qkv.size(1);
  at::Tensor out = at::empty({B, T, heads, head_dim}, qkv.options());
  at::Tensor lse = at::empty({B, heads, T}, qkv.options().dtype(at::kFloat));
  kernels::attention_head_fwd_sm90(static_cast<const __nv_bfloat16*>(qkv.data_ptr()),
                                   static_cast<__nv_bfloat16*>(out.data_ptr()), lse.data_ptr<float>(), int(B),
                                   int(heads), int(head_dim), 1.f / std::sqrt(float(head_dim)),
                                   at::cuda::getCurrentCUDAStream());
  return {out.transpose(1, 2), lse};
}

}  // namespace perftrain::ops
