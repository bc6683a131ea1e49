// The run directory under faults, with the program as a user runs it (real
// processes, real files): one trainer per run, kill -9 during saves, metrics
// across a resume, a failed resume, a flipped bit, files from other tools,
// and --run-name.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "base/fs.h"
#include "io/safetensors.h"
#include "support/test_support.h"

namespace {

namespace fs = perftrain::fs;
using perftrain::testing::read_raw;
using perftrain::testing::TempDir;
using perftrain::testing::write_raw;
using Result = perftrain::testing::CommandResult;

Result run(const std::string& args) {
  return perftrain::testing::run_shell(std::string(PERFTRAIN_BINARY) + " " + args);
}

// A tiny DiT on synthetic data on the CPU: each step takes milliseconds, so
// the time goes into starting the program and into checkpoints.
const std::string kTiny =
    " --device cpu --data synthetic --set data.synthetic_size=40 --batch-size 8 --set model.depth=1"
    " --set model.hidden=32 --set model.heads=2 --set model.patch=4 --set model.image_size=8"
    " --set model.in_channels=2 --set model.num_classes=3 --set log.sample_every=0 --set log.every=1"
    " --set log.sample_per_class=1 --set log.sample_classes=2 --set diffusion.sample_steps=1";

std::string train_args(const TempDir& tmp, const std::string& name, int64_t steps, const std::string& more = "") {
  return "train --runs-dir " + tmp.path() + " --run-name " + name + kTiny + " --steps " + std::to_string(steps) + more;
}

// A perftrain process in the background, its output in a file.
struct Background {
  pid_t pid = -1;
  std::string out;
};

Background spawn(const std::string& args, const std::string& out) {
  const std::string cmd = "exec " + std::string(PERFTRAIN_BINARY) + " " + args + " >'" + out + "' 2>&1";
  Background b{::fork(), out};
  if (b.pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return b;
}

// The exit code, or 128 + the signal that ended it.
int wait_for(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool still_running(pid_t pid) { return ::waitpid(pid, nullptr, WNOHANG) == 0; }

std::string host_name() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// The step ckpt/latest names (-1 if none).
int64_t latest_step(const std::string& run) {
  std::istringstream in(read_raw(run + "/ckpt/latest"));
  std::string name;
  in >> name;
  return name.rfind("step_", 0) == 0 ? std::stoll(name.substr(5)) : -1;
}

// Every step directory is complete (all three files, every tensor matching
// its checksum) and `latest` names one of them.
void expect_checkpoints_complete(const std::string& run, const std::string& when) {
  const std::string ckpt = run + "/ckpt";
  int complete = 0;
  for (const auto& name : fs::list_directory(ckpt)) {
    if (name.rfind("step_", 0) != 0) continue;
    for (const char* f : {"model.safetensors", "ema.safetensors", "trainer_state.safetensors"}) {
      const std::string path = ckpt + "/" + name + "/" + f;
      ASSERT_TRUE(fs::is_regular_file(path)) << when << ": " << name << " has no " << f;
      try {
        const auto file = perftrain::io::SafetensorsFile::open(path);
        EXPECT_TRUE(file.has_checksums()) << path;
        file.verify_checksums();
      } catch (const std::exception& e) {
        ADD_FAILURE() << when << ": " << e.what();
      }
    }
    ++complete;
  }
  EXPECT_GT(complete, 0) << when;
  char want[32];
  std::snprintf(want, sizeof want, "step_%08lld", static_cast<long long>(latest_step(run)));
  EXPECT_TRUE(fs::is_directory(ckpt + "/" + want)) << when << ": latest names " << want << ", which is absent";
}

// The steps of metrics.jsonl; every line must be whole JSON.
std::vector<int64_t> metric_steps(const std::string& run) {
  std::vector<int64_t> steps;
  std::istringstream in(read_raw(run + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const auto rec = nlohmann::json::parse(line, nullptr, false);
    EXPECT_FALSE(rec.is_discarded()) << "torn line in metrics.jsonl: " << line;
    if (!rec.is_discarded()) steps.push_back(rec.at("step").get<int64_t>());
  }
  return steps;
}

void expect_strictly_increasing(const std::vector<int64_t>& steps, const std::string& when) {
  for (size_t i = 1; i < steps.size(); ++i)
    ASSERT_GT(steps[i], steps[i - 1]) << when << ": metrics.jsonl step " << steps[i] << " follows " << steps[i - 1];
}

// Every file under a directory (relative path -> bytes), the lock file aside
// (it records the last process that held the run).
void snapshot(const std::string& root, const std::string& rel, std::map<std::string, std::string>& out) {
  const std::string dir = rel.empty() ? root : root + "/" + rel;
  for (const auto& name : fs::list_directory(dir)) {
    const std::string r = rel.empty() ? name : rel + "/" + name;
    if (fs::is_directory(root + "/" + r)) snapshot(root, r, out);
    else if (r != "lock") out[r] = read_raw(root + "/" + r);
  }
}
std::map<std::string, std::string> snapshot(const std::string& root) {
  std::map<std::string, std::string> out;
  snapshot(root, "", out);
  return out;
}

bool wait_until(const std::function<bool()>& done, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

TEST(ReliabilityStore, ASecondTrainerOnTheSameRunExitsTwoNamingTheHolder) {
  // The first run has far more steps than it can take while the others try,
  // so it holds the run for the whole test (a run that finished while the
  // second ones started would let a resume in); SIGTERM then ends it with a
  // checkpoint at its last step.
  TempDir tmp;
  const std::string run_dir = tmp.path() + "/R";
  auto first = spawn(train_args(tmp, "R", 1000000, " --set log.checkpoint_every=10"), tmp.file("first.log"));
  ASSERT_TRUE(wait_until([&] { return fs::exists(run_dir + "/ckpt/latest") || !still_running(first.pid); }, 120));
  ASSERT_TRUE(still_running(first.pid)) << read_raw(first.out);
  const Result second = run(train_args(tmp, "R", 30));
  const Result resume = run("train --resume " + run_dir);
  ASSERT_TRUE(still_running(first.pid)) << read_raw(first.out);
  ::kill(first.pid, SIGTERM);
  const int code = wait_for(first.pid);
  ASSERT_EQ(code, 128 + SIGTERM) << read_raw(first.out);
  for (const Result* r : {&second, &resume}) {
    EXPECT_EQ(r->code, 2) << r->output;
    EXPECT_NE(r->output.find("pid " + std::to_string(first.pid)), std::string::npos) << r->output;
    EXPECT_NE(r->output.find(host_name()), std::string::npos) << r->output;
    EXPECT_EQ(std::count(r->output.begin(), r->output.end(), '\n'), 1) << "one line: " << r->output;
  }
  // The first run is whole: its last checkpoint, every line of its metrics.
  const auto m = metric_steps(run_dir);
  ASSERT_FALSE(m.empty());
  EXPECT_EQ(latest_step(run_dir), m.back());
  expect_checkpoints_complete(run_dir, "after two trainers");
  expect_strictly_increasing(m, "after two trainers");
  EXPECT_EQ(m.size(), static_cast<size_t>(m.back() - 1));  // every step but the first (timed apart)
  const Result v = run("verify " + run_dir);
  EXPECT_EQ(v.code, 0) << v.output;
}

// kill -9 at random moments of a run that checkpoints every step (and prunes
// every step), every other one as soon as a save has begun: after each, every
// step directory is complete or absent, the metrics are whole lines, and the
// next --resume continues.
TEST(ReliabilityStore, KillNineDuringSavesLeavesCompleteCheckpoints) {
  TempDir tmp;
  const std::string run_dir = tmp.path() + "/K";
  // A wider model (about 0.5M parameters, 7 MB a checkpoint), so that saves
  // take a while.
  const std::string more = " --set model.hidden=128 --set model.depth=2 --set log.checkpoint_every=1"
                           " --set log.keep_checkpoints=2";
  const Result start = run(train_args(tmp, "K", 2, more));
  ASSERT_EQ(start.code, 0) << start.output;
  std::mt19937 rng(std::random_device{}());
  int kills = 0, early = 0, leftovers_seen = 0;
  for (int i = 0; i < 24; ++i) {
    const int64_t before = latest_step(run_dir);
    auto p = spawn("train --resume " + run_dir + " --steps 1000000", tmp.file("k.log"));
    if (i % 6 == 5) {
      // A kill while starting: loading, taking the lock, cleaning up.
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 1500));
      ++early;
    } else {
      // Proof that this resume works: it has written a checkpoint of its own.
      ASSERT_TRUE(wait_until([&] { return latest_step(run_dir) > before || !still_running(p.pid); }, 120))
          << "resume " << i << " made no checkpoint";
      ASSERT_TRUE(still_running(p.pid)) << "resume " << i << " stopped: " << read_raw(p.out);
      if (i % 2 == 0) {
        // Inside a save: as soon as a step directory is being written.
        auto saving = [&] {
          for (const auto& name : fs::list_directory(run_dir + "/ckpt"))
            if (name.rfind(".step_", 0) == 0) return true;
          return false;
        };
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (!saving() && std::chrono::steady_clock::now() < end)
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300000));
      }
      ++kills;
    }
    ::kill(p.pid, SIGKILL);
    const int code = wait_for(p.pid);
    if (code != 128 + SIGKILL) {
      ASSERT_EQ(code, 128 + SIGKILL) << "resume " << i << " exited by itself: " << read_raw(p.out);
    }
    const std::string when = "after kill " + std::to_string(i);
    expect_checkpoints_complete(run_dir, when);
    expect_strictly_increasing(metric_steps(run_dir), when);
    for (const auto& name : fs::list_directory(run_dir + "/ckpt")) leftovers_seen += name[0] == '.';
    if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) return;
  }
  EXPECT_GE(kills, 20);
  // A last resume runs to its end; the leftovers are gone and said to be.
  const int64_t at = latest_step(run_dir);
  const Result last = run("train --resume " + run_dir + " --steps " + std::to_string(at + 3));
  ASSERT_EQ(last.code, 0) << last.output;
  EXPECT_EQ(latest_step(run_dir), at + 3);
  for (const auto& name : fs::list_directory(run_dir + "/ckpt")) EXPECT_NE(name[0], '.') << "leftover " << name;
  expect_checkpoints_complete(run_dir, "at the end");
  const auto steps = metric_steps(run_dir);
  expect_strictly_increasing(steps, "at the end");
  EXPECT_EQ(steps.back(), at + 3);
  std::printf("    %d kills during training and saves, %d while starting; %d leftovers of interrupted saves seen\n",
              kills, early, leftovers_seen);
}

