// The run directory under faults, with the program as a user runs it (real
// processes, real files): one trainer per run (a symbolic link, a removed or
// replaced lock file included), kill -9 during saves, metrics across a resume, a
// failed resume, the clean-up leaving what is not its own, `latest` naming
// another run, a flipped bit, an edited header, integer weights, files from
// other tools (torch.save's too), --run-name and --resume, a run that
// diverges before its first checkpoint.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "base/fs.h"
#include "io/safetensors.h"
#include "support/header_edit.h"
#include "support/test_support.h"

namespace {

namespace fs = perftrain::fs;
using perftrain::testing::edit_header;
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
    meta = {k: v for k, v in f.metadata().items() if not k.startswith("perftrain.crc32c")}
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
  // A run that fails before its first checkpoint (the loss blows up) keeps
  // what it wrote, and says why it stopped: the metrics line, the report.
  const Result blow = run("train --runs-dir " + runs + " --run-name X" + kTiny +
                          " --steps 50 --lr 1e30 --set train.grad_clip=0 --set train.warmup_steps=0");
  EXPECT_EQ(blow.code, 1) << blow.output;
  ASSERT_TRUE(fs::is_directory(runs + "/X")) << blow.output;
  EXPECT_FALSE(fs::exists(runs + "/X/ckpt/latest"));
  const std::string metrics = read_raw(runs + "/X/metrics.jsonl");
  ASSERT_FALSE(metrics.empty()) << blow.output;
  const auto last = nlohmann::json::parse(metrics.substr(metrics.rfind('\n', metrics.size() - 2) + 1));
  EXPECT_TRUE(last.contains("first_nonfinite_step")) << metrics;
  EXPECT_NE(read_raw(runs + "/X/report.md").find("non-finite"), std::string::npos);
  EXPECT_TRUE(fs::is_regular_file(runs + "/X/config.toml"));
}

// The clean-up at a resume removes only the saves' own temporaries: a step
// directory without its trainer state, a user's step_60_best/ and a stray
// step_1/README stay (one warning line each), and pruning passes them by.
TEST(ReliabilityStore, ResumeLeavesDirectoriesItDidNotWrite) {
  TempDir tmp;
  const std::string run_dir = tmp.path() + "/C", ckpt = run_dir + "/ckpt";
  const Result a = run(train_args(tmp, "C", 4, " --set log.checkpoint_every=2 --set log.keep_checkpoints=1"));
  ASSERT_EQ(a.code, 0) << a.output;
  const std::string step4 = ckpt + "/step_00000004";
  fs::create_directories(ckpt + "/step_00000003");
  fs::create_directories(ckpt + "/step_60_best");
  fs::create_directories(ckpt + "/step_1");
  for (const char* f : {"model.safetensors", "ema.safetensors"})
    write_raw(ckpt + "/step_00000003/" + f, read_raw(step4 + "/" + f));
  for (const char* f : {"model.safetensors", "ema.safetensors", "trainer_state.safetensors"})
    write_raw(ckpt + "/step_60_best/" + f, read_raw(step4 + "/" + f));
  write_raw(ckpt + "/step_1/README", "my notes\n");
  fs::create_directories(ckpt + "/.step_00000005.tmp.99999");  // a save that was interrupted
  const auto before = snapshot(run_dir);

  const Result r = run("train --resume " + run_dir + " --steps 8");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* w : {"C/ckpt/step_00000003: an incomplete step directory (no trainer_state.safetensors)",
                        "C/ckpt/step_1: not a step directory name", "C/ckpt/step_60_best: not a step directory name"})
    EXPECT_NE(r.output.find("warning: " + tmp.path() + "/" + w), std::string::npos) << w << "\n" << r.output;
  EXPECT_NE(r.output.find("removed 1 leftover of interrupted saves in " + run_dir + ": ckpt/.step_00000005.tmp.99999"),
            std::string::npos)
      << r.output;
  const auto after = snapshot(run_dir);
  for (const auto& [path, bytes] : before)
    if (path.rfind("ckpt/step_00000003/", 0) == 0 || path.rfind("ckpt/step_60_best/", 0) == 0 ||
        path.rfind("ckpt/step_1/", 0) == 0)
      EXPECT_TRUE(after.count(path) && after.at(path) == bytes) << path;
  // Its own step directories were pruned to one, as asked.
  EXPECT_EQ(fs::list_directory(ckpt), (std::vector<std::string>{"latest", "step_00000003", "step_00000008",
                                                                "step_1", "step_60_best"}));
}

