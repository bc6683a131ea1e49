// The bench's GPU-only parts on a real GPU: the measured bf16 matrix peak is
// a plausible rate, CUDA-event step times agree with the host clock, and the
// environment report names the GPU, its clocks and the CUDA/cuDNN versions.
#include <gtest/gtest.h>

#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>

#include <chrono>

#include "observe/bench/environment.h"
#include "observe/bench/matmul_peak.h"
#include "observe/bench/step_timer.h"
#include "observe/bench/subprocess.h"
#include "compat/compat.h"

namespace {

using namespace perftrain::observe::bench;

#define SKIP_WITHOUT_GPU() \
  if (!perftrain::compat::cuda_available()) GTEST_SKIP() << "no CUDA device"

TEST(BenchGpu, MatmulPeakIsPlausible) {
  SKIP_WITHOUT_GPU();
  const at::Device cuda(at::kCUDA, 0);
  MatmulPeakOptions o;
  o.n = 4096;
  o.iterations = 10;
  o.warmup = 3;
  const auto p = measure_matmul_peak(cuda, o);
  ASSERT_TRUE(p.tflops.has_value()) << p.note;
  // H200 dense bf16: 989 TFLOP/s on paper, ~790 measured at 8192^3; any
  // Hopper-class GPU gives more than 100 and no GPU gives more than 2000.
  EXPECT_GT(*p.tflops, 100.0) << p.note;
  EXPECT_LT(*p.tflops, 2000.0) << p.note;
  EXPECT_LE(p.tflops_min, *p.tflops);
  EXPECT_GE(p.tflops_max, *p.tflops);
  EXPECT_NEAR(p.ms_median, 2.0 * 4096.0 * 4096.0 * 4096.0 / (*p.tflops * 1e12) * 1e3, 0.5 * p.ms_median);
  std::printf("    bf16 mm 4096^3: %.1f TFLOP/s (%s)\n", *p.tflops, p.note.c_str());
}

TEST(BenchGpu, EventTimesAgreeWithTheHostClock) {
  SKIP_WITHOUT_GPU();
  const at::Device cuda(at::kCUDA, 0);
  auto a = at::randn({4096, 4096}, at::TensorOptions().device(cuda));
  auto b = at::randn({4096, 4096}, at::TensorOptions().device(cuda));
  at::mm(a, b);  // cuBLAS handle and workspace outside the timing
  perftrain::compat::synchronize(cuda);
  StepTimer timer(cuda, 5);
  EXPECT_TRUE(timer.uses_cuda_events());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) {
    timer.begin(i);
    for (int k = 0; k < 10; ++k) at::mm(a, b);  // fp32 (TF32 off by default): milliseconds each
    timer.end(i);
  }
  const auto ms = timer.elapsed_ms();  // synchronizes
  const double host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  double sum = 0;
  for (double m : ms) {
    EXPECT_GT(m, 0.0);
    sum += m;
  }
  // The events see only GPU time between the brackets: no more than the
  // host's wall time, and most of it (the GPU is busy throughout).
  EXPECT_LE(sum, host_ms * 1.01 + 0.1);
  EXPECT_GT(sum, 0.5 * host_ms) << "host " << host_ms << " ms";
}

TEST(BenchGpu, EnvironmentNamesTheGpu) {
  SKIP_WITHOUT_GPU();
  const auto e = collect_environment(at::Device(at::kCUDA, 0), "");
  EXPECT_NE(e.gpu_name, "n/a");
  EXPECT_NE(e.cuda_runtime, "n/a");
  EXPECT_NE(e.cuda_driver_api, "n/a");
  EXPECT_NE(e.cudnn, "n/a");
  for (const auto& [k, v] : environment_fields(e)) std::printf("    %s: %s\n", k.c_str(), v.c_str());
  if (!run_command_capture("command -v nvidia-smi").ok) {
    std::printf("    (no nvidia-smi here: clocks are n/a)\n");
    return;
  }
  // nvidia-smi found the same GPU by its PCI address.
  EXPECT_NE(e.smi.driver, "n/a");
  EXPECT_NE(e.smi.sm_clock_max, "n/a");
  EXPECT_EQ(e.smi.name, e.gpu_name);
}

}  // namespace
