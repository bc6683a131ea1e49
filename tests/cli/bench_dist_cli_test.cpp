// `perftrain bench` data parallel on the CPU over Gloo, in real processes:
// --nproc-per-node 2 times the trainer's multi-process step beside the same
// variant run by one process, and bench.json says so (world size, per-rank
// and total img/s, scaling efficiency and exposed communication computed from
// the two rows, every rank's median); one rank (the single-GPU case); ranks
// started by hand with torchrun's variables; --against-torch runs the
// reference under DistributedDataParallel. Every process runs under a hard
// timeout, so nothing can hang.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "base/fs.h"
#include "distributed/launch_env.h"
#include "support/test_support.h"

namespace {

using perftrain::testing::read_raw;
using perftrain::testing::TempDir;

const std::string kTiny =
    " bench --device cpu --model DiT-T/4 --batch 2 --steps 3 --warmup 1 --variants eager-fp32"
    " --set distributed.timeout_s=180";

perftrain::testing::CommandResult run(const std::string& args, const std::string& env = "") {
  return perftrain::testing::run_shell(env + " timeout -k 5 240 " + std::string(PERFTRAIN_BINARY) + args);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

bool have_torch() {
  return perftrain::testing::run_command(std::string(PERFTRAIN_PYTHON) + " -c 'import torch' >/dev/null 2>&1") == 0;
}

// A data-parallel bench.json of `world` ranks, one batch and one variant:
// the multi-process row and its one-process baseline, and the numbers the
// report derives from them, recomputed here.
void expect_data_parallel_report(const nlohmann::json& j, int world) {
  const auto& c = j["config"];
  EXPECT_EQ(c["world_size"], world) << c.dump(2);
  EXPECT_EQ(c["data_parallel"], true);
  EXPECT_EQ(c["dist_backend"], "gloo");
  ASSERT_EQ(j["rows"].size(), 1u);
  ASSERT_EQ(j["single_process"].size(), 1u);
  const auto& row = j["rows"][0];
  const auto& one = j["single_process"][0];
  ASSERT_TRUE(row["error"].is_null()) << row.dump(2);
  ASSERT_TRUE(one["error"].is_null()) << one.dump(2);
  EXPECT_EQ(row["data_parallel"], true);
  EXPECT_EQ(row["world_size"], world);
  EXPECT_EQ(one["data_parallel"], false);
  EXPECT_EQ(one["world_size"], 1);
  EXPECT_EQ(row["variant"], "eager-fp32");
  EXPECT_EQ(one["variant"], "eager-fp32");
  EXPECT_EQ(row["batch"], 2);  // per rank
  EXPECT_EQ(one["batch"], 2);
  EXPECT_EQ(row["step_ms"].size(), 3u);
  EXPECT_TRUE(std::isfinite(row["loss"].get<double>()));
  EXPECT_TRUE(std::isfinite(one["loss"].get<double>()));
  const double ms = row["ms"].get<double>(), ms1 = one["ms"].get<double>();
  ASSERT_GT(ms, 0.0);
  ASSERT_GT(ms1, 0.0);
  const auto rank_ms = row["rank_ms"].get<std::vector<double>>();
  ASSERT_EQ(rank_ms.size(), static_cast<size_t>(world));
  for (double x : rank_ms) EXPECT_GT(x, 0.0);
  EXPECT_DOUBLE_EQ(rank_ms[0], ms);  // rank 0's own
  const double slowest = *std::max_element(rank_ms.begin(), rank_ms.end());
  EXPECT_NEAR(row["images_per_s"].get<double>(), 2 / (ms / 1e3), 1e-6 * (2 / (ms / 1e3)));
  EXPECT_NEAR(row["images_per_s_total"].get<double>(), world * 2 / (slowest / 1e3), 1e-6 * (world * 2 / (slowest / 1e3)));
  EXPECT_NEAR(row["scaling_efficiency"].get<double>(), ms1 / ms, 1e-12);
  EXPECT_NEAR(row["exposed_comm_ms"].get<double>(), ms - ms1, 1e-9);
  EXPECT_EQ(j["summary"][0]["ms"], row["ms"]);  // the summary is the multi-process row's
}

TEST(BenchDataParallel, TwoRanksBesideOneProcess) {
  TempDir tmp;
  auto r = run(kTiny + " --nproc-per-node 2 --out " + tmp.file("b"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "data parallel: 2 ranks over gloo")) << r.output;
  EXPECT_TRUE(contains(r.output, "batch 2 eager-fp32, 1 process:")) << r.output;
  EXPECT_TRUE(contains(r.output, "batch 2 eager-fp32, 2 ranks:")) << r.output;
  EXPECT_TRUE(contains(r.output, "scaling efficiency")) << r.output;
  // Rank 0 alone prints: one header, one table.
  size_t headers = 0;
  for (size_t p = 0; (p = r.output.find("perftrain bench: ", p)) != std::string::npos; ++p) ++headers;
  EXPECT_EQ(headers, 1u) << r.output;
  const auto j = nlohmann::json::parse(read_raw(tmp.file("b/bench.json")));
  expect_data_parallel_report(j, 2);
  EXPECT_TRUE(contains(j["method"].get<std::string>(), "exposed communication")) << j["method"];
  const auto md = read_raw(tmp.file("b/bench.md"));
  EXPECT_TRUE(contains(md, "## Data parallel")) << md;
  EXPECT_TRUE(contains(md, "| 2 | eager-fp32 | 2 | ")) << md;
  EXPECT_TRUE(contains(md, "| 2 | eager-fp32, 1 process | ")) << md;
  EXPECT_TRUE(contains(md, "| 2 | eager-fp32, 2 ranks | ")) << md;
}

// One rank (what a one-GPU machine can run: the group's path with nothing to
// wait for), and two ranks started by hand as torchrun starts them.
TEST(BenchDataParallel, OneRankAndRanksStartedByTorchrunVariables) {
  TempDir tmp;
  auto r = run(kTiny + " --nproc-per-node 1 --out " + tmp.file("one"));
  ASSERT_EQ(r.code, 0) << r.output;
  expect_data_parallel_report(nlohmann::json::parse(read_raw(tmp.file("one/bench.json"))), 1);
  EXPECT_TRUE(contains(r.output, "batch 2 eager-fp32, 1 rank:")) << r.output;

  const std::string port = std::to_string(perftrain::distributed::free_loopback_port("test"));
  const std::string vars = "LOCAL_WORLD_SIZE=2 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port;
  const std::string bin = " timeout -k 5 240 " + std::string(PERFTRAIN_BINARY) + kTiny + " --out " + tmp.file("tr");
  r = perftrain::testing::run_shell("(RANK=1 LOCAL_RANK=1 " + vars + bin + " > " + tmp.file("rank1.log") +
                                    " 2>&1; echo $? > " + tmp.file("rank1.rc") + ") & RANK=0 LOCAL_RANK=0 " + vars +
                                    bin + "; s=$?; wait; exit $s");
  ASSERT_EQ(r.code, 0) << r.output << "\nrank 1:\n" << read_raw(tmp.file("rank1.log"));
  EXPECT_EQ(read_raw(tmp.file("rank1.rc")), "0\n") << read_raw(tmp.file("rank1.log"));
  EXPECT_FALSE(contains(read_raw(tmp.file("rank1.log")), "perftrain bench: ")) << "rank 1 prints no report";
  expect_data_parallel_report(nlohmann::json::parse(read_raw(tmp.file("tr/bench.json"))), 2);

  // --nproc-per-node under torchrun's variables: a usage error before anything runs.
  r = run(kTiny + " --nproc-per-node 2 --out " + tmp.file("x"),
          "RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--nproc-per-node starts the ranks itself")) << r.output;
  EXPECT_FALSE(perftrain::fs::exists(tmp.file("x")));
}

TEST(BenchDataParallel, AgainstTorchDistributedDataParallel) {
  if (!have_torch()) GTEST_SKIP() << "no Python with torch at " << PERFTRAIN_PYTHON;
  TempDir tmp;
  auto r = run(kTiny + " --nproc-per-node 2 --against-torch --torch-modes eager-fp32 --python " +
                   std::string(PERFTRAIN_PYTHON) + " --out " + tmp.file("t"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(read_raw(tmp.file("t/bench.json")));
  expect_data_parallel_report(j, 2);
  ASSERT_EQ(j["torch"].size(), 1u);
  const auto& t = j["torch"][0];
  const std::string log = read_raw(t["log"].get<std::string>());
  ASSERT_TRUE(t["error"].is_null()) << t.dump(2) << "\n" << log;
  EXPECT_TRUE(contains(log, "-m torch.distributed.run --standalone --nnodes 1 --nproc-per-node 2 ")) << log;
  EXPECT_TRUE(contains(log, " --ddp")) << log;
  EXPECT_EQ(t["world_size"], 2);
  EXPECT_EQ(t["mode"], "eager-fp32");
  EXPECT_GT(t["ms"].get<double>(), 0.0);
  EXPECT_GT(t["images_per_s_total"].get<double>(), t["images_per_s"].get<double>());
  const auto& s = j["summary"][0];
  EXPECT_EQ(s["best_torch_mode"], "eager-fp32");
  EXPECT_NEAR(s["speedup_vs_best_torch"].get<double>(), t["ms"].get<double>() / s["ms"].get<double>(), 1e-9);
  EXPECT_TRUE(contains(r.output, "torch eager-fp32 DDP x2")) << r.output;
}

}  // namespace
