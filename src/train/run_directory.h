// The run directory (docs/design.md): runs/<name>/ with config.toml,
// metrics.jsonl, ckpt/, samples/ and report.md.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <fstream>
#include <string>

namespace perftrain::train {

class RunDirectory {
 public:
  // Creates the folders. A directory that already holds checkpoints is only
  // reused when resuming (UsageError otherwise, so a run is never clobbered).
  RunDirectory(const std::string& path, bool resuming);

  const std::string& path() const { return path_; }
  std::string ckpt_dir() const { return path_ + "/ckpt"; }
  std::string samples_dir() const { return path_ + "/samples"; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

  // Appends one JSON object as a line of metrics.jsonl and flushes it.
  void log_metrics(const nlohmann::json& record);

 private:
  std::string path_;
  std::ofstream metrics_;
};

}  // namespace perftrain::train
