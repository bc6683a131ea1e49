#include "ops/attention_tiled.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <utility>

#include "compat/compat.h"
#include "kernels/attention_tiled_bwd_sm90.h"
#include "kernels/attention_tiled_fwd_sm90.h"
#include "ops/attention_choice.h"
#include "ops/attention_head_fwd.h"
#include "ops/attention_paths.h"
#include "ops/cudnn_attention.h"

namespace perftrain::ops {
namespace {

std::atomic<bool> tiled_on{false};

// A [B, T, D] bf16 CUDA view the kernel reads as an AttentionOperand.
bool operand_ok(const at::Tensor& x, int64_t B, int64_t T, int64_t D) {
  return x.is_cuda() && x.scalar_type() == at::kBFloat16 && x.dim() == 3 && x.size(0) == B && x.size(1) == T &&
         x.size(2) == D && x.stride(2) == 1 && x.stride(1) % 8 == 0 && x.stride(1) >= D &&
         (B == 1 || x.stride(0) == T * x.stride(1)) && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
}

bool bias_ok(const at::Tensor& bias, int64_t B, int64_t T) {
  if (!bias.defined()) return true;
  // The kernels copy its rows by TMA: 16-byte aligned, rows a multiple of 16 bytes apart (attention_key_bias's).
  const bool tma_rows = reinterpret_cast<uintptr_t>(bias.data_ptr()) % 16 == 0 &&
                        (B == 1 || (bias.stride(0) >= T && bias.stride(0) * bias.element_size() % 16 == 0));
  return bias.is_cuda() && (bias.scalar_type() == at::kFloat || bias.scalar_type() == at::kBFloat16) &&
         bias.dim() == 4 && bias.size(0) == B && bias.size(1) == 1 && bias.size(2) == 1 && bias.size(3) == T &&
         bias.stride(3) == 1 && tma_rows;
}

kernels::AttentionOperand operand(const at::Tensor& x) {
  return {static_cast<const __nv_bfloat16*>(x.data_ptr()), x.stride(1)};
}

kernels::AttentionGradOperand grad_operand(const at::Tensor& x) {
  return {static_cast<__nv_bfloat16*>(x.data_ptr()), x.stride(1)};
}

// A forward's out [B, H, T, d] over [B, T, H, d] memory (ours, or cuDNN's
// on token-major q) and lse with B * H * T fp32 elements, contiguous: what
// the tiled backward reads.
bool forward_state_ok(const at::Tensor& out, const at::Tensor& lse, int64_t B, int64_t T, int64_t heads, int64_t d) {
  const bool out_ok = out.defined() && out.scalar_type() == at::kBFloat16 && out.dim() == 4 && out.size(0) == B &&
                      out.size(1) == heads && out.size(2) == T && out.size(3) == d &&
                      out.transpose(1, 2).is_contiguous();
  return out_ok && lse.defined() && lse.scalar_type() == at::kFloat && lse.is_contiguous() &&
         lse.numel() == B * heads * T;
}

kernels::AttentionKeyBias key_bias_of(const at::Tensor& key_bias, int64_t B, int64_t T) {
  kernels::AttentionKeyBias bias;
  if (key_bias.defined()) {
    bias.data = key_bias.data_ptr();
    bias.sample_stride = B == 1 ? T : key_bias.stride(0);
    bias.fp32 = key_bias.scalar_type() == at::kFloat;
  }
  return bias;
}

}  // namespace

bool tiled_attention() { return tiled_on.load(std::memory_order_relaxed); }
void set_tiled_attention(bool on) { tiled_on.store(on, std::memory_order_relaxed); }

bool tiled_attention_takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                           const at::Tensor& key_bias) {
  if (!q.defined() || q.dim() != 3 || heads < 1 || q.size(2) % heads != 0) return false;
  const int64_t B = q.size(0), T = q.size(1), D = q.size(2), d = D / heads;
  if (!kernels::tiled_attention_dim_supported(int(d)) || T < kernels::kTiledAttentionMinTokens) return false;
  if (!operand_ok(q, B, T, D) || !operand_ok(k, B, T, D) || !operand_ok(v, B, T, D)) return false;
  if (k.device() != q.device() || v.device() != q.device()) return false;
  if (key_bias.defined() && key_bias.device() != q.device()) return false;
  return bias_ok(key_bias, B, T) && compat::current_device_is_sm90();
}

std::pair<at::Tensor, at::Tensor> attention_tiled_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                      int64_t heads, const at::Tensor& key_bias) {
  if (!tiled_attention_takes(q, k, v, heads, key_bias))
    throw std::invalid_argument("attention_tiled_fwd: the tiled kernel does not take these tensors "
                                "(tiled_attention_takes says which)");
  const c10::DeviceGuard device_guard(q.device());
  const int64_t B = q.size(0), T = q.size(1), D = q.size(2), d = D / heads;
  at::Tensor out = at::empty({B, T, heads, d}, q.options());
  at::Tensor lse = at::empty({B, heads, T}, q.options().dtype(at::kFloat));
  kernels::attention_tiled_fwd_sm90(operand(q), operand(k), operand(v), key_bias_of(key_bias, B, T),
                                    static_cast<__nv_bfloat16*>(out.data_ptr()), lse.data_ptr<float>(), int(B), int(T),
                                    int(heads), int(d), 1.f / std::sqrt(float(d)), at::cuda::getCurrentCUDAStream());
  return {out.transpose(1, 2), lse};
}

