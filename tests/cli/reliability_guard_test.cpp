// The program under signals, bad values and bad data, as a user runs it
// (real processes, real files): SIGINT/SIGTERM/SIGHUP and a closed stdout
// give a final checkpoint, the report and 130/143/129/141, a second signal
// exits at once; values that crashed or
// were silently accepted are usage errors naming the key, from the command
// line and from a checkpoint's metadata; a NaN in a latent shard and a shard
// truncated under a running trainer are runtime errors naming the file.
#include <ATen/ops/arange.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/fs.h"
#include "io/safetensors.h"
#include "support/child_process.h"
#include "support/test_support.h"
#include "train/config.h"
#include "train/memory_estimate.h"

namespace {

namespace fs = perftrain::fs;
using perftrain::testing::read_raw;
using perftrain::testing::TempDir;
using Result = perftrain::testing::CommandResult;
using Clock = std::chrono::steady_clock;
using perftrain::testing::wait_exit;

Result run(const std::string& args) { return perftrain::testing::run_shell(std::string(PERFTRAIN_BINARY) + " " + args); }

// A tiny DiT on the CPU; each step takes milliseconds.
const std::string kTinyModel =
    " --set model.depth=1 --set model.hidden=32 --set model.heads=2"
    " --set model.patch=4 --set model.image_size=8 --set model.in_channels=2 --set model.num_classes=3"
    " --set log.sample_every=0 --set log.every=1 --set log.sample_per_class=1 --set log.sample_classes=2"
    " --set diffusion.sample_steps=1";
const std::string kTiny = " --device cpu --batch-size 8" + kTinyModel;
const std::string kSynthetic = " --data synthetic --set data.synthetic_size=40";

// A perftrain process in the background; killed if a test leaves it running.
struct Background {
  pid_t pid = -1;
  std::string out;
  Background(pid_t p, std::string o) : pid(p), out(std::move(o)) {}
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;
  ~Background() {
    if (pid > 0 && ::waitpid(pid, nullptr, WNOHANG) == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

// `shell` runs first in the same shell (e.g. a trap that ignores a signal).
std::unique_ptr<Background> spawn(const std::string& args, const std::string& out, const std::string& shell = "") {
  const std::string cmd = shell + "exec " + std::string(PERFTRAIN_BINARY) + " " + args + " >'" + out + "' 2>&1";
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The signals' default actions, whatever this test was started under
    // (a background job ignores SIGINT, nohup SIGHUP): the program keeps an
    // ignored one ignored.
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return std::make_unique<Background>(pid, out);
}

int lines_in(const std::string& path) {
  const std::string text = read_raw(path);
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

// Waits until the run has logged `lines` metrics lines (with log.every = 1, a
// line per step after the first): the loop is running. False when the
// process ended first or the time ran out.
bool wait_for_metrics(const Background& p, const std::string& run_dir, int lines, double timeout_s = 240) {
  const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (Clock::now() < end) {
    if (lines_in(run_dir + "/metrics.jsonl") >= lines) return true;
    if (::kill(p.pid, 0) != 0 || ::waitpid(p.pid, nullptr, WNOHANG) != 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::string step_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
}

// The first SIGINT or SIGTERM: the step finishes, a checkpoint at that step
// and the report are written, the program says so in one line and exits
// 128 + the signal; the run resumes from there.
void expect_graceful_stop(int sig, int want_code, const char* name) {
  TempDir tmp;
  const std::string run_dir = tmp.file("R");
  auto p = spawn("train --runs-dir " + tmp.path() + " --run-name R" + kTiny + kSynthetic + " --steps 1000000",
                 tmp.file("out.log"));
  ASSERT_TRUE(wait_for_metrics(*p, run_dir, 3)) << read_raw(tmp.file("out.log"));
  ::kill(p->pid, sig);
  const int code = wait_exit(p->pid, 120);
  const std::string out = read_raw(tmp.file("out.log"));
  ASSERT_EQ(code, want_code) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(std::string("perftrain: stopped by ") + name +
                                                   " after step (\\d+): checkpoint [^\\n]*, report [^\\n]*"
                                                   "\\(continue with --resume [^\\n]*\\)\\n")))
      << out;
  const int64_t step = std::stoll(m[1]);
  EXPECT_GE(step, 4);
  EXPECT_EQ(read_raw(run_dir + "/ckpt/latest").substr(0, 13), step_dir_name(step));
  for (const char* f : {"model.safetensors", "ema.safetensors", "trainer_state.safetensors"})
    EXPECT_TRUE(fs::is_regular_file(run_dir + "/ckpt/" + step_dir_name(step) + "/" + f)) << f;
  const Result verified = run("verify " + run_dir + "/ckpt/" + step_dir_name(step));
  EXPECT_EQ(verified.code, 0) << verified.output;
  const std::string report = read_raw(run_dir + "/report.md");
  EXPECT_NE(report.find("to " + std::to_string(step) + ", batch 8, stopped by " + name), std::string::npos) << report;
  // The last metrics line is the stop's step.
  const std::string metrics = read_raw(run_dir + "/metrics.jsonl");
  const auto last_line = metrics.substr(metrics.rfind('\n', metrics.size() - 2) + 1);
  EXPECT_EQ(nlohmann::json::parse(last_line).at("step").get<int64_t>(), step) << metrics;

  const Result resumed = run("train --resume " + run_dir + " --steps " + std::to_string(step + 2));
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("at step " + std::to_string(step)), std::string::npos) << resumed.output;
}

TEST(ReliabilityGuard, SigintFinishesTheStepSavesAndExits130) { expect_graceful_stop(SIGINT, 130, "SIGINT"); }

TEST(ReliabilityGuard, SigtermFinishesTheStepSavesAndExits143) { expect_graceful_stop(SIGTERM, 143, "SIGTERM"); }

// stdout piped into `head`: once head has exited, the next write raised
// SIGPIPE, which killed the run without a checkpoint. The run now stops as on
// SIGTERM: the step finishes, a checkpoint and the report, exit 141.
TEST(ReliabilityGuard, AClosedStdoutStopsTheRunWithACheckpoint) {
  TempDir tmp;
  const std::string run_dir = tmp.file("R");
  perftrain::testing::run_shell("( timeout 300 " + std::string(PERFTRAIN_BINARY) + " train --runs-dir " + tmp.path() +
                                " --run-name R" + kTiny + kSynthetic + " --steps 100000 2>" + tmp.file("err.log") +
                                "; echo $? >" + tmp.file("code") + " ) | head -n 2 >/dev/null");
  const std::string err = read_raw(tmp.file("err.log"));
  EXPECT_EQ(read_raw(tmp.file("code")), "141\n") << err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(err, m, std::regex("perftrain: stopped by SIGPIPE after step (\\d+): checkpoint ")))
      << err;
  const int64_t step = std::stoll(m[1]);
  EXPECT_EQ(read_raw(run_dir + "/ckpt/latest").substr(0, 13), step_dir_name(step));
  const Result verified = run("verify " + run_dir);
  EXPECT_EQ(verified.code, 0) << verified.output;
  EXPECT_NE(read_raw(run_dir + "/report.md").find("stopped by SIGPIPE"), std::string::npos);
}

// Under nohup (SIGHUP ignored when the program starts) a hangup does not
// stop the run: the signal stays ignored, as nohup asked; SIGTERM still saves.
TEST(ReliabilityGuard, ASignalIgnoredAtStartStaysIgnored) {
  TempDir tmp;
  const std::string run_dir = tmp.file("R");
  auto p = spawn("train --runs-dir " + tmp.path() + " --run-name R" + kTiny + kSynthetic + " --steps 1000000",
                 tmp.file("out.log"), "trap '' HUP; ");
  ASSERT_TRUE(wait_for_metrics(*p, run_dir, 3)) << read_raw(tmp.file("out.log"));
  ::kill(p->pid, SIGHUP);
  const int lines = lines_in(run_dir + "/metrics.jsonl");
  ASSERT_TRUE(wait_for_metrics(*p, run_dir, lines + 3)) << "stopped by an ignored SIGHUP:\n"
                                                        << read_raw(tmp.file("out.log"));
  ::kill(p->pid, SIGTERM);
  EXPECT_EQ(wait_exit(p->pid, 120), 143) << read_raw(tmp.file("out.log"));
}

// A closed terminal or SSH session.
TEST(ReliabilityGuard, SighupFinishesTheStepSavesAndExits129) { expect_graceful_stop(SIGHUP, 129, "SIGHUP"); }

// A second signal does not wait for the step: a DiT-S/2-sized model whose CPU
// step takes seconds, SIGTERM then SIGINT: the exit code is the second's
// (130, not the graceful 143), at once, with no report written.
TEST(ReliabilityGuard, SecondSignalExitsAtOnce) {
  TempDir tmp;
  const std::string run_dir = tmp.file("R");
  auto p = spawn("train --runs-dir " + tmp.path() + " --run-name R --device cpu --data synthetic"
                 " --set data.synthetic_size=64 --batch-size 4 --set model.depth=12 --set model.hidden=384"
                 " --set model.heads=6 --set model.patch=2 --set log.every=1 --set log.sample_every=0"
                 " --steps 1000000",
                 tmp.file("out.log"));
  ASSERT_TRUE(wait_for_metrics(*p, run_dir, 1, 400)) << read_raw(tmp.file("out.log"));
  ::kill(p->pid, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the first signal is taken
  // What the run had written when the second signal came (a step that ended
  // in those 30 ms has written its line; the graceful save after it has not
  // finished).
  const std::string before = read_raw(run_dir + "/metrics.jsonl");
  const auto second = Clock::now();
  ::kill(p->pid, SIGINT);
  const int code = wait_exit(p->pid, 60);
  const double took = std::chrono::duration<double>(Clock::now() - second).count();
  const std::string out = read_raw(tmp.file("out.log"));
  EXPECT_EQ(code, 130) << out;
  EXPECT_LT(took, 5.0) << out;
  EXPECT_NE(out.find("second signal: exiting now"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(run_dir + "/report.md")) << out;
  // The step in progress was not finished: no later metrics line.
  EXPECT_EQ(read_raw(run_dir + "/metrics.jsonl"), before) << out;
}

// --save-on-signal off: the signal's default action, no checkpoint.
TEST(ReliabilityGuard, SaveOnSignalOffLeavesTheDefault) {
  TempDir tmp;
  const std::string run_dir = tmp.file("R");
  auto p = spawn("train --runs-dir " + tmp.path() + " --run-name R --save-on-signal off" + kTiny + kSynthetic +
                     " --steps 1000000",
                 tmp.file("out.log"));
  ASSERT_TRUE(wait_for_metrics(*p, run_dir, 2)) << read_raw(tmp.file("out.log"));
  ::kill(p->pid, SIGTERM);
  EXPECT_EQ(wait_exit(p->pid, 60), 128 + SIGTERM);  // killed by the signal itself
  EXPECT_FALSE(fs::exists(run_dir + "/ckpt/latest"));
  EXPECT_FALSE(fs::exists(run_dir + "/report.md"));
}

// A usage error (2) naming `expect`, with nothing written under runs.
void expect_usage_error(const std::string& args, const std::string& expect, const TempDir& runs) {
  const Result r = run(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(expect), std::string::npos) << args << "\n" << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "not one line: " << r.output;
  EXPECT_TRUE(fs::list_directory(runs.path()).empty()) << args << ": a run directory was created";
}

TEST(ReliabilityGuard, BadValuesAreUsageErrorsNamingTheKeyBeforeAnythingIsCreated) {
  TempDir runs;
  const std::string train = "train --runs-dir " + runs.path() + " --device cpu" + kTinyModel + kSynthetic + " --steps 3";
  expect_usage_error(train + " --set model.mlp_ratio=0.001", "model.mlp_ratio", runs);  // was SIGFPE
  expect_usage_error(train + " --set model.mlp_ratio=inf", "model.mlp_ratio", runs);    // was a SymInt message
  expect_usage_error(train + " --set model.class_dropout=nan", "model.class_dropout", runs);
  expect_usage_error(train + " --set train.lr=inf", "train.lr", runs);
  expect_usage_error(train + " --set train.weight_decay=nan", "train.weight_decay", runs);
  expect_usage_error(train + " --set diffusion.cfg_scale=-inf", "diffusion.cfg_scale", runs);
  expect_usage_error("train --runs-dir " + runs.path() + kTinyModel + kSynthetic + " --device tpu",
                     "train.device 'tpu' (expected auto, cpu or cuda)", runs);
  expect_usage_error(train + " --batch-size 99999999999999999999", "--batch-size", runs);
  expect_usage_error(train + " --set train.batch_size=99999999999999999999", "train.batch_size", runs);
  expect_usage_error(train + " --set model.depth=100000", "model.depth", runs);
  // A batch no machine holds: refused from the memory estimate, with what fits.
  const Result big = run(train + " --batch-size 3000000000");
  EXPECT_EQ(big.code, 2) << big.output;
  for (const char* want : {"train.batch_size 3000000000 needs about", "activations", "of memory",
                           "the largest batch that fits is"})
    EXPECT_NE(big.output.find(want), std::string::npos) << want << "\n" << big.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(big.output, m, std::regex(R"(--batch-size (\d+)\))"))) << big.output;
  EXPECT_TRUE(fs::list_directory(runs.path()).empty());
  // The suggested batch is accepted by the same bound (--dry-run would not
  // check it: run one step).
  const Result fits = run("train --runs-dir " + runs.path() + " --run-name ok --device cpu" + kTinyModel + kSynthetic +
                          " --steps 1 --batch-size " + std::to_string(std::min<int64_t>(std::stoll(m[1]), 64)));
  EXPECT_EQ(fits.code, 0) << fits.output;
}

// The peak resident memory (KiB) of a finished child.
long max_rss_kib(const std::string& args, const std::string& log) {
  auto p = spawn(args, log);
  int status = 0;
  struct rusage usage {};
  ::wait4(p->pid, &status, 0, &usage);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_raw(log);
  return usage.ru_maxrss;
}

// The estimate's per-sample bytes on the CPU's plain path against the peak
// resident memory of real runs at two batches (the difference leaves out the
// program itself): within 15%.
TEST(ReliabilityGuard, MemoryEstimateMatchesCpuRunsPerSample) {
  TempDir tmp;
  const std::string common = " --device cpu --model DiT-S/4 --set model.depth=4 --data synthetic --steps 1"
                             " --set log.sample_every=0"
                             " --set log.sample_classes=1 --set log.sample_per_class=1 --set diffusion.sample_steps=1"
                             " --runs-dir " + tmp.path();
  const long small = max_rss_kib("train" + common + " --run-name a --batch-size 8", tmp.file("a.log"));
  const long large = max_rss_kib("train" + common + " --run-name b --batch-size 40", tmp.file("b.log"));
  const double measured = (large - small) * 1024.0 / 32;
  auto cfg = perftrain::train::default_config(false);
  perftrain::train::apply_override(cfg, "model.name=\"DiT-S/4\"");
  cfg.model.depth = 4;
  const double estimated = perftrain::train::estimate_training_memory(cfg, false, "auto").per_sample_bytes;
  EXPECT_NEAR(estimated, measured, 0.15 * measured) << "per sample: estimated " << estimated << " B, measured "
                                                    << measured << " B (peak RSS " << small << " / " << large << " KiB)";
}

// Replaces `key = ...` in the perftrain config of a weights file's metadata.
void plant_in_metadata(const std::string& path, const std::string& key, const std::string& value) {
  const auto file = perftrain::io::SafetensorsFile::open(path);
  perftrain::io::NamedTensors tensors;
  for (const auto& name : file.names()) tensors.emplace_back(name, file.get(name).clone());
  auto meta = file.metadata();
  meta.erase("perftrain.crc32c.header");  // as an older version wrote it: the values themselves are checked
  std::string& toml = meta.at("perftrain.config");
  const auto at = toml.find("\n" + key + " = ");
  ASSERT_NE(at, std::string::npos) << toml;
  const auto end = toml.find('\n', at + 1);
  toml = toml.substr(0, at + 1) + key + " = " + value + toml.substr(end);
  perftrain::io::save_safetensors(path + ".new", tensors, meta);
  ASSERT_EQ(std::rename((path + ".new").c_str(), path.c_str()), 0);
}

// The same values arriving through a checkpoint's metadata: `sample` and
// `--resume` refuse them the same way, and the resume leaves the run as it was.
TEST(ReliabilityGuard, BadValuesInCheckpointMetadataAreUsageErrors) {
  TempDir tmp;
  const std::string run_dir = tmp.file("R");
  const Result made = run("train --runs-dir " + tmp.path() + " --run-name R" + kTiny + kSynthetic + " --steps 2");
  ASSERT_EQ(made.code, 0) << made.output;
  const std::string step = run_dir + "/ckpt/" + step_dir_name(2);
  const std::map<std::string, std::pair<std::string, std::string>> cases = {
      {"model.mlp_ratio", {"mlp_ratio", "0.001"}},
      {"model.mlp_ratio ", {"mlp_ratio", "inf"}},
      {"model.class_dropout", {"class_dropout", "nan"}},
      {"train.lr", {"lr", "nan"}},
  };
  const std::string good_model = read_raw(step + "/model.safetensors"), good_ema = read_raw(step + "/ema.safetensors");
  for (const auto& [what, kv] : cases) {
    perftrain::testing::write_raw(step + "/model.safetensors", good_model);
    perftrain::testing::write_raw(step + "/ema.safetensors", good_ema);
    plant_in_metadata(step + "/model.safetensors", kv.first, kv.second);
    plant_in_metadata(step + "/ema.safetensors", kv.first, kv.second);
    const std::string config_before = read_raw(run_dir + "/config.toml");
    const Result sample = run("sample --device cpu --ckpt " + run_dir + " --out " + tmp.file("s.png"));
    EXPECT_EQ(sample.code, 2) << what << "\n" << sample.output;
    EXPECT_NE(sample.output.find(what), std::string::npos) << what << "\n" << sample.output;
    const Result resume = run("train --resume " + run_dir + " --steps 4");
    EXPECT_EQ(resume.code, 2) << what << "\n" << resume.output;
    EXPECT_NE(resume.output.find(what), std::string::npos) << what << "\n" << resume.output;
    EXPECT_EQ(read_raw(run_dir + "/config.toml"), config_before) << what;
    EXPECT_FALSE(fs::exists(tmp.file("s.png"))) << what;
  }
}

// sample's integer flags: a value beyond the type is refused, not clamped
// (CLI11 clamps it), nothing is written.
TEST(ReliabilityGuard, SampleFlagsOutOfRangeAreUsageErrors) {
  TempDir tmp;
  const Result made = run("train --runs-dir " + tmp.path() + " --run-name R" + kTiny + kSynthetic + " --steps 1");
  ASSERT_EQ(made.code, 0) << made.output;
  const std::string sample = "sample --device cpu --ckpt " + tmp.file("R") + " --steps 1 --out " + tmp.file("g.png");
  const std::vector<std::pair<std::string, std::string>> bad = {{"--classes", "99999999999999999999"},
                                                                 {"--seed", "99999999999999999999"},
                                                                 {"--seed", "-1"},
                                                                 {"--per-class", "99999999999"},
                                                                 {"--device", "tpu"}};
  for (const auto& [flag, value] : bad) {
    const Result r = run(sample + " " + flag + " " + value);
    EXPECT_EQ(r.code, 2) << flag << " " << value << "\n" << r.output;
    EXPECT_NE(r.output.find(flag), std::string::npos) << r.output;
  }
  EXPECT_FALSE(fs::exists(tmp.file("g.png")));
  const Result ok = run(sample + " --classes 2 --per-class 1 --seed 9223372036854775807");
  EXPECT_EQ(ok.code, 0) << ok.output;
}

// A latent shard: [n, 2, 8, 8] float32 (kTiny's input), labels below 3.
void write_shard(const std::string& path, int64_t n, int64_t nan_sample = -1) {
  at::Tensor lat = at::randn({n, 2, 8, 8});
  if (nan_sample >= 0) lat.data_ptr<float>()[nan_sample * 128 + 77] = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor labels = at::arange(n, at::TensorOptions().dtype(at::kLong)).remainder(3);
  perftrain::io::save_safetensors(path, {{"latents", lat}, {"labels", labels}});
}

TEST(ReliabilityGuard, NanInALatentShardIsADataErrorNamingFileAndSample) {
  TempDir tmp;
  write_shard(tmp.file("a.safetensors"), 24);
  write_shard(tmp.file("b.safetensors"), 24, /*nan_sample=*/13);
  const Result r = run("train --runs-dir " + tmp.file("runs") + " --run-name R" + kTiny + " --data latents --data-path " +
                       tmp.path() + " --steps 20");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("data error: " + tmp.file("b.safetensors") + ": sample 13 of 'latents' holds NaN"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("train.lr"), std::string::npos) << "reported as a training problem: " << r.output;
}

// Truncating a shard under a running trainer: a runtime error naming the
// file, not SIGBUS (the shard is read, not mapped), and the report's reason.
TEST(ReliabilityGuard, ShardTruncatedWhileTrainingIsARuntimeErrorNotSigbus) {
  TempDir tmp;
  const std::string shard = tmp.file("shard.safetensors");
  write_shard(shard, 512);
  auto p = spawn("train --runs-dir " + tmp.path() + " --run-name R" + kTiny + " --data latents --data-path " + shard +
                     " --steps 1000000",
                 tmp.file("out.log"));
  ASSERT_TRUE(wait_for_metrics(*p, tmp.file("R"), 2)) << read_raw(tmp.file("out.log"));
  struct stat st {};
  ASSERT_EQ(::stat(shard.c_str(), &st), 0);
  ASSERT_EQ(::truncate(shard.c_str(), st.st_size / 4), 0);
  const int code = wait_exit(p->pid, 120);
  const std::string out = read_raw(tmp.file("out.log"));
  EXPECT_EQ(code, 1) << "exit " << code << " (SIGBUS is 135)\n" << out;
  EXPECT_NE(out.find(shard + ": cannot read sample"), std::string::npos) << out;
  EXPECT_NE(out.find("truncated while training"), std::string::npos) << out;
  // The run had logged metrics, so it stays, and its report says why it ended.
  const std::string report = read_raw(tmp.file("R/report.md"));
  EXPECT_NE(report.find("failed after step "), std::string::npos) << report;
  EXPECT_NE(report.find("truncated while training"), std::string::npos) << report;
}

}  // namespace
