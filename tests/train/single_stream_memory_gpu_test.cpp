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
#include <sstream>

#include "compat/compat.h"
#include "support/test_support.h"
#include "train/config.h"
#include "train/memory_estimate.h"
#include "train/trainer.h"

namespace perftrain::train {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

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
    TrainConfig c = default_config(true);
    apply_override(c, std::string("model.name=\"") + k.model + "\"");
    apply_override(c, "data.source=\"synthetic\"");
    c.model.image_size = 32;
    c.model.in_channels = 4;
    c.model.num_classes = 1000;
    c.model.cond_tokens = 32;
    c.model.cond_dim = k.cond_dim;
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
    const MemoryEstimate e = estimate_training_memory(c, true, "auto");
    const double estimate = e.total_bytes() / kGiB;
    std::ostringstream log;
    const TrainSummary s = run_training(c, TrainOptions{}, log);
    ASSERT_TRUE(s.peak_memory_gib.has_value());
    const double peak = *s.peak_memory_gib;
    std::printf("%s b%lld cond_dim %lld %s: estimate %.2f GiB, peak %.2f GiB (%+.1f%%): %s\n", k.model,
                static_cast<long long>(k.batch), static_cast<long long>(k.cond_dim), *k.speed ? k.speed : "default",
                estimate, peak, 100 * (estimate - peak) / peak, e.breakdown().c_str());
    EXPECT_NEAR(estimate, peak, 0.12 * peak) << k.model << " b" << k.batch << " cond_dim " << k.cond_dim << " "
                                             << k.speed << "\n" << log.str();
    failures += std::abs(estimate - peak) > 0.12 * peak;
  }
  std::printf("%d of %zu cases off by more than 12%%\n", failures, sizeof(cases) / sizeof(cases[0]));
}

}  // namespace
}  // namespace perftrain::train
