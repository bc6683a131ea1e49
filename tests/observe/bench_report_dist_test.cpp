// The data-parallel bench's report: the multi-process rows beside their
// one-process twins in JSON, bench.md's "Data parallel" table and the
// stdout lines, each number as the row holds it, n/a where the twin failed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <vector>

#include "observe/bench/report.h"
#include "support/test_support.h"

namespace {

using namespace perftrain::observe::bench;

using perftrain::testing::contains;

BenchRow row(const std::string& variant, double ms, int64_t world) {
  BenchRow r;
  r.model = "DiT-XL/2";
  r.batch = 256;
  r.variant = variant;
  r.ms = ms;
  r.graph_status = "captured at step 4";
  r.world_size = world;
  r.data_parallel = world > 0;
  if (world == 0) r.world_size = 1;
  fill_rates(r, 3 * 118.6e9 * 256, 800.0);
  return r;
}

BenchReport dp_report() {
  BenchReport r;
  r.settings.model = "DiT-XL/2";
  r.settings.device = "cuda";
  r.settings.world_size = 2;
  r.settings.dist_backend = "nccl";
  r.single_process = {row("all", 800.0, 0), row("fused", 900.0, 0)};
  r.single_process[1].error = "CUDA out of memory";
  r.single_process[1].ms.reset();
  BenchRow all = row("all", 820.0, 2);
  all.rank_ms = {820.0, 830.0};
  all.images_per_s_total = 2 * 256 / 0.830;
  all.scaling_efficiency = 800.0 / 820.0;
  all.exposed_comm_ms = 20.0;
  BenchRow fused = row("fused", 950.0, 2);  // its twin failed: no efficiency
  fused.rank_ms = {950.0, 940.0};
  fused.images_per_s_total = 2 * 256 / 0.950;
  r.rows = {all, fused};
  r.summary = summarize_batches(r.rows, r.torch);
  return r;
}

TEST(BenchReportDist, JsonHoldsBothKindsOfRowAndTheGroup) {
  const auto j = to_json(dp_report());
  EXPECT_EQ(j["config"]["world_size"], 2);
  EXPECT_EQ(j["config"]["data_parallel"], true);
  EXPECT_EQ(j["config"]["dist_backend"], "nccl");
  ASSERT_EQ(j["rows"].size(), 2u);
  ASSERT_EQ(j["single_process"].size(), 2u);
  const auto& all = j["rows"][0];
  EXPECT_EQ(all["data_parallel"], true);
  EXPECT_EQ(all["world_size"], 2);
  EXPECT_EQ(all["rank_ms"].get<std::vector<double>>(), (std::vector<double>{820.0, 830.0}));
  EXPECT_DOUBLE_EQ(all["images_per_s"].get<double>(), 256 / 0.820);
  EXPECT_DOUBLE_EQ(all["images_per_s_total"].get<double>(), 512 / 0.830);
  EXPECT_DOUBLE_EQ(all["scaling_efficiency"].get<double>(), 800.0 / 820.0);
  EXPECT_DOUBLE_EQ(all["exposed_comm_ms"].get<double>(), 20.0);
  EXPECT_TRUE(j["rows"][1]["scaling_efficiency"].is_null());
  EXPECT_EQ(j["single_process"][0]["data_parallel"], false);
  EXPECT_EQ(j["single_process"][0]["world_size"], 1);
  EXPECT_EQ(j["single_process"][1]["error"], "CUDA out of memory");
  EXPECT_TRUE(contains(j["method"].get<std::string>(), "2 ranks")) << j["method"];
  EXPECT_EQ(j["summary"][0]["ms"], 820.0);  // the summary is the multi-process row

  // One process without a group: no data-parallel keys' values.
  BenchReport one;
  one.rows = {row("all", 800.0, 0)};
  const auto k = to_json(one);
  EXPECT_EQ(k["config"]["world_size"], 0);
  EXPECT_EQ(k["config"]["data_parallel"], false);
  EXPECT_TRUE(k["config"]["dist_backend"].is_null());
  EXPECT_TRUE(k["single_process"].empty());
  EXPECT_EQ(k["rows"][0]["data_parallel"], false);
}

TEST(BenchReportDist, MarkdownTableAndLines) {
  const auto r = dp_report();
  const std::string md = to_markdown(r);
  EXPECT_TRUE(contains(md, "## Data parallel\n\n2 ranks over nccl")) << md;
  EXPECT_TRUE(contains(md, "| 256 | all | 2 | 820.00 | 800.00 | 312.2 | 616.9 | 97.6% | 20.00 | 820.00, 830.00 | "
                           "captured at step 4 |"))
      << md;
  EXPECT_TRUE(contains(md, "| 256 | fused | 2 | 950.00 | n/a | 269.5 | 538.9 | n/a | n/a | 950.00, 940.00 |")) << md;
  EXPECT_TRUE(contains(md, "| 256 | all, 1 process | 800.00 |")) << md;  // the results table names both
  EXPECT_TRUE(contains(md, "| 256 | all, 2 ranks | 820.00 |")) << md;
  EXPECT_EQ(data_parallel_line(r, r.rows[0]),
            "DiT-XL/2 batch 256 per rank, all, 2 ranks: 820.00 ms (alone 800.00 ms), 312.2 img/s per GPU, 616.9 "
            "img/s total, scaling efficiency 97.6%, exposed communication 20.00 ms");
  const std::string table = format_table(r);
  EXPECT_TRUE(contains(table, "all, 1 process")) << table;
  EXPECT_TRUE(contains(table, data_parallel_line(r, r.rows[1]))) << table;
  // Without a group the tables name the variant alone.
  BenchReport one;
  one.rows = {row("all", 800.0, 0)};
  EXPECT_FALSE(contains(format_table(one), "process")) << format_table(one);
  EXPECT_FALSE(contains(to_markdown(one), "## Data parallel"));
}

}  // namespace
