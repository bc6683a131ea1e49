// The run directory's bookkeeping in one process: the lock, the clean-up of
// what interrupted saves leave, metrics.jsonl across a resume, and the
// removal of a fresh run that kept no checkpoint.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "base/fs.h"
#include "support/test_support.h"
#include "train/run_directory.h"
#include "train/run_lock.h"

namespace perftrain::train {
namespace {

using perftrain::testing::error_of;
using perftrain::testing::read_raw;
using perftrain::testing::TempDir;
using perftrain::testing::write_raw;

TEST(RunLock, ASecondHolderIsRefusedNamingTheFirst) {
  TempDir tmp;
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  {
    RunLock first(tmp.path());
    EXPECT_EQ(read_raw(tmp.file("lock")), "pid " + std::to_string(::getpid()) + " on host " + host + "\n");
    // flock locks belong to the open file, so a second open in this process conflicts too.
    const std::string msg = error_of<UsageError>([&] { RunLock second(tmp.path()); });
    EXPECT_NE(msg.find("pid " + std::to_string(::getpid())), std::string::npos) << msg;
    EXPECT_NE(msg.find(host), std::string::npos) << msg;
    EXPECT_NE(msg.find(tmp.path()), std::string::npos) << msg;
  }
  RunLock again(tmp.path());  // released with the first
}

TEST(RunDirectory, RemovesWhatInterruptedSavesLeftAndNothingElse) {
  TempDir tmp;
  const std::string run = tmp.file("r");
  for (const char* d : {"r/ckpt/step_00000001", "r/ckpt/step_00000009", "r/ckpt/.step_00000003.tmp.123",
                        "r/ckpt/.step_00000002.old.77", "r/samples"})
    fs::create_directories(tmp.file(d));
  for (const char* f : {"model.safetensors", "ema.safetensors", "trainer_state.safetensors"}) {
    write_raw(tmp.file(std::string("r/ckpt/step_00000001/") + f), "x");
    write_raw(tmp.file(std::string("r/ckpt/.step_00000003.tmp.123/") + f), "x");
  }
  write_raw(tmp.file("r/ckpt/step_00000009/model.safetensors"), "x");  // an older version's partial save
  const std::vector<std::string> leftovers = {"r/ckpt/.latest.tmp.4.0.0", "r/.config.toml.tmp.5.1.0",
                                              "r/samples/.step_00000001.png.tmp.6.0.0"};
  for (const auto& f : leftovers) write_raw(tmp.file(f), "partial");
  for (const char* f : {"r/ckpt/latest", "r/config.toml", "r/notes.tmp.txt", "r/samples/step_00000001.png"})
    write_raw(tmp.file(f), "keep");
  std::ostringstream log;
  RunDirectory dir(run, /*resuming=*/true, log);
  EXPECT_EQ(fs::list_directory(run + "/ckpt"), (std::vector<std::string>{"latest", "step_00000001"}));
  EXPECT_EQ(fs::list_directory(run + "/samples"), std::vector<std::string>{"step_00000001.png"});
  EXPECT_EQ(fs::list_directory(run), (std::vector<std::string>{"ckpt", "config.toml", "lock", "notes.tmp.txt",
                                                               "samples"}));
  const std::string said = log.str();
  EXPECT_NE(said.find("removed 6 leftovers of interrupted saves"), std::string::npos) << said;
  EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 1) << said;
  EXPECT_EQ(read_raw(run + "/config.toml"), "keep");  // nothing of the run is written before start()
}

TEST(RunDirectory, MetricsAreCutBackToTheCheckpointOnResume) {
  TempDir tmp;
  const std::string run = tmp.file("r");
  fs::create_directories(run + "/ckpt");
  std::string lines;
  for (int s = 2; s <= 10; s += 2) lines += nlohmann::json{{"step", s}, {"loss", 1.0 / s}}.dump() + "\n";
  write_raw(run + "/metrics.jsonl", lines + "{\"step\": 12, \"lo");  // an older version's torn line
  std::ostringstream log;
  RunDirectory dir(run, /*resuming=*/true, log);
  dir.start("config", 6);
  dir.log_metrics({{"step", 7}});
  std::vector<int> steps;
  std::istringstream in(read_raw(run + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) steps.push_back(nlohmann::json::parse(line).at("step"));
  EXPECT_EQ(steps, (std::vector<int>{2, 4, 6, 7}));
  EXPECT_EQ(read_raw(run + "/config.toml"), "config");
}

TEST(RunDirectory, AFreshRunWithoutACheckpointLeavesNoDirectory) {
  TempDir tmp;
  std::ostringstream log;
  { RunDirectory dir(tmp.file("gone"), false, log); }
  EXPECT_FALSE(fs::exists(tmp.file("gone")));
  {
    RunDirectory dir(tmp.file("kept"), false, log);
    dir.start("config", -1);
    dir.keep();
  }
  EXPECT_TRUE(fs::exists(tmp.file("kept/config.toml")));
  // A directory that holds a run is neither reused for a fresh run nor removed.
  write_raw(tmp.file("kept/ckpt/latest"), "step_00000001\n");
  const std::string msg = error_of<UsageError>([&] { RunDirectory again(tmp.file("kept"), false, log); });
  EXPECT_NE(msg.find("--resume"), std::string::npos) << msg;
  EXPECT_TRUE(fs::exists(tmp.file("kept/config.toml")));
}

}  // namespace
}  // namespace perftrain::train
