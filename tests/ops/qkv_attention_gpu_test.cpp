// ops/qkv_attention on the GPU: cuDNN's attention with a key mask against
// the fp32 reference, the key bias made once, the packed gradient against
// cuDNN's own backward, the three-tensor form on the single-stream block's
// layout, the token counts steered around a cuDNN fault, and the kernel each
// shape took (projected_attention's too). Skips without a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "compat/compat.h"
#include "attention_gpu_cases.h"
#include "ops/attention_head_bwd.h"
#include "ops/attention_head_fwd.h"
#include "ops/attention_paths.h"
#include "ops/projected_attention.h"
#include "ops/qkv_attention.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

using namespace attention_gpu_cases;
using perftrain::testing::rel_l2;

// qkv_attention with a key mask through cuDNN (bf16, the mask as cuDNN's
// additive attn_bias in forward and backward) against the fp32 SDPA
// reference on the same values, on odd token counts and the head dims of the
// single-stream models; the masked keys' k and v gradients are zero and
// cuDNN did not refuse (no silent fallback).
TEST(QkvAttentionGpu, CudnnKeyMaskMatchesFp32Reference) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto g = cuda_gen(31);
  for (const Shape s : {Shape{3, 67, 128, 2}, Shape{2, 259, 384, 6}, Shape{4, 35, 384, 4}, Shape{2, 131, 256, 2},
                        Shape{2, 288, 1152, 16}, Shape{2, 320, 384, 6}}) {
    const int64_t B = s.batch, T = s.tokens, D = s.dim;
    const at::Tensor qkv = rnd({B, T, 3 * D}, g).to(at::kBFloat16);
    // Sample b attends to its first len_b keys and the last half (the image tokens).
    const at::Tensor len = at::randint(0, T / 2 + 1, {B, 1}, g, at::TensorOptions().device(kCuda).dtype(at::kLong));
    const at::Tensor idx = at::arange(T, at::TensorOptions().device(kCuda).dtype(at::kLong)).unsqueeze(0);
    const at::Tensor mask = (idx < len) | (idx >= T / 2);  // [B, T]
    const at::Tensor gout = rnd({B, T, D}, g);
    const auto fwd_bwd = [&](const at::Tensor& x, const at::Tensor& m) {
      const at::Tensor leaf = x.detach().requires_grad_(true);
      const at::Tensor out = qkv_attention(leaf, s.heads, m);
      const at::Tensor d = torch::autograd::grad({(out.to(at::kFloat) * gout).sum()}, {leaf})[0];
      return std::pair<at::Tensor, at::Tensor>{out.detach(), d};
    };
    const auto [out, dqkv] = fwd_bwd(qkv, mask);
    const auto [ref, dref] = fwd_bwd(qkv.to(at::kFloat), mask);  // fp32: ATen's SDPA
    const std::string what = describe(s);
    ASSERT_EQ(out.scalar_type(), at::kBFloat16) << what;
    EXPECT_FALSE(cudnn_attention_refused()) << what;
    const double e_out = rel_l2(out, ref), e_grad = rel_l2(dqkv, dref);
    std::cout << what << ": rel L2 out " << e_out << ", dqkv " << e_grad << "\n";
    EXPECT_LT(e_out, 1e-2) << what << " out";
    EXPECT_LT(e_grad, 2e-2) << what << " dqkv";
    const at::Tensor dkv = dqkv.narrow(2, D, 2 * D).to(at::kFloat);
    const at::Tensor off = mask.logical_not().unsqueeze(2).expand_as(dkv);
    if (off.any().item<bool>())
      EXPECT_LE(dkv.masked_select(off).abs().max().item<float>(), 1e-6f * dkv.abs().max().item<float>())
          << what << " masked keys' dk, dv";
    // Unmasked cuDNN on the same values still differs (the mask was applied).
    EXPECT_GT(rel_l2(qkv_attention(qkv, s.heads), out), 1e-2) << what;
  }
}

