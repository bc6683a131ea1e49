#include "data/batch_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <set>

#include "base/error.h"
#include "support/test_support.h"

namespace perftrain::data {
namespace {

using perftrain::testing::error_of;

// Sample i is the constant i with label i, so batches reveal the order. It can
// fail after a number of gathers, or take a while per gather.
class IndexDataset final : public Dataset {
 public:
  explicit IndexDataset(int64_t n, int fail_after = -1, int sleep_ms = 0)
      : n_(n), fail_after_(fail_after), sleep_ms_(sleep_ms) {}
  int64_t size() const override { return n_; }
  std::array<int64_t, 3> sample_shape() const override { return {1, 2, 3}; }
  int64_t num_classes() const override { return n_; }
  void gather(const int64_t* idx, int64_t n, float* x, int64_t* y) const override {
    if (fail_after_ >= 0 && gathers_++ >= fail_after_) throw RuntimeError("shard-7.safetensors: bad bytes");
    if (sleep_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    Dataset::gather(idx, n, x, y);
  }
  std::string describe() const override { return "index dataset"; }

 protected:
  int64_t read(int64_t i, float* out) const override {
    std::fill(out, out + 6, static_cast<float>(i));
    return i;
  }

 private:
  int64_t n_;
  int fail_after_;
  int sleep_ms_;
  mutable std::atomic<int> gathers_{0};
};

std::vector<int64_t> labels(const Batch& b) {
  EXPECT_EQ(b.x.sizes(), (std::vector<int64_t>{b.y.size(0), 1, 2, 3}));
  EXPECT_EQ(b.x.scalar_type(), at::kFloat);
  EXPECT_EQ(b.y.scalar_type(), at::kLong);
  std::vector<int64_t> out(b.y.data_ptr<int64_t>(), b.y.data_ptr<int64_t>() + b.y.numel());
  for (size_t k = 0; k < out.size(); ++k) EXPECT_EQ(b.x.data_ptr<float>()[k * 6 + 5], float(out[k]));
  return out;
}

std::vector<int64_t> take(BatchLoader& loader, int batches) {
  std::vector<int64_t> out;
  for (int i = 0; i < batches; ++i) {
    const auto l = labels(loader.next());
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

TEST(EpochPermutation, MatchesTheDocumentedAlgorithm) {
  // From an independent implementation of the comment in batch_loader.h.
  EXPECT_EQ(epoch_permutation(10, 0, 0), (std::vector<int64_t>{0, 1, 7, 2, 5, 4, 9, 3, 8, 6}));
  EXPECT_EQ(epoch_permutation(10, 0, 1), (std::vector<int64_t>{1, 9, 6, 5, 7, 4, 3, 2, 8, 0}));
  EXPECT_EQ(epoch_permutation(10, 12345, 7), (std::vector<int64_t>{9, 2, 0, 8, 1, 3, 7, 6, 5, 4}));
  EXPECT_EQ(epoch_permutation(16, 0xDEADBEEFCAFEF00Dull, 3),
            (std::vector<int64_t>{8, 9, 5, 15, 0, 11, 6, 7, 1, 12, 2, 3, 13, 14, 4, 10}));
  EXPECT_TRUE(epoch_permutation(0, 1, 0).empty());
  EXPECT_EQ(epoch_permutation(1, 1, 0), std::vector<int64_t>{0});
}

TEST(EpochPermutation, IsAPermutationAndVaries) {
  const auto a = epoch_permutation(1000, 5, 0);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(a, epoch_permutation(1000, 5, 0));
  EXPECT_NE(a, epoch_permutation(1000, 5, 1));
  EXPECT_NE(a, epoch_permutation(1000, 6, 0));
}

TEST(EpochPermutation, AllOrdersOfThreeAboutEquallyLikely) {
  std::map<std::vector<int64_t>, int> counts;
  const int epochs = 6000;
  for (int e = 0; e < epochs; ++e) counts[epoch_permutation(3, 9, e)]++;
  ASSERT_EQ(counts.size(), 6u);
  for (const auto& [p, c] : counts) EXPECT_NEAR(c, epochs / 6, 150);  // ~5 standard deviations
}

TEST(BatchLoader, StreamIsTheEpochPermutationsBackToBack) {
  IndexDataset ds(10);
  BatchLoader loader(ds, 4, 77);  // 4 does not divide 10: batches straddle epochs
  const auto got = take(loader, 10);
  std::vector<int64_t> want;
  for (int e = 0; e < 4; ++e) {
    const auto p = epoch_permutation(10, 77, e);
    want.insert(want.end(), p.begin(), p.end());
  }
  EXPECT_EQ(got, want);
  // Each epoch visits every index once, and epochs differ in order.
  for (int e = 0; e < 4; ++e) {
    std::set<int64_t> seen(got.begin() + e * 10, got.begin() + (e + 1) * 10);
    EXPECT_EQ(seen.size(), 10u);
  }
  EXPECT_NE(std::vector<int64_t>(got.begin(), got.begin() + 10), std::vector<int64_t>(got.begin() + 10, got.begin() + 20));
}

TEST(BatchLoader, SameSeedSameStreamOtherSeedOther) {
  IndexDataset ds(37);
  BatchLoader a(ds, 8, 1), b(ds, 8, 1), c(ds, 8, 2);
  const auto sa = take(a, 12), sb = take(b, 12), sc = take(c, 12);
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

TEST(BatchLoader, ResumeFromPositionReproducesTheStream) {
  IndexDataset ds(23);
  BatchLoader first(ds, 5, 99, {}, false, 2);
  EXPECT_EQ(first.position().epoch, 0);
  EXPECT_EQ(first.position().index, 0);
  take(first, 7);  // 35 samples: epoch 1, index 12
  const LoaderPosition pos = first.position();
  EXPECT_EQ(pos.epoch, 1);
  EXPECT_EQ(pos.index, 12);
  const auto rest = take(first, 9);
  BatchLoader resumed(ds, 5, 99, pos, false, 2);
  EXPECT_EQ(take(resumed, 9), rest);
}

TEST(BatchLoader, BatchEndingAnEpochMovesToTheNext) {
  IndexDataset ds(8);
  BatchLoader loader(ds, 4, 3, {2, 4});
  take(loader, 1);
  EXPECT_EQ(loader.position().epoch, 3);
  EXPECT_EQ(loader.position().index, 0);
  // (e, n) is accepted and means (e + 1, 0).
  BatchLoader a(ds, 4, 3, {2, 8}), b(ds, 4, 3, {3, 0});
  EXPECT_EQ(take(a, 3), take(b, 3));
}

TEST(BatchLoader, BadArgumentsAreUsageErrors) {
  IndexDataset ds(8), empty(0);
  error_of<UsageError>([&] { BatchLoader(ds, 0, 1); });
  error_of<UsageError>([&] { BatchLoader(ds, 4, 1, {}, false, 0); });
  error_of<UsageError>([&] { BatchLoader(ds, 4, 1, {0, 9}); });
  error_of<UsageError>([&] { BatchLoader(ds, 4, 1, {-1, 0}); });
  error_of<UsageError>([&] { BatchLoader(empty, 4, 1); });
}

TEST(BatchLoader, ProducerErrorsArriveAfterTheGoodBatches) {
  IndexDataset ds(100, /*fail_after=*/3);
  BatchLoader loader(ds, 10, 5);
  take(loader, 3);
  const std::string msg = error_of<RuntimeError>([&] { loader.next(); });
  EXPECT_NE(msg.find("shard-7.safetensors"), std::string::npos) << msg;
  error_of<RuntimeError>([&] { loader.next(); });  // and stays failed
  EXPECT_EQ(loader.position().index, 30);
}

TEST(BatchLoader, DestructorReturnsWhileTheProducerIsBlocked) {
  IndexDataset ds(1000);
  const auto t0 = std::chrono::steady_clock::now();
  {
    BatchLoader loader(ds, 10, 1, {}, false, 1);
    loader.next();
    // Give the producer time to fill the queue and block on it.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  {
    BatchLoader never_read(ds, 10, 1, {}, false, 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  { BatchLoader immediately(ds, 10, 1); }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

TEST(BatchLoader, CountsTimeSpentWaiting) {
  IndexDataset ds(100, -1, /*sleep_ms=*/30);
  BatchLoader loader(ds, 10, 5, {}, false, 1);
  EXPECT_EQ(loader.wait_seconds(), 0.0);
  take(loader, 3);
  EXPECT_GT(loader.wait_seconds(), 0.02);
}

TEST(BatchLoader, PinMemoryWorksWithoutAGpu) {
  IndexDataset ds(16);
  BatchLoader pinned(ds, 4, 8, {}, /*pin_memory=*/true), plain(ds, 4, 8);
  EXPECT_EQ(take(pinned, 5), take(plain, 5));
}

}  // namespace
}  // namespace perftrain::data
