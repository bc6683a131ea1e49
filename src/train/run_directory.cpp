#include "train/run_directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "base/fs.h"
#include "io/atomic_file.h"
#include "train/checkpoint.h"

namespace perftrain::train {

namespace {

// Why ckpt/name looks like a checkpoint but is not a complete one of this
// program's names ("" when it is one, or looks like none).
std::string doubtful_checkpoint(const std::string& ckpt, const std::string& name) {
  const std::string path = fs::join(ckpt, name);
  if (name.rfind(".step_", 0) == 0) return "a hidden name perftrain's saves do not use";
  if (name.rfind("step_", 0) != 0 || !fs::is_directory(path)) return "";
  if (!is_step_dir_name(name)) return "not a step directory name perftrain writes (step_<8 digits>), never pruned";
  const auto missing = missing_checkpoint_files(path);
  if (missing.empty()) return "";
  std::string what = "an incomplete step directory (no";
  for (const auto& f : missing) what += " " + f;
  return what + "), never loaded or pruned";
}

}  // namespace

Cleanup clean_interrupted_saves(const std::string& run_dir) {
  Cleanup out;
  for (const char* sub : {"", "ckpt", "samples"}) {
    const std::string dir = *sub ? fs::join(run_dir, sub) : run_dir;
    if (!fs::is_directory(dir)) continue;
    const bool ckpt = std::string(sub) == "ckpt";
    for (const auto& name : fs::list_directory(dir)) {
      const std::string rel = *sub ? std::string(sub) + "/" + name : name;
      if (io::is_atomic_temp_name(name) || (ckpt && is_step_temp_name(name))) {
        fs::remove_tree(fs::join(dir, name));
        out.removed.push_back(rel);
      } else if (ckpt) {
        const std::string why = doubtful_checkpoint(dir, name);
        if (!why.empty()) out.warnings.push_back(rel + ": " + why + "; left as it is");
      }
    }
  }
  return out;
}

RunDirectory::RunDirectory(const std::string& path, bool resuming, std::ostream& log) : path_(path) {
  fs::create_directories(fs::parent_path(path));
  if (::mkdir(path.c_str(), 0777) == 0) {
    created_ = true;
  } else if (errno != EEXIST || !fs::is_directory(path)) {
    throw RuntimeError("cannot create the run directory " + path + ": " + std::strerror(errno));
  }
  // On failure, another process may hold the directory this one has just
  // made: leave it.
  lock_ = std::make_unique<RunLock>(path);
  try {
    if (!resuming && fs::exists(path + "/ckpt/latest"))
      throw UsageError("run directory " + path +
                       " already holds a run; pass --resume to continue it or choose another --run-name");
    const Cleanup cleanup = clean_interrupted_saves(path);
    const auto& removed = cleanup.removed;
    if (!removed.empty()) {
      log << "removed " << removed.size() << " leftover" << (removed.size() == 1 ? "" : "s")
          << " of interrupted saves in " << path << ":";
      for (const auto& r : removed) log << " " << r;
      log << "\n";
    }
    for (const auto& w : cleanup.warnings) log << "warning: " << path << "/" << w << "\n";
    for (const char* sub : {"/ckpt", "/samples"}) fs::create_directories(path + sub);
  } catch (...) {
    if (created_) fs::remove_tree(path);
    throw;
  }
}

RunDirectory::~RunDirectory() {
  if (metrics_fd_ >= 0) ::close(metrics_fd_);
  // Still under the lock (members are destroyed after this body). A run that
  // wrote a metrics line keeps its directory whatever stopped it: the metrics,
  // events and report say what happened.
  if (created_ && !keep_ && !logged_ && lock_->still_held()) fs::remove_tree(path_);
}

void RunDirectory::start(const std::string& config_toml, int64_t resume_step) {
  const std::string metrics = file("metrics.jsonl");
  if (resume_step >= 0) {
    // Keep the lines of steps up to the checkpoint; a torn last line (from an
    // older version) or lines past the checkpoint go.
    std::ifstream in(metrics);
    std::string kept, line;
    while (std::getline(in, line)) {
      const auto rec = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!rec.is_object() || !rec.contains("step") || !rec["step"].is_number_integer()) continue;
      if (rec["step"].get<int64_t>() > resume_step) continue;
      kept += line + "\n";
    }
    io::write_text_atomic(metrics, kept);
  } else {
    io::write_text_atomic(metrics, "");
  }
  io::write_text_atomic(file("config.toml"), config_toml);
  metrics_fd_ = ::open(metrics.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (metrics_fd_ < 0) throw RuntimeError("cannot write " + metrics + ": " + std::strerror(errno));
}

void RunDirectory::log_metrics(const nlohmann::json& record) {
  // One write of the whole line: a crash leaves whole lines only (a write
  // to a local file is cut short only by a full disk).
  const std::string line = record.dump() + "\n";
  const ssize_t n = ::write(metrics_fd_, line.data(), line.size());
  logged_ = logged_ || n > 0;
  if (n != static_cast<ssize_t>(line.size()))
    throw RuntimeError("cannot write " + file("metrics.jsonl") + ": " +
                       (n < 0 ? std::strerror(errno) : "short write (disk full?)"));
}

}  // namespace perftrain::train