// What the single-stream blocks rely on beyond the values above: the key
// bias made once (ops::attention_key_bias, passed to every block) gives the
// same output as the bias each call makes, and the same gradients; and the
// packed gradient (dq, dk, dv cat into [B, T, 3D]) is cuDNN's own backward on
// the same tensors, packed by hand. The forward is deterministic: equal bits.
// cuDNN's dq may be accumulated in a run-dependent order, so the gradients
// are compared at 2e-3 (1 bf16 ulp is 4e-3 relative); the printed maxima say
// whether they were bit-identical. Shapes: odd ones, and the SS-B/2 block (288
// tokens, 768 wide, 12 heads).
TEST(QkvAttentionGpu, CudnnKeyBiasOnceAndPackedGradientMatchCudnn) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto g = cuda_gen(41);
  for (const Shape s : {Shape{3, 67, 128, 2}, Shape{2, 288, 768, 12}, Shape{2, 131, 384, 6}}) {
    const int64_t B = s.batch, T = s.tokens, D = s.dim, H = s.heads, hd = D / H;
    const at::Tensor qkv = rnd({B, T, 3 * D}, g).to(at::kBFloat16);
    const at::Tensor len = at::randint(1, T / 2 + 1, {B, 1}, g, at::TensorOptions().device(kCuda).dtype(at::kLong));
    const at::Tensor idx = at::arange(T, at::TensorOptions().device(kCuda).dtype(at::kLong)).unsqueeze(0);
    const at::Tensor mask = (idx < len) | (idx >= T / 2);  // [B, T]
    const at::Tensor gout = rnd({B, T, D}, g).to(at::kBFloat16);
    const at::Tensor bias = attention_key_bias(mask, at::kBFloat16);
    const auto fwd_bwd = [&](const at::Tensor& b) {
      const at::Tensor leaf = qkv.detach().requires_grad_(true);
      const at::Tensor out = qkv_attention(leaf, H, mask, b);
      const at::Tensor d = torch::autograd::grad({out}, {leaf}, {gout})[0];
      return std::pair<at::Tensor, at::Tensor>{out.detach(), d};
    };
    const auto [out, dqkv] = fwd_bwd(at::Tensor());
    const auto [out_once, dqkv_once] = fwd_bwd(bias);
    // cuDNN's forward and backward called directly on the packed views, the
    // gradients packed by hand.
    const at::Tensor v5 = qkv.view({B, T, 3, H, hd});
    const at::Tensor q = v5.select(2, 0).transpose(1, 2), k = v5.select(2, 1).transpose(1, 2),
                     v = v5.select(2, 2).transpose(1, 2);
    const auto r = at::_scaled_dot_product_cudnn_attention(q, k, v, bias, /*compute_log_sumexp=*/true);
    const at::Tensor& o = std::get<0>(r);
    const at::Tensor dout = gout.view({B, T, H, hd}).transpose(1, 2);
    const auto [dq, dk, dv] = at::_scaled_dot_product_cudnn_attention_backward(
        dout, q, k, v, o, std::get<1>(r), std::get<6>(r), std::get<7>(r), bias, std::get<2>(r), std::get<3>(r),
        std::get<4>(r).expect_int(), std::get<5>(r).expect_int(), 0.0, false);
    at::Tensor hand = at::empty({B, T, 3, H, hd}, qkv.options());
    hand.select(2, 0).copy_(dq.transpose(1, 2));
    hand.select(2, 1).copy_(dk.transpose(1, 2));
    hand.select(2, 2).copy_(dv.transpose(1, 2));
    hand = hand.view({B, T, 3 * D});
    const std::string what = describe(s);
    auto max_diff = [](const at::Tensor& a, const at::Tensor& b) {
      return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<float>();
    };
    std::cout << what << ": max |out - out with the bias made once| " << max_diff(out, out_once)
              << ", |out - cuDNN's| " << max_diff(out, o.transpose(1, 2).reshape({B, T, D}))
              << "; max |dqkv - dqkv with the bias made once| " << max_diff(dqkv, dqkv_once)
              << ", |dqkv - cuDNN's packed by hand| q " << max_diff(dqkv.narrow(2, 0, D), hand.narrow(2, 0, D))
              << " k " << max_diff(dqkv.narrow(2, D, D), hand.narrow(2, D, D)) << " v "
              << max_diff(dqkv.narrow(2, 2 * D, D), hand.narrow(2, 2 * D, D)) << " (of max "
              << hand.abs().max().item<float>() << ")\n";
    EXPECT_FALSE(cudnn_attention_refused()) << what;
    EXPECT_TRUE(at::equal(out, out_once)) << what;
    EXPECT_TRUE(at::equal(out, o.transpose(1, 2).reshape({B, T, D}))) << what;
    EXPECT_LT(rel_l2(dqkv_once, dqkv), 2e-3) << what << " dqkv, bias made once";
    for (int64_t i = 0; i < 3; ++i)
      EXPECT_LT(rel_l2(dqkv.narrow(2, i * D, D), hand.narrow(2, i * D, D)), 2e-3)
          << what << " d" << "qkv"[i] << " against cuDNN's packed by hand";
  }
}

