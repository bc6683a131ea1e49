// ops::gelu_mlp on the GPU: forward and backward against float64 over the
// DiT shapes and odd ones, with the fallback count (0 expected on the DiT
// shapes at training batch sizes), on every backward form (our DGELU
// kernel with fc1's bias gradient from its column partials, cuBLASLt's DGELU
// epilogue, split with ATen's or the fused GELU pass) and with the activation
// recomputed; kAuto's timed choice of the form, once a shape; where the
// fused GELU cannot run (H % 8) the ATen fallback is counted and right;
// mixed devices raise UsageError; forward and backward capture into a CUDA
// graph and replay to the eager result. Skips without a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "compat/compat.h"
#include "gpu_products.h"
#include "ops/gelu_mlp.h"

namespace perftrain::ops {
namespace {

using namespace gpu_products;

// keep_activation: gelu_mlp's.
void check_gelu_mlp(at::ScalarType dt, int64_t m, int64_t c, int64_t h, bool dit, uint64_t seed,
                    bool keep_activation = true) {
  at::Generator g = cuda_gen(seed);
  const std::string name = case_name("gelu_mlp", dt, m, c, h);
  const at::Tensor x = rnd({m, c}, g, dt, 1.0, 0.2).requires_grad_(true);
  const at::Tensor w1 = master({h, c}, g, dt, 1.5 / std::sqrt(double(c))).requires_grad_(true);
  const at::Tensor b1 = rnd({h}, g, at::kFloat, 0.5).requires_grad_(true);
  const at::Tensor w2 = master({c, h}, g, dt, 1.0 / std::sqrt(double(h))).requires_grad_(true);
  const at::Tensor b2 = rnd({c}, g, at::kFloat).requires_grad_(true);
  const at::Tensor dy = rnd({m, c}, g, dt);
  const std::vector<at::Tensor> params = {x, w1, b1, w2, b2};
  std::vector<at::Tensor> got;
  count_fallbacks(name, dit && m >= 8192, [&] {
    const at::Tensor y = gelu_mlp(x, w1, b1, w2, b2, keep_activation);
    got = torch::autograd::grad({y}, params, {dy});
    got.insert(got.begin(), y);
  });
  ASSERT_EQ(got[0].scalar_type(), dt) << name;
  std::vector<at::Tensor> ref;
  for (const auto& p : params) ref.push_back(p.detach().to(at::kDouble).requires_grad_(true));
  const at::Tensor yr = at::linear(at::gelu(at::linear(ref[0], ref[1], ref[2]), "tanh"), ref[3], ref[4]);
  std::vector<at::Tensor> want = torch::autograd::grad({yr}, ref, {dy.to(at::kDouble)});
  want.insert(want.begin(), yr.detach());
  const char* what[] = {"y", "dx", "dW1", "db1", "dW2", "db2"};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_LT(rel_l2(got[i], want[i]), tolerance(dt)) << name << " " << what[i];
}

TEST(GeluMlpGpu, MatchesFloat64) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  struct CH {
    int64_t c, h;
    bool dit;
  };
  const std::vector<CH> shapes = {{384, 1536, true}, {1152, 4608, true}, {40, 24, false}};
  uint64_t seed = 500;
  // The DGELU epilogue first (the default picks the split form for the
  // smaller products), then the split form on the same shapes.
  set_gelu_mlp_dgelu_path(DGeluPath::kEpilogue);
  for (const auto dt : {at::kBFloat16, at::kFloat})
    for (const CH& s : shapes)
      for (const int64_t m : kRows) check_gelu_mlp(dt, m, s.c, s.h, s.dit, seed++);
  check_gelu_mlp(at::kHalf, 8192, 384, 1536, true, seed++);
  // Keeping only the pre-activation (GELU computed again by ATen for dW2,
  // where the forward's came from cuBLASLt's epilogue): same tolerance.
  for (const CH& s : shapes) check_gelu_mlp(at::kBFloat16, 8192, s.c, s.h, s.dit, seed++, false);
  check_gelu_mlp(at::kBFloat16, 77, 384, 1536, true, seed++, false);
  // pre's gradient from a plain product and GELU's backward in place (the
  // split form), by ATen's pass and by the fused one that also gives db1:
  // same tolerance.
  set_gelu_mlp_dgelu_path(DGeluPath::kSplit);
  for (const GeluBackwardForm form : {GeluBackwardForm::kAten, GeluBackwardForm::kFused}) {
    set_gelu_mlp_gelu_backward_form(form);
    for (const CH& s : shapes) check_gelu_mlp(at::kBFloat16, 8192, s.c, s.h, s.dit, seed++);
    check_gelu_mlp(at::kBFloat16, 77, 384, 1536, true, seed++);
  }
  check_gelu_mlp(at::kFloat, 77, 40, 24, false, seed++);  // the fused pass in fp32, odd widths
  set_gelu_mlp_gelu_backward_form(GeluBackwardForm::kAuto);
  // Our kernel (bf16; rows % 128: one tile row and many; 77 rows and fp32
  // take the split form): same tolerance, db1 from its column partials.
  set_gelu_mlp_dgelu_path(DGeluPath::kKernel);
  for (const CH& s : shapes)
    for (const int64_t m : {int64_t(128), int64_t(8192)}) check_gelu_mlp(at::kBFloat16, m, s.c, s.h, s.dit, seed++);
  check_gelu_mlp(at::kBFloat16, 8192, 1152, 4608, true, seed++, false);
  check_gelu_mlp(at::kBFloat16, 77, 384, 1536, true, seed++);
  check_gelu_mlp(at::kFloat, 256, 384, 1536, true, seed++);
  set_gelu_mlp_dgelu_path(DGeluPath::kAuto);
}

// kAuto with GEMM tuning on times the forms on a shape's first backward,
// records the choice and each time beside the products' tuning and keeps
// it: a second backward of the shape times nothing. Every form is right.
TEST(GeluMlpGpu, AutoTimesTheFormsOnceAShapeAndIsRight) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  ASSERT_GE(gemm_tune_candidates(), 2) << "the default tunes";
  set_gelu_mlp_dgelu_path(DGeluPath::kAuto);
  // 8192 x 4096 outputs: the size rule's form is the split one, candidate 0;
  // our kernel is timed on an sm_90 GPU and refused elsewhere.
  const bool sm90 = compat::current_device_is_sm90();
  const std::string what = "DGELU form m=8192 n=4096 k=1024 (0: split, 1: kernel, 2: epilogue)";
  auto records_of_shape = [&] {
    int n = 0;
    for (const auto& r : gemm_tune_records()) {
      if (r.what.rfind(what, 0) != 0) continue;
      ++n;
      EXPECT_NE(r.what.find(": split "), std::string::npos) << r.what;
      EXPECT_EQ(r.what.find(", kernel refused") == std::string::npos, sm90) << r.what;
      EXPECT_NE(r.what.find(", epilogue "), std::string::npos) << r.what;
      EXPECT_EQ(r.candidates, 3);
      EXPECT_TRUE(r.chosen >= 0 && r.chosen < 3) << r.chosen;
      EXPECT_GT(r.heuristic_ms, 0.0);
      EXPECT_GT(r.chosen_ms, 0.0);
      EXPECT_LE(r.chosen_ms, r.heuristic_ms);
    }
    return n;
  };
  check_gelu_mlp(at::kBFloat16, 8192, 1024, 4096, true, 950);
  EXPECT_EQ(records_of_shape(), 1) << "the first backward times the two forms";
  check_gelu_mlp(at::kBFloat16, 8192, 1024, 4096, true, 951);
  EXPECT_EQ(records_of_shape(), 1) << "the second keeps the choice";
}

