// train::estimate_training_memory against the caching allocator's peak of
// real training steps on the GPU (run_training: model, EMA, device
// optimizer, warm-up, the captured graph, a checkpoint at the end), for
// DiT-S/2 and DiT-B/2 on 4x32x32 latents at batches 64 and 128, with each
// recompute, and the plain ATen blocks (speed.fused_kernels off). Expected: within 12% of the peak (the H200 bench peaks at
// b256 are within 6%; at small batches the fixed workspaces and the graph
// pool weigh more).
#include <gtest/gtest.h>

#include <cstdio>

#include "compat/compat.h"
#include "support/memory_peak.h"
#include "support/test_support.h"

namespace perftrain::train {
namespace {

TEST(MemoryEstimateGpu, WithinTwelvePercentOfTheStepPeak) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no CUDA GPU";
  struct Case {
    const char* model;
    int64_t batch;
    const char* speed;  // one [speed] override, or ""
  };
  const Case cases[] = {{"DiT-S/2", 128, ""},
                        {"DiT-S/2", 128, "speed.recompute=true"},
                        {"DiT-B/2", 64, ""},
                        {"DiT-B/2", 128, "speed.gelu_recompute=true"},
                        {"DiT-B/2", 128, "speed.recompute=true"},
                        {"DiT-S/2", 128, "speed.fused_kernels=false"}};
  for (const Case& k : cases) {
    testing::TempDir tmp;
    const testing::EstimateAndPeak r =
        testing::estimate_and_peak(testing::memory_run_config(k.model, k.batch, k.speed, tmp.path()));
    ASSERT_TRUE(r.peak_gib.has_value());
    std::printf("%s b%lld %s: estimate %.2f GiB, peak %.2f GiB (%+.1f%%)\n", k.model,
                static_cast<long long>(k.batch), *k.speed ? k.speed : "default", r.estimate_gib, *r.peak_gib,
                100 * r.off());
    EXPECT_NEAR(r.estimate_gib, *r.peak_gib, 0.12 * *r.peak_gib)
        << k.model << " b" << k.batch << " " << k.speed << ": " << r.breakdown << "\n" << r.log;
  }
}

}  // namespace
}  // namespace perftrain::train