TEST(ReliabilityStore, MetricsAfterAResumeFromAnOlderCheckpointKeepIncreasing) {
  TempDir tmp;
  const std::string run_dir = tmp.path() + "/M";
  const Result a = run(train_args(tmp, "M", 10, " --set log.checkpoint_every=2 --set log.keep_checkpoints=10"));
  ASSERT_EQ(a.code, 0) << a.output;
  ASSERT_EQ(metric_steps(run_dir).back(), 10);
  const Result b = run("train --resume " + run_dir + "/ckpt/step_00000006 --steps 12");
  ASSERT_EQ(b.code, 0) << b.output;
  const auto steps = metric_steps(run_dir);
  expect_strictly_increasing(steps, "after resuming at step 6");
  EXPECT_EQ(steps.back(), 12);
  EXPECT_NE(std::find(steps.begin(), steps.end(), 6), steps.end());  // the lines up to the checkpoint stay
  expect_checkpoints_complete(run_dir, "after re-saving steps 8 and 10");
  for (const auto& name : fs::list_directory(run_dir + "/ckpt")) EXPECT_NE(name[0], '.') << "leftover " << name;
}

TEST(ReliabilityStore, AFailedResumeLeavesEveryFileOfTheRunAsItWas) {
  TempDir tmp;
  const std::string run_dir = tmp.path() + "/F";
  const Result a = run(train_args(tmp, "F", 4, " --set log.checkpoint_every=2"));
  ASSERT_EQ(a.code, 0) << a.output;
  const auto before = snapshot(run_dir);
  ASSERT_TRUE(before.count("config.toml"));
  const Result shapes = run("train --resume " + run_dir + " --set model.hidden=64 --steps 8");
  EXPECT_EQ(shapes.code, 1) << shapes.output;
  EXPECT_NE(shapes.output.find("shape"), std::string::npos) << shapes.output;
  const Result done = run("train --resume " + run_dir);  // already at train.steps
  EXPECT_EQ(done.code, 2) << done.output;
  const auto after = snapshot(run_dir);
  EXPECT_EQ(read_raw(run_dir + "/config.toml"), before.at("config.toml"));
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [path, bytes] : before) EXPECT_TRUE(after.count(path) && after.at(path) == bytes) << path;
}

