#include "ops/attention_head_fwd.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>

#include <atomic>
#include <cmath>
#include <cstdlib>

#include "base/env.h"
#include "kernels/attention_head_bwd_sm90.h"
#include "kernels/attention_head_fwd_sm90.h"
#include "ops/attention_head_bwd.h"
#include "compat/compat.h"

namespace perftrain::ops {
namespace {

std::atomic<bool>& own_flag() {  // read once, at first use
  static std::atomic<bool> on{own_attention_forward_from(std::getenv("PERFTRAIN_ATTN_FWD"))};
  return on;
}

}  // namespace

bool own_attention_forward_from(const char* value) { return own_or_cudnn("PERFTRAIN_ATTN_FWD", value); }

bool own_attention_forward() { return own_flag().load(std::memory_order_relaxed); }
void set_own_attention_forward(bool on) { own_flag().store(on, std::memory_order_relaxed); }

std::pair<at::Tensor, at::Tensor> try_attention_head_fwd(const at::Tensor& qkv, int64_t heads) {
  if (!own_attention_forward() || !own_attention_backward() || !qkv.is_cuda() ||
      qkv.scalar_type() != at::kBFloat16 || qkv.dim() != 3 || !qkv.is_contiguous() || heads < 1)
    return {};
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3, head_dim = D / heads;
  if (T != kernels::kHeadBwdTokens || D != heads * head_dim || qkv.size(2) != 3 * D ||
      !kernels::head_bwd_dim_supported(int(head_dim)))
    return {};
  if (!compat::current_device_is_sm90()) return {};
  at::Tensor out = at::empty({B, T, heads, head_dim}, qkv.options());
  at::Tensor lse = at::empty({B, heads, T}, qkv.options().dtype(at::kFloat));
  kernels::attention_head_fwd_sm90(static_cast<const __nv_bfloat16*>(qkv.data_ptr()),
                                   static_cast<__nv_bfloat16*>(out.data_ptr()), lse.data_ptr<float>(), int(B),
                                   int(heads), int(head_dim), 1.f / std::sqrt(float(head_dim)),
                                   at::cuda::getCurrentCUDAStream());
  return {out.transpose(1, 2), lse};
}

}  // namespace perftrain::ops
