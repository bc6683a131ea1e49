// ops/attention_tiled on the GPU (kernels/attention_tiled_fwd_sm90 and
// kernels/attention_tiled_bwd_sm90): out and lse against float64 at T = 64,
// 257, 288, 1024 and 1152 tokens, head dims 64, 72, 96 and 128, without a mask and
// with the single-stream key mask (condition tokens first, a sample with one
// attended condition key, a whole 128-key tile masked) as bf16 and fp32
// bias; reruns bit-identical; q and k from a [B, T, 2D] tensor and the
// gradients into separate tensors give the packed result's bits; and, with
// the [speed] value "tiled" (set_tiled_attention), qkv_attention's
// and projected_attention's outputs and gradients (our tiled backward, or
// at 256 tokens our whole-head one) against float64, reruns bit-identical,
// with the path each noted; the three-tensor form on the single-stream
// block's layout gives the packed form's bits. Skips without an sm_90 GPU.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/softmax.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <initializer_list>
#include <cmath>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "attention_gpu_cases.h"
#include "compat/compat.h"
#include "ops/attention_head_bwd.h"
#include "ops/attention_head_fwd.h"
#include "ops/attention_paths.h"
#include "ops/attention_tiled.h"
#include "ops/linear.h"
#include "ops/projected_attention.h"
#include "ops/qkv_attention.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

using namespace attention_gpu_cases;
using perftrain::testing::rel_l2;

bool sm90() { return compat::cuda_available() && at::cuda::getCurrentDeviceProperties()->major == 9; }

// The single-stream key mask [B, T]: condition tokens first (Tc = 32 up to
// 288 tokens, 128 beyond), sample 0 attends one of them, sample 1 all, the
// rest a length drawn in [1, Tc]; beyond 256 tokens sample 0 also loses keys
// 128-255, a whole tile of the kernel.
at::Tensor condition_mask(int64_t B, int64_t T, at::Generator& g) {
  const int64_t tc = T <= 288 ? std::min<int64_t>(32, T / 2) : 128;
  const auto longs = at::TensorOptions().device(kCuda).dtype(at::kLong);
  at::Tensor len = at::randint(1, tc + 1, {B, 1}, g, longs);
  len[0] = 1;
  if (B > 1) len[1] = tc;
  const at::Tensor pos = at::arange(T, longs).unsqueeze(0);
  at::Tensor mask = (pos >= tc).logical_or(pos < len);
  if (T > 256) mask[0].narrow(0, 128, 128).fill_(false);
  return mask;
}

// Softmax attention in float64 on the GPU: out [B, T, H, d] and lse [B, H, T]
// of the packed qkv [B, T, 3D] with the additive bias [B, 1, 1, T] (or none).
std::pair<at::Tensor, at::Tensor> reference(const at::Tensor& qkv, int64_t heads, const at::Tensor& bias) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3, d = D / heads;
  const at::Tensor x = qkv.to(at::kDouble).view({B, T, 3, heads, d});
  const at::Tensor q = x.select(2, 0).transpose(1, 2), k = x.select(2, 1).transpose(1, 2),
                   v = x.select(2, 2).transpose(1, 2);
  at::Tensor s = at::matmul(q, k.transpose(2, 3)) / std::sqrt(double(d));
  if (bias.defined()) s = s + bias.to(at::kDouble);
  const at::Tensor lse = at::logsumexp(s, -1);
  const at::Tensor out = at::matmul(at::softmax(s, -1), v).transpose(1, 2);
  return {out, lse};
}

