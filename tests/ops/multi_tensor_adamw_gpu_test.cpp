// The multi-tensor AdamW kernels against multi_tensor_adamw_reference (plain
// ATen fp32 on CPU copies): odd sizes, views whose pointers defeat the 16-byte
// vector path, a parameter without a gradient, no EMA, more tensors than one
// table holds; poisoned scalar slots; the bf16 shadow copies bit for bit;
// input errors; a bandwidth readout.
// Skips without a GPU.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "base/error.h"
#include "compat/compat.h"
#include "ops/multi_tensor_adamw.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

// (rtol, atol), as these tests were written.
::testing::AssertionResult close(const at::Tensor& a, const at::Tensor& ref, double rtol, double atol) {
  return perftrain::testing::all_close(a, ref, atol, rtol);
}

at::Generator gen_for(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }
const at::Device kCuda(at::kCUDA, 0);


// A contiguous CUDA copy of `t`, optionally 4 bytes past a 16-byte boundary.
at::Tensor on_gpu(const at::Tensor& t, bool misalign) {
  if (!misalign) return t.to(kCuda);
  auto buf = at::empty({t.numel() + 1}, t.options().device(kCuda));
  auto view = buf.narrow(0, 1, t.numel()).view(t.sizes());
  view.copy_(t);
  return view;
}

struct Lists {
  std::vector<at::Tensor> p, g, m, v, e;
};

struct Case {
  Lists cpu, gpu;
  at::Tensor scalars_cpu, scalars_gpu;
};

// Random weights, moments (v > 0) and EMA; tensor i is misaligned when misalign(i).
template <typename Misalign>
Case make_case(const std::vector<std::vector<int64_t>>& shapes, bool ema, at::Generator& gen, Misalign misalign) {
  Case c;
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto p = at::randn(shapes[i], gen, at::kFloat);
    auto m = 0.01 * at::randn(shapes[i], gen, at::kFloat);
    auto v = 1e-4 * at::rand(shapes[i], gen, at::kFloat);
    auto e = p + 0.1 * at::randn(shapes[i], gen, at::kFloat);
    const bool mis = misalign(i);
    c.cpu.p.push_back(p.clone()), c.gpu.p.push_back(on_gpu(p, mis));
    c.cpu.m.push_back(m.clone()), c.gpu.m.push_back(on_gpu(m, mis && i % 2 == 0));
    c.cpu.v.push_back(v.clone()), c.gpu.v.push_back(on_gpu(v, false));
    if (ema) c.cpu.e.push_back(e.clone()), c.gpu.e.push_back(on_gpu(e, mis));
  }
  c.scalars_cpu = make_adamw_scalars(at::kCPU, 1.0);
  c.scalars_gpu = make_adamw_scalars(kCuda, 1.0);
  return c;
}

void new_grads(Case& c, at::Generator& gen, double gain, int skip_index) {
  c.cpu.g.clear(), c.gpu.g.clear();
  for (size_t i = 0; i < c.cpu.p.size(); ++i) {
    if (static_cast<int>(i) == skip_index) {  // no gradient for this one
      c.cpu.g.emplace_back(), c.gpu.g.emplace_back();
      continue;
    }
    auto g = gain * at::randn(c.cpu.p[i].sizes(), gen, at::kFloat);
    c.cpu.g.push_back(g);
    c.gpu.g.push_back(on_gpu(g, i % 3 == 1));
  }
}