// ckpt/latest names only a step directory of its own run: an edited or
// copied one that leads elsewhere (another run, an absolute path) is an
// error for resume, sample and verify, and so is one naming a missing or
// garbage step.
TEST(ReliabilityStore, LatestNamingAnythingButAStepOfItsRunIsAnError) {
  TempDir tmp;
  for (const char* name : {"A", "B"}) {
    const Result r = run(train_args(tmp, name, 2));
    ASSERT_EQ(r.code, 0) << r.output;
  }
  const std::string a = tmp.path() + "/A", b = tmp.path() + "/B";
  const auto b_before = snapshot(b);
  const std::string a_config = read_raw(a + "/config.toml");
  for (const std::string& elsewhere : {std::string("../../B/ckpt/step_00000002"), b + "/ckpt/step_00000002"}) {
    write_raw(a + "/ckpt/latest", elsewhere + "\n");
    const Result resume = run("train --resume " + a + " --steps 4");
    EXPECT_EQ(resume.code, 1) << elsewhere << "\n" << resume.output;
    EXPECT_NE(resume.output.find("not a step directory of this run"), std::string::npos) << resume.output;
    const Result sample = run("sample --device cpu --ckpt " + a + " --out " + tmp.file("s.png"));
    EXPECT_EQ(sample.code, 1) << elsewhere << "\n" << sample.output;
    EXPECT_NE(sample.output.find("not a step directory of this run"), std::string::npos) << sample.output;
    EXPECT_FALSE(fs::exists(tmp.file("s.png")));
    const Result verify = run("verify " + a);
    EXPECT_EQ(verify.code, 1) << elsewhere << "\n" << verify.output;
    EXPECT_NE(verify.output.find("latest names"), std::string::npos) << verify.output;
  }
  const auto b_after = snapshot(b);
  EXPECT_EQ(b_after.size(), b_before.size());
  for (const auto& [path, bytes] : b_before) EXPECT_TRUE(b_after.count(path) && b_after.at(path) == bytes) << path;
  EXPECT_EQ(read_raw(a + "/config.toml"), a_config);
  for (const std::string& bad : {"step_00000099", "garbage", ""}) {
    write_raw(a + "/ckpt/latest", bad + "\n");
    const Result verify = run("verify " + a);
    EXPECT_EQ(verify.code, 1) << "'" << bad << "'\n" << verify.output;
    EXPECT_NE(verify.output.find(a + "/ckpt/latest names"), std::string::npos) << verify.output;
  }
  write_raw(a + "/ckpt/latest", "step_00000002\n");
  EXPECT_EQ(run("verify " + a).code, 0);
}