TEST(AttentionTiledGpu, ForwardMatchesFloat64AndRerunsAreBitIdentical) {
  if (!sm90()) GTEST_SKIP() << "no sm_90 GPU";
  auto g = cuda_gen(51);
  for (const int64_t d : {64, 72, 96, 128})
    for (const int64_t T : {64, 257, 288, 1024, 1152})
      for (const int bias_kind : {0, 1, 2}) {  // none, bf16, fp32
        const int64_t B = 3, heads = 2, D = heads * d;
        const at::Tensor qkv = rnd({B, T, 3 * D}, g).to(at::kBFloat16);
        at::Tensor bias;
        if (bias_kind > 0)
          bias = attention_key_bias(condition_mask(B, T, g), bias_kind == 1 ? at::kBFloat16 : at::kFloat);
        const at::Tensor q = qkv.narrow(2, 0, D), k = qkv.narrow(2, D, D), v = qkv.narrow(2, 2 * D, D);
        ASSERT_TRUE(tiled_attention_takes(q, k, v, heads, bias));
        const auto [out, lse] = attention_tiled_fwd(q, k, v, heads, bias);
        const auto [out2, lse2] = attention_tiled_fwd(q, k, v, heads, bias);
        const auto [ref, ref_lse] = reference(qkv, heads, bias);
        const std::string what = "T=" + std::to_string(T) + " d=" + std::to_string(d) + " bias " +
                                 std::to_string(bias_kind);
        const at::Tensor o = out.transpose(1, 2);  // [B, T, H, d]
        EXPECT_LT(rel_l2(o, ref), 1e-2) << what << " out";
        EXPECT_TRUE(perftrain::testing::all_close(lse, ref_lse, 1e-3, 1e-3)) << what << " lse";
        EXPECT_TRUE(at::equal(out, out2) && at::equal(lse, lse2)) << what << " reruns differ";
      }
}

// q and k read from QK-norm+RoPE's [B, T, 2D] output and v in place from the
// projection, dq|dk written into a [B, T, 2D] gradient and dv into its own:
// the same values in other places give the same bits.
TEST(AttentionTiledGpu, StridedOperandsGiveThePackedResult) {
  if (!sm90()) GTEST_SKIP() << "no sm_90 GPU";
  auto g = cuda_gen(52);
  for (const int64_t d : {64, 72, 96, 128}) {
    const int64_t B = 2, T = 288, heads = 3, D = heads * d;
    const at::Tensor qkv = rnd({B, T, 3 * D}, g).to(at::kBFloat16);
    const at::Tensor qk = qkv.narrow(2, 0, 2 * D).contiguous();
    const at::Tensor bias = attention_key_bias(condition_mask(B, T, g), at::kBFloat16);
    const auto packed = attention_tiled_fwd(qkv.narrow(2, 0, D), qkv.narrow(2, D, D), qkv.narrow(2, 2 * D, D), heads,
                                            bias);
    const auto split = attention_tiled_fwd(qk.narrow(2, 0, D), qk.narrow(2, D, D), qkv.narrow(2, 2 * D, D), heads,
                                           bias);
    EXPECT_TRUE(at::equal(packed.first, split.first) && at::equal(packed.second, split.second)) << "d=" << d;
    const at::Tensor gout = rnd({B, T, D}, g).to(at::kBFloat16);
    const at::Tensor dqkv = at::empty_like(qkv), dqk = at::empty_like(qk), dv = at::empty({B, T, D}, qkv.options());
    attention_tiled_bwd(qkv.narrow(2, 0, D), qkv.narrow(2, D, D), qkv.narrow(2, 2 * D, D), heads, bias, packed.first,
                        packed.second, gout, dqkv.narrow(2, 0, D), dqkv.narrow(2, D, D), dqkv.narrow(2, 2 * D, D));
    attention_tiled_bwd(qk.narrow(2, 0, D), qk.narrow(2, D, D), qkv.narrow(2, 2 * D, D), heads, bias, packed.first,
                        packed.second, gout, dqk.narrow(2, 0, D), dqk.narrow(2, D, D), dv);
    EXPECT_TRUE(at::equal(dqkv.narrow(2, 0, 2 * D), dqk) && at::equal(dqkv.narrow(2, 2 * D, D), dv)) << "d=" << d;
  }
}

