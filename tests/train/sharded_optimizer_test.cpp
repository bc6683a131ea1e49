// ZeRO-1's pieces in one process: the ownership rule (every tensor one owner,
// balanced, the same on every call) and the sharded DeviceOptimizer (its ATen
// path) simulated over 2 and 3 ranks against one unsharded optimizer
// (sharded_optimizer_sim.h). The processes themselves: tests/cli/dist_zero1_cli_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "base/error.h"
#include "support/test_support.h"
#include "train/config.h"
#include "train/memory_estimate.h"
#include "train/sharded_optimizer_sim.h"

namespace perftrain::train {
namespace {

TEST(ShardOwners, EveryTensorOneOwnerBalancedAndDeterministic) {
  const std::vector<int64_t> numels = {1152, 1152 * 4, 1152, 6 * 1152 * 1152, 1152 * 1152, 3 * 1152, 7, 1, 4096, 4096};
  for (int world : {1, 2, 3, 5, 16}) {
    const auto owner = shard_owners(numels, world);
    EXPECT_EQ(owner, shard_owners(numels, world));
    ASSERT_EQ(owner.size(), numels.size());
    std::vector<int64_t> load(world, 0);
    for (size_t i = 0; i < owner.size(); ++i) {
      ASSERT_GE(owner[i], 0);
      ASSERT_LT(owner[i], world);
      load[owner[i]] += numels[i];
    }
    // Greedy largest-first: the spread is at most the largest tensor.
    const int64_t spread = *std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end());
    EXPECT_LE(spread, *std::max_element(numels.begin(), numels.end())) << world;
    EXPECT_EQ(std::accumulate(load.begin(), load.end(), int64_t{0}),
              std::accumulate(numels.begin(), numels.end(), int64_t{0}));
  }
  // Equal sizes go round the ranks.
  EXPECT_EQ(shard_owners({5, 5, 5, 5}, 2), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(shard_owners({1, 9, 4}, 2), (std::vector<int>{1, 0, 1}));
}

TEST(ShardedDeviceOptimizer, RanksTogetherEqualOneOptimizerCpu) {
  for (int world : {2, 3}) {
    const auto r = testing::simulate_sharded_device_optimizer(at::Device(at::kCPU), world, /*shadows=*/false);
    EXPECT_LT(r.max_weight, 1e-5) << world;
    EXPECT_LT(r.max_ema, 1e-5) << world;
    EXPECT_LT(r.max_state, 1e-5) << world;
    EXPECT_LT(r.max_norm_rel, 1e-5) << world;
    // Each rank holds a share of the moments: fewer state tensors than the whole.
    EXPECT_LT(r.state_tensors_sharded, r.state_tensors_whole) << world;
  }
}

// The memory check counts 1/N of the moments per rank, so a model whose
// whole state does not fit may start sharded.
TEST(ShardedMemoryEstimate, MomentsSplitOverTheRanks) {
  TrainConfig c = default_config(true);
  apply_override(c, "model.name=\"DiT-XL/2\"");
  c.model.image_size = 32, c.model.in_channels = 4, c.model.num_classes = 1000, c.optim.batch_size = 8;
  const double P = static_cast<double>(c.model.parameter_count(true));
  const MemoryEstimate one = estimate_training_memory(c, true, "bf16");
  const MemoryEstimate four = estimate_training_memory(c, true, "bf16", 4);
  auto moments = [](const MemoryEstimate& e) {
    for (const auto& [what, bytes] : e.parts)
      if (what == "optimizer moments") return bytes;
    return -1.0;
  };
  EXPECT_EQ(moments(one), 8 * P);
  EXPECT_EQ(moments(four), 2 * P);
  EXPECT_EQ(one.fixed_bytes - four.fixed_bytes, 6 * P);
  const double between = four.total_bytes() + 3 * P;  // fits sharded, not whole
  check_memory_fits(c, true, "bf16", between, 4);
  const std::string msg =
      perftrain::testing::error_of<UsageError>([&] { check_memory_fits(c, true, "bf16", between, 1); });
  EXPECT_NE(msg.find("train.batch_size"), std::string::npos) << msg;
}

}  // namespace
}  // namespace perftrain::train
