// ZeRO-1 (distributed.shard_optimizer = true) on the CPU over Gloo, as a user runs
// it (perftrain train --nproc-per-node N): 2 and 3 sharded ranks train as one
// unsharded process does (losses, weights, EMA, and the whole optimizer state
// rank 0 gathers into the checkpoint); each rank holds a share of the state
// (the logged bytes); a checkpoint of a sharded 2-rank run resumes sharded in
// 3 processes and unsharded in one, and both end where an uninterrupted run
// does; in fp8 too. Every process runs under a hard timeout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "cli/dist_runs.h"
#include "support/test_support.h"

namespace {

using perftrain::testing::read_raw;
using perftrain::testing::TempDir;

// A tiny DiT on the CPU, label dropout, clipping that bites and weight decay; global batch 6.
const std::string kTiny =
    " --device cpu --batch-size 6 --data synthetic --set data.synthetic_size=40"
    " --set model.depth=1 --set model.hidden=32 --set model.heads=2 --set model.patch=4 --set model.image_size=8"
    " --set model.in_channels=2 --set model.num_classes=3 --set model.class_dropout=0.3"
    " --set train.grad_clip=0.05 --set train.weight_decay=0.01"
    " --set log.sample_every=0 --set log.every=1 --set log.sample_per_class=1 --set log.sample_classes=2"
    " --set diffusion.sample_steps=1 --set log.tensorboard=false --set distributed.timeout_s=30 --set log.checkpoint_every=0";
const std::string kShard = " --set distributed.shard_optimizer=true";

using perftrain::testing::dist_runs::expect_fp8_scales_as_one_process;
using perftrain::testing::dist_runs::latest;
using perftrain::testing::dist_runs::losses;
using perftrain::testing::dist_runs::run;

// The largest |a - b| over the floating tensors of two checkpoints' file, which must hold the same names.
double max_diff(const std::string& a_dir, const std::string& b_dir, const char* file) {
  const auto a = perftrain::io::SafetensorsFile::open(latest(a_dir) + "/" + file);
  const auto b = perftrain::io::SafetensorsFile::open(latest(b_dir) + "/" + file);
  EXPECT_EQ(a.names(), b.names()) << file;
  double d = 0;
  for (const auto& n : a.names()) {
    if (!b.contains(n)) continue;
    const at::Tensor x = a.get(n), y = b.get(n);
    if (!x.is_floating_point()) continue;
    EXPECT_EQ(x.sizes(), y.sizes()) << n;
    d = std::max(d, x.sub(y).abs().max().item<double>());
  }
  return d;
}

void expect_same_end(const std::string& one, const std::string& other, const std::string& what) {
  const double w = max_diff(one, other, "model.safetensors");
  const double e = max_diff(one, other, "ema.safetensors");
  const double s = max_diff(one, other, "trainer_state.safetensors");
  std::printf("%s: max |weight difference| %.3g, EMA %.3g, optimizer state %.3g\n", what.c_str(), w, e, s);
  EXPECT_LT(w, 2e-6) << what;
  EXPECT_LT(e, 2e-6) << what;
  EXPECT_LT(s, 2e-6) << what;
}

// "(H of W bytes" from the log line: this rank's and the whole state's bytes.
std::pair<double, double> logged_bytes(const std::string& output, int ranks) {
  const std::regex re("optimizer state sharded over " + std::to_string(ranks) +
                      " ranks: [^(]*\\((\\d+) of (\\d+) bytes");
  std::smatch m;
  if (!std::regex_search(output, m, re)) return {-1, -1};
  return {std::stod(m[1]), std::stod(m[2])};
}

TEST(DataParallelZero1, ShardedTwoAndThreeRanksTrainAsOneProcess) {
  TempDir tmp;
  const std::string common = " --runs-dir " + tmp.path() + kTiny + " --steps 6";
  auto r1 = run("train --run-name one" + common);
  ASSERT_EQ(r1.code, 0) << r1.output;
  EXPECT_EQ(r1.output.find("optimizer state sharded"), std::string::npos) << r1.output;
  auto r2 = run("train --nproc-per-node 2 --run-name two" + common + kShard);
  ASSERT_EQ(r2.code, 0) << r2.output;
  auto r3 = run("train --nproc-per-node 3 --run-name three" + common + kShard);
  ASSERT_EQ(r3.code, 0) << r3.output;
  for (const auto& [dir, what] : {std::pair<std::string, std::string>{"two", "2 sharded ranks vs 1 process"},
                                  {"three", "3 sharded ranks vs 1 process"}}) {
    const auto a = losses(tmp.file("one")), b = losses(tmp.file(dir));
    ASSERT_EQ(a.size(), b.size()) << what;
    double loss_diff = 0;
    for (size_t i = 0; i < a.size(); ++i) loss_diff = std::max(loss_diff, std::abs(a[i] - b[i]) / std::abs(a[i]));
    std::printf("%s: %zu steps, max relative loss difference %.3g\n", what.c_str(), a.size(), loss_diff);
    EXPECT_LT(loss_diff, 1e-5) << what;
    expect_same_end(tmp.file("one"), tmp.file(dir), what);
  }
  // Rank 0 holds about 1/N of the state (whole tensors: not exactly).
  const auto [here2, whole2] = logged_bytes(r2.output, 2);
  const auto [here3, whole3] = logged_bytes(r3.output, 3);
  std::printf("rank 0's optimizer state: %.0f of %.0f bytes (2 ranks), %.0f of %.0f (3 ranks)\n", here2, whole2,
              here3, whole3);
  ASSERT_GT(here2, 0) << r2.output;
  ASSERT_GT(here3, 0) << r3.output;
  EXPECT_EQ(whole2, whole3);
  EXPECT_LT(here2, 0.6 * whole2);
  EXPECT_LT(here3, 0.45 * whole3);
}

TEST(DataParallelZero1, ShardedCheckpointResumesWithThreeRanksAndWithOne) {
  TempDir tmp;
  const std::string common = " --runs-dir " + tmp.path() + kTiny;
  auto whole = run("train --run-name whole --steps 6" + common);
  ASSERT_EQ(whole.code, 0) << whole.output;
  auto first = run("train --nproc-per-node 2 --run-name split --steps 3" + common + kShard);
  ASSERT_EQ(first.code, 0) << first.output;
  // The same checkpoint, once more, for the one-process resume.
  ASSERT_EQ(perftrain::testing::run_shell("cp -a " + tmp.file("split") + " " + tmp.file("split1")).code, 0);
  auto three = run("train --nproc-per-node 3 --resume " + tmp.file("split") + " --steps 6");
  ASSERT_EQ(three.code, 0) << three.output;
  EXPECT_NE(three.output.find("resumed from"), std::string::npos) << three.output;
  EXPECT_NE(three.output.find("optimizer state sharded over 3 ranks"), std::string::npos) << three.output;
  auto one = run("train --resume " + tmp.file("split1") + " --steps 6");
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_EQ(one.output.find("optimizer state sharded"), std::string::npos) << one.output;
  EXPECT_NE(latest(tmp.file("split")).find("step_00000006"), std::string::npos);
  EXPECT_NE(latest(tmp.file("split1")).find("step_00000006"), std::string::npos);
  expect_same_end(tmp.file("whole"), tmp.file("split"), "2 sharded ranks 3 steps + 3 sharded ranks 3 steps vs 1 process");
  expect_same_end(tmp.file("whole"), tmp.file("split1"), "2 sharded ranks 3 steps + 1 process 3 steps vs 1 process");
}

// train.precision = fp8 with ZeRO-1: 2 sharded ranks, 3 steps, resumed
// sharded (every rank loads the checkpoint's scaling state) to step 5, end
// where one unsharded process does: the weights, the EMA and the fp8 scales.
TEST(DataParallelZero1, ShardedFp8RanksResumedTrainAsOneProcess) {
  TempDir tmp;
  const std::string common = " --runs-dir " + tmp.path() + kTiny + " --precision fp8";
  auto whole = run("train --run-name whole --steps 5" + common);
  ASSERT_EQ(whole.code, 0) << whole.output;
  auto first = run("train --nproc-per-node 2 --run-name split --steps 3" + common + kShard);
  ASSERT_EQ(first.code, 0) << first.output;
  auto rest = run("train --nproc-per-node 2 --resume " + tmp.file("split") + " --steps 5");
  ASSERT_EQ(rest.code, 0) << rest.output;
  EXPECT_NE(rest.output.find("resumed from"), std::string::npos) << rest.output;
  EXPECT_NE(rest.output.find("optimizer state sharded over 2 ranks"), std::string::npos) << rest.output;
  EXPECT_NE(latest(tmp.file("split")).find("step_00000005"), std::string::npos);
  const double w = max_diff(tmp.file("whole"), tmp.file("split"), "model.safetensors");
  const double e = max_diff(tmp.file("whole"), tmp.file("split"), "ema.safetensors");
  std::printf("fp8, 2 sharded ranks 3 + 2 steps vs 1 process: max |weight difference| %.3g, EMA %.3g\n", w, e);
  EXPECT_LT(w, 2e-6);
  EXPECT_LT(e, 2e-6);
  EXPECT_GE(expect_fp8_scales_as_one_process(tmp.file("whole"), tmp.file("split"), 2), 4);
}

}  // namespace
