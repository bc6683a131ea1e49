#include "ops/attention_head_bwd.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>

#include <atomic>
#include <cmath>
#include <stdexcept>

#include "compat/compat.h"
#include "kernels/attention_head_bwd_sm90.h"

namespace perftrain::ops {
namespace {

std::atomic<bool> own_backward{true};

// Whether the kernel takes these tensors (the switch aside).
bool kernel_applies(const at::Tensor& qkv, const at::Tensor& out, const at::Tensor& lse, const at::Tensor& grad_out,
                    int64_t heads) {
  const int64_t head_dim = detail::whole_head_dim(qkv, heads);
  if (head_dim == 0) return false;
  const int64_t B = qkv.size(0), T = qkv.size(1), D = heads * head_dim;
  // out: [B, H, T, d] whose memory is [B, T, H, d]; lse: B * H * T fp32, contiguous.
  if (out.scalar_type() != at::kBFloat16 || out.dim() != 4 || !out.transpose(1, 2).is_contiguous() ||
      out.size(0) != B || out.size(1) != heads || out.size(2) != T || out.size(3) != head_dim)
    return false;
  if (lse.scalar_type() != at::kFloat || !lse.is_contiguous() || lse.numel() != B * heads * T) return false;
  return grad_out.scalar_type() == at::kBFloat16 && grad_out.numel() == B * T * D && compat::current_device_is_sm90();
}

}  // namespace

bool whole_head_attention_backward() { return own_backward.load(std::memory_order_relaxed); }
void set_whole_head_attention_backward(bool on) { own_backward.store(on, std::memory_order_relaxed); }

namespace detail {

int64_t whole_head_dim(const at::Tensor& qkv, int64_t heads) {
  if (!qkv.is_cuda() || qkv.scalar_type() != at::kBFloat16 || qkv.dim() != 3 || !qkv.is_contiguous() || heads < 1)
    return 0;
  const int64_t T = qkv.size(1), D = qkv.size(2) / 3, head_dim = D / heads;
  if (T != kernels::kHeadBwdTokens || D != heads * head_dim || qkv.size(2) != 3 * D ||
      !kernels::head_bwd_dim_supported(int(head_dim)))
    return 0;
  return head_dim;
}

}  // namespace detail

at::Tensor try_attention_head_bwd(const at::Tensor& qkv, const at::Tensor& out, const at::Tensor& lse,
                                  const at::Tensor& grad_out, int64_t heads, bool forward_was_ours) {
  if (!forward_was_ours && !whole_head_attention_backward()) return at::Tensor();
  if (!kernel_applies(qkv, out, lse, grad_out, heads)) {
    if (forward_was_ours)
      throw std::logic_error("attention backward: the forward was ours, but the backward kernel cannot take "
                             "these tensors (their dtype or layout changed?)");
    return at::Tensor();
  }
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3, head_dim = D / heads;
  const at::Tensor dout = grad_out.contiguous();
  at::Tensor dqkv = at::empty({B, T, 3 * D}, qkv.options());
  kernels::attention_head_bwd_sm90(static_cast<const __nv_bfloat16*>(qkv.data_ptr()),
                                   static_cast<const __nv_bfloat16*>(out.data_ptr()),
                                   static_cast<const __nv_bfloat16*>(dout.data_ptr()), lse.data_ptr<float>(),
                                   static_cast<__nv_bfloat16*>(dqkv.data_ptr()), int(B), int(heads), int(head_dim),
                                   1.f / std::sqrt(float(head_dim)), at::cuda::getCurrentCUDAStream());
  return dqkv;
}

}  // namespace perftrain::ops
