// Each diagnosis rule on synthetic steps: it fires with its evidence and
// advice where the step shows the problem, and stays quiet on a step just
// short of it. One launch-bound step goes the whole way from a timeline.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>

#include "observe/profile/diagnosis.h"
#include "support/findings.h"
#include "support/test_support.h"

namespace {

using namespace perftrain::observe::profile;

using perftrain::testing::contains;

using perftrain::testing::find_finding;

// A healthy 10 ms step: GPU busy 9.5 ms, about half of it matrix products and
// attention, 300 kernels of 30 us.
StepAnalysis healthy() {
  StepAnalysis a;
  a.steps = 4;
  a.step_ms = 10, a.window_ms = 40;
  a.gpu_busy_ms = 9.5, a.idle_other_ms = 0.5;
  a.busy_by_phase = {{"forward", 3}, {"backward", 6}, {"optimizer", 0.5}};
  a.matrix_ms = 4.0, a.attention_ms = 1.0, a.elementwise_ms = 3.0, a.copy_ms = 1.5;
  a.kernels_per_step = 300, a.median_kernel_us = 30, a.launch_cpu_ms = 2;
  return a;
}

RunFacts facts() {
  RunFacts f;
  f.precision = "bf16";
  f.fused_kernels = true;
  f.graph = false;
  f.prefetch = 3;
  return f;
}

TEST(ProfileDiagnosis, AHealthyStepHasNoFindings) {
  EXPECT_TRUE(diagnose(healthy(), facts()).empty());
  EXPECT_TRUE(contains(format_findings({}), "Nothing stands out"));
}

TEST(ProfileDiagnosis, LaunchBound) {
  StepAnalysis a = healthy();
  a.gpu_busy_ms = 4, a.idle_other_ms = 6;  // 60% idle
  a.kernels_per_step = 900, a.median_kernel_us = 6, a.launch_cpu_ms = 5;
  auto f = diagnose(a, facts());
  std::optional<Finding> x = find_finding(f, "launch-bound");
  ASSERT_TRUE(x);
  EXPECT_EQ(f.front().id, "launch-bound");  // the largest share first
  EXPECT_TRUE(contains(x->title, "60%")) << x->title;
  EXPECT_TRUE(contains(x->evidence, "900 kernels per step, median 6.0 us")) << x->evidence;
  EXPECT_TRUE(contains(x->advice, "speed.graph=true")) << x->advice;
  // captured: other advice
  a.captured = true, a.graph_launches = 4;
  x = find_finding(diagnose(a, facts()), "launch-bound");
  ASSERT_TRUE(x);
  EXPECT_TRUE(contains(x->advice, "already one graph launch"));
  EXPECT_TRUE(find_finding(diagnose(a, facts()), "captured"));
  // idle but long, few kernels, cheap launches: not launch-bound
  a = healthy();
  a.gpu_busy_ms = 6, a.idle_other_ms = 4;
  a.kernels_per_step = 50, a.median_kernel_us = 120, a.launch_cpu_ms = 0.2;
  EXPECT_FALSE(find_finding(diagnose(a, facts()), "launch-bound"));
  // short kernels but the GPU idles only 20%
  a = healthy();
  a.gpu_busy_ms = 8, a.idle_other_ms = 2, a.median_kernel_us = 5;
  EXPECT_FALSE(find_finding(diagnose(a, facts()), "launch-bound"));
}

TEST(ProfileDiagnosis, DataBound) {
  StepAnalysis a = healthy();
  a.gpu_busy_ms = 6, a.idle_other_ms = 0.5, a.idle_data_ms = 3.5, a.data_wait_ms = 3.6;
  std::optional<Finding> x = find_finding(diagnose(a, facts()), "data-bound");
  ASSERT_TRUE(x);
  EXPECT_TRUE(contains(x->evidence, "3.600 ms/step")) << x->evidence;
  EXPECT_TRUE(contains(x->advice, "data.prefetch, now 3")) << x->advice;
  EXPECT_TRUE(contains(x->advice, "data.source=latents"));
  a.idle_data_ms = 0.9, a.data_wait_ms = 0.9;  // 9%
  EXPECT_FALSE(find_finding(diagnose(a, facts()), "data-bound"));
}

TEST(ProfileDiagnosis, ElementwiseWork) {
  StepAnalysis a = healthy();
  a.matrix_ms = 3, a.attention_ms = 1, a.elementwise_ms = 5;  // 53% of busy
  auto f = facts();
  f.fused_kernels = false;
  std::optional<Finding> x = find_finding(diagnose(a, f), "elementwise");
  ASSERT_TRUE(x);
  EXPECT_TRUE(contains(x->advice, "speed.fused_kernels=true"));
  f.fused_kernels = true;
  EXPECT_TRUE(contains(find_finding(diagnose(a, f), "elementwise")->advice, "epilogues"));
  a.elementwise_ms = 3.0, a.matrix_ms = 5.0;  // 32%
  EXPECT_FALSE(find_finding(diagnose(a, f), "elementwise"));
}

TEST(ProfileDiagnosis, MatrixBoundAgainstThePeakMeasuredInTheRun) {
  StepAnalysis a = healthy();
  a.matrix_ms = 7, a.attention_ms = 1.5, a.elementwise_ms = 0.8, a.copy_ms = 0.2;  // 89% of busy
  auto f = facts();
  f.train_flops_per_step = 5e12;  // 5 TFLOP in 10 ms: 500 TFLOP/s
  f.peak_tflops = 790;
  std::optional<Finding> x = find_finding(diagnose(a, f), "matrix-bound");
  ASSERT_TRUE(x);
  EXPECT_TRUE(contains(x->evidence, "achieves 500 TFLOP/s")) << x->evidence;
  EXPECT_TRUE(contains(x->evidence, "588 TFLOP/s while in matrix")) << x->evidence;  // 5e12 / 8.5 ms
  EXPECT_TRUE(contains(x->evidence, "63% and 74% of the 790 TFLOP/s")) << x->evidence;
  a.idle_other_ms = 2, a.gpu_busy_ms = 8;  // 20% idle: not matrix-bound
  EXPECT_FALSE(find_finding(diagnose(a, f), "matrix-bound"));
}

TEST(ProfileDiagnosis, PowerCappedWithTheClockTheCapAllows) {
  auto f = facts();
  f.gpu.count = 50;
  f.gpu.at_power_limit = 0.9;
  f.gpu.power_w_mean = 690, f.gpu.power_limit_w = 700;
  f.gpu.sm_clock_mhz_median = 1500, f.gpu.sm_clock_max_mhz = 1980;
  f.peak_tflops = 790, f.peak_clock_mhz = 1755;
  std::optional<Finding> x = find_finding(diagnose(healthy(), f), "power-capped");
  ASSERT_TRUE(x);
  EXPECT_TRUE(contains(x->evidence, "1500 MHz SM clock, 76% of the 1980 MHz")) << x->evidence;
  EXPECT_TRUE(contains(x->evidence, "about 675 TFLOP/s at the step's clock")) << x->evidence;  // 790*1500/1755
  f.gpu.at_power_limit = 0.3;
  EXPECT_FALSE(find_finding(diagnose(healthy(), f), "power-capped"));
}

TEST(ProfileDiagnosis, Alignment) {
  auto f = facts();
  f.matrix_dims = {{"hidden", 1152}, {"tokens x batch", 8 * 256}, {"final out", 36}};
  f.head_dims = {{"head dim", 72}};
  std::optional<Finding> x = find_finding(diagnose(healthy(), f), "alignment");
  ASSERT_TRUE(x);
  EXPECT_TRUE(contains(x->evidence, "final out = 36")) << x->evidence;
  EXPECT_TRUE(contains(x->evidence, "head dim = 72")) << x->evidence;
  EXPECT_FALSE(contains(x->evidence, "hidden"));
  f.matrix_dims = {{"hidden", 384}};
  f.head_dims = {{"head dim", 64}};
  EXPECT_FALSE(find_finding(diagnose(healthy(), f), "alignment"));
}

TEST(ProfileDiagnosis, HostSyncs) {
  StepAnalysis a = healthy();
  a.syncs = {{"cudaStreamSynchronize", "aten::_local_scalar_dense", "clipping", 8}};
  a.syncs_per_step = 2;
  std::optional<Finding> x = find_finding(diagnose(a, facts()), "host-syncs");
  ASSERT_TRUE(x);
  EXPECT_TRUE(contains(x->evidence, "8 x cudaStreamSynchronize in aten::_local_scalar_dense (clipping)"))
      << x->evidence;
  EXPECT_TRUE(contains(x->advice, ".item()"));
  a.syncs_per_step = 0.25;  // one per log window
  EXPECT_TRUE(contains(find_finding(diagnose(a, facts()), "host-syncs")->advice, "fewer than one per step"));
  a.syncs.clear(), a.syncs_per_step = 0;
  EXPECT_FALSE(find_finding(diagnose(a, facts()), "host-syncs"));
}

TEST(ProfileDiagnosis, Fp32WhereBf16WasMeant) {
  StepAnalysis a = healthy();
  a.fp32_matrix_ms = 1.0;  // 25% of the matrix time
  std::optional<Finding> x = find_finding(diagnose(a, facts()), "fp32-matmul");
  ASSERT_TRUE(x);
  EXPECT_TRUE(contains(x->title, "bf16"));
  auto f = facts();
  f.precision = "fp32";  // asked for: no finding
  EXPECT_FALSE(find_finding(diagnose(a, f), "fp32-matmul"));
  a.fp32_matrix_ms = 0.1;  // 2%
  EXPECT_FALSE(find_finding(diagnose(a, facts()), "fp32-matmul"));
  a.fp32_matrix_ops = 3;  // seen by dtype
  EXPECT_TRUE(find_finding(diagnose(a, facts()), "fp32-matmul"));
}

TEST(ProfileDiagnosis, AllocatorChurn) {
  StepAnalysis a = healthy();
  a.device_mallocs = 12, a.device_frees = 10;
  std::optional<Finding> x = find_finding(diagnose(a, facts()), "allocator-churn");
  ASSERT_TRUE(x);
  EXPECT_TRUE(contains(x->evidence, "12 cudaMalloc and 10 cudaFree"));
  a.device_mallocs = a.device_frees = 0;
  auto f = facts();
  f.alloc_retries = 2;
  EXPECT_TRUE(contains(find_finding(diagnose(a, f), "allocator-churn")->evidence, "2 allocation retries"));
  EXPECT_FALSE(find_finding(diagnose(a, facts()), "allocator-churn"));
}

TEST(ProfileDiagnosis, RecomputeCost) {
  StepAnalysis a = healthy();
  a.busy_by_phase = {{"forward", 2.5}, {"backward", 7}, {"optimizer", 0.5}};
  auto f = facts();
  f.recompute = true;
  f.peak_reserved_gib = 40, f.memory_total_gib = 139.8;
  std::optional<Finding> x = find_finding(diagnose(a, f), "recompute");
  ASSERT_TRUE(x);
  EXPECT_TRUE(contains(x->title, "2.000 ms per step (20%)")) << x->title;
  EXPECT_TRUE(contains(x->advice, "speed.recompute"));
  EXPECT_TRUE(contains(x->evidence, "40.0 GiB of 139.8"));
  f.recompute = false;  // not asked for: backward 2.8x forward is then not this rule's business
  EXPECT_FALSE(find_finding(diagnose(a, f), "recompute"));
}

// From events: 200 kernels of 4 us, each launched 20 us after the last.
TEST(ProfileDiagnosis, LaunchBoundFromATimeline) {
  Timeline t;
  int64_t corr = 1;
  auto add = [&](EventKind k, const std::string& n, double ts, double dur, int64_t tid) -> Event& {
    Event e;
    e.kind = k, e.name = n, e.ts = ts, e.dur = dur, e.tid = tid;
    t.events.push_back(e);
    return t.events.back();
  };
  add(EventKind::kScope, "ProfilerStep#0", 0, 200 * 20 + 10, 1);
  add(EventKind::kScope, "perftrain::forward", 0, 200 * 20 + 5, 1);
  for (int i = 0; i < 200; ++i) {
    add(EventKind::kRuntime, "cudaLaunchKernel", 20.0 * i, 15, 1).correlation = corr;
    add(EventKind::kKernel, "vectorized_elementwise_kernel", 20.0 * i + 16, 4, 7).correlation = corr++;
  }
  const auto a = analyze(t);
  EXPECT_NEAR(a.idle_other_ms / a.step_ms, 1 - 800.0 / 4010, 1e-9);  // the step scope ends last
  const auto f = diagnose(a, facts());
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f.front().id, "launch-bound");
  EXPECT_TRUE(find_finding(f, "elementwise"));  // and all of it elementwise
}

}  // namespace
