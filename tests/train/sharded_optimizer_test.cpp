// ZeRO-1's pieces in one process: the ownership rule (every tensor one owner,
// balanced, the same on every call) and the sharded DeviceOptimizer (its ATen
// path) simulated over 2 and 3 ranks against one unsharded optimizer
// (sharded_optimizer_sim.h). The processes themselves: tests/cli/dist_zero1_cli_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

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

}  // namespace
}  // namespace perftrain::train
