#include "observe/log/mlflow_logger.h"

#include <fcntl.h>
#include <pwd.h>
#include <unistd.h>

#include <sys/stat.h>

#include <cctype>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "base/error.h"
#include "base/fs.h"
#include "io/atomic_file.h"

namespace perftrain::observe::log {
namespace {

// MLflow's user_id: the account this process runs as (its password entry,
// not $USER, which a caller may set to anything or leave unset).
std::string account_name() {
  passwd entry{};
  passwd* found = nullptr;
  char buffer[4096];
  if (getpwuid_r(geteuid(), &entry, buffer, sizeof buffer, &found) == 0 && found != nullptr) return found->pw_name;
  return "uid " + std::to_string(geteuid());
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string absolute(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) throw RuntimeError("cannot resolve " + path + ": " + std::strerror(errno));
  return buf;
}

// A YAML single-quoted scalar: 'it''s'.
std::string yaml_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// The value of a top-level "key: value" line of a meta.yaml MLflow or we
// wrote (plain, single- or double-quoted); "" when absent.
std::string yaml_field(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::string v = line.substr(key.size() + 1);
    v.erase(0, v.find_first_not_of(' '));
    if (v.size() >= 2 && v.front() == '\'' && v.back() == '\'') {
      std::string out;
      for (size_t i = 1; i + 1 < v.size(); ++i) {
        out += v[i];
        if (v[i] == '\'' && v[i + 1] == '\'') ++i;
      }
      return out;
    }
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') return v.substr(1, v.size() - 2);
    return v;
  }
  return "";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh id: 18 decimal digits for an experiment, 32 hex digits for a run (as MLflow makes them).
std::string random_digits(int n, const char* alphabet, int base) {
  std::random_device rd;
  std::mt19937_64 gen((uint64_t(rd()) << 32) ^ rd() ^ uint64_t(now_ms()));
  std::string out;
  for (int i = 0; i < n; ++i) out += alphabet[gen() % base];
  if (base == 10 && out[0] == '0') out[0] = '1';
  return out;
}

std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void write_experiment_meta(const std::string& root, const std::string& id, const std::string& name) {
  const int64_t now = now_ms();
  std::ostringstream m;
  m << "artifact_location: " << yaml_quoted("file://" + root + "/" + id) << "\n"
    << "creation_time: " << now << "\n"
    << "experiment_id: " << yaml_quoted(id) << "\n"
    << "last_update_time: " << now << "\n"
    << "lifecycle_stage: active\n"
    << "name: " << yaml_quoted(name) << "\n";
  io::write_text_atomic(root + "/" + id + "/meta.yaml", m.str());
}

// The active experiment named `name` under root, made when there is none.
std::string experiment_id(const std::string& root, const std::string& name) {
  for (const std::string& id : fs::list_directory(root)) {
    const std::string meta = root + "/" + id + "/meta.yaml";
    if (fs::is_regular_file(meta) && yaml_field(meta, "name") == name &&
        yaml_field(meta, "lifecycle_stage") != "deleted")
      return id;
  }
  for (int attempt = 0;; ++attempt) {
    const std::string id = name == "Default" && attempt == 0 ? "0" : random_digits(18, "0123456789", 10);
    if (::mkdir((root + "/" + id).c_str(), 0777) == 0) {
      write_experiment_meta(root, id, name);
      return id;
    }
    if (errno != EEXIST || attempt > 100) throw RuntimeError("cannot create " + root + "/" + id + ": " + std::strerror(errno));
  }
}

// The run of the experiment tagged perftrain.run_dir = run_dir ("" if none).
std::string find_run(const std::string& experiment_dir, const std::string& run_dir) {
  for (const std::string& id : fs::list_directory(experiment_dir)) {
    const std::string tag = experiment_dir + "/" + id + "/tags/perftrain.run_dir";
    if (fs::is_regular_file(tag) && read_text(tag) == run_dir) return id;
  }
  return "";
}

// Every metric file under dir keeps its lines of steps up to `step`.
void cut_metrics_after(const std::string& dir, int64_t step) {
  if (!fs::is_directory(dir)) return;
  for (const std::string& name : fs::list_directory(dir)) {
    const std::string path = dir + "/" + name;
    if (fs::is_directory(path)) {
      cut_metrics_after(path, step);
      continue;
    }
    std::ifstream in(path);
    std::string kept, line;
    while (std::getline(in, line)) {
      long long ts = 0, s = 0;
      char value[64];
      if (std::sscanf(line.c_str(), "%lld %63s %lld", &ts, value, &s) == 3 && s <= step) kept += line + "\n";
    }
    io::write_text_atomic(path, kept);
  }
}

// A param or tag: a small file, written once (no fsync: a hundred of them at
// start-up should not cost a hundred disk flushes; meta.yaml is atomic).
void write_small_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) throw RuntimeError("cannot write " + path);
}

}  // namespace

