#include "ops/qkv_attention.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <optional>
#include <string>

#include "base/error.h"
#include "ops/attention_choice.h"
#include "ops/attention_head_bwd.h"
#include "ops/attention_head_fwd.h"
#include "ops/attention_paths.h"
#include "ops/attention_tiled.h"
#include "ops/cudnn_attention.h"
#include "ops/packed_attention_route.h"
#include "ops/self_attention.h"

namespace perftrain::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// bias: undefined, or key_bias()'s [B, 1, 1, T] (no gradient). The packed
// form: one input, its gradient packed (detail::pack_dqkv); the kernels are
// ops/packed_attention_route's choice, as projected_attention's. Saved: qkv
// at 0, then out and lse from 1 (save_cudnn_state's layout, or only those two
// after our whole-head forward).
struct CudnnAttention : torch::autograd::Function<CudnnAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv, int64_t heads,
                            const std::optional<at::Tensor>& bias) {
    return detail::packed_attention_forward(ctx, qkv, heads, {qkv}, bias.value_or(at::Tensor()));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto s = ctx->get_saved_variables();
    if (at::Tensor dqkv = detail::own_packed_attention_backward(ctx, s, 1, s[0], grads[0]); dqkv.defined())
      return {dqkv, at::Tensor(), at::Tensor()};
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const auto d = detail::cudnn_backward(ctx, s, 1, grads[0]);
    const int64_t B = d[0].size(0), T = d[0].size(2), D = heads * d[0].size(3);
    return {detail::pack_dqkv(d, B, T, heads, D), at::Tensor(), at::Tensor()};
  }
};

