// train::estimate_training_memory against the caching allocator's peak of
// real training steps on the GPU (run_training: model, EMA, device
// optimizer, warm-up, the captured graph, a checkpoint at the end), for
// DiT-S/2 and DiT-B/2 on 4x32x32 latents at batches 64 and 128, with each
// recompute, and the plain ATen blocks (speed.fused_kernels off). Expected: within 12% of the peak (the H200 bench peaks at
// b256 are within 6%; at small batches the fixed workspaces and the graph
// pool weigh more).
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>

#include "compat/compat.h"
#include "support/test_support.h"
#include "train/config.h"
#include "train/memory_estimate.h"
#include "train/trainer.h"

namespace perftrain::train {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

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
    TrainConfig c = default_config(true);
    apply_override(c, std::string("model.name=\"") + k.model + "\"");
    apply_override(c, "data.source=\"synthetic\"");
    c.model.image_size = 32;
    c.model.in_channels = 4;
    c.model.num_classes = 1000;
    c.data.synthetic_size = 1024;
    c.optim.batch_size = k.batch;
    c.optim.steps = 8;
    c.log.every = 4;
    c.log.sample_every = 0;
    c.log.checkpoint_every = 0;
    c.log.sample_classes = 1;
    c.log.sample_per_class = 1;
    c.diffusion.sample_steps = 1;
    c.run.dir = tmp.path();
    c.run.name = "m";
    if (*k.speed) apply_override(c, k.speed);
    const double estimate = estimate_training_memory(c, true, "auto").total_bytes() / kGiB;
    std::ostringstream log;
    const TrainSummary s = run_training(c, TrainOptions{}, log);
    ASSERT_TRUE(s.peak_memory_gib.has_value());
    const double peak = *s.peak_memory_gib;
    std::printf("%s b%lld %s: estimate %.2f GiB, peak %.2f GiB (%+.1f%%)\n", k.model,
                static_cast<long long>(k.batch), *k.speed ? k.speed : "default", estimate, peak,
                100 * (estimate - peak) / peak);
    EXPECT_NEAR(estimate, peak, 0.12 * peak)
        << k.model << " b" << k.batch << " " << k.speed << ": "
        << estimate_training_memory(c, true, "auto").breakdown() << "\n" << log.str();
  }
}

}  // namespace
}  // namespace perftrain::train