// H = 20 is no multiple of 8: the fused GELU cannot run, the products fall
// back to ATen (counted), and the result is still right. The DGELU epilogue
// is forced: by default so small a product takes the split form, which
// never tries it.
TEST(GeluMlpGpu, FallbackIsCountedAndRight) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  set_gelu_mlp_dgelu_path(DGeluPath::kEpilogue);
  const int64_t before = gemm_fallback_count();
  check_gelu_mlp(at::kBFloat16, 77, 40, 20, false, 900);
  EXPECT_GE(gemm_fallback_count() - before, 2) << "GELU_AUX_BIAS and DGELU should both have fallen back";
  set_gelu_mlp_dgelu_path(DGeluPath::kAuto);
  const int64_t split_before = gemm_fallback_count();
  check_gelu_mlp(at::kBFloat16, 77, 40, 20, false, 901);
  EXPECT_GE(gemm_fallback_count() - split_before, 1) << "GELU_AUX_BIAS should have fallen back";
}

TEST(GeluMlpGpu, MixedDevicesRaiseUsageError) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(3);
  const at::Tensor x = rnd({4, 40}, g, at::kBFloat16);
  const at::Tensor w1 = rnd({24, 40}, g, at::kFloat), b1 = rnd({24}, g, at::kFloat);
  EXPECT_THROW(gelu_mlp(x, w1, b1, at::randn({40, 24}), at::randn({40}).to(kCuda)), UsageError);
  EXPECT_THROW(gelu_mlp(x, w1, b1.cpu(), w1.t().contiguous(), at::Tensor()), UsageError);
}

// The DiT-S/2 MLP, forward and backward, in a CUDA graph.
TEST(GeluMlpGpu, CapturesInCudaGraph) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(78);
  const at::ScalarType bf = at::kBFloat16;
  const int64_t b = 4, t = 256, c = 384;
  const at::Tensor x = rnd({b, t, c}, g, bf).requires_grad_(true);
  const at::Tensor w1 = master({4 * c, c}, g, bf, 0.07).requires_grad_(true);
  const at::Tensor b1 = rnd({4 * c}, g, at::kFloat).requires_grad_(true);
  const at::Tensor w2 = master({c, 4 * c}, g, bf, 0.03).requires_grad_(true);
  const at::Tensor b2 = rnd({c}, g, at::kFloat).requires_grad_(true);
  const at::Tensor dm = rnd({b, t, c}, g, bf), x_next = rnd({b, t, c}, g, bf);
  expect_capture_matches_eager(
      [&] {
        const at::Tensor y = gelu_mlp(x, w1, b1, w2, b2);
        std::vector<at::Tensor> out = torch::autograd::grad({y}, {x, w1, b1, w2, b2}, {dm});
        out.push_back(y.detach());
        return out;
      },
      x, x_next);
}

}  // namespace
}  // namespace perftrain::ops