// The three-tensor form on the single-stream block's layout: q and k from a
// dense [B, T, 2D] (QK-norm + RoPE's output), v the column block of a
// [B, T, 3D] (the projection's output), each with its own row stride: cuDNN
// takes them (not refused, noted as cuDNN), the output is the packed form's
// on the same values bit for bit (the forward is deterministic), and the
// gradients of q | k and of v match the packed form's at 2e-3 (cuDNN's dq
// order; see above); the projection's q | k columns get no gradient. Masked
// and not, odd shapes and the SS-B/2 block, and 1152 tokens (SS at 512 px).
TEST(QkvAttentionGpu, ThreeTensorFormReadsTheBlockLayoutInPlace) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto g = cuda_gen(43);
  for (const Shape s : {Shape{3, 67, 128, 2}, Shape{2, 288, 768, 12}, Shape{2, 131, 576, 8}, Shape{1, 1152, 768, 12}}) {
    const int64_t B = s.batch, T = s.tokens, D = s.dim, H = s.heads;
    const at::Tensor qk = rnd({B, T, 2 * D}, g).to(at::kBFloat16), proj = rnd({B, T, 3 * D}, g).to(at::kBFloat16);
    const at::Tensor len = at::randint(1, T / 2 + 1, {B, 1}, g, at::TensorOptions().device(kCuda).dtype(at::kLong));
    const at::Tensor idx = at::arange(T, at::TensorOptions().device(kCuda).dtype(at::kLong)).unsqueeze(0);
    const at::Tensor gout = rnd({B, T, D}, g).to(at::kBFloat16);
    for (const bool masked : {false, true}) {
      const at::Tensor mask = masked ? (idx < len) | (idx >= T / 2) : at::Tensor();
      const std::string what = describe(s) + (masked ? " masked" : "");
      reset_attention_paths();
      const at::Tensor qk_leaf = qk.detach().requires_grad_(true), proj_leaf = proj.detach().requires_grad_(true);
      const at::Tensor out = qkv_attention(qk_leaf.narrow(2, 0, D), qk_leaf.narrow(2, D, D),
                                           proj_leaf.narrow(2, 2 * D, D), H, mask);
      const auto got = torch::autograd::grad({out}, {qk_leaf, proj_leaf}, {gout});
      const at::Tensor packed = at::cat({qk, proj.narrow(2, 2 * D, D)}, 2).requires_grad_(true);
      const at::Tensor ref = qkv_attention(packed, H, mask);
      const at::Tensor dref = torch::autograd::grad({ref}, {packed}, {gout})[0];
      EXPECT_FALSE(cudnn_attention_refused()) << what;
      const auto paths = attention_paths_used();
      ASSERT_EQ(paths.size(), 1u) << what;
      EXPECT_EQ(paths[0].rfind("cuDNN fused", 0), 0u) << what << ": " << paths[0];
      EXPECT_TRUE(at::equal(out, ref)) << what << " out";
      EXPECT_LT(rel_l2(got[0], dref.narrow(2, 0, 2 * D)), 2e-3) << what << " d(q | k)";
      EXPECT_LT(rel_l2(got[1].narrow(2, 2 * D, D), dref.narrow(2, 2 * D, D)), 2e-3) << what << " dv";
      EXPECT_EQ(got[1].narrow(2, 0, 2 * D).abs().max().item<float>(), 0.f) << what;
      std::cout << what << ": rel L2 d(q | k) " << rel_l2(got[0], dref.narrow(2, 0, 2 * D)) << ", dv "
                << rel_l2(got[1].narrow(2, 2 * D, D), dref.narrow(2, 2 * D, D)) << "\n";
    }
  }
}