// The three-tensor form: q, k, v [B, T, D] each, their gradients left as
// cuDNN (or our tiled backward) writes them ([B, T, D] token-major: nothing
// packed or copied).
struct CudnnAttentionQkv : torch::autograd::Function<CudnnAttentionQkv> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t heads, const std::optional<at::Tensor>& bias) {
    // Our tiled forward where it is on and applies (ops/attention_tiled).
    const at::Tensor b = bias.value_or(at::Tensor());
    if (at::Tensor tiled = detail::tiled_forward(ctx, q, k, v, heads, {}, b); tiled.defined()) return tiled;
    at::Tensor out = detail::cudnn_forward(ctx, detail::heads_view(q, heads), detail::heads_view(k, heads),
                                           detail::heads_view(v, heads), {}, b);
    // Our tiled backward on cuDNN's out and lse where "auto" chose that plan.
    ctx->saved_data["tiled"] = detail::tiled_backward_after_cudnn(q, k, v, heads, b);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    if (ctx->saved_data["tiled"].toBool())
      if (const auto d = detail::try_tiled_backward(s, 0, grads[0]); d[0].defined())
        return {d[0], d[1], d[2], at::Tensor(), at::Tensor()};
    const auto d = detail::cudnn_backward(ctx, s, 0, grads[0]);
    return {detail::token_major(d[0]), detail::token_major(d[1]), detail::token_major(d[2]), at::Tensor(),
            at::Tensor()};
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

namespace {

// What both forms decide alike: the key mask as [B, 1, 1, T] (or undefined),
// whether cuDNN runs, and the bias it reads then.
struct AttentionRoute {
  at::Tensor mask;
  bool cudnn = false;
  std::optional<at::Tensor> bias;
};

// x: qkv or q (its dtype and device); layout_ok: whether cuDNN may read the
// inputs as they are laid out; tiled_ok: whether our tiled kernels run them
// (detail::tiled_attention_applies).
AttentionRoute route(const at::Tensor& x, int64_t B, int64_t T, int64_t head_dim, const at::Tensor& key_mask,
                     const at::Tensor& key_bias_in, bool layout_ok, bool tiled_ok) {
  AttentionRoute r;
  r.mask = key_mask.defined() ? key_mask_4d(key_mask, B, T, x.device()) : at::Tensor();
  const bool masked = r.mask.defined();
  if (key_bias_in.defined()) {
    const bool ok = masked && key_bias_in.dim() == 4 && key_bias_in.size(0) == B && key_bias_in.size(1) == 1 &&
                    key_bias_in.size(2) == 1 && key_bias_in.size(3) == T &&
                    key_bias_in.scalar_type() == x.scalar_type() && key_bias_in.device() == x.device() &&
                    key_bias_in.stride(3) == 1 && key_bias_in.stride(0) % 8 == 0 && key_bias_in.stride(1) % 8 == 0 &&
                    key_bias_in.stride(2) % 8 == 0;  // key_bias()'s aligned rows
    if (!ok)
      throw UsageError("qkv_attention: key_bias must come with key_mask and be attention_key_bias(key_mask, " +
                       std::string(c10::toString(x.scalar_type())) + ") [" + std::to_string(B) + ", 1, 1, " +
                       std::to_string(T) + "] on qkv's device, given " +
                       std::string(c10::toString(key_bias_in.scalar_type())) + " " + c10::str(key_bias_in.sizes()) +
                       (masked ? "" : " without a key_mask"));
  }
  // cuDNN's masked backward turns dq NaN at T % 128 == 64 when a query's
  // logsumexp is below about -88.7 (PyTorch issue 196678; reproduced on the
  // H200 by QkvAttentionGpu.CudnnKeyMaskBackwardFiniteAtVeryNegativeLogsumexp):
  // those token counts take ATen's SDPA (its memory-efficient kernel), or
  // with "tiled" our tiled kernels, whose backward has no such limit
  // (tiled_ok: they take the inputs; the bias key_bias() makes is one they
  // take, a given one was checked).
  r.cudnn = detail::cudnn_eligible(x, head_dim, masked) && layout_ok && !(masked && T % 128 == 64 && !tiled_ok);
  if (r.cudnn && masked) r.bias = key_bias_in.defined() ? key_bias_in : key_bias(r.mask, x.scalar_type());
  return r;
}

// Whether cuDNN reads x [B, T, D] in place: its last dimension contiguous,
// its rows evenly strided, each row 16-byte aligned.
bool cudnn_rows(const at::Tensor& x) {
  const bool even = x.size(0) == 1 || x.size(1) == 1 || x.stride(0) == x.size(1) * x.stride(1);
  const int64_t row = x.size(1) > 1 ? x.stride(1) : x.stride(0);
  const auto addr = reinterpret_cast<uintptr_t>(x.data_ptr());
  return x.stride(2) == 1 && even && (row * x.element_size()) % 16 == 0 && addr % 16 == 0;
}

}  // namespace

at::Tensor qkv_attention(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_mask,
                         const at::Tensor& key_bias_in) {
  if (qkv.dim() != 3 || qkv.size(2) % 3 != 0) throw UsageError("qkv_attention: qkv must be [B, T, 3D]");
  detail::check_heads("qkv_attention", qkv.size(2) / 3, heads);
  const bool tiled_ok = detail::tiled_attention_applies(qkv, heads, key_bias_in, key_mask.defined());
  const AttentionRoute r = route(qkv, qkv.size(0), qkv.size(1), qkv.size(2) / 3 / heads, key_mask, key_bias_in,
                                 qkv.is_contiguous(), tiled_ok);
  if (!r.cudnn) return self_attention(qkv, heads, r.mask);
  try {
    return CudnnAttention::apply(qkv, heads, r.bias);
  } catch (const std::exception& e) {
    detail::note_refusal(qkv, e, r.mask.defined());
    return self_attention(qkv, heads, r.mask);
  }
}

at::Tensor qkv_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                         const at::Tensor& key_mask, const at::Tensor& key_bias_in) {
  if (!q.defined()) throw UsageError("qkv_attention: q must be a defined tensor");
  for (const at::Tensor* x : {&q, &k, &v})
    if (!x->defined() || x->dim() != 3 || x->sizes() != q.sizes() || x->scalar_type() != q.scalar_type() ||
        x->device() != q.device())
      throw UsageError("qkv_attention: q, k and v must be [B, T, D] tensors of one shape, dtype and device, given " +
                       (x->defined() ? c10::str(x->sizes()) : std::string("an undefined tensor")) + " beside q " +
                       c10::str(q.sizes()));
  detail::check_heads("qkv_attention", q.size(2), heads);
  const bool in_place = cudnn_rows(q) && cudnn_rows(k) && cudnn_rows(v);
  const bool tiled_ok = detail::tiled_attention_applies(q, k, v, heads, key_bias_in, key_mask.defined());
  const AttentionRoute r =
      route(q, q.size(0), q.size(1), q.size(2) / heads, key_mask, key_bias_in, in_place, tiled_ok);
  if (!r.cudnn) return self_attention(q, k, v, heads, r.mask);
  try {
    return CudnnAttentionQkv::apply(q, k, v, heads, r.bias);
  } catch (const std::exception& e) {
    detail::note_refusal(q, e, r.mask.defined());
    return self_attention(q, k, v, heads, r.mask);
  }
}

