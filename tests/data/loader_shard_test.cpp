// BatchLoader's shards (data parallel): rank i of N reads samples
// [i B/N, (i+1) B/N) of every global batch, so the N shards side by side are
// the one-process stream, across epoch ends and from a resumed position too;
// the position stays the global one.
#include <ATen/ops/cat.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "base/error.h"
#include "data/batch_loader.h"
#include "data/dataset.h"
#include "support/test_support.h"

namespace {

using perftrain::data::BatchLoader;
using perftrain::data::LoaderPosition;
using perftrain::data::LoaderShard;

TEST(LoaderShard, ShardsSideBySideAreTheOneProcessStream) {
  // 23 samples, global batch 6: batches cross epoch ends.
  const auto ds = perftrain::data::make_synthetic(23, {2, 4, 4}, 5, /*seed=*/7);
  for (const LoaderPosition start : {LoaderPosition{0, 0}, LoaderPosition{1, 20}}) {
    for (int world : {2, 3}) {
      BatchLoader one(*ds, 6, /*seed=*/11, start, false, 2);
      std::vector<std::unique_ptr<BatchLoader>> ranks;
      for (int r = 0; r < world; ++r)
        ranks.push_back(std::make_unique<BatchLoader>(*ds, 6, 11, start, false, 2, LoaderShard{r, world}));
      for (int step = 0; step < 9; ++step) {
        const auto whole = one.next();
        std::vector<at::Tensor> xs, ys;
        for (auto& r : ranks) {
          const auto b = r->next();
          EXPECT_EQ(b.x.size(0), 6 / world);
          xs.push_back(b.x), ys.push_back(b.y);
        }
        EXPECT_TRUE(at::cat(xs).equal(whole.x)) << "world " << world << " step " << step;
        EXPECT_TRUE(at::cat(ys).equal(whole.y)) << "world " << world << " step " << step;
        for (auto& r : ranks) {
          EXPECT_EQ(r->position().epoch, one.position().epoch);
          EXPECT_EQ(r->position().index, one.position().index);
        }
      }
    }
  }
}

TEST(LoaderShard, BatchThatDoesNotSplitIsAUsageError) {
  const auto ds = perftrain::data::make_synthetic(10, {1, 2, 2}, 2, 0);
  const std::string msg = perftrain::testing::error_of<perftrain::UsageError>(
      [&] { BatchLoader l(*ds, 6, 0, {}, false, 2, LoaderShard{0, 4}); });
  EXPECT_NE(msg.find("batch size 6 cannot be split into 4 equal shards"), std::string::npos) << msg;
  perftrain::testing::error_of<perftrain::UsageError>([&] { BatchLoader l(*ds, 6, 0, {}, false, 2, LoaderShard{3, 3}); });
}

}  // namespace