// A cuDNN fault qkv_attention steers around (PyTorch issue 196678, seen on
// the H200 with 2.11): with an attn_bias, T % 128 == 64 and a query row whose
// logsumexp is below -88.7, cuDNN's backward turns dq NaN (T = 192, 320, 448
// here; 200, 256, 288, 330, 1152 stay finite), and ATen's SDPA picks cuDNN
// for a masked bf16 call too, so those token counts take the memory-efficient
// kernel by name (ops::self_attention). Every logit here is about -127 (q's
// first channel 1, k's first channel -127 sqrt(hd)), which softmax ignores
// (shift-invariant), so the gradients must be finite, and out, dk and dv match
// fp32 SDPA (dq is not compared: its first channel is a sum of dS against
// that huge constant, zero in exact arithmetic and bf16 rounding noise of dS
// times 1e3 in any bf16 kernel). QK-norm keeps the models' logits far from
// this, but a data-dependent NaN must not be left to chance.
TEST(QkvAttentionGpu, CudnnKeyMaskBackwardFiniteAtVeryNegativeLogsumexp) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto g = cuda_gen(37);
  for (const Shape s : {Shape{1, 320, 64, 1}, Shape{2, 192, 128, 2}, Shape{1, 256, 64, 1}, Shape{1, 288, 64, 1},
                        Shape{1, 1152, 64, 1}, Shape{1, 200, 64, 1}, Shape{1, 330, 128, 2}, Shape{1, 448, 64, 1}}) {
    const int64_t B = s.batch, T = s.tokens, D = s.dim;
    const at::Tensor qkv = very_negative_logits_qkv(s, g);
    const at::Tensor mask = at::ones({B, T}, at::TensorOptions().device(kCuda).dtype(at::kBool));
    mask.narrow(1, 0, T / 4).fill_(false);  // some keys masked, every query keeps 3/4 of them
    const at::Tensor gout = rnd({B, T, D}, g);
    const auto fwd_bwd = [&](const at::Tensor& x) {
      const at::Tensor leaf = x.detach().requires_grad_(true);
      const at::Tensor out = qkv_attention(leaf, s.heads, mask);
      const at::Tensor d = torch::autograd::grad({(out.to(at::kFloat) * gout).sum()}, {leaf})[0];
      return std::pair<at::Tensor, at::Tensor>{out.detach(), d};
    };
    const auto [out, dqkv] = fwd_bwd(qkv);
    const auto [ref, dref] = fwd_bwd(qkv.to(at::kFloat));
    const std::string what = describe(s);
    EXPECT_FALSE(cudnn_attention_refused()) << what;
    const int64_t bad_q = (~at::isfinite(dqkv.narrow(2, 0, D))).sum().item<int64_t>();
    const int64_t bad_kv = (~at::isfinite(dqkv.narrow(2, D, 2 * D))).sum().item<int64_t>();
    const double e_out = rel_l2(out, ref), e_kv = rel_l2(dqkv.narrow(2, D, 2 * D), dref.narrow(2, D, 2 * D));
    std::cout << what << " (logits ~ -127): non-finite dq " << bad_q << ", dk/dv " << bad_kv << "; rel L2 out "
              << e_out << ", dk/dv " << e_kv << "\n";
    EXPECT_EQ(bad_q, 0) << what << " non-finite dq (T % 128 = " << T % 128 << ")";
    EXPECT_EQ(bad_kv, 0) << what << " non-finite dk, dv";
    EXPECT_LT(e_out, 1e-2) << what << " out";
    EXPECT_LT(e_kv, 2e-2) << what << " dk, dv";
  }
}

