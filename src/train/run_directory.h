// The run directory (docs/design.md): runs/<name>/ with config.toml,
// metrics.jsonl, ckpt/, samples/, report.md and the lock file (run_lock.h).
// What it promises: one trainer at a time; a failed resume changes none of
// the run's files; a fresh run that fails during set-up (before its first
// metrics line) leaves no directory behind, and one that stops later keeps
// everything it wrote; metrics.jsonl holds whole lines with increasing steps;
// the clean-up removes only this program's own temporary names.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "train/run_lock.h"

namespace perftrain::train {

class RunDirectory {
 public:
  // Opens the directory (a fresh run creates it) and takes its lock; a
  // directory that already holds checkpoints is only reused when resuming
  // (UsageError otherwise, so a run is never clobbered). Under the lock,
  // removes what interrupted saves left (one line on `log`) and names on
  // `log` what looks wrong but is not its own (a "warning:" line each).
  // Writes no file of the run: that waits for start().
  RunDirectory(const std::string& path, bool resuming, std::ostream& log);
  // A directory this process created is removed if it never got past set-up:
  // no checkpoint kept and no metrics line written (and the lock still its own).
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::string& path() const { return path_; }
  std::string ckpt_dir() const { return path_ + "/ckpt"; }
  std::string samples_dir() const { return path_ + "/samples"; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

  // Writes config.toml and opens metrics.jsonl: a fresh run (resume_step < 0)
  // starts it empty, a resumed one keeps the lines up to resume_step (the
  // checkpoint's step), so that steps never repeat or go backwards.
  void start(const std::string& config_toml, int64_t resume_step);
  // A checkpoint is in the directory: it stays, whatever happens next.
  void keep() { keep_ = true; }

  // Appends one JSON object as a line of metrics.jsonl, in one write.
  void log_metrics(const nlohmann::json& record);
  // Whether this process has written a metrics line (the run then stays).
  bool logged() const { return logged_; }

 private:
  std::string path_;
  std::unique_ptr<RunLock> lock_;
  bool created_ = false, keep_ = false, logged_ = false;
  int metrics_fd_ = -1;
};

// What the clean-up of a run directory did, paths relative to it.
struct Cleanup {
  std::vector<std::string> removed;  // leftovers of interrupted saves
  std::vector<std::string> warnings;  // "ckpt/step_1: ..." what looks wrong, left as it is
};

// Removes what interrupted saves leave, and only that: write_file_atomic's
// temporary files (in the run directory, ckpt/ and samples/), and in ckpt/
// save_checkpoint's temporary step directories (checkpoint.h). Anything
// else in ckpt/ that looks like a checkpoint but is not a complete one of
// this program's names (a step_* directory missing files, a user's
// step_60_best/, another hidden .step_* name) stays and gets a warning. Call
// only under the lock.
Cleanup clean_interrupted_saves(const std::string& run_dir);

}  // namespace perftrain::train
