#include "ops/qkv_attention.h"

#include <ATen/ops/_scaled_dot_product_cudnn_attention.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <atomic>
#include <iostream>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "compat/compat.h"
#include "ops/attention_head_bwd.h"
#include "ops/attention_paths.h"
#include "ops/attention_head_fwd.h"
#include "ops/column_sums.h"
#include "ops/compute_weights.h"
#include "ops/linear.h"
#include "ops/self_attention.h"
#include "ops/weight_grad_lane.h"

namespace perftrain::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// [B, T, 3D] -> q, k, v as [B, H, T, Dh] views (no copy).
std::array<at::Tensor, 3> split_heads(const at::Tensor& qkv, int64_t heads) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3;
  auto v5 = qkv.view({B, T, 3, heads, D / heads});
  return {v5.select(2, 0).transpose(1, 2), v5.select(2, 1).transpose(1, 2), v5.select(2, 2).transpose(1, 2)};
}

// cuDNN's forward on the packed qkv: saves what its backward needs in ctx
// (after `first_saved`, tensors the caller saves first) and returns the
// output as [B, T, D] (a view: cuDNN writes it token-major). bias: the
// additive key bias [B, 1, 1, T] of key_bias(), or undefined.
at::Tensor cudnn_forward(AutogradContext* ctx, const at::Tensor& qkv, int64_t heads,
                         std::vector<at::Tensor> first_saved, const at::Tensor& bias = at::Tensor()) {
  auto [q, k, v] = split_heads(qkv, heads);
  auto r = at::_scaled_dot_product_cudnn_attention(
      q, k, v, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt, /*compute_log_sumexp=*/true);
  const at::Tensor& out = std::get<0>(r);  // [B, H, T, Dh], token-major in memory
  note_attention_path(AttentionPath::Cudnn, qkv.size(1), q.size(3), bias.defined(), qkv.scalar_type());
  first_saved.insert(first_saved.end(), {qkv, out, std::get<1>(r), std::get<2>(r), std::get<3>(r), std::get<6>(r),
                                         std::get<7>(r), bias});
  ctx->save_for_backward(first_saved);
  ctx->saved_data["heads"] = heads;
  ctx->saved_data["max_q"] = std::get<4>(r).expect_int();
  ctx->saved_data["max_k"] = std::get<5>(r).expect_int();
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3;
  return out.transpose(1, 2).reshape({B, T, D});
}

// cuDNN's backward from what cudnn_forward saved (starting at index `at`):
// dq, dk, dv as [B, H, T, Dh] in the layout of q (token-major).
std::array<at::Tensor, 3> cudnn_backward(AutogradContext* ctx, const variable_list& s, size_t at,
                                         const at::Tensor& grad_out) {
  const at::Tensor &qkv = s[at], &out = s[at + 1], &lse = s[at + 2], &cum_q = s[at + 3], &cum_k = s[at + 4],
                   &seed = s[at + 5], &offset = s[at + 6], &bias = s[at + 7];
  const int64_t heads = ctx->saved_data["heads"].toInt();
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3;
  auto [q, k, v] = split_heads(qkv, heads);
  // The output gradient in the output's own layout (cuDNN wants them alike).
  at::Tensor dout = grad_out.contiguous().view({B, T, heads, D / heads}).transpose(1, 2);
  auto [dq, dk, dv] = at::_scaled_dot_product_cudnn_attention_backward(
      dout, q, k, v, out, lse, seed, offset, bias, cum_q, cum_k,
      ctx->saved_data["max_q"].toInt(), ctx->saved_data["max_k"].toInt(), /*dropout_p=*/0.0,
      /*is_causal=*/false);
  return {dq, dk, dv};
}

// dq, dk, dv [B, H, T, Dh] -> the packed [B, T, 3D] gradient of qkv. When
// each is token-major in memory ([B, T, D], as cuDNN writes them for the
// packed q, k, v views), one cat of three [B*T, 1, D] views into [B*T, 3, D]:
// one launch of ATen's batched cat kernel, which moves 16-byte vectors when D
// is a multiple of 8, instead of three strided element-wise copies of 2-byte
// elements (about 1.8 TB/s each on the H200). The same values either way.
// Otherwise (another layout) those copies.
at::Tensor pack_dqkv(const std::array<at::Tensor, 3>& d, int64_t B, int64_t T, int64_t heads, int64_t D) {
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < 3; ++i) {
    const at::Tensor tm = d[i].transpose(1, 2);  // [B, T, H, Dh]
    if (!tm.is_contiguous()) break;
    rows.push_back(tm.view({B * T, 1, D}));
  }
  if (rows.size() == 3) return at::cat(rows, 1).view({B, T, 3 * D});
  at::Tensor dqkv = at::empty({B, T, 3, heads, D / heads}, d[0].options());
  for (int64_t i = 0; i < 3; ++i) dqkv.select(2, i).copy_(d[i].transpose(1, 2));
  return dqkv.view({B, T, 3 * D});
}