void attention_tiled_bwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                         const at::Tensor& key_bias, const at::Tensor& out, const at::Tensor& lse,
                         const at::Tensor& grad_out, const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv) {
  if (!tiled_attention_takes(q, k, v, heads, key_bias))
    throw std::invalid_argument("attention_tiled_bwd: the tiled kernel does not take q, k, v");
  const int64_t B = q.size(0), T = q.size(1), D = q.size(2), d = D / heads;
  const bool grads_ok = operand_ok(dq, B, T, D) && operand_ok(dk, B, T, D) && operand_ok(dv, B, T, D);
  if (!grads_ok || !forward_state_ok(out, lse, B, T, heads, d) || grad_out.scalar_type() != at::kBFloat16 ||
      grad_out.numel() != B * T * D)
    throw std::invalid_argument("attention_tiled_bwd: dq, dk, dv, out, lse or the output's gradient is not in the "
                                "layout the kernel reads");
  const c10::DeviceGuard device_guard(q.device());
  const at::Tensor dout = grad_out.contiguous();
  const at::Tensor delta = at::empty({B, heads, T}, lse.options());
  kernels::attention_tiled_bwd_sm90(operand(q), operand(k), operand(v), key_bias_of(key_bias, B, T),
                                    static_cast<const __nv_bfloat16*>(out.data_ptr()),
                                    static_cast<const __nv_bfloat16*>(dout.data_ptr()), lse.data_ptr<float>(),
                                    delta.data_ptr<float>(), grad_operand(dq), grad_operand(dk), grad_operand(dv),
                                    int(B), int(T), int(heads), int(d), 1.f / std::sqrt(float(d)),
                                    at::cuda::getCurrentCUDAStream());
}

namespace detail {
namespace {

// qkv [B, T, 3D] -> its q, k, v column blocks [B, T, D] (views).
std::array<at::Tensor, 3> column_blocks(const at::Tensor& qkv) {
  const int64_t D = qkv.size(2) / 3;
  return {qkv.narrow(2, 0, D), qkv.narrow(2, D, D), qkv.narrow(2, 2 * D, D)};
}

// [B, H, T, Dh] over [B, T, D] rows (as save_cudnn_state keeps q, k, v) -> [B, T, D], a view.
at::Tensor rows_view(const at::Tensor& x) {
  return x.transpose(1, 2).view({x.size(0), x.size(2), x.size(1) * x.size(3)});
}

// Whether the tiled backward reads what save_cudnn_state saved at `at` and
// the output's gradient: bf16, and the forward's out and lse (ours, or
// cuDNN's: its lse [B, H, T, 1] as ATen allocates it) in the layouts it reads.
// Otherwise cuDNN's backward runs on the same state.
bool tiled_backward_reads(const torch::autograd::variable_list& s, size_t at, const at::Tensor& grad_out) {
  const at::Tensor& q = s[at + 7];  // [B, H, T, d]
  return grad_out.scalar_type() == at::kBFloat16 &&
         forward_state_ok(s[at], s[at + 1], q.size(0), q.size(2), q.size(1), q.size(3));
}

// attention_tiled_bwd from save_cudnn_state's layout at `at` into dq, dk, dv [B, T, D].
void tiled_backward_into(const torch::autograd::variable_list& s, size_t at, const at::Tensor& grad_out,
                         const std::array<at::Tensor, 3>& d) {
  const at::Tensor &out = s[at], &lse = s[at + 1], &bias = s[at + 6], &q = s[at + 7];
  attention_tiled_bwd(rows_view(q), rows_view(s[at + 8]), rows_view(s[at + 9]), q.size(1), bias, out, lse, grad_out,
                      d[0], d[1], d[2]);
}

// With "auto" (no timing run's forced family), an unmasked packed qkv our
// whole-head kernels take stays with them: they run ahead of both families
// at 256 tokens (docs/PERFORMANCE.md), so nothing is timed there.
bool auto_keeps_whole_head(const at::Tensor& qkv, int64_t heads, bool masked) {
  return !masked && !tiled_attention() && attention_auto() && forced_attention_plan() == nullptr &&
         whole_head_attention_applies(qkv, heads);
}

}  // namespace

// A timing run's forced plan first (ops/attention_choice), then the
// switch, then with "auto" the per-shape plan's forward.
bool tiled_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                             const at::Tensor& key_bias, std::optional<bool> masked) {
  if (const AttentionPlan* forced = forced_attention_plan())
    return forced->forward == AttentionFamily::Tiled && tiled_attention_takes(q, k, v, heads, key_bias);
  if (!tiled_attention() && !attention_auto()) return false;
  if (!tiled_attention_takes(q, k, v, heads, key_bias)) return false;
  return tiled_attention() ||
         auto_attention_plan(q, heads, masked.value_or(key_bias.defined())).forward == AttentionFamily::Tiled;
}

