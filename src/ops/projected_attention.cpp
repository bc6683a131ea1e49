#include "ops/projected_attention.h"

#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <optional>
#include <string>

#include "base/error.h"
#include "ops/column_sums.h"
#include "ops/compute_weights.h"
#include "ops/cudnn_attention.h"
#include "ops/linear.h"
#include "ops/packed_attention_route.h"
#include "ops/qkv_attention.h"
#include "ops/self_attention.h"
#include "ops/weight_grad_stream.h"

namespace perftrain::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using detail::check_heads;
using detail::cudnn_backward;
using detail::cudnn_eligible;
using detail::note_refusal;
using detail::pack_dqkv;

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
    // The attention's kernels as qkv_attention's packed form chooses them.
    return detail::packed_attention_forward(ctx, qkv, heads, {h2, w, qkv});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const at::Tensor &h2 = s[0], &w = s[1], &qkv = s[2];
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3, m = B * T;
    const auto w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    const int64_t b_dtype = ctx->saved_data["b_dtype"].toInt();
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    // Our kernels' packed gradient where they take it (ops/packed_attention_route),
    // cuDNN's backward otherwise.
    const at::Tensor own_dqkv = detail::own_packed_attention_backward(ctx, s, 3, qkv, grads[0]);
    const auto d = own_dqkv.defined() ? std::array<at::Tensor, 3>{} : cudnn_backward(ctx, s, 3, grads[0]);

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
    // products (ops/weight_grad_stream.h), into outputs allocated here.
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

}  // namespace

at::Tensor projected_attention(const at::Tensor& h, const at::Tensor& qkv_weight, const at::Tensor& qkv_bias,
                               int64_t heads) {
  detail::check_linear_args("projected_attention", h, qkv_weight, qkv_bias);
  if (h.dim() != 3 || qkv_weight.size(0) != 3 * h.size(2))
    throw UsageError("projected_attention: h must be [B, T, D] and qkv_weight [3D, D]");
  check_heads("projected_attention", h.size(2), heads);
  if (!cudnn_eligible(h, h.size(2) / heads)) return qkv_attention(linear(h, qkv_weight, qkv_bias), heads);
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
