// ops/projected_attention on the GPU (the qkv projection's backward fed
// straight from the attention's gradients): forward and all three gradients
// against the fp32 reference, on the DiT head sizes (64, 72) and odd ones,
// with cuDNN's attention and with our whole-head kernels
// (ops/attention_head_fwd, ops/attention_head_bwd); the same result as the
// unfused linear + qkv_attention; and the accumulating product (D += A B) it
// relies on. Skips without a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/matmul.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "compat/compat.h"
#include "attention_gpu_cases.h"
#include "ops/attention_head_bwd.h"
#include "ops/attention_head_fwd.h"
#include "ops/cublaslt_workspace.h"
#include "ops/linear.h"
#include "ops/projected_attention.h"
#include "ops/qkv_attention.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

using namespace attention_gpu_cases;
using perftrain::testing::rel_l2;

struct Grads {
  at::Tensor out, dh, dw, db;
};

// bf16 activations h [B, T, D], the fp32 master weight [3D, D] and bias
// [3D] of the projection, and the output's gradient, drawn from g in this order.
struct Inputs {
  at::Tensor h, w, b, gout;
};

Inputs random_inputs(const Shape& s, at::Generator& g) {
  Inputs in;
  in.h = rnd({s.batch, s.tokens, s.dim}, g).to(at::kBFloat16);
  in.w = rnd({3 * s.dim, s.dim}, g, 1.0 / std::sqrt(double(s.dim)));
  in.b = rnd({3 * s.dim}, g, 0.1);
  in.gout = rnd({s.batch, s.tokens, s.dim}, g);
  return in;
}

// Output and gradients of (out * gout).sum() through `f`, leaves made here.
template <typename F>
Grads run(F f, const Inputs& in) {
  at::Tensor hl = in.h.detach().requires_grad_(true), wl = in.w.detach().requires_grad_(true),
             bl = in.b.detach().requires_grad_(true);
  at::Tensor out = f(hl, wl, bl);
  auto g = torch::autograd::grad({(out.to(at::kFloat) * in.gout).sum()}, {hl, wl, bl});
  return {out.detach(), g[0], g[1], g[2]};
}

// The fp32 reference (the projection and attention in fp32 from h in fp32).
Grads reference(const Inputs& in, int64_t heads) {
  return run([&](auto x, auto wt, auto bt) { return projected_attention_reference(x.to(at::kFloat), wt, bt, heads); },
             in);
}

TEST(ProjectedAttentionGpu, MatchesFp32ReferenceAndTheUnfusedOps) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto g = cuda_gen(21);
  const int64_t fallbacks_before = gemm_fallback_count();
  // cuDNN's attention backward on both sides, so that the fusion is compared
  // on the same dq/dk/dv (ours is compared with cuDNN's in its own test).
  const bool was_own = whole_head_attention_backward();
  set_whole_head_attention_backward(false);
  // DiT-S/2's head dim 64, DiT-XL/2's 72, odd token counts, a single sample.
  for (const Shape s : {Shape{3, 17, 96, 3}, Shape{2, 256, 144, 2}, Shape{4, 64, 384, 6}, Shape{1, 33, 128, 2}}) {
    const Inputs in = random_inputs(s, g);
    const int64_t heads = s.heads;

    const Grads ref = reference(in, heads);
    const Grads got = run([&](auto x, auto wt, auto bt) { return projected_attention(x, wt, bt, heads); }, in);
    const Grads unfused =
        run([&](auto x, auto wt, auto bt) { return qkv_attention(linear(x, wt, bt), heads); }, in);

    const std::string what = describe(s);
    ASSERT_EQ(got.out.scalar_type(), at::kBFloat16) << what;
    ASSERT_EQ(got.dh.scalar_type(), at::kBFloat16) << what;
    ASSERT_EQ(got.dw.scalar_type(), at::kFloat) << what;
    ASSERT_EQ(got.db.scalar_type(), at::kFloat) << what;
    // bf16 operands (2^-9 relative rounding) through two products and a
    // softmax: ~1% in relative L2 against fp32; NaN fails (NaN < x is false).
    EXPECT_LT(rel_l2(got.out, ref.out), 1.5e-2) << what << " out";
    EXPECT_LT(rel_l2(got.dh, ref.dh), 2e-2) << what << " dh";
    EXPECT_LT(rel_l2(got.dw, ref.dw), 2e-2) << what << " dW";
    EXPECT_LT(rel_l2(got.db, ref.db), 2e-2) << what << " db";
    // The unfused ops run the same products on the same bf16 values; only the
    // order of dh's three partial sums (and their bf16 rounding) differs.
    EXPECT_LT(rel_l2(got.out, unfused.out), 1e-6) << what << " out vs unfused";
    EXPECT_LT(rel_l2(got.dh, unfused.dh), 1e-2) << what << " dh vs unfused";
    EXPECT_LT(rel_l2(got.dw, unfused.dw), 1e-5) << what << " dW vs unfused";
    // The q and v bias blocks: the same sums of the same bf16 values.
    for (const int64_t block : {0, 2})
      EXPECT_LT(rel_l2(got.db.narrow(0, block * s.dim, s.dim), unfused.db.narrow(0, block * s.dim, s.dim)), 1e-5)
          << what << " db block " << block << " vs unfused";
    // The key block: exactly zero here, and only rounding noise elsewhere:
    // in the fp32 reference, and in the unfused sums of bf16 dk (measured
    // 4e-4 to 1.2e-3 of the whole gradient on these shapes).
    const auto k_block = [&](const Grads& r) { return r.db.narrow(0, s.dim, s.dim).cpu(); };
    EXPECT_EQ(k_block(got).abs().max().item<float>(), 0.f) << what << " db_k";
    EXPECT_LT(k_block(ref).norm().item<double>(), 1e-4 * ref.db.norm().item<double>()) << what << " reference db_k";
    EXPECT_LT(k_block(unfused).norm().item<double>(), 1e-2 * unfused.db.norm().item<double>())
        << what << " unfused db_k";
  }
  EXPECT_EQ(gemm_fallback_count(), fallbacks_before) << "cuBLASLt refused a product on these shapes";
  set_whole_head_attention_backward(was_own);
}