namespace {

// What the packed form runs: ATen's SDPA where qkv_attention's gate (route())
// says cuDNN may not, else detail::packed_attention_plan's family, as
// CudnnAttention's forward chooses it.
struct PackedChoice {
  std::optional<detail::PackedAttentionPlan> plan;  // none: SDPA
  AttentionRoute route;
  at::Tensor bias;  // the key bias cuDNN and the tiled kernels read, or undefined
};

PackedChoice choose_packed(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_mask) {
  if (qkv.dim() != 3 || qkv.size(2) % 3 != 0) throw UsageError("qkv_attention: qkv must be [B, T, 3D]");
  detail::check_heads("qkv_attention", qkv.size(2) / 3, heads);
  PackedChoice c;
  const bool tiled_ok = detail::tiled_attention_applies(qkv, heads, at::Tensor(), key_mask.defined());
  c.route = route(qkv, qkv.size(0), qkv.size(1), qkv.size(2) / 3 / heads, key_mask, at::Tensor(),
                  qkv.is_contiguous(), tiled_ok);
  if (!c.route.cudnn) return c;
  c.bias = c.route.bias.value_or(at::Tensor());
  c.plan = detail::packed_attention_plan(qkv, heads, c.bias);
  return c;
}

std::pair<at::Tensor, at::Tensor> sdpa_forward(const at::Tensor& qkv, int64_t heads, const at::Tensor& mask) {
  const int64_t B = qkv.size(0), T = qkv.size(1);
  return {self_attention(qkv, heads, mask).contiguous(),
          at::zeros({B, heads, T}, qkv.options().dtype(at::kFloat))};
}

}  // namespace

std::pair<at::Tensor, at::Tensor> qkv_attention_forward(const at::Tensor& qkv, int64_t heads,
                                                        const at::Tensor& key_mask) {
  using detail::PackedAttentionPlan;
  const at::NoGradGuard no_grad;
  const PackedChoice c = choose_packed(qkv, heads, key_mask);
  if (!c.plan) return sdpa_forward(qkv, heads, c.route.mask);
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3;
  const bool masked = key_mask.defined();
  if (*c.plan == PackedAttentionPlan::Tiled) {
    auto [out, lse] = attention_tiled_fwd(qkv.narrow(2, 0, D), qkv.narrow(2, D, D), qkv.narrow(2, 2 * D, D), heads,
                                          c.bias);
    note_attention_path(AttentionPath::Tiled, T, D / heads, masked, qkv.scalar_type());
    return {detail::token_major(out), lse};
  }
  if (*c.plan == PackedAttentionPlan::WholeHead) {
    auto [out, lse] = try_attention_head_fwd(qkv, heads);
    note_attention_path(AttentionPath::Own, T, D / heads, false, qkv.scalar_type());
    return {detail::token_major(out), lse};
  }
  try {
    auto [q, k, v] = detail::split_heads(qkv, heads);
    const detail::CudnnState st = detail::cudnn_forward_state(q, k, v, c.bias);
    if (*c.plan == PackedAttentionPlan::CudnnThenTiledBackward)
      note_attention_path(AttentionPath::TiledBackward, T, D / heads, masked, qkv.scalar_type());
    return {detail::token_major(st.out), st.lse.reshape({B, heads, T})};
  } catch (const std::exception& e) {
    detail::note_refusal(qkv, e, masked);
    return sdpa_forward(qkv, heads, c.route.mask);
  }
}

at::Tensor qkv_attention_backward(const at::Tensor& grad_out, const at::Tensor& qkv, int64_t heads,
                                  const at::Tensor& key_mask, const at::Tensor& out, const at::Tensor& lse) {
  using detail::PackedAttentionPlan;
  const PackedChoice c = choose_packed(qkv, heads, key_mask);
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3;
  if (!c.plan) return at::Tensor();  // SDPA ran: the caller differentiates it
  const at::Tensor out_heads = out.view({B, T, heads, D / heads}).transpose(1, 2);  // [B, H, T, d], token-major
  if (*c.plan == PackedAttentionPlan::WholeHead)
    return try_attention_head_bwd(qkv, out_heads, lse, grad_out.contiguous(), heads, /*forward_was_ours=*/true);
  const bool ours = *c.plan == PackedAttentionPlan::Tiled || *c.plan == PackedAttentionPlan::CudnnThenTiledBackward;
  if (ours && grad_out.scalar_type() == at::kBFloat16) {
    at::Tensor dqkv = at::empty(qkv.sizes(), qkv.options());
    attention_tiled_bwd(qkv.narrow(2, 0, D), qkv.narrow(2, D, D), qkv.narrow(2, 2 * D, D), heads, c.bias, out_heads,
                        lse, grad_out, dqkv.narrow(2, 0, D), dqkv.narrow(2, D, D), dqkv.narrow(2, 2 * D, D));
    return dqkv;
  }
  // cuDNN's backward on its own forward's state, or on ours (the same layouts: detail::save_cudnn_state).
  // A dense, dropout-free backward reads neither varlen offsets nor seeds: empty stand-ins.
  auto [q, k, v] = detail::split_heads(qkv, heads);
  const at::Tensor no_seed = at::empty({}, qkv.options().dtype(at::kLong));
  const detail::CudnnState st{out_heads, lse.view({B, heads, T, 1}), at::Tensor(), at::Tensor(), no_seed, no_seed,
                              T, T};
  return detail::pack_dqkv(detail::cudnn_backward(st, q, k, v, c.bias, grad_out), B, T, heads, D);
}

bool cudnn_attention_refused() { return detail::cudnn_refused(false) || detail::cudnn_refused(true); }

}  // namespace perftrain::ops