bool tiled_attention_applies(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_bias,
                             std::optional<bool> masked) {
  if (qkv.dim() != 3 || qkv.size(2) % 3 != 0) return false;
  if (!tiled_attention() && !attention_auto() && !forced_attention_plan()) return false;
  if (auto_keeps_whole_head(qkv, heads, masked.value_or(key_bias.defined()))) return false;
  const auto [q, k, v] = column_blocks(qkv);
  return tiled_attention_applies(q, k, v, heads, key_bias, masked);
}

at::Tensor tiled_forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, int64_t heads, std::vector<at::Tensor> first_saved,
                         const at::Tensor& key_bias) {
  ctx->saved_data["tiled"] = false;
  if (!tiled_attention_applies(q, k, v, heads, key_bias)) return at::Tensor();
  ctx->saved_data["tiled"] = true;
  const int64_t B = q.size(0), T = q.size(1), D = q.size(2);
  auto [out, lse] = attention_tiled_fwd(q, k, v, heads, key_bias);
  note_attention_path(AttentionPath::Tiled, T, D / heads, key_bias.defined(), q.scalar_type());
  // cuDNN's dense, dropout-free backward reads neither the varlen offsets
  // nor the seeds: empty tensors stand in for them, no launch.
  const at::Tensor unused = at::empty({}, q.options().dtype(at::kLong));
  save_cudnn_state(ctx, std::move(first_saved), heads_view(q, heads), heads_view(k, heads), heads_view(v, heads),
                   {out, lse.view({B, heads, T, 1}), at::Tensor(), at::Tensor(), unused, unused, T, T}, key_bias);
  return token_major(out);
}

at::Tensor tiled_forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv, int64_t heads,
                         std::vector<at::Tensor> first_saved, const at::Tensor& key_bias) {
  if (qkv.dim() != 3 || qkv.size(2) % 3 != 0 || auto_keeps_whole_head(qkv, heads, key_bias.defined())) {
    ctx->saved_data["tiled"] = false;
    return at::Tensor();
  }
  const auto [q, k, v] = column_blocks(qkv);
  return tiled_forward(ctx, q, k, v, heads, std::move(first_saved), key_bias);
}

bool tiled_backward_after_cudnn_chosen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                                       const at::Tensor& key_bias) {
  const AttentionPlan* forced = forced_attention_plan();
  if (forced == nullptr && !attention_auto()) return false;
  if (!tiled_attention_takes(q, k, v, heads, key_bias)) return false;
  const AttentionPlan plan = forced != nullptr ? *forced : auto_attention_plan(q, heads, key_bias.defined());
  return plan.backward == AttentionFamily::Tiled;
}

bool tiled_backward_after_cudnn_chosen(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_bias) {
  if (qkv.dim() != 3 || qkv.size(2) % 3 != 0) return false;
  const auto [q, k, v] = column_blocks(qkv);
  return tiled_backward_after_cudnn_chosen(q, k, v, heads, key_bias);
}

bool tiled_backward_after_cudnn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                                const at::Tensor& key_bias) {
  if (!tiled_backward_after_cudnn_chosen(q, k, v, heads, key_bias)) return false;
  note_attention_path(AttentionPath::TiledBackward, q.size(1), q.size(2) / heads, key_bias.defined(),
                      q.scalar_type());
  return true;
}

bool tiled_backward_after_cudnn(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_bias) {
  if (qkv.dim() != 3 || qkv.size(2) % 3 != 0) return false;
  const auto [q, k, v] = column_blocks(qkv);
  return tiled_backward_after_cudnn(q, k, v, heads, key_bias);
}

std::array<at::Tensor, 3> try_tiled_backward(const torch::autograd::variable_list& s, size_t at,
                                             const at::Tensor& grad_out) {
  if (!tiled_backward_reads(s, at, grad_out)) return {};
  const at::Tensor& q = s[at + 7];
  const std::array<int64_t, 3> shape = {q.size(0), q.size(2), q.size(1) * q.size(3)};
  const std::array<at::Tensor, 3> d = {at::empty(shape, q.options()), at::empty(shape, q.options()),
                                       at::empty(shape, q.options())};
  tiled_backward_into(s, at, grad_out, d);
  return d;
}

at::Tensor try_tiled_backward_packed(const torch::autograd::variable_list& s, size_t at, const at::Tensor& grad_out) {
  if (!tiled_backward_reads(s, at, grad_out)) return at::Tensor();
  const at::Tensor& q = s[at + 7];
  at::Tensor dqkv = at::empty({q.size(0), q.size(2), 3 * q.size(1) * q.size(3)}, q.options());
  tiled_backward_into(s, at, grad_out, column_blocks(dqkv));
  return dqkv;
}

}  // namespace detail

}  // namespace perftrain::ops
