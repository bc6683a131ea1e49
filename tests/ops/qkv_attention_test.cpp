// ops/qkv_attention on the CPU (ATen's SDPA under autograd) with a key mask:
// output and the packed qkv gradient against softmax attention written out
// in float64 with the masked keys' logits at -inf, on odd token counts; the
// two mask shapes agree; what lies in masked keys changes nothing; bad masks
// are refused; the key bias made once equals the mask's. The three-tensor
// form (q, k, v apart, each read through its own row stride) gives the packed
// form's output and gradients, masked or not, and refuses mismatched inputs.
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/where.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>

#include "base/error.h"
#include "ops/qkv_attention.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

using perftrain::testing::expect_close;
using perftrain::testing::seeded_cpu_generator;

// Softmax attention in float64 from the packed qkv, masked keys at -inf.
at::Tensor direct(const at::Tensor& qkv, int64_t heads, const at::Tensor& mask_bt) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3, d = D / heads;
  const at::Tensor x = qkv.to(at::kDouble).view({B, T, 3, heads, d}).permute({2, 0, 3, 1, 4});  // [3, B, H, T, d]
  const at::Tensor logits = at::matmul(x[0], x[1].transpose(-1, -2)) / std::sqrt(double(d));    // [B, H, T, T]
  const at::Tensor masked =
      at::where(mask_bt.view({B, 1, 1, T}), logits, at::full_like(logits, -std::numeric_limits<double>::infinity()));
  return at::matmul(at::softmax(masked, -1), x[2]).transpose(1, 2).reshape({B, T, D});
}

// B samples of T tokens; sample b attends to its first len_b keys and the last `always` keys.
at::Tensor random_mask(int64_t B, int64_t T, int64_t always, at::Generator& g) {
  const at::Tensor len = at::randint(0, T - always + 1, {B, 1}, g, at::kLong);
  const at::Tensor idx = at::arange(T, at::kLong).unsqueeze(0);
  return (idx < len) | (idx >= T - always);
}

TEST(QkvAttention, MaskedMatchesDirectSoftmaxOnOddSizes) {
  auto g = seeded_cpu_generator(11);
  for (auto [B, T, heads, d] : {std::array<int64_t, 4>{3, 67, 2, 16}, {2, 13, 3, 8}, {1, 5, 1, 4}}) {
    const at::Tensor qkv = at::randn({B, T, 3 * heads * d}, g).requires_grad_(true);
    const at::Tensor mask = random_mask(B, T, 2, g);
    const at::Tensor gout = at::randn({B, T, heads * d}, g);
    const at::Tensor out = qkv_attention(qkv, heads, mask);
    const at::Tensor ref = direct(qkv, heads, mask);
    expect_close(out, ref, 1e-5, 1e-4, "output");
    const at::Tensor dgot = torch::autograd::grad({(out * gout).sum()}, {qkv})[0];
    const at::Tensor dref = torch::autograd::grad({(ref * gout.to(at::kDouble)).sum()}, {qkv})[0];
    expect_close(dgot, dref, 1e-5, 1e-4, "d qkv");
    // The masked keys' k and v gradients are zero.
    const int64_t D = heads * d;
    const at::Tensor dkv = dgot.narrow(2, D, 2 * D);               // [B, T, 2D]
    const at::Tensor off = mask.logical_not().unsqueeze(2).expand_as(dkv);
    EXPECT_EQ(dkv.masked_select(off).abs().max().item<double>(), 0.0) << "T " << T;
  }
}

TEST(QkvAttention, BothMaskShapesAgreeAndMaskedKeysChangeNothing) {
  auto g = seeded_cpu_generator(12);
  const int64_t B = 2, T = 19, heads = 2, d = 8, D = heads * d;
  const at::Tensor qkv = at::randn({B, T, 3 * D}, g);
  const at::Tensor mask = random_mask(B, T, 3, g);
  const at::Tensor a = qkv_attention(qkv, heads, mask);
  const at::Tensor b = qkv_attention(qkv, heads, mask.view({B, 1, 1, T}));
  EXPECT_TRUE(at::equal(a, b));
  // Other k and v values in the masked keys (the queries stay).
  const at::Tensor noise = at::randn({B, T, 2 * D}, g) * 10;
  at::Tensor changed = qkv.clone();
  changed.narrow(2, D, 2 * D).add_(at::where(mask.unsqueeze(2), at::zeros_like(noise), noise));
  expect_close(qkv_attention(changed, heads, mask).narrow(1, 0, T), a, 1e-6, 1e-5, "masked keys changed");
  // Unmasked differs from masked where a key is masked.
  EXPECT_GT((qkv_attention(qkv, heads) - a).abs().max().item<double>(), 1e-3);
}

TEST(QkvAttention, RefusesBadMasks) {
  const at::Tensor qkv = at::randn({2, 7, 12});
  EXPECT_THROW(qkv_attention(qkv, 2, at::ones({2, 6}, at::kBool)), UsageError);
  EXPECT_THROW(qkv_attention(qkv, 2, at::ones({2, 7})), UsageError);             // not bool
  EXPECT_THROW(qkv_attention(qkv, 2, at::ones({2, 7, 7}, at::kBool)), UsageError);  // a query dim
  EXPECT_THROW(qkv_attention(qkv, 3, at::ones({2, 7}, at::kBool)), UsageError);  // 4 channels in 3 heads
}

