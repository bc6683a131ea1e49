// Micro-benchmark (GPU, libtorch): our tiled attention forward and backward
// (ops::attention_tiled_fwd and attention_tiled_bwd,
// kernels/attention_tiled_{fwd,bwd}_sm90) against cuDNN's fused attention (ATen's _scaled_dot_product_cudnn_attention, as
// ops/cudnn_attention calls it, compute_log_sumexp on) at the shapes the
// tiled kernel is for: single-stream SS-B/2 b256 (288 tokens), SS-B/2 b64
// (1152), SS-XL/2 b128 and b32 (head dim 72), each with the key mask as
// attention_key_bias's bf16 [B, 1, 1, T] (condition tokens first, lengths
// drawn in [1, Tc]); DiT-B/2 b64 and XL/2 b32 at 512 px (1024 tokens, no
// mask); head dim 128 at 1024 tokens (with and without a mask of 128
// condition tokens) and 4096, head dim 96 at 1024; and DiT-B/2 and XL/2
// b256 at 256 tokens, where the whole-head
// forward (kernels/attention_head_fwd_sm90) runs today, timed beside. The
// backward: ours into the packed gradient against cuDNN's (on its own
// forward's state), and cuDNN's fed our forward's out and lse (the fallback
// after our forward); max |ours - cuDNN| of the output. Per call: the
// median of 9 windows of 10 back-to-back calls after 10 warm-up ones, CUDA
// events.
//   attention_tiled_bench
// Build: cmake --build build --target attention_tiled_bench (binary in
// build/bench/kernels/). On the GPU machine: tools/gpu_run.sh MODE=lab
// LAB=attention_tiled_bench, or bench/attention_gpu.sh.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randn_like.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <vector>

#include "compat/compat.h"
#include "kernels/attention_head_bwd_sm90.h"  // kHeadBwdTokens
#include "kernels/attention_head_fwd_sm90.h"
#include "ops/attention_tiled.h"
#include "ops/qkv_attention.h"

#include "torch_timing.h"

namespace {

struct Shape {
  const char* name;
  int64_t batch, tokens, heads, dim, condition;  // condition 0: no key mask
};

// [B, T, 3D] -> q, k, v as [B, H, T, d] views (ops/cudnn_attention's split).
std::array<at::Tensor, 3> split_heads(const at::Tensor& qkv, int64_t heads) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3;
  auto v5 = qkv.view({B, T, 3, heads, D / heads});
  return {v5.select(2, 0).transpose(1, 2), v5.select(2, 1).transpose(1, 2), v5.select(2, 2).transpose(1, 2)};
}

// The single-stream key mask: condition tokens first, sample b attends a
// length drawn in [1, Tc] of them and every image token.
at::Tensor condition_mask(const Shape& s) {
  const auto opts = at::TensorOptions().device(at::kCUDA);
  const at::Tensor lengths = at::randint(1, s.condition + 1, {s.batch, 1}, opts.dtype(at::kLong));
  const at::Tensor pos = at::arange(s.tokens, opts.dtype(at::kLong)).unsqueeze(0);
  return (pos >= s.condition).logical_or(pos < lengths);
}

