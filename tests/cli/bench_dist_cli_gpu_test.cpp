// `perftrain bench --nproc-per-node 1` on a GPU: a one-rank NCCL group (what
// a one-GPU machine can run of the data-parallel bench), the trainer's
// group step beside the same step without a group, as a user runs it.
// Skips without a GPU; a build without NCCL skips saying so.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <string>

#include "compat/compat.h"
#include "support/test_support.h"

namespace {

using perftrain::testing::read_raw;
using perftrain::testing::TempDir;

TEST(BenchDataParallelGpu, OneRankNcclGroupBesideOneProcess) {
  if (!perftrain::compat::cuda_available()) GTEST_SKIP() << "no CUDA GPU";
  TempDir tmp;
  const auto r = perftrain::testing::run_shell(
      "timeout -k 5 300 " + std::string(PERFTRAIN_BINARY) +
      " bench --nproc-per-node 1 --device cuda --model DiT-T/4 --batch 16 --variants eager-bf16,all --steps 6"
      " --warmup 5 --set distributed.timeout_s=120 --out " + tmp.file("b"));
  if (r.output.find("built without NCCL") != std::string::npos) GTEST_SKIP() << "this build has no NCCL";
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("data parallel: 1 rank over nccl"), std::string::npos) << r.output;
  const auto j = nlohmann::json::parse(read_raw(tmp.file("b/bench.json")));
  EXPECT_EQ(j["config"]["world_size"], 1);
  EXPECT_EQ(j["config"]["dist_backend"], "nccl");
  ASSERT_EQ(j["rows"].size(), 2u);
  ASSERT_EQ(j["single_process"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto& row = j["rows"][i];
    const auto& one = j["single_process"][i];
    ASSERT_TRUE(row["error"].is_null()) << row.dump(2) << "\n" << r.output;
    ASSERT_TRUE(one["error"].is_null()) << one.dump(2) << "\n" << r.output;
    EXPECT_EQ(row["variant"], one["variant"]);
    EXPECT_EQ(row["world_size"], 1);
    EXPECT_EQ(row["data_parallel"], true);
    EXPECT_EQ(one["data_parallel"], false);
    const double ms = row["ms"].get<double>(), ms1 = one["ms"].get<double>();
    std::printf("%s: 1 process %.3f ms (%s), 1-rank NCCL group %.3f ms (%s): efficiency %.3f, exposed %.3f ms, "
                "loss %.4f vs %.4f\n",
                row["variant"].get<std::string>().c_str(), ms1, one["graph_status"].get<std::string>().c_str(), ms,
                row["graph_status"].get<std::string>().c_str(), row["scaling_efficiency"].get<double>(),
                row["exposed_comm_ms"].get<double>(), one["loss"].get<double>(), row["loss"].get<double>());
    EXPECT_GT(ms, 0.0);
    EXPECT_NEAR(row["scaling_efficiency"].get<double>(), ms1 / ms, 1e-9);
    EXPECT_NEAR(row["exposed_comm_ms"].get<double>(), ms - ms1, 1e-9);
    EXPECT_TRUE(std::isfinite(row["loss"].get<double>()));
    EXPECT_GT(row["peak_gib"].get<double>(), 0.0);
    ASSERT_EQ(row["rank_ms"].size(), 1u);
    EXPECT_DOUBLE_EQ(row["rank_ms"][0].get<double>(), ms);
  }
  // The full stack with the group is captured as without it.
  EXPECT_EQ(j["rows"][1]["graph_status"].get<std::string>().rfind("captured", 0), 0u) << j["rows"][1].dump(2);
  EXPECT_EQ(j["single_process"][1]["graph_status"].get<std::string>().rfind("captured", 0), 0u);
}

}  // namespace