void expect_close(const Case& c, const std::string& when) {
  for (size_t i = 0; i < c.cpu.p.size(); ++i) {
    // fp32 both sides, FMA contraction, summation order and 1 - beta (double
    // here, float there) differ; Adam's m / sqrt(v) amplifies that where v is
    // tiny: measured up to 9e-6 absolute on p after 3 steps of lr 1e-3, so p and
    // the EMA get 2e-5 absolute (a wrong formula moves them by ~lr), m and v
    // 1e-4 relative; absolute
    // floors far below each quantity's size (p O(1), m O(1e-2) and may cancel, v O(1e-4)).
    EXPECT_TRUE(close(c.gpu.p[i], c.cpu.p[i], 1e-5, 2e-5)) << "p " << i << " " << when;
    EXPECT_TRUE(close(c.gpu.m[i], c.cpu.m[i], 1e-4, 1e-7)) << "m " << i << " " << when;
    EXPECT_TRUE(close(c.gpu.v[i], c.cpu.v[i], 1e-4, 1e-12)) << "v " << i << " " << when;
    if (!c.cpu.e.empty()) EXPECT_TRUE(close(c.gpu.e[i], c.cpu.e[i], 1e-5, 2e-5)) << "ema " << i << " " << when;
  }
  auto s = c.scalars_gpu.cpu(), r = c.scalars_cpu;
  auto slot_of = [](const at::Tensor& t, int64_t slot) { return t[slot].item<float>(); };
  // Norm: fp32 partial sums (fp64 across chunks) against ATen's norm: 1e-5 relative.
  EXPECT_NEAR(slot_of(s, kSlotGradNorm), slot_of(r, kSlotGradNorm), 1e-5 * slot_of(r, kSlotGradNorm)) << when;
  for (int64_t slot : {kSlotLossScale, kSlotLr, kSlotSkipped, kSlotStep, kSlotGoodSteps})
    EXPECT_EQ(slot_of(s, slot), slot_of(r, slot)) << "slot " << slot << " " << when;
}

MultiTensorAdamWOptions busy_options() {
  MultiTensorAdamWOptions o;
  o.lr = 2e-2, o.warmup_steps = 2, o.beta1 = 0.9, o.beta2 = 0.99, o.eps = 1e-8, o.weight_decay = 0.1;
  o.grad_clip = 2.0, o.ema_decay = 0.9, o.ema_warmup = true;
  return o;
}

void run_case(Case& c, const MultiTensorAdamWOptions& o, at::Generator& gen, int steps, int skip_index) {
  MultiTensorAdamW op(c.gpu.p, c.gpu.m, c.gpu.v, c.gpu.e, c.scalars_gpu, o);
  // The prepare kernel must write every per-step slot: poison them first.
  c.scalars_gpu.narrow(0, kSlotGradNorm, 2).fill_(std::numeric_limits<float>::quiet_NaN());
  // kSlotScheduleStep is state (the LR schedule's position), not written per step.
  for (int64_t slot = kSlotGoodSteps + 1; slot < adamw_scalar_slots(); ++slot)
    if (slot != kSlotScheduleStep) c.scalars_gpu[slot].fill_(std::numeric_limits<float>::quiet_NaN());
  for (int step = 1; step <= steps; ++step) {
    // Gain 1: norm above the clip of 2 (clipped); gain 1e-3: below it.
    new_grads(c, gen, step % 2 ? 1.0 : 1e-3, skip_index);
    op.step(c.gpu.g);
    multi_tensor_adamw_reference(c.cpu.p, c.cpu.g, c.cpu.m, c.cpu.v, c.cpu.e, c.scalars_cpu, o);
    expect_close(c, "step " + std::to_string(step));
  }
}

TEST(MultiTensorAdamWGpu, MatchesReferenceOnOddSizesAndMisalignedViews) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto gen = gen_for(31);
  const std::vector<std::vector<int64_t>> shapes = {{1}, {7}, {1000}, {65537}, {384, 1152}, {3, 5, 7}, {131072}};
  Case c = make_case(shapes, /*ema=*/true, gen, [](size_t i) { return i == 2 || i == 3; });
  run_case(c, busy_options(), gen, 4, /*skip_index=*/5);
}

TEST(MultiTensorAdamWGpu, MatchesReferenceWithoutEma) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto gen = gen_for(32);
  Case c = make_case({{65536}, {17, 3}, {1}}, /*ema=*/false, gen, [](size_t) { return false; });
  auto o = busy_options();
  o.grad_clip = 0, o.warmup_steps = 0;
  run_case(c, o, gen, 3, -1);
}