// bias: undefined, or key_bias()'s [B, 1, 1, T] (no gradient).
struct CudnnAttention : torch::autograd::Function<CudnnAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv, int64_t heads,
                            const std::optional<at::Tensor>& bias) {
    return cudnn_forward(ctx, qkv, heads, {}, bias.value_or(at::Tensor()));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor& qkv = s[0];
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const auto d = cudnn_backward(ctx, s, 0, grads[0]);
    return {pack_dqkv(d, qkv.size(0), qkv.size(1), heads, qkv.size(2) / 3), at::Tensor(), at::Tensor()};
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

// The key bias's gradient is exactly zero, so it is written as zeros instead
// of summed from dk (a [B*T, D] read, a third of the bias gradients' bytes).
// Adding b_k to every key adds q_i . b_k to all logits of query i, which
// softmax ignores; in the gradient, each row of dS = P (dP - rowsum(P dP))
// sums to zero, so sum_j dk_j = scale sum_i q_i sum_j dS_ij = 0. Autograd
// through SDPA gets rounding noise there instead (about 1e-3 of the whole
// bias gradient in bf16), which AdamW turns into steps of about the learning
// rate on b_k that change nothing the model computes.
struct ProjectedAttention : torch::autograd::Function<ProjectedAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias_opt, int64_t heads) {
    const at::Tensor bias = bias_opt.value_or(at::Tensor());
    const c10::DeviceGuard device_guard(h.device());
    const int64_t B = h.size(0), T = h.size(1), D = h.size(2), m = B * T;
    const at::Tensor h2 = h.contiguous().view({m, D});
    const at::Tensor w = compute_weight(weight, h.scalar_type());  // the optimizer's bf16 copy, or a cast
    at::Tensor qkv = at::empty({B, T, 3 * D}, h.options());
    detail::linear_forward_product(h2, w, bias.defined() ? bias.contiguous() : bias, qkv.view({m, 3 * D}));
    ctx->saved_data["w_dtype"] = int64_t(weight.scalar_type());
    ctx->saved_data["b_dtype"] = bias.defined() ? int64_t(bias.scalar_type()) : int64_t(-1);
    // Our whole-head forward where it applies (ops/attention_head_fwd): the
    // same saved layout as cudnn_forward's up to out and lse.
    auto [out, lse] = try_attention_head_fwd(qkv, heads);
    ctx->saved_data["own_fwd"] = out.defined();
    if (!out.defined()) return cudnn_forward(ctx, qkv, heads, {h2, w});
    note_attention_path(AttentionPath::Own, T, D / heads, false, qkv.scalar_type());
    ctx->save_for_backward({h2, w, qkv, out, lse});
    ctx->saved_data["heads"] = heads;
    return out.transpose(1, 2).reshape({B, T, D});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor &h2 = s[0], &w = s[1], &qkv = s[2];
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3, m = B * T;
    const auto w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    const int64_t b_dtype = ctx->saved_data["b_dtype"].toInt();
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    // Our whole-head kernel where it applies (ops::own_attention_backward),
    // and always after our forward: the packed gradient directly, from the
    // forward's out (s[3]) and lse (s[4]); cuDNN's backward elsewhere.
    const at::Tensor own_dqkv =
        try_attention_head_bwd(qkv, s[3], s[4], grads[0], heads, ctx->saved_data["own_fwd"].toBool());
    const auto d = own_dqkv.defined() ? std::array<at::Tensor, 3>{} : cudnn_backward(ctx, s, 2, grads[0]);

    // Each of dq, dk, dv is [B, T, D] in memory when cuDNN kept q's token-major
    // layout (it does on the DiT shapes): then it is the output gradient of
    // one row block of the projection, and the products read it in place.
    std::array<at::Tensor, 3> blocks;
    bool in_place = !own_dqkv.defined();
    for (int i = 0; i < 3 && in_place; ++i) {
      const at::Tensor tm = d[i].transpose(1, 2);
      in_place = in_place && tm.is_contiguous();
      if (in_place) blocks[i] = tm.view({m, D});
    }
    // The weight and bias gradients first, handed off to run beside dh's
    // products (ops/weight_grad_lane.h), into outputs allocated here.
    at::Tensor dh, dw, db;
    if (ctx->needs_input_grad(1)) dw = at::empty({3 * D, D}, w.options().dtype(w_dtype));
    if (b_dtype >= 0 && ctx->needs_input_grad(2)) db = at::empty({3 * D}, w.options().dtype(at::ScalarType(b_dtype)));
    if (!in_place) {  // the packed gradient and the plain linear backward on it
      const at::Tensor dqkv = (own_dqkv.defined() ? own_dqkv : pack_dqkv(d, B, T, heads, D)).view({m, 3 * D});
      if (dw.defined() || db.defined())
        run_weight_grads(
            [&] {
              // The q and v blocks' column sums straight from the packed
              // gradient (its rows 3D apart), the k block zero and not read,
              // as in the in-place path.
              detail::linear_weight_grad_into(dqkv, h2, dw, at::Tensor());
              if (db.defined()) {
                column_sums_into({dqkv.narrow(1, 0, D), dqkv.narrow(1, 2 * D, D)},
                                 {db.narrow(0, 0, D), db.narrow(0, 2 * D, D)});
                db.narrow(0, D, D).zero_();
              }
            },
            {dqkv, h2});
      if (ctx->needs_input_grad(0)) {
        dh = at::empty({B, T, D}, dqkv.options());
        detail::linear_input_grad(dqkv, w, dh.view({m, D}));
      }
      return {dh, dw, db, at::Tensor()};
    }

