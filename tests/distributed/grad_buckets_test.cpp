// distributed::GradBuckets on the CPU over Gloo: the buckets are formed in reverse
// parameter order up to bucket_mb, one dtype each; from the second backward
// on a bucket is sent while backward still runs (its send comes before the
// last gradient's arrival in the trace); an unused parameter holds nothing
// back; gradients arriving twice per backward turn the overlap off and still
// average right; and across 2 and 3 real processes the averaged gradients
// equal the mean of every rank's own gradients, computed directly.
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "distributed/grad_buckets.h"
#include "distributed/group.h"
#include "distributed/launch_env.h"
#include "support/dist_ranks.h"
#include "support/test_support.h"

namespace {

using perftrain::distributed::GradBucketOptions;
using perftrain::distributed::GradBuckets;
using perftrain::distributed::Group;
using perftrain::distributed::LaunchEnv;

std::unique_ptr<Group> one_rank_group() {
  LaunchEnv env;
  env.world_size = 1, env.master_addr = "127.0.0.1", env.from_env = true;
  env.master_port = perftrain::distributed::free_loopback_port("test");
  perftrain::distributed::GroupOptions o;
  o.timeout_s = 30;
  return std::make_unique<Group>(env, at::kCPU, o);
}

at::Tensor param(std::vector<int64_t> shape, at::ScalarType dtype = at::kFloat, uint64_t seed = 1) {
  at::Generator g = at::globalContext().defaultGenerator(at::kCPU).clone();
  g.set_current_seed(seed);
  return at::randn(shape, g, at::TensorOptions().dtype(dtype)).requires_grad_(true);
}

TEST(GradBuckets, LayoutIsReverseOrderUpToBucketMb) {
  auto group = one_rank_group();
  // Bytes: 40, 40, 120, 20, 32, 16 (double), 8; cap 100 bytes.
  std::vector<at::Tensor> p = {param({10}),    param({2, 5}),           param({30}), param({5}),
                               param({2, 4}), param({2}, at::kDouble), param({2})};
  GradBucketOptions o;
  o.bucket_mb = 100.0 / (1 << 20);
  GradBuckets b(*group, p, o);
  // From the last: [6] then 5 is double (new), [4 3] = 52, 2 alone (over the
  // cap by itself), [1 0] = 80.
  const std::vector<std::vector<size_t>> want = {{6}, {5}, {4, 3}, {2}, {1, 0}};
  EXPECT_EQ(b.buckets(), want);
}

// A chain of tanh layers; params in forward order W0 b0 W1 b1 ...; `unused`
// takes no part in the loss.
struct Chain {
  std::vector<at::Tensor> params;
  explicit Chain(int layers, int width, bool with_unused) {
    for (int l = 0; l < layers; ++l) {
      params.push_back(param({width, width}, at::kFloat, 10 + l));
      params.push_back(param({width}, at::kFloat, 100 + l));
    }
    if (with_unused) params.push_back(param({width}, at::kFloat, 999));
  }
  at::Tensor loss(const at::Tensor& x) const {
    at::Tensor h = x;
    for (size_t l = 0; l + 1 < params.size(); l += 2) h = at::tanh(at::matmul(h, params[l]) + params[l + 1]);
    return (h * h).sum();
  }
  void clear() {
    for (auto& p : params) p.mutable_grad() = at::Tensor();
  }
  std::vector<at::Tensor> grads() const {
    std::vector<at::Tensor> g;
    for (const auto& p : params) g.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    return g;
  }
};

at::Tensor input(int rank, int width) {
  at::Generator g = at::globalContext().defaultGenerator(at::kCPU).clone();
  g.set_current_seed(5000 + rank);
  return at::randn({6, width}, g);
}

// The position in the trace of the first send and of the last arrival.
std::pair<size_t, size_t> first_send_last_arrival(const std::vector<int64_t>& t) {
  size_t first_send = t.size(), last_arrival = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] < 0 && first_send == t.size()) first_send = i;
    if (t[i] >= 0) last_arrival = i;
  }
  return {first_send, last_arrival};
}