// Without the norm: one launch group fewer, the same update as the reference,
// and the norm slot NaN (poisoned to 0 first, so the kernel must write it).
TEST(MultiTensorAdamWGpu, MatchesReferenceWithoutTheNorm) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto gen = gen_for(35);
  Case c = make_case({{65537}, {384, 1152}, {5}}, /*ema=*/true, gen, [](size_t i) { return i == 0; });
  auto o = busy_options();
  o.grad_clip = 0, o.grad_norm = false;
  MultiTensorAdamW op(c.gpu.p, c.gpu.m, c.gpu.v, c.gpu.e, c.scalars_gpu, o);
  auto with_norm = o;
  with_norm.grad_norm = true;
  EXPECT_EQ(op.launches_per_step() + 1, MultiTensorAdamW(c.gpu.p, c.gpu.m, c.gpu.v, c.gpu.e,
                                                          make_adamw_scalars(kCuda, 1.0), with_norm)
                                                .launches_per_step());
  for (int step = 1; step <= 3; ++step) {
    c.scalars_gpu.narrow(0, kSlotGradNorm, 1).fill_(0.f);
    new_grads(c, gen, 1.0, -1);
    op.step(c.gpu.g);
    multi_tensor_adamw_reference(c.cpu.p, c.cpu.g, c.cpu.m, c.cpu.v, c.cpu.e, c.scalars_cpu, o);
    for (size_t i = 0; i < c.cpu.p.size(); ++i) {
      EXPECT_TRUE(close(c.gpu.p[i], c.cpu.p[i], 1e-5, 2e-5)) << "p " << i << " step " << step;
      EXPECT_TRUE(close(c.gpu.e[i], c.cpu.e[i], 1e-5, 2e-5)) << "ema " << i << " step " << step;
    }
    const auto s = c.scalars_gpu.cpu();
    EXPECT_TRUE(std::isnan(s[kSlotGradNorm].item<float>())) << "step " << step;
    EXPECT_TRUE(std::isnan(c.scalars_cpu[kSlotGradNorm].item<float>())) << "step " << step;
    EXPECT_EQ(s[kSlotStep].item<float>(), step);
  }
}

TEST(MultiTensorAdamWGpu, SplitsIntoSeveralTablesBeyondOnesCapacity) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto gen = gen_for(33);
  std::vector<std::vector<int64_t>> shapes;
  for (int i = 0; i < 450; ++i) shapes.push_back({1 + (i * 7919) % 3001});
  shapes.push_back({70000});
  shapes.push_back({0});  // empty tensors take no table entry
  Case c = make_case(shapes, true, gen, [](size_t i) { return i % 5 == 0; });
  {
    MultiTensorAdamW op(c.gpu.p, c.gpu.m, c.gpu.v, c.gpu.e, c.scalars_gpu, busy_options());
    EXPECT_EQ(op.launches_per_step(), 5) << "451 tensors: two tables of up to 384";
  }
  run_case(c, busy_options(), gen, 3, /*skip_index=*/400);
}

TEST(MultiTensorAdamWGpu, RepeatedStepsAreBitwiseDeterministic) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto gen = gen_for(34);
  const std::vector<std::vector<int64_t>> shapes = {{3000, 1000}, {65537}, {5}};
  Case a = make_case(shapes, true, gen, [](size_t) { return false; });
  Case b;
  for (auto l : {&Lists::p, &Lists::m, &Lists::v, &Lists::e})
    for (auto& t : a.gpu.*l) (b.gpu.*l).push_back(t.clone());
  b.scalars_gpu = a.scalars_gpu.clone();
  new_grads(a, gen, 1.0, -1);
  MultiTensorAdamW opa(a.gpu.p, a.gpu.m, a.gpu.v, a.gpu.e, a.scalars_gpu, busy_options());
  MultiTensorAdamW opb(b.gpu.p, b.gpu.m, b.gpu.v, b.gpu.e, b.scalars_gpu, busy_options());
  opa.step(a.gpu.g);
  opb.step(a.gpu.g);
  EXPECT_TRUE(a.scalars_gpu.equal(b.scalars_gpu));
  for (size_t i = 0; i < shapes.size(); ++i) EXPECT_TRUE(a.gpu.p[i].equal(b.gpu.p[i]));
}

