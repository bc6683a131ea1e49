#include "ops/qkv_attention.h"

#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <string>

#include "base/error.h"
#include "ops/attention_tiled.h"
#include "ops/cudnn_attention.h"
#include "ops/self_attention.h"

namespace perftrain::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// bias: undefined, or key_bias()'s [B, 1, 1, T] (no gradient).
struct CudnnAttention : torch::autograd::Function<CudnnAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv, int64_t heads,
                            const std::optional<at::Tensor>& bias) {
    // Our tiled forward where it is on and applies (ops/attention_tiled),
    // saving cuDNN's backward state with its out and lse (for our backward
    // or cuDNN's).
    const at::Tensor b = bias.value_or(at::Tensor());
    if (at::Tensor tiled = detail::tiled_forward(ctx, qkv, heads, {}, b); tiled.defined()) return tiled;
    return detail::cudnn_forward(ctx, qkv, heads, {}, b);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor& qkv = s[0];
    const int64_t heads = ctx->saved_data["heads"].toInt();
    // After our tiled forward, our tiled backward (cudnn_forward's saved
    // layout: out, lse at 1, 2, the bias at 7); cuDNN's where it does not take grads[0].
    if (ctx->saved_data["tiled"].toBool())
      if (at::Tensor dqkv = detail::try_tiled_backward(qkv, heads, s[7], s[1], s[2], grads[0]); dqkv.defined())
        return {dqkv, at::Tensor(), at::Tensor()};
    const auto d = detail::cudnn_backward(ctx, s, 0, grads[0]);
    return {detail::pack_dqkv(d, qkv.size(0), qkv.size(1), heads, qkv.size(2) / 3), at::Tensor(), at::Tensor()};
  }
};

// A bool key mask [B, T] or [B, 1, 1, T] on `device` as [B, 1, 1, T] (UsageError otherwise).
at::Tensor key_mask_4d(const at::Tensor& mask, int64_t batch, int64_t tokens, const at::Device& device) {
  const bool shape_ok = (mask.dim() == 2 && mask.size(0) == batch && mask.size(1) == tokens) ||
                        (mask.dim() == 4 && mask.size(0) == batch && mask.size(1) == 1 && mask.size(2) == 1 &&
                         mask.size(3) == tokens);
  if (mask.scalar_type() != at::kBool || !shape_ok || mask.device() != device)
    throw UsageError("qkv_attention: key_mask must be bool [" + std::to_string(batch) + ", " +
                     std::to_string(tokens) + "] or [" + std::to_string(batch) + ", 1, 1, " +
                     std::to_string(tokens) + "] on qkv's device, given " +
                     std::string(c10::toString(mask.scalar_type())) + " " + c10::str(mask.sizes()) + " on " +
                     mask.device().str());
  return mask.reshape({batch, 1, 1, tokens});
}

// The additive bias cuDNN reads: 0 where attended, -65504 elsewhere (finite:
// exp underflows to exactly 0 in fp32 as long as a row has one attended key,
// and cuDNN mishandles -inf; ATen's SDPA gives cuDNN the same value). Rows
// padded to 8 elements so that each sample's row starts 16-byte aligned
// whatever T is: [B, 1, 1, T] over [B, 1, 1, padded], so every stride but the
// last is a multiple of 8 elements (cuDNN gets the strides as they are, those
// of the size-1 dimensions too; a view of [B, T] would give them stride T).
at::Tensor key_bias(const at::Tensor& mask4, at::ScalarType dtype) {
  const int64_t B = mask4.size(0), T = mask4.size(3), padded = (T + 7) / 8 * 8;
  at::Tensor bias = at::zeros({B, 1, 1, padded}, mask4.options().dtype(dtype)).narrow(3, 0, T);
  bias.masked_fill_(mask4.logical_not(), -65504.0);
  return bias;
}

}  // namespace

at::Tensor attention_key_bias(const at::Tensor& key_mask, at::ScalarType dtype) {
  if (!key_mask.defined() || (key_mask.dim() != 2 && key_mask.dim() != 4))
    throw UsageError("attention_key_bias: key_mask must be bool [B, T] or [B, 1, 1, T]");
  const int64_t B = key_mask.size(0), T = key_mask.size(-1);
  return key_bias(key_mask_4d(key_mask, B, T, key_mask.device()), dtype);
}

at::Tensor qkv_attention(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_mask,
                         const at::Tensor& key_bias_in) {
  if (qkv.dim() != 3 || qkv.size(2) % 3 != 0) throw UsageError("qkv_attention: qkv must be [B, T, 3D]");
  detail::check_heads("qkv_attention", qkv.size(2) / 3, heads);
  const at::Tensor mask = key_mask.defined() ? key_mask_4d(key_mask, qkv.size(0), qkv.size(1), qkv.device()) : at::Tensor();
  const bool masked = mask.defined();
  if (key_bias_in.defined()) {
    const int64_t B = qkv.size(0), T = qkv.size(1);
    const bool ok = masked && key_bias_in.dim() == 4 && key_bias_in.size(0) == B && key_bias_in.size(1) == 1 &&
                    key_bias_in.size(2) == 1 && key_bias_in.size(3) == T &&
                    key_bias_in.scalar_type() == qkv.scalar_type() && key_bias_in.device() == qkv.device() &&
                    key_bias_in.stride(3) == 1 && key_bias_in.stride(0) % 8 == 0 && key_bias_in.stride(1) % 8 == 0 &&
                    key_bias_in.stride(2) % 8 == 0;  // key_bias()'s aligned rows
    if (!ok)
      throw UsageError("qkv_attention: key_bias must come with key_mask and be attention_key_bias(key_mask, " +
                       std::string(c10::toString(qkv.scalar_type())) + ") [" + std::to_string(B) + ", 1, 1, " +
                       std::to_string(T) + "] on qkv's device, given " +
                       std::string(c10::toString(key_bias_in.scalar_type())) + " " + c10::str(key_bias_in.sizes()) +
                       (masked ? "" : " without a key_mask"));
  }
  const int64_t head_dim = qkv.size(2) / 3 / heads;
  if (!detail::cudnn_eligible(qkv, head_dim, masked) || !qkv.is_contiguous()) return self_attention(qkv, heads, mask);
  // cuDNN's masked backward turns dq NaN at T % 128 == 64 when a query's
  // logsumexp is below about -88.7 (PyTorch issue 196678; reproduced on the
  // H200 by QkvAttentionGpu.CudnnKeyMaskBackwardFiniteAtVeryNegativeLogsumexp):
  // those token counts take ATen's SDPA (its memory-efficient kernel), or
  // with "tiled" our tiled kernels, whose backward has no such limit (the
  // bias key_bias() makes is one they take; a given one is checked).
  if (masked && qkv.size(1) % 128 == 64 && !detail::tiled_attention_applies(qkv, heads, key_bias_in))
    return self_attention(qkv, heads, mask);
  try {
    const std::optional<at::Tensor> bias =
        masked ? std::optional<at::Tensor>(key_bias_in.defined() ? key_bias_in : key_bias(mask, qkv.scalar_type()))
               : std::nullopt;
    return CudnnAttention::apply(qkv, heads, bias);
  } catch (const std::exception& e) {
    detail::note_refusal(qkv, e, masked);
    return self_attention(qkv, heads, mask);
  }
}

bool cudnn_attention_refused() { return detail::cudnn_refused(false) || detail::cudnn_refused(true); }

}  // namespace perftrain::ops
