// [speed] attention = "auto" on the GPU (ops/attention_choice): a DiT-shaped
// qkv_attention forward and backward at 1024 tokens times the three plans
// once, records one decision with three positive times, times nothing on a
// second call, and gives the chosen plan's own result; cuDNN's forward with
// our tiled backward (the mixed plan, forced) matches float64 on the packed
// and three-tensor forms, masked or not, and reruns bit for bit; the masked
// T % 128 == 64 shape (cuDNN's NaN case) runs ours untimed; during a capture
// a new key is not timed. Skips without an sm_90 GPU.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "attention_gpu_cases.h"
#include "compat/compat.h"
#include "ops/attention_choice.h"
#include "ops/attention_head_bwd.h"
#include "ops/attention_head_fwd.h"
#include "ops/attention_paths.h"
#include "ops/attention_tiled.h"
#include "ops/qkv_attention.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

using namespace attention_gpu_cases;
using perftrain::testing::rel_l2;

bool sm90() { return compat::cuda_available() && at::cuda::getCurrentDeviceProperties()->major == 9; }

// Output and packed gradient of (out * gout).sum() through qkv_attention.
std::pair<at::Tensor, at::Tensor> qkv_fwd_bwd(const at::Tensor& qkv, int64_t heads, const at::Tensor& mask,
                                              const at::Tensor& gout) {
  const at::Tensor leaf = qkv.detach().requires_grad_(true);
  const at::Tensor out = qkv_attention(leaf, heads, mask);
  const at::Tensor d = torch::autograd::grad({(out.to(at::kFloat) * gout).sum()}, {leaf})[0];
  return {out.detach(), d};
}

// Puts the switches back and forgets the decisions a test made.
struct RestoreSwitches {
  bool tiled = tiled_attention(), automatic = attention_auto();
  ~RestoreSwitches() {
    set_tiled_attention(tiled);
    set_attention_auto(automatic);
    reset_attention_choices();
  }
};

TEST(AttentionChoiceGpu, AutoTimesOnceAndGivesTheChosenFamilysResult) {
  if (!sm90()) GTEST_SKIP() << "no sm_90 GPU";
  RestoreSwitches restore;
  reset_attention_choices();
  reset_attention_paths();
  set_tiled_attention(false);
  set_attention_auto(true);
  auto g = cuda_gen(61);
  for (const bool masked : {false, true}) {
    reset_attention_choices();
    const int64_t B = 2, T = 1024, heads = 16, d = 72, D = heads * d;  // DiT-XL's heads at 1024 tokens
    const at::Tensor qkv = rnd({B, T, 3 * D}, g).to(at::kBFloat16);
    at::Tensor mask;
    if (masked) {
      mask = at::rand({B, T}, at::TensorOptions().device(kCuda)) < 0.8;
      mask.select(1, 0).fill_(true);
    }
    const at::Tensor gout = rnd({B, T, D}, g);
    const auto [out, dqkv] = qkv_fwd_bwd(qkv, heads, mask, gout);
    const std::vector<AttentionChoiceRecord> first = attention_choice_records();
    ASSERT_EQ(first.size(), 1u);
    const AttentionChoiceRecord& r = first[0];
    std::cout << (masked ? "masked" : "unmasked") << ": tiled " << r.tiled_ms << " ms, cuDNN " << r.cudnn_ms
              << " ms, cuDNN then tiled " << r.mixed_ms << " ms fwd+bwd -> "
              << (r.choice == kTiledPlan ? "tiled" : r.choice == kCudnnPlan ? "cuDNN" : "cuDNN then tiled") << "\n";
    EXPECT_TRUE(r.timed);
    EXPECT_GT(r.tiled_ms, 0.0);
    EXPECT_GT(r.cudnn_ms, 0.0);
    EXPECT_GT(r.mixed_ms, 0.0);
    EXPECT_EQ(r.key.tokens, T);
    EXPECT_EQ(r.key.head_dim, d);
    EXPECT_EQ(r.key.masked, masked);
    const double best = std::min({r.tiled_ms, r.cudnn_ms, r.mixed_ms});
    EXPECT_EQ(r.choice, r.tiled_ms == best ? kTiledPlan : r.mixed_ms == best ? kMixedPlan : kCudnnPlan);

    // A second call times nothing: the record is the same.
    (void)qkv_fwd_bwd(qkv, heads, mask, gout);
    const auto second = attention_choice_records();
    ASSERT_EQ(second.size(), 1u);
    EXPECT_EQ(second[0].tiled_ms, r.tiled_ms);
    EXPECT_EQ(second[0].cudnn_ms, r.cudnn_ms);
    EXPECT_EQ(second[0].mixed_ms, r.mixed_ms);

    // The chosen plan run directly.
    std::pair<at::Tensor, at::Tensor> direct;
    {
      const detail::ForcedAttentionPlan forced(r.choice);
      direct = qkv_fwd_bwd(qkv, heads, mask, gout);
    }
    const auto& [direct_out, direct_d] = direct;
    EXPECT_LT(rel_l2(out, direct_out), 1e-2);
    EXPECT_LT(rel_l2(dqkv, direct_d), 2e-2);
  }
  const std::vector<std::string> lines = attention_paths_used();
  bool noted = false;
  for (const auto& l : lines) {
    std::cout << "[attention] " << l << "\n";
    // The masked shape's record is the one left (each shape resets the records).
    noted = noted || (l.find("key mask") != std::string::npos && l.find(" (auto, fwd+bwd: tiled ") != std::string::npos);
  }
  EXPECT_TRUE(noted) << "the masked shape's attention line does not carry its timing";
}

