// train::estimate_training_memory for the single-stream family against the
// caching allocator's peak of real training steps on the GPU (run_training:
// model, EMA, device optimizer, warm-up, the captured graph, a checkpoint at
// the end): SS-S/2 and SS-B/2 on 4x32x32 latents (256 image tokens) with 32
// class tokens, and with 32 tokens of masked synthetic condition features;
// the fused chained step (also with SwiGLU made again in backward), per-block
// recompute and the plain ATen blocks.
// Expected within 12% of the peak, as DiT's (memory_estimate_gpu_test.cpp).
// Prints each case's estimate, peak and breakdown.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "compat/compat.h"
#include "support/memory_peak.h"
#include "support/test_support.h"

namespace perftrain::train {
namespace {

TEST(SingleStreamMemoryGpu, WithinTwelvePercentOfTheStepPeak) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no CUDA GPU";
  struct Case {
    const char* model;
    int64_t batch, cond_dim;
    const char* speed;  // one [speed] override, or ""
  };
  const Case cases[] = {{"SS-S/2", 128, 0, ""},
                        {"SS-S/2", 128, 64, ""},
                        {"SS-B/2", 64, 0, ""},
                        {"SS-B/2", 64, 64, ""},
                        {"SS-B/2", 128, 0, "speed.recompute=true"},
                        {"SS-B/2", 64, 64, "speed.gelu_recompute=true"},
                        {"SS-S/2", 128, 64, "speed.fused_kernels=false"}};
  int failures = 0;
  for (const Case& k : cases) {
    testing::TempDir tmp;
    TrainConfig c = testing::memory_run_config(k.model, k.batch, k.speed, tmp.path());
    c.model.cond_tokens = 32;
    c.model.cond_dim = k.cond_dim;
    const testing::EstimateAndPeak r = testing::estimate_and_peak(c);
    ASSERT_TRUE(r.peak_gib.has_value());
    const double peak = *r.peak_gib;
    std::printf("%s b%lld cond_dim %lld %s: estimate %.2f GiB, peak %.2f GiB (%+.1f%%): %s\n", k.model,
                static_cast<long long>(k.batch), static_cast<long long>(k.cond_dim), *k.speed ? k.speed : "default",
                r.estimate_gib, peak, 100 * r.off(), r.breakdown.c_str());
    EXPECT_NEAR(r.estimate_gib, peak, 0.12 * peak) << k.model << " b" << k.batch << " cond_dim " << k.cond_dim
                                                   << " " << k.speed << "\n" << r.log;
    failures += std::abs(r.estimate_gib - peak) > 0.12 * peak;
  }
  std::printf("%d of %zu cases off by more than 12%%\n", failures, sizeof(cases) / sizeof(cases[0]));
}

}  // namespace
}  // namespace perftrain::train