// A lock file that is a symbolic link is refused, its target untouched. The
// lock is held on the run directory itself, so a lock file removed or
// replaced under a running trainer lets no second trainer in (both are
// refused naming the holder) and the first goes on and ends whole, its
// record written again.
TEST(ReliabilityStore, TheLockIsTheDirectoryNotTheLockFile) {
  TempDir tmp;
  fs::create_directories(tmp.path() + "/L");
  write_raw(tmp.file("precious"), "the user's file\n");
  ASSERT_EQ(::symlink(tmp.file("precious").c_str(), tmp.file("L/lock").c_str()), 0);
  const Result linked = run(train_args(tmp, "L", 2));
  EXPECT_EQ(linked.code, 2) << linked.output;
  EXPECT_NE(linked.output.find("is a symbolic link"), std::string::npos) << linked.output;
  EXPECT_EQ(read_raw(tmp.file("precious")), "the user's file\n");
  EXPECT_FALSE(fs::exists(tmp.path() + "/L/ckpt"));

  const std::string run_dir = tmp.path() + "/R";
  auto first = spawn(train_args(tmp, "R", 1000000, " --set log.checkpoint_every=5"), tmp.file("first.log"));
  ASSERT_TRUE(wait_until([&] { return fs::exists(run_dir + "/ckpt/latest") || !still_running(first.pid); }, 120));
  ASSERT_TRUE(still_running(first.pid)) << read_raw(first.out);
  ASSERT_EQ(std::remove((run_dir + "/lock").c_str()), 0);
  const Result second = run(train_args(tmp, "R", 30));
  write_raw(run_dir + "/lock", "pid 1 on host elsewhere\n");
  const Result resume = run("train --resume " + run_dir);
  ASSERT_TRUE(still_running(first.pid)) << read_raw(first.out);
  for (const Result* r : {&second, &resume}) {
    EXPECT_EQ(r->code, 2) << r->output;
    EXPECT_NE(r->output.find("in use by another perftrain (pid " + std::to_string(first.pid) + " on host " +
                             host_name()), std::string::npos) << r->output;
    EXPECT_EQ(std::count(r->output.begin(), r->output.end(), '\n'), 1) << "one line: " << r->output;
  }
  // The first saves again (its record written back before a save), then
  // ends with a checkpoint on SIGTERM.
  const int64_t saved = latest_step(run_dir);
  ASSERT_TRUE(wait_until([&] { return latest_step(run_dir) > saved || !still_running(first.pid); }, 60));
  ::kill(first.pid, SIGTERM);
  ASSERT_EQ(wait_for(first.pid), 128 + SIGTERM) << read_raw(first.out);
  EXPECT_EQ(read_raw(run_dir + "/lock").rfind("pid " + std::to_string(first.pid) + " on host ", 0), 0u)
      << read_raw(run_dir + "/lock");
  const auto m = metric_steps(run_dir);
  ASSERT_FALSE(m.empty());
  EXPECT_EQ(latest_step(run_dir), m.back());
  expect_checkpoints_complete(run_dir, "after the lock file was removed and replaced");
  expect_strictly_increasing(m, "after the lock file was removed and replaced");
  const Result v = run("verify " + run_dir);
  EXPECT_EQ(v.code, 0) << v.output;
}

// The checksums cover the header as well as the tensors: an edited step or
// learning rate in a checkpoint's metadata is found by verify, resume and
// sample, and the run is left as it was.
TEST(ReliabilityStore, AnEditedStepOrLearningRateIsFoundByVerifyResumeAndSample) {
  TempDir tmp;
  const std::string run_dir = tmp.path() + "/H", step = run_dir + "/ckpt/step_00000004";
  const Result a = run(train_args(tmp, "H", 4, " --lr 0.0001 --set log.checkpoint_every=2 --set log.keep_checkpoints=5"));
  ASSERT_EQ(a.code, 0) << a.output;
  const auto before = snapshot(run_dir);
  struct Edit {
    std::string file, from, to;
  };
  for (const Edit& e : {Edit{"trainer_state.safetensors", "\"step\":\"4\"", "\"step\":\"2\""},
                        Edit{"model.safetensors", "lr = 0.0001", "lr = 0.0009"}}) {
    const std::string path = step + "/" + e.file, good = read_raw(path);
    edit_header(path, e.from, e.to);
    const std::string named = path + ": the header is corrupt";
    const Result v = run("verify " + run_dir);
    EXPECT_EQ(v.code, 1) << e.to << "\n" << v.output;
    EXPECT_NE(v.output.find(named), std::string::npos) << v.output;
    const Result r = run("train --resume " + run_dir + " --steps 6");
    EXPECT_EQ(r.code, 1) << e.to << "\n" << r.output;
    EXPECT_NE(r.output.find(named), std::string::npos) << r.output;
    const Result s = run("sample --device cpu --weights model --ckpt " + run_dir + " --out " + tmp.file("s.png"));
    if (e.file == "model.safetensors") {
      EXPECT_EQ(s.code, 1) << s.output;
      EXPECT_NE(s.output.find(named), std::string::npos) << s.output;
    }
    write_raw(path, good);
    fs::remove_tree(tmp.file("s.png"));
  }
  const auto after = snapshot(run_dir);
  EXPECT_EQ(after.size(), before.size());
  for (const auto& [path, bytes] : before) EXPECT_TRUE(after.count(path) && after.at(path) == bytes) << path;
  EXPECT_EQ(run("verify " + run_dir).code, 0);
}