// The bias made once (for a model's blocks): 0 where attended, -65504
// elsewhere, [B, 1, 1, T] in the dtype asked with rows 8-element aligned (as
// cuDNN needs); passed with its mask it changes nothing; without the mask,
// or not shaped like one, it is refused.
TEST(QkvAttention, KeyBiasMadeOnceMatchesTheMask) {
  auto g = seeded_cpu_generator(13);
  const int64_t B = 3, T = 13, heads = 2, D = 16;
  const at::Tensor mask = random_mask(B, T, 2, g);
  for (const at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const at::Tensor bias = attention_key_bias(mask, dt);
    ASSERT_EQ(bias.sizes(), (at::IntArrayRef{B, 1, 1, T}));
    EXPECT_EQ(bias.scalar_type(), dt);
    EXPECT_EQ(bias.stride(3), 1);
    EXPECT_EQ(bias.stride(0) % 8, 0);
    const at::Tensor want = at::where(mask, at::zeros({B, T}), at::full({B, T}, -65504.0)).to(dt);
    EXPECT_TRUE(at::equal(bias.view({B, T}), want)) << c10::toString(dt);
    EXPECT_TRUE(at::equal(attention_key_bias(mask.view({B, 1, 1, T}), dt), bias));
  }
  const at::Tensor qkv = at::randn({B, T, 3 * D}, g);
  const at::Tensor bias = attention_key_bias(mask, at::kFloat);
  EXPECT_TRUE(at::equal(qkv_attention(qkv, heads, mask, bias), qkv_attention(qkv, heads, mask)));
  EXPECT_THROW(qkv_attention(qkv, heads, at::Tensor(), bias), UsageError);                           // no mask
  EXPECT_THROW(qkv_attention(qkv, heads, mask, attention_key_bias(mask, at::kBFloat16)), UsageError);  // dtype
  EXPECT_THROW(qkv_attention(qkv, heads, mask, at::zeros({B, 1, 1, T})), UsageError);  // unaligned rows (T = 13)
  EXPECT_THROW(qkv_attention(qkv, heads, mask, at::zeros({B, T})), UsageError);        // shape
  EXPECT_THROW(attention_key_bias(at::ones({B, T}), at::kFloat), UsageError);          // not bool
}

// q and k from a dense [B, T, 2D] (as QK-norm + RoPE writes them), v the
// column block of a [B, T, 3D] (the projection's output): the same output
// and gradients as the packed form on the same values, with and without a
// mask, on odd sizes.
TEST(QkvAttention, ThreeTensorFormIsThePackedForm) {
  auto g = seeded_cpu_generator(14);
  for (auto [B, T, heads, d] : {std::array<int64_t, 4>{3, 67, 2, 16}, {2, 13, 3, 8}, {1, 5, 1, 4}}) {
    const int64_t D = heads * d;
    const at::Tensor qk0 = at::randn({B, T, 2 * D}, g), proj0 = at::randn({B, T, 3 * D}, g);
    const at::Tensor gout = at::randn({B, T, D}, g);
    for (const bool masked : {false, true}) {
      const at::Tensor mask = masked ? random_mask(B, T, 2, g) : at::Tensor();
      const at::Tensor qk = qk0.clone().requires_grad_(true), proj = proj0.clone().requires_grad_(true);
      const at::Tensor out = qkv_attention(qk.narrow(2, 0, D), qk.narrow(2, D, D), proj.narrow(2, 2 * D, D), heads, mask);
      const auto got = torch::autograd::grad({(out * gout).sum()}, {qk, proj});
      const at::Tensor packed = at::cat({qk0, proj0.narrow(2, 2 * D, D)}, 2).requires_grad_(true);
      const at::Tensor ref = qkv_attention(packed, heads, mask);
      const at::Tensor dref = torch::autograd::grad({(ref * gout).sum()}, {packed})[0];
      const std::string where = "T " + std::to_string(T) + (masked ? " masked " : " ");
      expect_close(out, ref, 1e-6, 1e-5, where + "output");
      expect_close(got[0], dref.narrow(2, 0, 2 * D), 1e-6, 1e-5, where + "d(q | k)");
      expect_close(got[1].narrow(2, 2 * D, D), dref.narrow(2, 2 * D, D), 1e-6, 1e-5, where + "dv");
      EXPECT_EQ(got[1].narrow(2, 0, 2 * D).abs().max().item<double>(), 0.0) << where << "the projection's q | k unused";
    }
  }
}

TEST(QkvAttention, ThreeTensorFormRefusesMismatchedInputs) {
  const at::Tensor q = at::randn({2, 7, 12});
  EXPECT_THROW(qkv_attention(q, q, at::randn({2, 7, 8}), 2), UsageError);                 // v's shape
  EXPECT_THROW(qkv_attention(q, q.to(at::kDouble), q, 2), UsageError);                    // k's dtype
  EXPECT_THROW(qkv_attention(q, at::Tensor(), q, 2), UsageError);                          // undefined k
  EXPECT_THROW(qkv_attention(at::Tensor(), q, q, 2), UsageError);                          // undefined q
  EXPECT_THROW(qkv_attention(q, q, q, 5), UsageError);                                     // 12 channels in 5 heads
  EXPECT_THROW(qkv_attention(q, q, q, 2, at::ones({2, 6}, at::kBool)), UsageError);        // mask length
  EXPECT_THROW(qkv_attention(q.view({14, 12}), q.view({14, 12}), q.view({14, 12}), 2), UsageError);  // 2-D
}

}  // namespace
}  // namespace perftrain::ops