void bench(const Shape& s) {
  using namespace perftrain;
  const int64_t D = s.heads * s.dim;
  const at::Tensor qkv = at::randn({s.batch, s.tokens, 3 * D}, at::TensorOptions().device(at::kCUDA))
                             .to(at::kBFloat16);
  const at::Tensor bias = s.condition > 0 ? ops::attention_key_bias(condition_mask(s), at::kBFloat16) : at::Tensor();
  const std::optional<at::Tensor> bias_opt = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  auto [q, k, v] = split_heads(qkv, s.heads);
  const at::Tensor qv = qkv.narrow(2, 0, D), kv = qkv.narrow(2, D, D), vv = qkv.narrow(2, 2 * D, D);
  const bool ours_runs = ops::tiled_attention_takes(qv, kv, vv, s.heads, bias);

  std::pair<at::Tensor, at::Tensor> ours;
  const double t_ours = median_ms([&] {
    if (!ours_runs) return false;
    ours = ops::attention_tiled_fwd(qv, kv, vv, s.heads, bias);
    return true;
  });
  decltype(at::_scaled_dot_product_cudnn_attention(q, k, v, bias_opt, true)) cudnn;
  const double t_cudnn = median_ms([&] {
    cudnn = at::_scaled_dot_product_cudnn_attention(q, k, v, bias_opt, /*compute_log_sumexp=*/true);
    return true;
  });
  at::Tensor whole = at::empty({s.batch, s.tokens, s.heads, s.dim}, qkv.options());
  at::Tensor whole_lse = at::empty({s.batch, s.heads, s.tokens}, qkv.options().dtype(at::kFloat));
  const double t_whole = median_ms([&] {
    if (s.tokens != kernels::kHeadBwdTokens || s.condition > 0) return false;
    kernels::attention_head_fwd_sm90(static_cast<const __nv_bfloat16*>(qkv.data_ptr()),
                                     static_cast<__nv_bfloat16*>(whole.data_ptr()), whole_lse.data_ptr<float>(),
                                     int(s.batch), int(s.heads), int(s.dim), 1.f / std::sqrt(float(s.dim)),
                                     at::cuda::getCurrentCUDAStream());
    return true;
  });
  // The backwards: ours into the packed gradient, cuDNN's on its own state,
  // cuDNN's after our forward (its out and lse).
  const at::Tensor dout = at::randn_like(std::get<0>(cudnn));
  const at::Tensor grad_out = dout.transpose(1, 2).contiguous();  // [B, T, H, d]
  at::Tensor dqkv = at::empty_like(qkv);
  const double t_ours_bwd = median_ms([&] {
    if (!ours_runs) return false;
    ops::attention_tiled_bwd(qv, kv, vv, s.heads, bias, ours.first, ours.second, grad_out, dqkv.narrow(2, 0, D),
                             dqkv.narrow(2, D, D), dqkv.narrow(2, 2 * D, D));
    return true;
  });
  const double t_cudnn_bwd = median_ms([&] {
    (void)at::_scaled_dot_product_cudnn_attention_backward(
        grad_out.transpose(1, 2), q, k, v, std::get<0>(cudnn), std::get<1>(cudnn), std::get<6>(cudnn),
        std::get<7>(cudnn), bias.defined() ? bias : at::Tensor(), at::Tensor(), at::Tensor(), s.tokens, s.tokens, 0.0,
        false);
    return true;
  });
  const double t_bwd = median_ms([&] {
    if (!ours_runs) return false;
    const at::Tensor lse4 = ours.second.view({s.batch, s.heads, s.tokens, 1});
    const at::Tensor unused = at::empty({}, qkv.options().dtype(at::kLong));
    (void)at::_scaled_dot_product_cudnn_attention_backward(
        grad_out.transpose(1, 2), q, k, v, ours.first, lse4, unused, unused,
        bias.defined() ? bias : at::Tensor(), at::Tensor(), at::Tensor(), s.tokens, s.tokens, 0.0, false);
    return true;
  });
  const double diff =
      ours_runs ? (ours.first.to(at::kFloat) - std::get<0>(cudnn).to(at::kFloat)).abs().max().item<double>() : NAN;
  const double flops = 4.0 * s.batch * s.heads * double(s.tokens) * s.tokens * s.dim;
  std::printf("%-20s B=%-4ld T=%-5ld H=%-3ld d=%-3ld %-9s fwd: ours %8.3f ms (%4.0f TFLOP/s) cuDNN %8.3f ms "
              "ours/cuDNN %5.2f whole-head %8.3f ms | bwd: ours %8.3f ms cuDNN %8.3f ms ours/cuDNN %5.2f, cuDNN's "
              "after our fwd %8.3f ms | max|ours-cuDNN| out %.3g\n",
              s.name, long(s.batch), long(s.tokens), long(s.heads), long(s.dim), s.condition > 0 ? "key mask" : "",
              t_ours, flops / t_ours * 1e-9, t_cudnn, t_ours / t_cudnn, t_whole, t_ours_bwd, t_cudnn_bwd,
              t_ours_bwd / t_cudnn_bwd, t_bwd, diff);
}

}  // namespace

int main() {
  if (!perftrain::compat::cuda_available()) {
    std::printf("attention_tiled_bench: no CUDA device\n");
    return 77;
  }
  if (!perftrain::compat::current_device_is_sm90()) std::printf("attention_tiled_bench: not sm_90: ours is skipped\n");
  const Shape shapes[] = {
      {"SS-B/2 b256", 256, 288, 12, 64, 32},      {"SS-B/2 b64", 64, 1152, 12, 64, 128},
      {"SS-XL/2 b128", 128, 288, 16, 72, 32},     {"SS-XL/2 b32", 32, 1152, 16, 72, 128},
      {"DiT-B/2 b64 512px", 64, 1024, 12, 64, 0}, {"DiT-XL/2 b32 512px", 32, 1024, 16, 72, 0},
      {"DiT-B/2 b256", 256, 256, 12, 64, 0},      {"DiT-XL/2 b256", 256, 256, 16, 72, 0},
      {"d128 T1024", 32, 1024, 16, 128, 0},       {"d128 T1024 masked", 32, 1024, 16, 128, 128},
      {"d128 T4096", 4, 4096, 16, 128, 0},        {"d96 T1024", 32, 1024, 16, 96, 0},
  };
  for (const Shape& s : shapes) bench(s);
  return 0;
}
