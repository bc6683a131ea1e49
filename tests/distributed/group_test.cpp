// distributed::LaunchEnv's validation, and distributed::Group across real processes: this
// test binary runs itself 2 and 3 times as the ranks (the DistWorker test,
// which does nothing unless DIST_TEST_WORKER is set), over Gloo on
// 127.0.0.1 at a free port; each rank checks the collectives' results against
// the values every rank's seed gives.
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <limits>
#include <string>
#include <vector>

#include "base/error.h"
#include "distributed/group.h"
#include "distributed/launch_env.h"
#include "support/dist_ranks.h"
#include "support/test_support.h"

namespace {

using perftrain::UsageError;
using perftrain::distributed::launch_env_from;
using perftrain::distributed::LaunchEnv;

LaunchEnv env_of(const std::map<std::string, std::string>& vars) {
  return launch_env_from([&](const char* n) -> const char* {
    auto it = vars.find(n);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::map<std::string, std::string> good() {
  return {{"RANK", "2"}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29500"}};
}

TEST(LaunchEnv, NoneIsOneProcess) {
  const LaunchEnv e = env_of({});
  EXPECT_FALSE(e.from_env);
  EXPECT_FALSE(e.distributed());
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
}

TEST(LaunchEnv, ReadsAllFive) {
  const LaunchEnv e = env_of(good());
  EXPECT_TRUE(e.from_env);
  EXPECT_TRUE(e.distributed());
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.master_addr, "node7");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.describe(), "rank 2 of 4 (master node7:29500)");
  EXPECT_EQ(e.local_world_size, 4);  // LOCAL_WORLD_SIZE unset: one host
  auto vars = good();
  vars["LOCAL_WORLD_SIZE"] = "2";
  EXPECT_EQ(env_of(vars).local_world_size, 2);
}

TEST(LaunchEnv, BadValuesNameTheVariable) {
  using perftrain::testing::error_of;
  struct Case {
    const char* var;
    const char* value;  // nullptr: unset
    const char* expect;
  };
  const Case cases[] = {
      {"MASTER_PORT", nullptr, "MASTER_PORT not set"},
      {"RANK", nullptr, "RANK not set"},
      {"RANK", "4", "RANK='4' must be an integer in [0, WORLD_SIZE) = [0, 4)"},
      {"RANK", "-1", "RANK='-1'"},
      {"RANK", "1x", "RANK='1x'"},
      {"LOCAL_RANK", "3", "LOCAL_RANK=3 must not exceed RANK=2"},
      {"WORLD_SIZE", "0", "WORLD_SIZE='0' must be an integer >= 1"},
      {"WORLD_SIZE", "two", "WORLD_SIZE='two'"},
      {"MASTER_PORT", "65536", "MASTER_PORT='65536' must be an integer in 1..65535"},
      {"MASTER_PORT", "0", "MASTER_PORT='0'"},
      {"MASTER_ADDR", "", "MASTER_ADDR is empty"},
      {"LOCAL_WORLD_SIZE", "5", "LOCAL_WORLD_SIZE='5' must be an integer in [1, WORLD_SIZE] = [1, 4]"},
      {"LOCAL_WORLD_SIZE", "0", "LOCAL_WORLD_SIZE='0'"},
      {"LOCAL_WORLD_SIZE", "2x", "LOCAL_WORLD_SIZE='2x'"},
  };
  for (const auto& c : cases) {
    auto vars = good();
    if (c.value == nullptr) vars.erase(c.var);
    else vars[c.var] = c.value;
    const std::string msg = error_of<UsageError>([&] { env_of(vars); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.var << ": " << msg;
  }
}

// The inputs of rank r: fresh random values from its own seed (float and
// double, sizes that do not fill a bucket evenly).
std::vector<at::Tensor> inputs_of(int r) {
  at::Generator g = at::globalContext().defaultGenerator(at::kCPU).clone();
  g.set_current_seed(1000 + r);
  return {at::randn({3, 5}, g), at::randn({7}, g), at::randn({2, 2, 2}, g, at::TensorOptions().dtype(at::kDouble)),
          at::randn({11}, g), at::randn({1}, g)};
}

// One rank (run by the Processes tests below through this same binary).
TEST(DistWorker, Collectives) {
  if (std::getenv("DIST_TEST_WORKER") == nullptr) GTEST_SKIP() << "a rank of the Processes tests only";
  const LaunchEnv env = perftrain::distributed::launch_env();
  ASSERT_TRUE(env.distributed());
  perftrain::distributed::GroupOptions o;
  o.timeout_s = 30;
  o.bucket_mb = 40.0 / (1 << 20);  // 40 bytes: several buckets, a tensor larger than one alone
  perftrain::distributed::Group group(env, at::kCPU, o);
  const int world = group.world_size();

  std::vector<at::Tensor> mine = inputs_of(group.rank());
  std::vector<at::Tensor> want;
  for (size_t i = 0; i < mine.size(); ++i) want.push_back(at::zeros_like(mine[i]));
  for (int r = 0; r < world; ++r) {
    auto in = inputs_of(r);
    for (size_t i = 0; i < in.size(); ++i) want[i].add_(in[i]);
  }
  group.allreduce_mean(mine);
  double max_diff = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    want[i].div_(world);
    max_diff = std::max(max_diff, mine[i].sub(want[i]).abs().max().item<double>());
  }
  std::printf("rank %d: all-reduce mean max |diff| %.3g\n", group.rank(), max_diff);
  EXPECT_LT(max_diff, 1e-6);

  // Broadcast from the last rank: everyone ends with its inputs.
  std::vector<at::Tensor> b = inputs_of(group.rank());
  group.broadcast(b, world - 1);
  const auto root = inputs_of(world - 1);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_TRUE(b[i].equal(root[i])) << "tensor " << i;

  const auto sums = group.allreduce_sum({1.0 * group.rank(), 0.5});
  EXPECT_DOUBLE_EQ(sums[0], world * (world - 1) / 2.0);
  EXPECT_DOUBLE_EQ(sums[1], 0.5 * world);
  EXPECT_DOUBLE_EQ(group.allreduce_max(group.rank() == 1 ? 7.0 : -1.0), 7.0);
  // The elementwise maximum of a tensor, in place (fp8's amax): rank 1's +inf wins.
  const float r = float(group.rank()), inf = std::numeric_limits<float>::infinity();
  at::Tensor m = at::tensor({r, -r, group.rank() == 1 ? inf : 1.5f});
  group.start_allreduce_max(m)();
  EXPECT_TRUE(m.equal(at::tensor({float(world - 1), 0.f, inf}))) << m;
  group.barrier();
}

// world ranks of DistWorker.Collectives, each under a hard timeout.
void run_ranks(int world) {
  perftrain::testing::expect_ranks_pass(world, "DIST_TEST_WORKER", "DistWorker.Collectives", /*quiet=*/true);
}

TEST(DistProcesses, TwoRanks) { run_ranks(2); }
TEST(DistProcesses, ThreeRanks) { run_ranks(3); }

// A master that no one hosts: the client gives up after distributed.timeout_s with
// the rank and the address.
TEST(DistProcesses, UnreachableMaster) {
  LaunchEnv env;
  env.rank = 1, env.local_rank = 1, env.world_size = 2, env.master_addr = "127.0.0.1";
  env.master_port = perftrain::distributed::free_loopback_port("test");
  env.from_env = true;
  perftrain::distributed::GroupOptions o;
  o.timeout_s = 2;
  const std::string msg = perftrain::testing::error_of<perftrain::RuntimeError>(
      [&] { perftrain::distributed::Group g(env, at::kCPU, o); });
  EXPECT_NE(msg.find("rank 1 of 2 (master 127.0.0.1:" + std::to_string(env.master_port) + "): cannot reach the master"),
            std::string::npos)
      << msg;
}

}  // namespace
