// The run directory (docs/design.md): runs/<name>/ with config.toml,
// metrics.jsonl, ckpt/, samples/, report.md and the lock file (run_lock.h).
// What it promises: one trainer at a time; a failed resume changes none of
// the run's files; a fresh run that fails before its first checkpoint leaves
// no directory behind; metrics.jsonl holds whole lines with increasing steps.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>

#include "train/run_lock.h"

namespace perftrain::train {

class RunDirectory {
 public:
  // Opens the directory (a fresh run creates it) and takes its lock; a
  // directory that already holds checkpoints is only reused when resuming
  // (UsageError otherwise, so a run is never clobbered). Under the lock,
  // removes what interrupted saves left (one line on `log`). Writes no file of
  // the run: that waits for start().
  RunDirectory(const std::string& path, bool resuming, std::ostream& log);
  // A directory this process created and kept no checkpoint in is removed.
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

 private:
  std::string path_;
  std::unique_ptr<RunLock> lock_;
  bool created_ = false, keep_ = false;
  int metrics_fd_ = -1;
};

// Names in a run directory that interrupted saves leave: write_file_atomic's
// temporary files, and in ckpt/ the step directories being written or removed
// (and incomplete step directories from older versions). Removes them and
// returns their paths relative to the run directory. Call only under the lock.
std::vector<std::string> remove_interrupted_saves(const std::string& run_dir);

}  // namespace perftrain::train