TEST(ReliabilityStore, AFlippedBitIsFoundByVerifySampleAndResume) {
  TempDir tmp;
  const std::string run_dir = tmp.path() + "/B";
  const Result a = run(train_args(tmp, "B", 3));
  ASSERT_EQ(a.code, 0) << a.output;
  const std::string file = run_dir + "/ckpt/step_00000003/ema.safetensors";
  // A random tensor of the EMA weights, a random bit of its data.
  std::mt19937 rng(std::random_device{}());
  std::string bytes = read_raw(file);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  std::vector<std::string> names;
  for (const auto& [k, v] : header.items())
    if (k != "__metadata__" && v["data_offsets"][1].get<int64_t>() > v["data_offsets"][0].get<int64_t>())
      names.push_back(k);
  const std::string name = names[rng() % names.size()];
  const int64_t begin = header[name]["data_offsets"][0], end = header[name]["data_offsets"][1];
  const int64_t at = 8 + static_cast<int64_t>(n) + begin + static_cast<int64_t>(rng() % (end - begin));
  bytes[at] = static_cast<char>(bytes[at] ^ (1 << (rng() % 8)));
  write_raw(file, bytes);
  const std::string config = read_raw(run_dir + "/config.toml");

  const std::string named = "tensor '" + name + "' is corrupt";
  const Result v = run("verify " + run_dir);
  EXPECT_EQ(v.code, 1) << v.output;
  EXPECT_NE(v.output.find(named), std::string::npos) << v.output;
  EXPECT_NE(v.output.find("ema.safetensors"), std::string::npos) << v.output;
  const Result s = run("sample --device cpu --ckpt " + run_dir + " --out " + tmp.file("s.png"));
  EXPECT_EQ(s.code, 1) << s.output;
  EXPECT_NE(s.output.find(named), std::string::npos) << s.output;
  EXPECT_FALSE(fs::exists(tmp.file("s.png")));
  const Result r = run("train --resume " + run_dir + " --steps 6");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find(named), std::string::npos) << r.output;
  EXPECT_EQ(read_raw(run_dir + "/config.toml"), config);
  // The healthy files of the same checkpoint pass.
  const Result ok = run("verify " + run_dir + "/ckpt/step_00000003/model.safetensors");
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_NE(ok.output.find("match their CRC32C"), std::string::npos) << ok.output;
}

