// Data parallel on the CPU over Gloo, as a user runs it (real processes:
// perftrain train --nproc-per-node N, and torchrun's variables set by hand):
// 2 and 3 ranks train the same model as one process with the same global
// batch, and the report says how many ranks ran; a 2-rank run resumed with
// 3 ranks ends where an uninterrupted run does, its report listing both
// segments; a signal stops every rank at one step with one checkpoint; a
// killed rank makes the run fail naming it instead of hanging; bad launch
// variables are usage errors naming the variable. Every process runs under a
// hard timeout and the launcher picks a free port, so nothing can hang or
// collide.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/fs.h"
#include "io/safetensors.h"
#include "cli/dist_runs.h"
#include "support/child_process.h"
#include "support/test_support.h"

namespace {

using perftrain::testing::read_raw;
using perftrain::testing::TempDir;
using Clock = std::chrono::steady_clock;
using perftrain::testing::wait_exit;

// A tiny DiT on the CPU (milliseconds a step), label dropout on, global batch 6.
const std::string kTiny =
    " --device cpu --batch-size 6 --data synthetic --set data.synthetic_size=40"
    " --set model.depth=1 --set model.hidden=32 --set model.heads=2 --set model.patch=4 --set model.image_size=8"
    " --set model.in_channels=2 --set model.num_classes=3 --set model.class_dropout=0.3"
    " --set log.sample_every=0 --set log.every=1 --set log.sample_per_class=1 --set log.sample_classes=2"
    " --set diffusion.sample_steps=1 --set log.tensorboard=false --set distributed.timeout_s=30 --set log.checkpoint_every=0";

using perftrain::testing::dist_runs::expect_fp8_scales_as_one_process;
using perftrain::testing::dist_runs::latest;
using perftrain::testing::dist_runs::losses;
using perftrain::testing::dist_runs::run;

// The largest |a - b| over every tensor of two checkpoints' file.
double max_weight_diff(const std::string& a_dir, const std::string& b_dir, const char* file) {
  const auto a = perftrain::io::SafetensorsFile::open(latest(a_dir) + "/" + file);
  const auto b = perftrain::io::SafetensorsFile::open(latest(b_dir) + "/" + file);
  EXPECT_EQ(a.names(), b.names());
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

// Step by step, the losses equal within fp32 summation order; the weights and
// the EMA too.
void expect_same_training(const std::string& one, const std::string& many, const std::string& what) {
  const auto a = losses(one), b = losses(many);
  ASSERT_EQ(a.size(), b.size()) << what;
  double loss_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) loss_diff = std::max(loss_diff, std::abs(a[i] - b[i]) / std::abs(a[i]));
  const double w = max_weight_diff(one, many, "model.safetensors");
  const double e = max_weight_diff(one, many, "ema.safetensors");
  std::printf("%s: %zu steps, max relative loss difference %.3g, max |weight difference| %.3g, EMA %.3g\n",
              what.c_str(), a.size(), loss_diff, w, e);
  EXPECT_LT(loss_diff, 1e-5) << what;
  EXPECT_LT(w, 2e-6) << what;
  EXPECT_LT(e, 2e-6) << what;
  EXPECT_GT(a.front(), 0);
}

TEST(DataParallel, TwoAndThreeRanksTrainAsOneProcess) {
  TempDir tmp;
  const std::string common = " --runs-dir " + tmp.path() + kTiny + " --steps 6";
  auto r1 = run("train --run-name one" + common);
  ASSERT_EQ(r1.code, 0) << r1.output;
  auto r2 = run("train --nproc-per-node 2 --run-name two" + common);
  ASSERT_EQ(r2.code, 0) << r2.output;
  EXPECT_NE(r2.output.find("data parallel: 2 processes"), std::string::npos) << r2.output;
  auto r3 = run("train --nproc-per-node=3 --run-name three" + common);
  ASSERT_EQ(r3.code, 0) << r3.output;
  expect_same_training(tmp.file("one"), tmp.file("two"), "2 ranks vs 1");
  expect_same_training(tmp.file("one"), tmp.file("three"), "3 ranks vs 1");
  // Rank 0 alone wrote the run directory: one checkpoint per save, one metrics line per step.
  EXPECT_EQ(losses(tmp.file("three")).size(), 5u);  // steps 2..6 (the first step is timed apart)
  // The report says how many ranks ran and the global batch.
  const std::string report = read_raw(tmp.file("two/report.md"));
  EXPECT_NE(report.find("| ranks | 2 processes (data parallel), global batch 6 = 2 x 3 per rank |"),
            std::string::npos)
      << report;
  EXPECT_NE(read_raw(tmp.file("one/report.md")).find("| ranks | 1 process, batch 6 |"), std::string::npos);
}

// One process and 2 ranks run with the same extra arguments (into
// tmp/one and tmp/two) train the same model.
void expect_two_ranks_train_as_one(const TempDir& tmp, const std::string& args, const std::string& what) {
  const std::string common = " --runs-dir " + tmp.path() + kTiny + args;
  for (const std::string how : {"train --run-name one", "train --nproc-per-node 2 --run-name two"}) {
    const auto r = run(how + common);
    ASSERT_EQ(r.code, 0) << r.output;
  }
  expect_same_training(tmp.file("one"), tmp.file("two"), what);
}

// The DDPM objective with the learned variance (the CPU default is flow):
// its timesteps, noise and VLB term through the same global draws.
TEST(DataParallel, DdpmTwoRanksTrainAsOneProcess) {
  TempDir tmp;
  expect_two_ranks_train_as_one(tmp, " --steps 5 --objective ddpm --set model.learn_sigma=true", "ddpm, 2 ranks vs 1");
}

// Gradient accumulation with data parallel: 2 ranks of 2 micro-batches each
// train as one process accumulating 2 (the gradients averaged once a step;
// the same rows and draws, split otherwise).
TEST(DataParallel, AccumulatingRanksTrainAsOneProcess) {
  TempDir tmp;
  expect_two_ranks_train_as_one(tmp, " --steps 5 --set train.accumulate=2", "accumulate 2, 2 ranks vs 1");
  EXPECT_NE(read_raw(tmp.file("two/report.md")).find("global batch 12 = 2 x 6 per rank"), std::string::npos);
}

// fp8 with data parallel: the ranks' amax reduced by their maximum give the
// one process's scales, hence the same codes and the same training.
TEST(DataParallel, Fp8TwoRanksTrainAsOneProcess) {
  TempDir tmp;
  expect_two_ranks_train_as_one(tmp, " --steps 5 --precision fp8", "fp8, 2 ranks vs 1");
  EXPECT_GE(expect_fp8_scales_as_one_process(tmp.file("one"), tmp.file("two"), 2), 4);
}

TEST(DataParallel, ResumeWithAnotherWorldSize) {
  TempDir tmp;
  const std::string common = " --runs-dir " + tmp.path() + kTiny;
  auto whole = run("train --run-name whole --steps 6" + common);
  ASSERT_EQ(whole.code, 0) << whole.output;
  auto first = run("train --nproc-per-node 2 --run-name split --steps 3" + common);
  ASSERT_EQ(first.code, 0) << first.output;
  auto rest = run("train --nproc-per-node 3 --resume " + tmp.file("split") + " --steps 6");
  ASSERT_EQ(rest.code, 0) << rest.output;
  EXPECT_NE(rest.output.find("resumed from"), std::string::npos) << rest.output;
  const double w = max_weight_diff(tmp.file("whole"), tmp.file("split"), "model.safetensors");
  const double e = max_weight_diff(tmp.file("whole"), tmp.file("split"), "ema.safetensors");
  std::printf("2 ranks 3 steps + 3 ranks 3 steps vs 1 process 6 steps: max |weight difference| %.3g, EMA %.3g\n", w,
              e);
  EXPECT_LT(w, 2e-6);
  EXPECT_LT(e, 2e-6);
  EXPECT_NE(latest(tmp.file("split")).find("step_00000006"), std::string::npos);
  // The report: the whole run, one row per segment with its ranks and global batch.
  const std::string report = read_raw(tmp.file("split/report.md"));
  EXPECT_NE(report.find("| steps | 1 to 6, batch 6; 6 steps in 2 segments (below) |"), std::string::npos) << report;
  EXPECT_NE(report.find("| ranks | 3 processes (data parallel), global batch 6 = 3 x 2 per rank |"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("| 1 to 3 | 2 processes (data parallel), global batch 6 = 2 x 3 per rank |"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("| 4 to 6 | 3 processes (data parallel), global batch 6 = 3 x 2 per rank |"),
            std::string::npos)
      << report;
}

// The launcher in the background, its output in a file.
struct Launcher {
  pid_t pid = -1;
  ~Launcher() {
    if (pid > 0 && ::waitpid(pid, nullptr, WNOHANG) == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

void spawn(Launcher& l, const std::string& args, const std::string& out) {
  const std::string cmd = "exec " + std::string(PERFTRAIN_BINARY) + " " + args + " >'" + out + "' 2>&1";
  l.pid = ::fork();
  if (l.pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
}

// Waits for `lines` metrics lines (the ranks are stepping); false if the
// launcher ended first or 240 s passed.
bool wait_for_steps(pid_t pid, const std::string& run_dir, int lines) {
  const auto end = Clock::now() + std::chrono::seconds(240);
  while (Clock::now() < end) {
    const std::string text = read_raw(run_dir + "/metrics.jsonl");
    if (std::count(text.begin(), text.end(), '\n') >= lines) return true;
    if (::waitpid(pid, nullptr, WNOHANG) != 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// The launcher's child with RANK=rank in its environment.
pid_t rank_pid(pid_t launcher, int rank) {
  const std::string want = "RANK=" + std::to_string(rank);
  for (const auto& name : perftrain::fs::list_directory("/proc")) {
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::ifstream stat("/proc/" + name + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string state;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid != launcher) continue;
    const std::string env = read_raw("/proc/" + name + "/environ");
    size_t i = 0;
    while (i < env.size()) {
      const size_t end = env.find('\0', i);
      if (env.compare(i, (end == std::string::npos ? env.size() : end) - i, want) == 0) return std::stoi(name);
      if (end == std::string::npos) break;
      i = end + 1;
    }
  }
  return -1;
}

TEST(DataParallel, SignalStopsEveryRankAtOneStep) {
  TempDir tmp;
  Launcher l;
  spawn(l, "train --nproc-per-node 2 --runs-dir " + tmp.path() + " --run-name R" + kTiny + " --steps 1000000",
        tmp.file("out.log"));
  ASSERT_TRUE(wait_for_steps(l.pid, tmp.file("R"), 3)) << read_raw(tmp.file("out.log"));
  ::kill(l.pid, SIGTERM);
  const int code = wait_exit(l.pid, 120);
  const std::string out = read_raw(tmp.file("out.log"));
  ASSERT_EQ(code, 143) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("stopped by SIGTERM after step (\\d+)"))) << out;
  EXPECT_NE(latest(tmp.file("R")).find(m[1].str()), std::string::npos) << out;
  // One checkpoint (checkpoint_every is far away), resumable with one process.
  EXPECT_EQ(perftrain::fs::list_directory(tmp.file("R/ckpt")).size(), 2u);  // step_* and latest
  auto more = run("train --resume " + tmp.file("R") + " --steps " + std::to_string(std::stoll(m[1]) + 2));
  EXPECT_EQ(more.code, 0) << more.output;
}

// kill -9 of one rank (1, or 0 which hosts the store): the launcher names it,
// the survivor fails on its own naming itself and the master; nothing hangs.
void expect_killed_rank_fails_the_run(int victim_rank) {
  TempDir tmp;
  Launcher l;
  spawn(l, "train --nproc-per-node 2 --runs-dir " + tmp.path() + " --run-name R" + kTiny + " --steps 1000000",
        tmp.file("out.log"));
  ASSERT_TRUE(wait_for_steps(l.pid, tmp.file("R"), 3)) << read_raw(tmp.file("out.log"));
  const pid_t victim = rank_pid(l.pid, victim_rank);
  ASSERT_GT(victim, 0);
  ::kill(victim, SIGKILL);
  const int code = wait_exit(l.pid, 90);  // distributed.timeout_s = 30 bounds every wait
  const std::string out = read_raw(tmp.file("out.log"));
  EXPECT_NE(code, -1) << "the run hung\n" << out;
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("rank " + std::to_string(victim_rank) + " of 2 was killed by signal 9"), std::string::npos) << out;
  const int survivor = 1 - victim_rank;
  EXPECT_TRUE(std::regex_search(
      out, std::regex("rank " + std::to_string(survivor) + " of 2 \\(master 127\\.0\\.0\\.1:\\d+\\)")))
      << out;
}

TEST(DataParallel, KilledRankFailsTheRunNamingIt) { expect_killed_rank_fails_the_run(1); }
TEST(DataParallel, KilledStoreHostFailsTheRunNamingIt) { expect_killed_rank_fails_the_run(0); }

TEST(DataParallel, BadLaunchValuesAreUsageErrors) {
  TempDir tmp;
  const std::string args = " train --runs-dir " + tmp.path() + kTiny + " --steps 2";
  auto missing = perftrain::testing::run_shell("RANK=0 WORLD_SIZE=2 timeout 60 " + std::string(PERFTRAIN_BINARY) + args);
  EXPECT_EQ(missing.code, 2) << missing.output;
  EXPECT_NE(missing.output.find("LOCAL_RANK, MASTER_ADDR, MASTER_PORT not set"), std::string::npos) << missing.output;
  auto rank = perftrain::testing::run_shell("RANK=2 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "
                                            "timeout 60 " + std::string(PERFTRAIN_BINARY) + args);
  EXPECT_EQ(rank.code, 2) << rank.output;
  EXPECT_NE(rank.output.find("RANK='2' must be an integer in [0, WORLD_SIZE) = [0, 2)"), std::string::npos)
      << rank.output;
  auto port = perftrain::testing::run_shell("RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=http "
                                            "timeout 60 " + std::string(PERFTRAIN_BINARY) + args);
  EXPECT_EQ(port.code, 2) << port.output;
  EXPECT_NE(port.output.find("MASTER_PORT='http'"), std::string::npos) << port.output;
  auto batch = run("train --nproc-per-node 4" + args.substr(6));
  EXPECT_EQ(batch.code, 2) << batch.output;
  EXPECT_NE(batch.output.find("train.batch_size = 6 is the global batch and must divide by --nproc-per-node 4"),
            std::string::npos)
      << batch.output;
  auto world = perftrain::testing::run_shell("RANK=0 LOCAL_RANK=0 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "
                                             "timeout 60 " + std::string(PERFTRAIN_BINARY) + args);
  EXPECT_EQ(world.code, 2) << world.output;
  EXPECT_NE(world.output.find("train.batch_size = 6 is the global batch and must divide by WORLD_SIZE = 4"),
            std::string::npos)
      << world.output;
  EXPECT_TRUE(perftrain::fs::list_directory(tmp.path()).empty());  // nothing written
}

}  // namespace