// Output and packed gradient of (out * gout).sum() through qkv_attention.
std::pair<at::Tensor, at::Tensor> qkv_fwd_bwd(const at::Tensor& qkv, int64_t heads, const at::Tensor& mask,
                                              const at::Tensor& gout) {
  const at::Tensor leaf = qkv.detach().requires_grad_(true);
  const at::Tensor out = qkv_attention(leaf, heads, mask);
  const at::Tensor d = torch::autograd::grad({(out.to(at::kFloat) * gout).sum()}, {leaf})[0];
  return {out.detach(), d};
}

// Prints the attention paths noted since reset_attention_paths() and
// expects each of `expected` among them.
void expect_paths_noted(std::initializer_list<const char*> expected) {
  const std::vector<std::string> lines = attention_paths_used();
  for (const auto& l : lines) std::cout << "[attention] " << l << "\n";
  for (const char* line : expected) EXPECT_NE(std::find(lines.begin(), lines.end(), line), lines.end()) << line;
}

// Restores the attention switches a test changed.
struct RestoreSwitches {
  bool tiled = tiled_attention(), fwd = whole_head_attention_forward(), bwd = whole_head_attention_backward();
  ~RestoreSwitches() {
    set_tiled_attention(tiled);
    set_whole_head_attention_forward(fwd);
    set_whole_head_attention_backward(bwd);
  }
};

// With "tiled": the single-stream attention (qkv_attention with the key
// mask, and without) runs our tiled forward and backward; out and dqkv
// against float64 autograd, the masked keys' dk, dv zero, a rerun's
// gradient the same bits.
TEST(AttentionTiledGpu, QkvAttentionWithTheTiledKernelsMatchesFloat64) {
  if (!sm90()) GTEST_SKIP() << "no sm_90 GPU";
  RestoreSwitches restore;
  set_tiled_attention(true);
  set_whole_head_attention_forward(false);
  set_whole_head_attention_backward(true);
  auto g = cuda_gen(53);
  reset_attention_paths();
  for (const int64_t d : {64, 72, 96, 128})
    for (const int64_t T : {192, 257, 288, 1024, 1152})  // 192: masked T % 128 == 64, cuDNN's NaN case
      for (const bool masked : {false, true}) {
        const int64_t B = 2, heads = 2, D = heads * d;
        const at::Tensor qkv = rnd({B, T, 3 * D}, g).to(at::kBFloat16);
        const at::Tensor mask = masked ? condition_mask(B, T, g) : at::Tensor();
        const at::Tensor gout = rnd({B, T, D}, g);
        const auto [out, dqkv] = qkv_fwd_bwd(qkv, heads, mask, gout);
        const auto rerun = qkv_fwd_bwd(qkv, heads, mask, gout);
        const at::Tensor x = qkv.to(at::kDouble).requires_grad_(true);
        const at::Tensor bias = masked ? attention_key_bias(mask, at::kDouble) : at::Tensor();
        const at::Tensor ref = reference(x, heads, bias).first.reshape({B, T, D});
        const at::Tensor dref = torch::autograd::grad({(ref * gout.to(at::kDouble)).sum()}, {x})[0];
        const std::string what = "T=" + std::to_string(T) + " d=" + std::to_string(d) + (masked ? " masked" : "");
        const double e_out = rel_l2(out, ref.detach()), e_grad = rel_l2(dqkv, dref);
        std::cout << what << ": rel L2 out " << e_out << ", dqkv " << e_grad << "\n";
        EXPECT_LT(e_out, 1e-2) << what << " out";
        EXPECT_LT(e_grad, 2e-2) << what << " dqkv";
        EXPECT_TRUE(at::equal(out, rerun.first) && at::equal(dqkv, rerun.second)) << what << " reruns differ";
        if (masked) {
          const at::Tensor dkv = dqkv.narrow(2, D, 2 * D).to(at::kFloat);
          const at::Tensor off = mask.logical_not().unsqueeze(2).expand_as(dkv);
          EXPECT_LE(dkv.masked_select(off).abs().max().item<float>(), 1e-6f * dkv.abs().max().item<float>())
              << what << " masked keys' dk, dv";
        }
      }
  expect_paths_noted({"ours, tiled: 1152 tokens, head dim 64, key mask, BFloat16",
                      "ours, tiled: 192 tokens, head dim 72, key mask, BFloat16",
                      "ours, tiled: 288 tokens, head dim 72, key mask, BFloat16",
                      "ours, tiled: 1024 tokens, head dim 64, BFloat16",
                      "ours, tiled: 288 tokens, head dim 96, key mask, BFloat16",
                      "ours, tiled: 1024 tokens, head dim 128, BFloat16",
                      "ours, tiled: 1152 tokens, head dim 128, key mask, BFloat16"});
}