// A weights file rewritten by Python's safetensors (no checksums, as from any
// other tool) still samples, and verify says it carries none.
TEST(ReliabilityStore, AFileWithoutChecksumsStillLoads) {
  TempDir tmp;
  const std::string run_dir = tmp.path() + "/P";
  const Result a = run(train_args(tmp, "P", 2));
  ASSERT_EQ(a.code, 0) << a.output;
  const std::string script = tmp.file("strip.py");
  write_raw(script, R"(
import sys
from safetensors import safe_open
from safetensors.torch import load_file, save_file
with safe_open(sys.argv[1], "pt") as f:
    meta = {k: v for k, v in f.metadata().items() if k != "perftrain.crc32c"}
save_file(load_file(sys.argv[1]), sys.argv[2], metadata=meta)
)");
  const std::string plain = tmp.file("plain.safetensors");
  ASSERT_EQ(perftrain::testing::run_command(std::string("'") + PERFTRAIN_PYTHON + "' '" + script + "' '" + run_dir +
                                            "/ckpt/step_00000002/ema.safetensors' '" + plain + "'"),
            0);
  const Result v = run("verify " + plain);
  EXPECT_EQ(v.code, 0) << v.output;
  EXPECT_NE(v.output.find("no checksums"), std::string::npos) << v.output;
  const Result s = run("sample --device cpu --ckpt " + plain + " --out " + tmp.file("s.png"));
  EXPECT_EQ(s.code, 0) << s.output;
  EXPECT_TRUE(fs::is_regular_file(tmp.file("s.png")));
}

TEST(ReliabilityStore, RunNameIsOneDirectoryNameAndAFailedFreshRunLeavesNoDirectory) {
  TempDir tmp;
  const std::string runs = tmp.path() + "/runs";
  for (const char* bad : {"..", ".", "a/b", "../escape"}) {
    const Result r = run("train --runs-dir " + runs + " --run-name '" + bad + "'" + kTiny + " --steps 2");
    EXPECT_EQ(r.code, 2) << bad << ": " << r.output;
    EXPECT_NE(r.output.find("run.name"), std::string::npos) << r.output;
  }
  EXPECT_FALSE(fs::exists(runs)) << "a bad --run-name created something";
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{});
  // A run that fails before its first checkpoint (the loss blows up) leaves
  // no run directory behind.
  const Result blow = run("train --runs-dir " + runs + " --run-name X" + kTiny +
                          " --steps 50 --lr 1e30 --set train.grad_clip=0 --set train.warmup_steps=0");
  EXPECT_NE(blow.code, 0) << blow.output;
  EXPECT_FALSE(fs::exists(runs + "/X")) << blow.output;
}

}  // namespace