// cuDNN's forward then our tiled backward, forced: out and the gradients
// against float64 at 288 tokens with the single-stream key mask (head dim
// 64) and at 1024 tokens without one (head dim 72; 128 masked), on the
// packed form and on the three-tensor form; the backward reads cuDNN's out
// and lse as it reads ours. Reruns bit-identical.
TEST(AttentionChoiceGpu, CudnnForwardThenTiledBackwardMatchesFloat64) {
  if (!sm90()) GTEST_SKIP() << "no sm_90 GPU";
  RestoreSwitches restore;
  set_tiled_attention(false);
  set_attention_auto(true);
  auto g = cuda_gen(64);
  struct Case {
    int64_t B, T, heads, d;
    bool masked;
  };
  for (const Case c : {Case{3, 288, 4, 64, true}, Case{2, 1024, 2, 72, false}, Case{2, 1024, 2, 128, true}}) {
    const std::string what = std::to_string(c.T) + " tokens, d " + std::to_string(c.d) + (c.masked ? ", masked" : "");
    const int64_t D = c.heads * c.d;
    const at::Tensor qkv = rnd({c.B, c.T, 3 * D}, g).to(at::kBFloat16);
    const at::Tensor gout = rnd({c.B, c.T, D}, g);
    at::Tensor mask, bias;
    if (c.masked) {
      mask = at::rand({c.B, c.T}, at::TensorOptions().device(kCuda)) < 0.7;
      mask.select(1, 0).fill_(true);
      bias = attention_key_bias(mask, at::kBFloat16);
    }
    // float64: out and d(qkv) of (out * gout).sum().
    const at::Tensor x64 = qkv.to(at::kDouble).requires_grad_(true);
    const at::Tensor x5 = x64.view({c.B, c.T, 3, c.heads, c.d});
    const at::Tensor q = x5.select(2, 0).transpose(1, 2), k = x5.select(2, 1).transpose(1, 2),
                     v = x5.select(2, 2).transpose(1, 2);
    at::Tensor s = at::matmul(q, k.transpose(2, 3)) / std::sqrt(double(c.d));
    if (c.masked) s = s + bias.to(at::kDouble);
    const at::Tensor out64 = at::matmul(at::softmax(s, -1), v).transpose(1, 2).reshape({c.B, c.T, D});
    const at::Tensor d64 = torch::autograd::grad({(out64 * gout.to(at::kDouble)).sum()}, {x64})[0];

    const detail::ForcedAttentionPlan forced(kMixedPlan);
    const auto [out, dqkv] = qkv_fwd_bwd(qkv, c.heads, mask, gout);
    EXPECT_LT(rel_l2(out, out64), 1e-2) << what;
    EXPECT_LT(rel_l2(dqkv, d64), 2e-2) << what;
    const auto [out2, dqkv2] = qkv_fwd_bwd(qkv, c.heads, mask, gout);
    EXPECT_TRUE(at::equal(dqkv, dqkv2)) << what << ": a rerun differs";

    // The three-tensor form on q, k, v column blocks of one tensor.
    const at::Tensor leaf = qkv.detach().requires_grad_(true);
    const at::Tensor o3 = qkv_attention(leaf.narrow(2, 0, D), leaf.narrow(2, D, D), leaf.narrow(2, 2 * D, D),
                                        c.heads, mask);
    const at::Tensor d3 = torch::autograd::grad({(o3.to(at::kFloat) * gout).sum()}, {leaf})[0];
    EXPECT_LT(rel_l2(o3.detach(), out64), 1e-2) << what << " (three tensors)";
    EXPECT_LT(rel_l2(d3, d64), 2e-2) << what << " (three tensors)";
  }
}