TEST(MultiTensorAdamWGpu, Bf16ShadowsFollowTheParametersBitForBit) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto gen = gen_for(35);
  // Odd sizes (the scalar tail), a misaligned view (the scalar path), more
  // than one chunk, a parameter without gradient, one without a shadow.
  const std::vector<std::vector<int64_t>> shapes = {{7}, {1000}, {65537}, {384, 1152}, {3, 5, 7}, {131072}};
  Case c = make_case(shapes, /*ema=*/true, gen, [](size_t i) { return i == 2; });
  std::vector<at::Tensor> shadows;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (i == 4) {
      shadows.emplace_back();  // no shadow for this one
      continue;
    }
    // Poisoned: every element must be written before it is read back.
    shadows.push_back(at::full(shapes[i], std::numeric_limits<float>::quiet_NaN(),
                               at::TensorOptions().device(kCuda).dtype(at::kBFloat16)));
  }
  MultiTensorAdamW op(c.gpu.p, c.gpu.m, c.gpu.v, c.gpu.e, c.scalars_gpu, busy_options(), {}, shadows);
  // The caller fills the shadows once; the parameter without gradient keeps that copy.
  shadows[1].copy_(c.gpu.p[1]);
  for (int step = 1; step <= 3; ++step) {
    new_grads(c, gen, step % 2 ? 1.0 : 1e-3, /*skip_index=*/1);
    op.step(c.gpu.g);
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (!shadows[i].defined()) continue;
      // Round-to-nearest-even on both sides: the same bits.
      EXPECT_TRUE(at::equal(shadows[i], c.gpu.p[i].to(at::kBFloat16)))
          << "shadow " << i << " after step " << step;
    }
  }
  // A shadow of the wrong dtype or size is refused up front.
  std::vector<at::Tensor> bad = shadows;
  bad[0] = at::empty({8}, at::TensorOptions().device(kCuda).dtype(at::kBFloat16));
  EXPECT_THROW(MultiTensorAdamW(c.gpu.p, c.gpu.m, c.gpu.v, c.gpu.e, c.scalars_gpu, busy_options(), {}, bad),
               UsageError);
  bad[0] = at::empty({7}, at::TensorOptions().device(kCuda).dtype(at::kHalf));
  EXPECT_THROW(MultiTensorAdamW(c.gpu.p, c.gpu.m, c.gpu.v, c.gpu.e, c.scalars_gpu, busy_options(), {}, bad),
               UsageError);
}

TEST(MultiTensorAdamWGpu, RejectsMismatchedInputs) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto gen = gen_for(35);
  Case c = make_case({{10}, {4, 4}}, true, gen, [](size_t) { return false; });
  MultiTensorAdamW op(c.gpu.p, c.gpu.m, c.gpu.v, c.gpu.e, c.scalars_gpu, busy_options(), {"a", "b"});
  auto expect_error = [&](std::vector<at::Tensor> g, const std::string& needle) {
    try {
      op.step(g);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto ok = at::randn({4, 4}, gen, at::kFloat).to(kCuda);
  expect_error({at::randn({10}, gen, at::kDouble).to(kCuda), ok}, "float32");
  expect_error({at::randn({10}, gen, at::kFloat), ok}, "cpu");
  expect_error({at::randn({11}, gen, at::kFloat).to(kCuda), ok}, "sizes");
  expect_error({at::randn({20}, gen, at::kFloat).to(kCuda).slice(0, 0, 20, 2), ok}, "contiguous");
  expect_error({ok}, "1 gradients for 2 parameters");
  try {
    MultiTensorAdamW bad({c.gpu.p[0]}, {c.gpu.m[1]}, {c.gpu.v[0]}, {}, c.scalars_gpu, busy_options(), {"a"});
    ADD_FAILURE() << "no error for a mis-shaped exp_avg";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("exp_avg of parameter 'a'"), std::string::npos) << e.what();
  }
}

// Not a pass/fail check: bytes moved per step over time, against the ~4.3 TB/s
// copy bandwidth measured on the H200.
TEST(MultiTensorAdamWGpu, ReportsBandwidth) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const int64_t n = 64 << 20;
  std::vector<at::Tensor> p, g, m, v, e;
  auto f = at::TensorOptions().dtype(at::kFloat).device(kCuda);
  for (int i = 0; i < 4; ++i) {
    for (auto* l : {&p, &g, &m, &v, &e}) l->push_back(at::empty({n / 4}, f).uniform_(-1, 1));
    v.back().abs_();
  }
  MultiTensorAdamW op(p, m, v, e, make_adamw_scalars(kCuda, 1.0), busy_options());
  op.step(g);
  at::cuda::device_synchronize();
  const int reps = 20;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) op.step(g);
  at::cuda::device_synchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  const double bytes = 10.0 * 4 * n;  // sum of squares reads g; the update reads 5 and writes 4
  std::printf("    multi_tensor_adamw: %lld elements, %.3f ms/step, %.0f GB/s\n", static_cast<long long>(n), s * 1e3,
              bytes / s / 1e9);
  EXPECT_GT(s, 0);
}

}  // namespace
}  // namespace perftrain::ops