// With "tiled": qkv_attention's three-tensor form on the single-stream
// block's layout (q and k views of a dense [B, T, 2D], v the column block of
// the projection's [B, T, 3D]) runs our tiled forward and backward: out and
// dq, dk, dv the packed form's bits (the same kernels on other row strides),
// the gradients [B, T, D] each, and the path noted as ours.
TEST(AttentionTiledGpu, ThreeTensorFormRunsTheTiledKernelsOnTheBlockLayout) {
  if (!sm90()) GTEST_SKIP() << "no sm_90 GPU";
  RestoreSwitches restore;
  set_tiled_attention(true);
  auto g = cuda_gen(56);
  reset_attention_paths();
  for (const int64_t d : {64, 72, 96, 128})
    for (const int64_t T : {192, 1152}) {
      const int64_t B = 2, heads = 2, D = heads * d;
      const at::Tensor qkv = rnd({B, T, 3 * D}, g).to(at::kBFloat16);
      const at::Tensor qk = qkv.narrow(2, 0, 2 * D).contiguous();
      const at::Tensor mask = condition_mask(B, T, g);
      const at::Tensor gout = rnd({B, T, D}, g);
      const auto [out, dqkv] = qkv_fwd_bwd(qkv, heads, mask, gout);
      at::Tensor q = qk.narrow(2, 0, D).detach().requires_grad_(true);
      at::Tensor k = qk.narrow(2, D, D).detach().requires_grad_(true);
      at::Tensor v = qkv.narrow(2, 2 * D, D).detach().requires_grad_(true);
      const at::Tensor out3 = qkv_attention(q, k, v, heads, mask);
      const auto d3 = torch::autograd::grad({(out3.to(at::kFloat) * gout).sum()}, {q, k, v});
      const std::string what = "T=" + std::to_string(T) + " d=" + std::to_string(d);
      EXPECT_TRUE(at::equal(out3, out)) << what << " out";
      for (int64_t i = 0; i < 3; ++i) {
        EXPECT_EQ(d3[i].sizes(), q.sizes()) << what;
        EXPECT_TRUE(at::equal(d3[i], dqkv.narrow(2, i * D, D))) << what << " gradient " << i;
      }
    }
  expect_paths_noted({"ours, tiled: 192 tokens, head dim 64, key mask, BFloat16",
                      "ours, tiled: 1152 tokens, head dim 72, key mask, BFloat16",
                      "ours, tiled: 192 tokens, head dim 96, key mask, BFloat16",
                      "ours, tiled: 1152 tokens, head dim 128, key mask, BFloat16"});
}