    if (dw.defined() || db.defined()) {
      run_weight_grads(
          [&] {
            for (int i = 0; i < 3 && dw.defined(); ++i)
              detail::linear_weight_grad_into(blocks[i], h2, dw.narrow(0, i * D, D), at::Tensor());
            // The q and v bias-gradient blocks in one launch; the k block is
            // zero (see above the struct), not read from dk.
            if (db.defined()) {
              column_sums_into({blocks[0], blocks[2]}, {db.narrow(0, 0, D), db.narrow(0, 2 * D, D)});
              db.narrow(0, D, D).zero_();
            }
          },
          {blocks[0], blocks[1], blocks[2], h2});
    }
    if (ctx->needs_input_grad(0)) {
      dh = at::empty({B, T, D}, blocks[0].options());
      for (int i = 0; i < 3; ++i) detail::linear_input_grad(blocks[i], w.narrow(0, i * D, D), dh.view({m, D}), i > 0);
    }
    return {dh, dw, db, at::Tensor()};
  }
};

// Unmasked and masked attention are refused (and fall back) separately.
std::atomic<bool> cudnn_refused{false}, cudnn_masked_refused{false};

bool cudnn_eligible(const at::Tensor& t, bool masked = false) {
  const bool half = t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
  return t.is_cuda() && half && !(masked ? cudnn_masked_refused : cudnn_refused).load();
}

// Once, before any capture (the first step runs eagerly): say so and use SDPA from now on.
void note_refusal(const at::Tensor& qkv, const std::exception& e, bool masked = false) {
  (masked ? cudnn_masked_refused : cudnn_refused).store(true);
  std::cerr << "perftrain: cuDNN attention refused " << qkv.sizes() << (masked ? " with a key mask" : "") << " ("
            << compat::error_message(e) << "); using at::scaled_dot_product_attention\n";
}

void check_heads(const char* op, int64_t d, int64_t heads) {
  if (heads <= 0 || d % heads != 0)
    throw UsageError(std::string(op) + ": " + std::to_string(d) + " channels do not split into " +
                     std::to_string(heads) + " heads");
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
  check_heads("qkv_attention", qkv.size(2) / 3, heads);
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
  if (!cudnn_eligible(qkv, masked) || !qkv.is_contiguous()) return self_attention(qkv, heads, mask);
  // cuDNN's masked backward turns dq NaN at T % 128 == 64 when a query's
  // logsumexp is below about -88.7 (PyTorch issue 196678; reproduced on the
  // H200 by QkvAttentionGpu.CudnnKeyMaskBackwardFiniteAtVeryNegativeLogsumexp):
  // those token counts take ATen's SDPA (its memory-efficient kernel).
  if (masked && qkv.size(1) % 128 == 64) return self_attention(qkv, heads, mask);
  try {
    const std::optional<at::Tensor> bias =
        masked ? std::optional<at::Tensor>(key_bias_in.defined() ? key_bias_in : key_bias(mask, qkv.scalar_type()))
               : std::nullopt;
    return CudnnAttention::apply(qkv, heads, bias);
  } catch (const std::exception& e) {
    note_refusal(qkv, e, masked);
    return self_attention(qkv, heads, mask);
  }
}

bool cudnn_attention_refused() { return cudnn_refused.load() || cudnn_masked_refused.load(); }

at::Tensor projected_attention(const at::Tensor& h, const at::Tensor& qkv_weight, const at::Tensor& qkv_bias,
                               int64_t heads) {
  detail::check_linear_args("projected_attention", h, qkv_weight, qkv_bias);
  if (h.dim() != 3 || qkv_weight.size(0) != 3 * h.size(2))
    throw UsageError("projected_attention: h must be [B, T, D] and qkv_weight [3D, D]");
  check_heads("projected_attention", h.size(2), heads);
  if (!cudnn_eligible(h)) return qkv_attention(linear(h, qkv_weight, qkv_bias), heads);
  try {
    return ProjectedAttention::apply(h, qkv_weight,
                                     qkv_bias.defined() ? std::optional<at::Tensor>(qkv_bias) : std::nullopt, heads);
  } catch (const std::exception& e) {
    note_refusal(h, e);
    return qkv_attention(linear(h, qkv_weight, qkv_bias), heads);
  }
}

at::Tensor projected_attention_reference(const at::Tensor& h, const at::Tensor& qkv_weight,
                                         const at::Tensor& qkv_bias, int64_t heads) {
  return self_attention(linear_reference(h, qkv_weight, qkv_bias), heads);
}

}  // namespace perftrain::ops
