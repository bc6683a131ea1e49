// The run directory's bookkeeping in one process: the lock (a symbolic link
// refused, a lock file removed or replaced letting no second holder in, a
// moved run directory found), the clean-up of what interrupted saves leave
// (and only that), metrics.jsonl across a resume, and the removal of a fresh
// run that never got past set-up.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "base/fs.h"
#include "support/test_support.h"
#include "train/checkpoint.h"
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
    const std::string record = read_raw(tmp.file("lock"));
    EXPECT_EQ(record.rfind("pid " + std::to_string(::getpid()) + " on host " + std::string(host) + " since 20", 0), 0u)
        << record;
    EXPECT_EQ(record.back(), '\n');
    // flock locks belong to the open file, so a second open in this process conflicts too.
    const std::string msg = error_of<UsageError>([&] { RunLock second(tmp.path()); });
    EXPECT_NE(msg.find("pid " + std::to_string(::getpid())), std::string::npos) << msg;
    EXPECT_NE(msg.find(host), std::string::npos) << msg;
    EXPECT_NE(msg.find(tmp.path()), std::string::npos) << msg;
  }
  RunLock again(tmp.path());  // released with the first
}

// A lock file that is a symbolic link is refused, not written through.
TEST(RunLock, ASymbolicLinkIsRefusedAndItsTargetLeftAsItWas) {
  TempDir tmp;
  write_raw(tmp.file("precious"), "the user's file\n");
  tmp.mkdir("r");
  ASSERT_EQ(::symlink(tmp.file("precious").c_str(), tmp.file("r/lock").c_str()), 0);
  const std::string msg = error_of<UsageError>([&] { RunLock lock(tmp.file("r")); });
  EXPECT_NE(msg.find(tmp.file("r/lock") + " is a symbolic link"), std::string::npos) << msg;
  EXPECT_EQ(read_raw(tmp.file("precious")), "the user's file\n");
}

// The lock is held on the directory, not on `lock`: once `lock` is removed
// or replaced, a second holder is still refused, named by the kernel's lock
// table, and the holder's check before a save writes its record back.
TEST(RunLock, ALockFileRemovedOrReplacedLetsNoSecondHolderIn) {
  TempDir tmp;
  tmp.mkdir("r");
  RunLock lock(tmp.path() + "/r");
  const std::string record = read_raw(tmp.file("r/lock"));
  const std::string me = "pid " + std::to_string(::getpid()) + " on host ";
  for (const char* replacement : {"", "pid 1 on host elsewhere\n"}) {
    if (*replacement) write_raw(tmp.file("r/lock"), replacement);
    else ASSERT_EQ(std::remove(tmp.file("r/lock").c_str()), 0);
    const std::string msg = error_of<UsageError>([&] { RunLock second(tmp.file("r")); });
    EXPECT_NE(msg.find("in use by another perftrain (" + me), std::string::npos) << msg;
    EXPECT_NE(msg.find(*replacement ? "is not its own" : "is missing"), std::string::npos) << msg;
    EXPECT_TRUE(lock.still_held());
    check_run_lock(tmp.path() + "/./r/");  // found whatever the spelling; writes the record back
    EXPECT_EQ(read_raw(tmp.file("r/lock")), record);
  }
}

// A run directory moved away (another directory now under its name) is found
// before a save.
TEST(RunLock, ARunDirectoryMovedAwayIsFoundBeforeASave) {
  TempDir tmp;
  tmp.mkdir("r");
  RunLock lock(tmp.file("r"));
  ASSERT_EQ(std::rename(tmp.file("r").c_str(), tmp.file("moved").c_str()), 0);
  EXPECT_FALSE(lock.still_held());
  EXPECT_THROW(check_run_lock(tmp.file("r")), RuntimeError);  // gone
  tmp.mkdir("r");
  const std::string msg = error_of<RuntimeError>([&] { check_run_lock(tmp.file("r")); });
  EXPECT_NE(msg.find(tmp.file("r") + " was moved or replaced"), std::string::npos) << msg;
  RunLock other(tmp.file("r"));  // the new directory is free
}