void check_mlflow_tracking_dir(const std::string& tracking_dir) {
  if (tracking_dir.empty()) return;
  if (fs::exists(tracking_dir) && !fs::is_directory(tracking_dir))
    throw UsageError("log.mlflow " + tracking_dir + " is not a directory (MLflow's tracking directory, e.g. mlruns)");
}

std::string mlflow_metric_key(const std::string& tag) {
  std::string out;
  for (char c : tag) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_-. /:", c) != nullptr;
    out += ok ? c : '_';
  }
  // No component a path would read as the directory itself or its parent.
  std::string cleaned, part;
  std::istringstream parts(out);
  while (std::getline(parts, part, '/')) {
    if (part.empty() || part == "." || part == "..") part = "_";
    cleaned += (cleaned.empty() ? "" : "/") + part;
  }
  return cleaned.empty() ? "_" : cleaned;
}

MlflowLogger::MlflowLogger(const std::string& tracking_dir, const std::string& experiment) : experiment_(experiment) {
  check_mlflow_tracking_dir(tracking_dir);
  const bool fresh = !fs::exists(tracking_dir);
  fs::create_directories(tracking_dir);
  root_ = absolute(tracking_dir);
  if (fresh) experiment_id(root_, "Default");  // as MLflow makes a new store
}

void MlflowLogger::start(const RunStart& run) {
  experiment_id_ = experiment_id(root_, experiment_);
  const std::string experiment_dir = root_ + "/" + experiment_id_;
  const std::string run_dir = absolute(run.run_dir);
  run_name_ = run.run_name;
  run_id_ = run.resume_step >= 0 ? find_run(experiment_dir, run_dir) : "";
  const bool resumed = !run_id_.empty();
  if (!resumed) run_id_ = random_digits(32, "0123456789abcdef", 16);
  run_path_ = experiment_dir + "/" + run_id_;
  for (const char* sub : {"/params", "/metrics", "/tags", "/artifacts"}) fs::create_directories(run_path_ + sub);
  if (resumed) {
    cut_metrics_after(run_path_ + "/metrics", run.resume_step);
    start_time_ms_ = std::stoll("0" + yaml_field(run_path_ + "/meta.yaml", "start_time"));
  } else {
    start_time_ms_ = now_ms();
  }
  write_run_meta("1", -1);  // RUNNING
  for (const Param& p : run.params) write_small_file(run_path_ + "/params/" + p.key, p.text);
  write_small_file(run_path_ + "/tags/mlflow.runName", run_name_);
  write_small_file(run_path_ + "/tags/mlflow.source.name", "perftrain");
  write_small_file(run_path_ + "/tags/mlflow.source.type", "LOCAL");
  write_small_file(run_path_ + "/tags/perftrain.run_dir", run_dir);
}

// RunStatus: RUNNING 1, FINISHED 3, FAILED 4, KILLED 5; end_time < 0: null.
void MlflowLogger::write_run_meta(const char* status, int64_t end_time_ms) {
  std::ostringstream m;
  m << "artifact_uri: " << yaml_quoted("file://" + run_path_ + "/artifacts") << "\n"
    << "end_time: " << (end_time_ms < 0 ? std::string("null") : std::to_string(end_time_ms)) << "\n"
    << "entry_point_name: ''\n"
    << "experiment_id: " << yaml_quoted(experiment_id_) << "\n"
    << "lifecycle_stage: active\n"
    << "run_id: " << run_id_ << "\n"
    << "run_name: " << yaml_quoted(run_name_) << "\n"
    << "source_name: ''\n"
    << "source_type: 4\n"
    << "source_version: ''\n"
    << "start_time: " << start_time_ms_ << "\n"
    << "status: " << status << "\n"
    << "tags: []\n"
    << "user_id: " << yaml_quoted(account_name()) << "\n";
  io::write_text_atomic(run_path_ + "/meta.yaml", m.str());
}

void MlflowLogger::append_metric(const std::string& key, int64_t timestamp_ms, double value, int64_t step) {
  const std::string path = run_path_ + "/metrics/" + mlflow_metric_key(key);
  const std::string dir = fs::parent_path(path);
  if (made_dirs_.insert(dir).second) fs::create_directories(dir);
  const std::string line = std::to_string(timestamp_ms) + " " + number_text(value) + " " + std::to_string(step) + "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) throw RuntimeError("cannot write " + path + ": " + std::strerror(errno));
  const ssize_t n = ::write(fd, line.data(), line.size());
  ::close(fd);
  if (n != static_cast<ssize_t>(line.size())) throw RuntimeError("cannot write " + path + ": " + std::strerror(errno));
}

void MlflowLogger::scalars(int64_t step, const Scalars& values) {
  const int64_t now = now_ms();
  for (const auto& [key, value] : values) append_metric(key, now, value, step);
}

void MlflowLogger::close(RunEnd end) {
  write_run_meta(end == RunEnd::finished ? "3" : end == RunEnd::stopped ? "5" : "4", now_ms());
}

}  // namespace perftrain::observe::log