// With "tiled", the inputs of QkvAttentionGpu.CudnnKeyMaskBackwardFiniteAtVeryNegativeLogsumexp
// (every logit about -127, a quarter of the keys masked): our backward keeps
// dq, dk, dv finite at every T, T % 128 == 64 among them (where cuDNN's turns
// dq NaN and qkv_attention otherwise takes the memory-efficient kernel), and
// out, dk, dv match float64 (dq is rounding noise times 1e3 there, as that
// test says).
TEST(AttentionTiledGpu, BackwardFiniteAtVeryNegativeLogsumexp) {
  if (!sm90()) GTEST_SKIP() << "no sm_90 GPU";
  RestoreSwitches restore;
  set_tiled_attention(true);
  auto g = cuda_gen(55);
  for (const Shape s : {Shape{2, 192, 128, 2}, Shape{1, 320, 144, 2}, Shape{1, 288, 64, 1}, Shape{1, 1152, 64, 1},
                        Shape{1, 320, 192, 2}, Shape{1, 1152, 256, 2}}) {
    const int64_t B = s.batch, T = s.tokens, D = s.dim;
    const at::Tensor qkv = very_negative_logits_qkv(s, g);
    at::Tensor mask = at::ones({B, T}, at::TensorOptions().device(kCuda).dtype(at::kBool));
    mask.narrow(1, 0, T / 4).fill_(false);
    const at::Tensor gout = rnd({B, T, D}, g);
    const auto [out, dqkv] = qkv_fwd_bwd(qkv, s.heads, mask, gout);
    const at::Tensor x = qkv.to(at::kDouble).requires_grad_(true);
    const at::Tensor ref = reference(x, s.heads, attention_key_bias(mask, at::kDouble)).first.reshape({B, T, D});
    const at::Tensor dref = torch::autograd::grad({(ref * gout.to(at::kDouble)).sum()}, {x})[0];
    const std::string what = describe(s);
    EXPECT_EQ((~at::isfinite(dqkv)).sum().item<int64_t>(), 0) << what << " non-finite gradient";
    EXPECT_LT(rel_l2(out, ref.detach()), 1e-2) << what << " out";
    EXPECT_LT(rel_l2(dqkv.narrow(2, D, 2 * D), dref.narrow(2, D, 2 * D)), 2e-2) << what << " dk, dv";
  }
}

// With "tiled": projected_attention at 256 tokens (our tiled forward, then
// our whole-head backward from its out and lse) and at 1024 (our tiled
// backward) against the fp32 reference (projected_attention_reference).
TEST(AttentionTiledGpu, ProjectedAttentionWithTheTiledKernelsMatchesReference) {
  if (!sm90()) GTEST_SKIP() << "no sm_90 GPU";
  RestoreSwitches restore;
  set_tiled_attention(true);
  set_whole_head_attention_forward(false);
  set_whole_head_attention_backward(true);
  auto g = cuda_gen(54);
  for (const Shape s : {Shape{2, 256, 128, 2}, Shape{2, 256, 216, 3}, Shape{2, 1024, 128, 2}, Shape{1, 1024, 216, 3},
                        Shape{2, 256, 256, 2}, Shape{1, 1024, 192, 2}}) {
    const at::Tensor h = rnd({s.batch, s.tokens, s.dim}, g).to(at::kBFloat16);
    const at::Tensor w = rnd({3 * s.dim, s.dim}, g, 1.0 / std::sqrt(double(s.dim))), b = rnd({3 * s.dim}, g, 0.1);
    const at::Tensor gout = rnd({s.batch, s.tokens, s.dim}, g);
    const auto run = [&](bool reference_path) {
      at::Tensor hl = (reference_path ? h.to(at::kFloat) : h).detach().requires_grad_(true);
      at::Tensor wl = w.detach().requires_grad_(true);
      const at::Tensor out = reference_path ? projected_attention_reference(hl, wl, b, s.heads)
                                            : projected_attention(hl, wl, b, s.heads);
      auto gr = torch::autograd::grad({(out.to(at::kFloat) * gout).sum()}, {hl, wl});
      return std::vector<at::Tensor>{out.detach(), gr[0], gr[1]};
    };
    const auto ours = run(false), ref = run(true);
    const std::string what = describe(s);
    EXPECT_LT(rel_l2(ours[0], ref[0]), 1.5e-2) << what << " out";
    EXPECT_LT(rel_l2(ours[1], ref[1]), 2e-2) << what << " dh";
    EXPECT_LT(rel_l2(ours[2], ref[2]), 2e-2) << what << " dW";
  }
}

}  // namespace
}  // namespace perftrain::ops