TEST(GradBuckets, SendsBucketsWhileBackwardRuns) {
  auto group = one_rank_group();
  Chain c(6, 16, /*with_unused=*/true);  // each layer ~1 KB + 64 B
  GradBucketOptions o;
  o.bucket_mb = 1100.0 / (1 << 20);  // one layer's W and b per bucket
  GradBuckets b(*group, c.params, o);
  ASSERT_GE(b.buckets().size(), 6u);
  const at::Tensor x = input(0, 16);
  c.loss(x).backward();  // without the hooks armed: the plain gradients
  const auto want = c.grads();
  for (int round = 1; round <= 3; ++round) {
    c.clear();
    b.begin();
    c.loss(x).backward();
    b.finish();
    const auto t = b.trace();
    const auto [first_send, last_arrival] = first_send_last_arrival(t);
    // Every parameter but the unused one arrives once; every bucket is sent once.
    EXPECT_EQ(std::count_if(t.begin(), t.end(), [](int64_t v) { return v >= 0; }),
              static_cast<long>(c.params.size() - 1));
    EXPECT_EQ(std::count_if(t.begin(), t.end(), [](int64_t v) { return v < 0; }),
              static_cast<long>(b.buckets().size()));
    // Sent in bucket order.
    int64_t expect = -1;
    for (int64_t v : t)
      if (v < 0) EXPECT_EQ(v, expect--);
    if (round == 1) {  // observing: all at the end
      EXPECT_FALSE(b.overlapping());
      EXPECT_GT(first_send, last_arrival);
      EXPECT_EQ(b.sent_during_backward(), 0);
    } else {
      EXPECT_TRUE(b.overlapping());
      EXPECT_LT(first_send, last_arrival) << "round " << round;
      EXPECT_GE(b.sent_during_backward(), static_cast<int64_t>(b.buckets().size()) - 2);
    }
    // Mean over one rank: the gradients unchanged, bit for bit.
    const auto got = c.grads();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].defined(), want[i].defined()) << i;
      if (got[i].defined()) EXPECT_TRUE(got[i].equal(want[i])) << "param " << i << " round " << round;
    }
  }
}

TEST(GradBuckets, GradientsArrivingTwiceTurnTheOverlapOff) {
  auto group = one_rank_group();
  Chain c(3, 8, false);
  GradBucketOptions o;
  o.bucket_mb = 300.0 / (1 << 20);
  GradBuckets b(*group, c.params, o);
  const at::Tensor x1 = input(1, 8), x2 = input(2, 8);
  c.loss(x1).backward();
  c.loss(x2).backward();  // accumulated: the sum of two
  const auto want = c.grads();
  for (int round = 1; round <= 2; ++round) {
    c.clear();
    b.begin();
    c.loss(x1).backward();
    c.loss(x2).backward();
    b.finish();
    EXPECT_FALSE(b.overlapping());
    EXPECT_EQ(b.sent_during_backward(), 0);
    const auto got = c.grads();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i].equal(want[i])) << i;
  }
  EXPECT_NE(b.note().find("more than once"), std::string::npos) << b.note();
}

// One rank of the Processes tests below (this binary run again).
TEST(DistWorker, Buckets) {
  if (std::getenv("DIST_TEST_BUCKETS_WORKER") == nullptr) GTEST_SKIP() << "a rank of the Processes tests only";
  const LaunchEnv env = perftrain::distributed::launch_env();
  perftrain::distributed::GroupOptions go;
  go.timeout_s = 30;
  Group group(env, at::kCPU, go);
  const int world = group.world_size();
  Chain c(5, 12, true);
  // The mean of every rank's own gradients, computed here directly.
  std::vector<at::Tensor> want;
  for (int r = 0; r < world; ++r) {
    c.clear();
    c.loss(input(r, 12)).backward();
    const auto g = c.grads();
    if (want.empty()) want = g;
    else
      for (size_t i = 0; i < g.size(); ++i)
        if (g[i].defined()) want[i] = want[i] + g[i];
  }
  for (auto& w : want)
    if (w.defined()) w = w / world;
  GradBucketOptions o;
  o.bucket_mb = 700.0 / (1 << 20);
  GradBuckets b(group, c.params, o);
  for (int round = 1; round <= 3; ++round) {
    c.clear();
    b.begin();
    c.loss(input(group.rank(), 12)).backward();
    b.finish();
    double max_diff = 0;
    const auto got = c.grads();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].defined(), want[i].defined()) << i;
      if (got[i].defined()) max_diff = std::max(max_diff, (got[i] - want[i]).abs().max().item<double>());
    }
    std::printf("rank %d round %d: bucketed mean max |diff| %.3g, %ld of %zu buckets sent during backward\n",
                group.rank(), round, max_diff, static_cast<long>(b.sent_during_backward()), b.buckets().size());
    EXPECT_LT(max_diff, 1e-6);
    if (round > 1) EXPECT_GT(b.sent_during_backward(), 0);
  }
  group.barrier();
}

void run_bucket_ranks(int world) {
  perftrain::testing::expect_ranks_pass(world, "DIST_TEST_BUCKETS_WORKER", "DistWorker.Buckets", /*quiet=*/false);
}

TEST(DistBucketProcesses, TwoRanks) { run_bucket_ranks(2); }
TEST(DistBucketProcesses, ThreeRanks) { run_bucket_ranks(3); }

}  // namespace
