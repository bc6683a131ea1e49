// The memory estimate's per-sample bytes for a single-stream model on the
// CPU's plain path against the peak resident memory of real runs at two
// batches (the difference leaves out the program itself), as
// ReliabilityGuard.MemoryEstimateMatchesCpuRunsPerSample does for DiT: with
// class tokens, and with masked synthetic condition features: the live
// tensors' peak, up to the allocator allowance above it.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "support/test_support.h"
#include "train/config.h"
#include "train/memory_estimate.h"

namespace {

using perftrain::testing::read_raw;
using perftrain::testing::TempDir;

// The peak resident memory (KiB) of `perftrain args`, which must succeed.
long max_rss_kib(const std::string& args, const std::string& log) {
  // A fixed mmap threshold: glibc then returns every large freed block at
  // once, so the peak is the live tensors' and the same in every run (with its
  // dynamic threshold the same run measured 14.6 to 20.9 MB a sample).
  const std::string cmd = "exec env MALLOC_MMAP_THRESHOLD_=65536 " + std::string(PERFTRAIN_BINARY) + " " + args + " >'" + log + "' 2>&1";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_raw(log);
  return usage.ru_maxrss;
}

void expect_estimate_matches(int64_t cond_tokens, int64_t cond_dim) {
  TempDir tmp;
  const std::string model = " --set model.depth=4 --set model.image_size=16 --set model.cond_tokens=" +
                            std::to_string(cond_tokens) + " --set model.cond_dim=" + std::to_string(cond_dim);
  const std::string common = " --device cpu --model SS-S/2" + model + " --data synthetic --steps 1" +
                             " --set log.sample_every=0 --set log.sample_classes=1 --set log.sample_per_class=1"
                             " --set diffusion.sample_steps=1 --runs-dir " + tmp.path();
  const long small = max_rss_kib("train" + common + " --run-name a --batch-size 8", tmp.file("a.log"));
  const long large = max_rss_kib("train" + common + " --run-name b --batch-size 40", tmp.file("b.log"));
  const double measured = (large - small) * 1024.0 / 32;
  auto cfg = perftrain::train::default_config(false);
  perftrain::train::apply_override(cfg, "model.name=\"SS-S/2\"");
  cfg.model.depth = 4, cfg.model.image_size = 16, cfg.model.cond_tokens = cond_tokens, cfg.model.cond_dim = cond_dim;
  cfg.model.in_channels = 1;  // the synthetic data's (as the run's config.toml says)
  const double estimated = perftrain::train::estimate_training_memory(cfg, false, "auto").per_sample_bytes;
  std::printf("SS-S/2 depth 4, %lld condition tokens%s: per sample estimated %.0f B, measured %.0f B (%+.1f%%)\n",
              static_cast<long long>(cond_tokens), cond_dim > 0 ? " (features)" : " (class)", estimated, measured,
              100 * (estimated - measured) / measured);
  // The estimate counts what the default allocator keeps of the forward's
  // temporaries on top of the live tensors measured here (+5 [S, D] a block):
  // it may exceed them by that, never fall short.
  EXPECT_GE(estimated, 0.95 * measured) << "per sample: estimated " << estimated << " B, measured " << measured
                                        << " B (peak RSS " << small << " / " << large << " KiB)";
  EXPECT_LE(estimated, 1.30 * measured) << "per sample: estimated " << estimated << " B, measured " << measured
                                        << " B (peak RSS " << small << " / " << large << " KiB)";
}

TEST(SingleStreamMemory, EstimateMatchesCpuRunsPerSampleWithClassTokens) { expect_estimate_matches(1, 0); }

TEST(SingleStreamMemory, EstimateMatchesCpuRunsPerSampleWithMaskedFeatures) { expect_estimate_matches(8, 32); }

}  // namespace