// The packed form without a mask at 256 tokens (head dims 64 and 72, the fp8
// DiT block's attention) runs projected_attention's whole-head kernels: its
// output and packed gradient match cuDNN's within bf16's bound, the
// whole-head backward after cuDNN's forward gives the same gradient, and
// reruns give the same bits. Skips without an sm_90 GPU.
TEST(QkvAttentionGpu, PackedFormRunsTheWholeHeadKernelsAt256Tokens) {
  if (!compat::cuda_available() || at::cuda::getCurrentDeviceProperties()->major != 9) GTEST_SKIP() << "no sm_90 GPU";
  const bool fwd = whole_head_attention_forward(), bwd = whole_head_attention_backward();
  auto g = cuda_gen(47);
  for (const int64_t d : {64, 72}) {
    const int64_t B = 3, T = 256, H = 4, D = H * d;
    const at::Tensor qkv = rnd({B, T, 3 * D}, g).to(at::kBFloat16), gout = rnd({B, T, D}, g).to(at::kBFloat16);
    const auto run = [&](bool own_fwd, bool own_bwd) {
      set_whole_head_attention_forward(own_fwd);
      set_whole_head_attention_backward(own_bwd);
      const at::Tensor leaf = qkv.detach().requires_grad_(true);
      const at::Tensor out = qkv_attention(leaf, H);
      const at::Tensor dq = torch::autograd::grad({out}, {leaf}, {gout})[0];
      return std::pair<at::Tensor, at::Tensor>{out.detach(), dq};
    };
    reset_attention_paths();
    const auto [out, dqkv] = run(true, true);
    const std::vector<std::string> lines = attention_paths_used();
    const auto [out2, dqkv2] = run(true, true);
    const auto [cudnn_out, cudnn_d] = run(false, false);
    const auto [mixed_out, mixed_d] = run(false, true);  // cuDNN's forward, our whole-head backward
    set_whole_head_attention_forward(fwd);
    set_whole_head_attention_backward(bwd);
    const std::string what = "d " + std::to_string(d);
    ASSERT_EQ(lines.size(), 1u) << what;
    EXPECT_NE(lines[0].find("ours (whole-head forward and backward): 256 tokens"), std::string::npos) << lines[0];
    EXPECT_TRUE(at::equal(out, out2)) << what;
    EXPECT_TRUE(at::equal(dqkv, dqkv2)) << what;
    EXPECT_LT(rel_l2(out, cudnn_out), 1e-2) << what;
    EXPECT_TRUE(at::equal(mixed_out, cudnn_out)) << what;
    for (int64_t i = 0; i < 3; ++i) {
      // The key block's gradient sums to zero per query row: compare blocks.
      EXPECT_LT(rel_l2(dqkv.narrow(2, i * D, D), cudnn_d.narrow(2, i * D, D)), 2e-2) << what << " block " << i;
      EXPECT_LT(rel_l2(mixed_d.narrow(2, i * D, D), cudnn_d.narrow(2, i * D, D)), 2e-2) << what << " block " << i;
    }
  }
}

// The kernel each shape takes, as the bench report lists it: ours at 256
// tokens (projected, sm_90), cuDNN for masked 288, the memory-efficient
// kernel for masked 192 (T % 128 == 64, cuDNN's NaN).
TEST(QkvAttentionGpu, NotesTheKernelEachShapeTook) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(77);
  const auto bf = at::TensorOptions().device(kCuda).dtype(at::kBFloat16);
  reset_attention_paths();
  const at::Tensor h = rnd({2, 256, 384}, g).to(at::kBFloat16);
  const at::Tensor w = rnd({3 * 384, 384}, g, 0.05), b = rnd({3 * 384}, g, 0.05);
  (void)projected_attention(h, w, b, 6);
  for (int64_t T : {288, 192}) {
    const at::Tensor qkv = rnd({2, T, 3 * 384}, g).to(bf.dtype());
    at::Tensor mask = at::ones({2, T}, bf.dtype(at::kBool));
    mask.narrow(1, T - 20, 20).fill_(false);
    (void)qkv_attention(qkv, 6, mask);
  }
  const std::vector<std::string> lines = attention_paths_used();
  for (const auto& l : lines) std::cout << "[attention] " << l << "\n";
  const bool sm90 = at::cuda::getCurrentDeviceProperties()->major == 9;
  const std::vector<std::string> want = {
      sm90 ? "ours (whole-head forward and backward): 256 tokens, head dim 64, BFloat16"
           : "cuDNN fused: 256 tokens, head dim 64, BFloat16",
      "cuDNN fused: 288 tokens, head dim 64, key mask, BFloat16",
      "memory-efficient (ATen, by name): 192 tokens, head dim 64, key mask, BFloat16"};
  ASSERT_EQ(lines.size(), want.size());
  for (const auto& line : want) EXPECT_NE(std::find(lines.begin(), lines.end(), line), lines.end()) << line;
}

}  // namespace
}  // namespace perftrain::ops