// The whole-head backward (ops/attention_head_bwd, sm_90 only, 256 tokens,
// head dims 64 and 72) against the fp32 reference and cuDNN's backward.
TEST(ProjectedAttentionGpu, OwnBackwardMatchesReferenceAndCudnn) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  if (at::cuda::getCurrentDeviceProperties()->major != 9) GTEST_SKIP() << "not sm_90";
  auto g = cuda_gen(33);
  for (const Shape s : {Shape{2, 256, 128, 2}, Shape{3, 256, 384, 6}, Shape{2, 256, 216, 3}}) {
    const Inputs in = random_inputs(s, g);
    const int64_t heads = s.heads;
    const auto attention = [&](auto x, auto wt, auto bt) { return projected_attention(x, wt, bt, heads); };
    const Grads ref = reference(in, heads);
    const bool was_own = whole_head_attention_backward();
    set_whole_head_attention_backward(false);
    const Grads cudnn = run(attention, in);
    set_whole_head_attention_backward(true);
    const Grads own = run(attention, in);
    set_whole_head_attention_backward(was_own);
    const std::string what = describe(s);
    EXPECT_LT(rel_l2(own.dh, ref.dh), 2e-2) << what << " dh";
    EXPECT_LT(rel_l2(own.dw, ref.dw), 2e-2) << what << " dW";
    EXPECT_LT(rel_l2(own.db, ref.db), 2e-2) << what << " db";
    EXPECT_LT(rel_l2(own.dh, cudnn.dh), 1.5e-2) << what << " dh vs cuDNN";
    EXPECT_LT(rel_l2(own.dw, cudnn.dw), 1.5e-2) << what << " dW vs cuDNN";
    EXPECT_EQ(own.db.narrow(0, s.dim, s.dim).abs().max().item<float>(), 0.f) << what << " db_k";
  }
}

// The whole-head forward (ops/attention_head_fwd, with our backward after
// it) against the fp32 reference and against cuDNN's forward (with our
// backward too), at head dims 64 and 72.
TEST(ProjectedAttentionGpu, OwnForwardMatchesReferenceAndCudnn) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  if (at::cuda::getCurrentDeviceProperties()->major != 9) GTEST_SKIP() << "not sm_90";
  auto g = cuda_gen(44);
  const bool was_fwd = whole_head_attention_forward(), was_bwd = whole_head_attention_backward();
  set_whole_head_attention_backward(true);
  for (const Shape s : {Shape{2, 256, 128, 2}, Shape{3, 256, 384, 6}, Shape{2, 256, 216, 3}}) {
    const Inputs in = random_inputs(s, g);
    const int64_t heads = s.heads;
    const auto attention = [&](auto x, auto wt, auto bt) { return projected_attention(x, wt, bt, heads); };
    const Grads ref = reference(in, heads);
    set_whole_head_attention_forward(false);
    const Grads cudnn = run(attention, in);
    set_whole_head_attention_forward(true);
    const Grads own = run(attention, in);
    const std::string what = describe(s);
    EXPECT_LT(rel_l2(own.out, ref.out), 1.5e-2) << what << " out";
    EXPECT_LT(rel_l2(own.out, cudnn.out), 1e-2) << what << " out vs cuDNN";
    EXPECT_LT(rel_l2(own.dh, ref.dh), 2e-2) << what << " dh";
    EXPECT_LT(rel_l2(own.dw, ref.dw), 2e-2) << what << " dW";
    EXPECT_LT(rel_l2(own.dh, cudnn.dh), 1.5e-2) << what << " dh vs cuDNN's forward";
  }
  set_whole_head_attention_forward(was_fwd);
  set_whole_head_attention_backward(was_bwd);
}

TEST(ProjectedAttentionGpu, AccumulatingProductAddsToD) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto g = cuda_gen(5);
  for (const auto& [m, n, k] : std::vector<std::array<int64_t, 3>>{{256, 96, 96}, {8192, 384, 384}, {77, 40, 24}}) {
    const at::Tensor a = rnd({m, k}, g).to(at::kBFloat16), b = rnd({k, n}, g, 0.2).to(at::kBFloat16);
    const at::Tensor d0 = rnd({m, n}, g).to(at::kBFloat16);
    at::Tensor d = d0.clone();
    ASSERT_TRUE(try_gemm_lt(a, false, b, false, d, kernels::GemmEpilogue::kDefault, at::Tensor(), at::Tensor(),
                            /*accumulate=*/true));
    const at::Tensor want = d0.to(at::kDouble) + at::matmul(a.to(at::kDouble), b.to(at::kDouble));
    EXPECT_LT(rel_l2(d, want), 1e-2) << m << "x" << n << "x" << k;
    // Without accumulate the old contents are ignored (poisoned with NaN).
    at::Tensor fresh = at::full_like(d0, std::numeric_limits<double>::quiet_NaN());
    ASSERT_TRUE(try_gemm_lt(a, false, b, false, fresh, kernels::GemmEpilogue::kDefault));
    EXPECT_LT(rel_l2(fresh, at::matmul(a.to(at::kDouble), b.to(at::kDouble))), 1e-2) << m << "x" << n << "x" << k;
  }
}

}  // namespace
}  // namespace perftrain::ops