TEST(RunDirectory, RemovesWhatInterruptedSavesLeftAndNothingElse) {
  TempDir tmp;
  const std::string run = tmp.file("r");
  for (const char* d : {"r/ckpt/step_00000001", "r/ckpt/step_00000009", "r/ckpt/.step_00000003.tmp.123",
                        "r/ckpt/.step_00000002.old.77", "r/ckpt/step_60_best", "r/ckpt/step_1",
                        "r/ckpt/.step_mine", "r/samples"})
    fs::create_directories(tmp.file(d));
  for (const char* f : {"model.safetensors", "ema.safetensors", "trainer_state.safetensors"}) {
    write_raw(tmp.file(std::string("r/ckpt/step_00000001/") + f), "x");
    write_raw(tmp.file(std::string("r/ckpt/.step_00000003.tmp.123/") + f), "x");
    write_raw(tmp.file(std::string("r/ckpt/step_60_best/") + f), "x");
  }
  // A step directory without its trainer state (the user kept the weights).
  write_raw(tmp.file("r/ckpt/step_00000009/model.safetensors"), "x");
  write_raw(tmp.file("r/ckpt/step_00000009/ema.safetensors"), "x");
  write_raw(tmp.file("r/ckpt/step_1/README"), "notes");
  const std::vector<std::string> leftovers = {"r/ckpt/.latest.tmp.4.0.0", "r/.config.toml.tmp.5.1.0",
                                              "r/samples/.step_00000001.png.tmp.6.0.0"};
  for (const auto& f : leftovers) write_raw(tmp.file(f), "partial");
  for (const char* f : {"r/ckpt/latest", "r/config.toml", "r/notes.tmp.txt", "r/samples/step_00000001.png"})
    write_raw(tmp.file(f), "keep");
  std::ostringstream log;
  RunDirectory dir(run, /*resuming=*/true, log);
  EXPECT_EQ(fs::list_directory(run + "/ckpt"), (std::vector<std::string>{".step_mine", "latest", "step_00000001",
                                                                         "step_00000009", "step_1", "step_60_best"}));
  EXPECT_EQ(fs::list_directory(run + "/ckpt/step_00000009"),
            (std::vector<std::string>{"ema.safetensors", "model.safetensors"}));
  EXPECT_EQ(read_raw(run + "/ckpt/step_1/README"), "notes");
  EXPECT_EQ(fs::list_directory(run + "/ckpt/step_60_best").size(), 3u);
  EXPECT_EQ(fs::list_directory(run + "/samples"), std::vector<std::string>{"step_00000001.png"});
  EXPECT_EQ(fs::list_directory(run), (std::vector<std::string>{"ckpt", "config.toml", "lock", "notes.tmp.txt",
                                                               "samples"}));
  const std::string said = log.str();
  EXPECT_NE(said.find("removed 5 leftovers of interrupted saves"), std::string::npos) << said;
  // One warning line naming each doubtful directory, and what is wrong with it.
  for (const char* w : {"ckpt/.step_mine: a hidden name", "ckpt/step_00000009: an incomplete step directory (no "
                        "trainer_state.safetensors)", "ckpt/step_1: not a step directory name", "ckpt/step_60_best: "
                        "not a step directory name"})
    EXPECT_NE(said.find("warning: " + run + "/" + w), std::string::npos) << w << "\n" << said;
  EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 5) << said;
  EXPECT_EQ(read_raw(run + "/config.toml"), "keep");  // nothing of the run is written before start()
}

// The names of save_checkpoint's own temporaries, and nothing like them.
TEST(RunDirectory, OnlyTheSavesOwnTemporaryNamesAreLeftovers) {
  for (const char* name : {".step_00000003.tmp.123", ".step_00000002.old.77", ".step_123456789.tmp.1"})
    EXPECT_TRUE(is_step_temp_name(name)) << name;
  for (const char* name : {".step_00000003.tmp.", ".step_.tmp.1", ".step_3.tmp.1x", ".step_3.bak.1", ".step_mine",
                           "step_00000003", ".step_00000003.tmp.1/.."})
    EXPECT_FALSE(is_step_temp_name(name)) << name;
  for (const char* name : {"step_00000001", "step_123456789"}) EXPECT_TRUE(is_step_dir_name(name)) << name;
  for (const char* name : {"step_1", "step_60_best", "step_0000000x", "../step_00000001", "/abs/step_00000001"})
    EXPECT_FALSE(is_step_dir_name(name)) << name;
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
    RunDirectory dir(tmp.file("set-up"), false, log);
    dir.start("config", -1);  // config.toml and an empty metrics.jsonl: still set-up
  }
  EXPECT_FALSE(fs::exists(tmp.file("set-up")));
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

// A run that stops (diverges, fails) after its first metrics line keeps
// everything it wrote, checkpoint or not.
TEST(RunDirectory, ARunThatLoggedAMetricsLineKeepsItsDirectory) {
  TempDir tmp;
  std::ostringstream log;
  {
    RunDirectory dir(tmp.file("stopped"), false, log);
    dir.start("config", -1);
    dir.log_metrics({{"step", 2}, {"nonfinite_steps", 1}});
    write_raw(dir.file("report.md"), "stopped");
  }
  EXPECT_EQ(read_raw(tmp.file("stopped/metrics.jsonl")), "{\"nonfinite_steps\":1,\"step\":2}\n");
  EXPECT_EQ(read_raw(tmp.file("stopped/report.md")), "stopped");
}

// The run directory moved away and another made under its name: that one may
// be another trainer's now, so this one removes nothing on its way out.
// Removing `lock` loses nothing: the fresh run's directory goes as usual.
TEST(RunDirectory, ARunThatLostItsDirectoryRemovesNothing) {
  TempDir tmp;
  std::ostringstream log;
  {
    RunDirectory dir(tmp.file("r"), false, log);
    ASSERT_EQ(std::rename(tmp.file("r").c_str(), tmp.file("moved").c_str()), 0);
    tmp.mkdir("r");
    write_raw(tmp.file("r/theirs"), "x");
  }
  EXPECT_EQ(read_raw(tmp.file("r/theirs")), "x");
  EXPECT_TRUE(fs::is_directory(tmp.file("moved")));
  {
    RunDirectory dir(tmp.file("q"), false, log);
    ASSERT_EQ(std::remove(tmp.file("q/lock").c_str()), 0);
  }
  EXPECT_FALSE(fs::exists(tmp.file("q")));
}

}  // namespace
}  // namespace perftrain::train