// At 256 tokens without a mask (head dims 64 and 72) "auto" keeps the
// whole-head kernels: nothing timed, nothing recorded, the whole-head line.
TEST(AttentionChoiceGpu, AutoKeepsTheWholeHeadKernelsAt256Tokens) {
  if (!sm90()) GTEST_SKIP() << "no sm_90 GPU";
  RestoreSwitches restore;
  const bool fwd = whole_head_attention_forward(), bwd = whole_head_attention_backward();
  set_tiled_attention(false);
  set_attention_auto(true);
  set_whole_head_attention_forward(true);
  set_whole_head_attention_backward(true);
  reset_attention_choices();
  reset_attention_paths();
  auto g = cuda_gen(63);
  for (const int64_t d : {64, 72}) {
    const int64_t B = 3, T = 256, heads = 4, D = heads * d;
    const at::Tensor qkv = rnd({B, T, 3 * D}, g).to(at::kBFloat16);
    const auto [out, dqkv] = qkv_fwd_bwd(qkv, heads, at::Tensor(), rnd({B, T, D}, g));
    EXPECT_FALSE(out.isnan().any().item<bool>()) << "d " << d;
    EXPECT_FALSE(dqkv.isnan().any().item<bool>()) << "d " << d;
  }
  set_whole_head_attention_forward(fwd);
  set_whole_head_attention_backward(bwd);
  EXPECT_TRUE(attention_choice_records().empty());
  const std::vector<std::string> lines = attention_paths_used();
  ASSERT_EQ(lines.size(), 2u);
  for (const auto& l : lines) {
    std::cout << "[attention] " << l << "\n";
    EXPECT_NE(l.find("ours (whole-head forward and backward): 256 tokens"), std::string::npos) << l;
  }
}

TEST(AttentionChoiceGpu, OnlyOursAtTheMaskedNaNShapeAndNoTimingDuringACapture) {
  if (!sm90()) GTEST_SKIP() << "no sm_90 GPU";
  RestoreSwitches restore;
  reset_attention_choices();
  set_tiled_attention(false);
  set_attention_auto(true);
  auto g = cuda_gen(62);
  // Masked at T % 128 == 64: cuDNN does not apply, ours runs untimed.
  const int64_t B = 2, heads = 2, d = 64, D = heads * d;
  const at::Tensor qkv = rnd({B, 192, 3 * D}, g).to(at::kBFloat16);
  at::Tensor mask = at::ones({B, 192}, at::TensorOptions().dtype(at::kBool).device(kCuda));
  EXPECT_TRUE(detail::tiled_attention_applies(qkv, heads, at::Tensor(), true));
  const auto [out, dqkv] = qkv_fwd_bwd(qkv, heads, mask, rnd({B, 192, D}, g));
  EXPECT_TRUE(at::isfinite(dqkv).all().item<bool>());
  EXPECT_TRUE(attention_choice_records().empty());

  // A new key during a capture: ours, recorded as not timed.
  const at::Tensor q = rnd({B, 512, 3 * D}, g).to(at::kBFloat16);
  compat::synchronize(kCuda);
  bool tiled = false;
  {
    c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromPool());
    at::cuda::CUDAGraph graph;
    graph.capture_begin();
    tiled = detail::tiled_attention_applies(q, heads);
    q.mul_(1);
    graph.capture_end();
  }
  EXPECT_TRUE(tiled);
  const auto r = attention_choice_records();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_FALSE(r[0].timed);
  EXPECT_EQ(r[0].choice, kTiledPlan);
}

}  // namespace
}  // namespace perftrain::ops