// A checkpoint written before the header checksum (tensor checksums only)
// verifies, says it has no metadata checksum, and resumes.
TEST(ReliabilityStore, ACheckpointWithoutAMetadataChecksumStillVerifiesAndResumes) {
  TempDir tmp;
  const std::string run_dir = tmp.path() + "/O", step = run_dir + "/ckpt/step_00000002";
  const Result a = run(train_args(tmp, "O", 2));
  ASSERT_EQ(a.code, 0) << a.output;
  for (const char* f : {"model.safetensors", "ema.safetensors", "trainer_state.safetensors"}) {
    const std::string path = step + "/" + f;
    const auto file = perftrain::io::SafetensorsFile::open(path);
    perftrain::io::NamedTensors tensors;
    for (const auto& name : file.names()) tensors.emplace_back(name, file.get(name).clone());
    auto meta = file.metadata();
    meta.erase("perftrain.crc32c.header");
    ASSERT_TRUE(meta.count("perftrain.crc32c"));
    perftrain::io::save_safetensors(path + ".old", tensors, meta);
    ASSERT_EQ(std::rename((path + ".old").c_str(), path.c_str()), 0);
  }
  const Result v = run("verify " + run_dir);
  EXPECT_EQ(v.code, 0) << v.output;
  size_t said = 0;
  for (size_t at = v.output.find("no metadata checksum"); at != std::string::npos;
       at = v.output.find("no metadata checksum", at + 1))
    ++said;
  EXPECT_EQ(said, 4u) << v.output;  // each file, and the summary
  const Result r = run("train --resume " + run_dir + " --steps 4");
  EXPECT_EQ(r.code, 0) << r.output;
}

// Integer weights in a file without checksums (no record to catch the
// change) are refused by dtype, not cast into the float weights.
TEST(ReliabilityStore, IntegerWeightsAreRefusedNamingTheTensorAndDtype) {
  TempDir tmp;
  const Result a = run(train_args(tmp, "I", 2));
  ASSERT_EQ(a.code, 0) << a.output;
  const auto file = perftrain::io::SafetensorsFile::open(tmp.path() + "/I/ckpt/step_00000002/ema.safetensors");
  perftrain::io::NamedTensors tensors;
  std::string cast;
  for (const auto& name : file.names()) {
    at::Tensor t = file.get(name).clone();
    if (cast.empty() && t.dim() == 2) {
      cast = name;
      t = t.mul(1000).to(at::kInt);
    }
    tensors.emplace_back(name, t);
  }
  ASSERT_FALSE(cast.empty());
  auto meta = file.metadata();
  meta.erase("perftrain.crc32c");
  meta.erase("perftrain.crc32c.header");
  perftrain::io::save_safetensors(tmp.file("int.safetensors"), tensors, meta);
  const Result s = run("sample --device cpu --ckpt " + tmp.file("int.safetensors") + " --out " + tmp.file("s.png"));
  EXPECT_EQ(s.code, 1) << s.output;
  EXPECT_NE(s.output.find("tensor '" + cast + "' has dtype I32 but the model's is F32"), std::string::npos) << s.output;
  EXPECT_EQ(std::count(s.output.begin(), s.output.end(), '\n'), 1) << s.output;
  EXPECT_FALSE(fs::exists(tmp.file("s.png")));
}

