// distributed::Group on CUDA tensors through NCCL, with one rank (the only setup one
// GPU allows: NCCL refuses two ranks on one device): the group connects, the
// bucketed all-reduce and the broadcast run through NCCL and give the inputs
// back, and the host scalars still go through Gloo. Fails with the build's
// "built without NCCL" message where nccl.h was not found.
#include <ATen/Context.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

#include "compat/compat.h"
#include "distributed/group.h"
#include "distributed/launch_env.h"

namespace {

TEST(DistGpu, NcclOneRankAllReduceAndBroadcast) {
  if (!perftrain::compat::cuda_available()) GTEST_SKIP() << "no CUDA GPU";
  perftrain::distributed::LaunchEnv env;
  env.world_size = 1, env.master_addr = "127.0.0.1", env.from_env = true;
  env.master_port = perftrain::distributed::free_loopback_port("test");
  perftrain::distributed::GroupOptions o;
  o.timeout_s = 60;
  o.bucket_mb = 0.001;  // ~1 KB: several buckets
  perftrain::distributed::Group group(env, at::Device(at::kCUDA, 0), o);
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  std::vector<at::Tensor> t = {at::randn({300}, cuda), at::randn({17, 5}, cuda),
                               at::randn({64}, cuda.dtype(at::kBFloat16)), at::randn({1000}, cuda)};
  std::vector<at::Tensor> before;
  for (const auto& x : t) before.push_back(x.clone());
  group.allreduce_mean(t);
  group.broadcast(t, 0);
  double max_diff = 0;
  for (size_t i = 0; i < t.size(); ++i)
    max_diff = std::max(max_diff, t[i].sub(before[i]).abs().max().item<double>());
  std::printf("NCCL one-rank all-reduce mean + broadcast: max |diff| %.3g\n", max_diff);
  EXPECT_EQ(max_diff, 0.0);
  EXPECT_DOUBLE_EQ(group.allreduce_sum({2.5})[0], 2.5);
  group.barrier();
}

}  // namespace