// A step directory missing its trainer state: --resume names what is missing.
TEST(ReliabilityStore, ResumeOfAnIncompleteStepDirectoryNamesWhatIsMissing) {
  TempDir tmp;
  const Result a = run(train_args(tmp, "S", 2));
  ASSERT_EQ(a.code, 0) << a.output;
  const std::string step = tmp.path() + "/S/ckpt/step_00000002";
  ASSERT_EQ(std::remove((step + "/trainer_state.safetensors").c_str()), 0);
  for (const std::string& target : {step, tmp.path() + "/S"}) {
    const Result r = run("train --resume " + target + " --steps 4");
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("no trainer_state.safetensors"), std::string::npos) << target << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
}

// torch.save files (its zip and its legacy format, made by PyTorch itself)
// are named as such by verify, with the way to convert them, not CORRUPT.
TEST(ReliabilityStore, VerifyNamesATorchSaveFileAndHowToConvertIt) {
  TempDir tmp;
  const std::string script = tmp.file("save.py");
  write_raw(script, R"(
import sys, torch
sd = {"w": torch.ones(3, 2), "b": torch.zeros(2)}
torch.save(sd, sys.argv[1])
torch.save(sd, sys.argv[2], _use_new_zipfile_serialization=False)
)");
  ASSERT_EQ(perftrain::testing::run_command(std::string("'") + PERFTRAIN_PYTHON + "' '" + script + "' '" +
                                            tmp.file("zip.pt") + "' '" + tmp.file("legacy.pt") + "'"),
            0);
  for (const char* name : {"zip.pt", "legacy.pt"}) {
    const Result v = run("verify " + tmp.file(name));
    EXPECT_EQ(v.code, 2) << name << "\n" << v.output;
    EXPECT_EQ(v.output.find("CORRUPT"), std::string::npos) << v.output;
    EXPECT_NE(v.output.find(tmp.file(name) + ": a torch.save file"), std::string::npos) << v.output;
    EXPECT_NE(v.output.find("not a perftrain safetensors checkpoint"), std::string::npos) << v.output;
    EXPECT_NE(v.output.find("safetensors.torch.save_file(torch.load(p"), std::string::npos) << v.output;
  }
}

// --resume "" is an error, not a fresh run; --resume with another
// --run-name or --runs-dir is refused and the run's recorded name stays.
TEST(ReliabilityStore, ResumeTakesARunAndKeepsItsName) {
  TempDir tmp;
  const Result empty = run("train --resume ''" + std::string(" --runs-dir ") + tmp.path() + kTiny + " --steps 2");
  EXPECT_EQ(empty.code, 2) << empty.output;
  EXPECT_NE(empty.output.find("--resume"), std::string::npos) << empty.output;
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{}) << empty.output;
  const Result a = run(train_args(tmp, "N", 2));
  ASSERT_EQ(a.code, 0) << a.output;
  const auto before = snapshot(tmp.path() + "/N");
  for (const std::string& flag : {std::string("--run-name other"), std::string("--runs-dir ") + tmp.file("elsewhere")}) {
    const Result r = run("train --resume " + tmp.path() + "/N " + flag + " --steps 4");
    EXPECT_EQ(r.code, 2) << flag << "\n" << r.output;
    EXPECT_NE(r.output.find("cannot go with --resume"), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{"N"});
  const auto after = snapshot(tmp.path() + "/N");
  EXPECT_EQ(after.size(), before.size());
  for (const auto& [path, bytes] : before) EXPECT_TRUE(after.count(path) && after.at(path) == bytes) << path;
}

}  // namespace
