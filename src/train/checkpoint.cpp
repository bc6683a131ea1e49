#include "train/checkpoint.h"

#include <ATen/core/grad_mode.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/fs.h"
#include "base/text.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "train/run_lock.h"

namespace perftrain::train {
namespace {

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

void rename_or_throw(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    throw RuntimeError("cannot rename " + from + " to " + to + ": " + std::strerror(errno));
}

// A step directory leaves the step names by one rename, then goes; a crash in
// between leaves a hidden leftover, never a partial step_* directory.
void remove_step_dir(const std::string& root, const std::string& name) {
  const std::string old = fs::join(root, "." + name + ".old." + std::to_string(::getpid()));
  fs::remove_tree(old);
  rename_or_throw(fs::join(root, name), old);
  fs::remove_tree(old);
}

// Keeps the newest `keep` complete step directories, the one just written
// among them; any other directory is not this program's to remove.
void prune(const std::string& root, int64_t keep, const std::string& current) {
  std::vector<std::string> others;
  for (const auto& name : fs::list_directory(root))
    if (name != current && is_step_dir_name(name) && fs::is_directory(fs::join(root, name)) &&
        missing_checkpoint_files(fs::join(root, name)).empty())
      others.push_back(name);
  for (size_t i = 0; i + static_cast<size_t>(keep) < others.size() + 1; ++i) remove_step_dir(root, others[i]);
}

bool all_digits(const std::string& s, size_t from, size_t to) {
  if (from >= to || to > s.size()) return false;
  for (size_t i = from; i < to; ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

}  // namespace

const std::vector<std::string>& checkpoint_files() {
  static const std::vector<std::string> files = {"model.safetensors", "ema.safetensors",
                                                 "trainer_state.safetensors"};
  return files;
}

bool is_step_dir_name(const std::string& name) {
  return name.rfind("step_", 0) == 0 && name.size() >= 13 && all_digits(name, 5, name.size());
}

bool is_step_temp_name(const std::string& name) {
  // ".step_<digits>.tmp.<digits>" or ".step_<digits>.old.<digits>"
  if (name.rfind(".step_", 0) != 0) return false;
  const size_t dot = name.find('.', 6);
  if (dot == std::string::npos || !all_digits(name, 6, dot)) return false;
  const std::string kind = name.substr(dot, 5);
  return (kind == ".tmp." || kind == ".old.") && all_digits(name, dot + 5, name.size());
}

std::vector<std::string> missing_checkpoint_files(const std::string& dir) {
  std::vector<std::string> missing;
  for (const auto& f : checkpoint_files())
    if (!fs::is_regular_file(fs::join(dir, f))) missing.push_back(f);
  return missing;
}

std::string save_checkpoint(const std::string& ckpt_root, const TrainConfig& cfg,
                            const TrainerState& state, const models::DiffusionModel& model,
                            const models::DiffusionModel& ema, const io::NamedTensors& optimizer_state,
                            at::Generator gen, int64_t keep) {
  const std::string name = step_dir_name(state.step);
  const std::string dir = fs::join(ckpt_root, name);
  const std::string tmp = fs::join(ckpt_root, "." + name + ".tmp." + std::to_string(::getpid()));
  check_run_lock(fs::parent_path(ckpt_root));
  fs::remove_tree(tmp);
  fs::create_directories(tmp);
  const io::SaveOptions checksums{/*checksums=*/true};
  const std::map<std::string, std::string> meta = {
      {"perftrain.config", cfg.to_toml()},
      {"perftrain.step", std::to_string(state.step)},
      {"format", "pt"},
  };
  io::save_safetensors(fs::join(tmp, "model.safetensors"), model.state(), meta, checksums);
  io::save_safetensors(fs::join(tmp, "ema.safetensors"), ema.state(), meta, checksums);

  io::NamedTensors trainer = optimizer_state;
  at::Tensor rng;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
  }
  trainer.emplace_back("rng.train", rng);
  io::save_safetensors(fs::join(tmp, "trainer_state.safetensors"), trainer,
                       {{"step", std::to_string(state.step)},
                        {"data.epoch", std::to_string(state.position.epoch)},
                        {"data.index", std::to_string(state.position.index)},
                        {"rng.device", gen.device().str()}},
                       checksums);
  // Each file was fsynced and renamed inside tmp, and tmp fsynced with it.
  check_run_lock(fs::parent_path(ckpt_root));  // the save took a while: still this run's trainer?
  if (fs::exists(dir)) {
    // The same step again (a resume from an older checkpoint): swap the two
    // directories in one step where the filesystem can, so that `latest`
    // never names a missing directory; else the old one goes first.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
      fs::remove_tree(tmp);
    } else {
      remove_step_dir(ckpt_root, name);
      rename_or_throw(tmp, dir);
    }
  } else {
    rename_or_throw(tmp, dir);
  }
  io::sync_directory(ckpt_root);
  io::write_text_atomic(fs::join(ckpt_root, "latest"), name + "\n");
  prune(ckpt_root, keep, name);
  return dir;
}

namespace {

// "a, b and c"
std::string listed(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i)
    out += (i == 0 ? "" : i + 1 == items.size() ? " and " : ", ") + items[i];
  return out;
}

}  // namespace

std::string latest_checkpoint_dir(const std::string& ckpt_root) {
  const std::string latest = fs::join(ckpt_root, "latest");
  std::ifstream in(latest);
  std::string name, rest;
  in >> name >> rest;
  // Only a step directory of this ckpt directory: never a path, so that an
  // edited or copied `latest` cannot lead a resume into another run.
  if (!is_step_dir_name(name) || !rest.empty())
    throw RuntimeError(latest + " names '" + base::printable(name + (rest.empty() ? "" : " " + rest)) +
                       "', which is not a step directory of this run (step_<8 digits> in " + ckpt_root +
                       "); resume from a step directory instead: --resume " + ckpt_root + "/step_<N>");
  const std::string dir = fs::join(ckpt_root, name);
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw RuntimeError(latest + " names " + name + ", which is " +
                       (fs::exists(dir) ? "not a directory of this run" : "absent"));
  const auto missing = missing_checkpoint_files(dir);
  if (!missing.empty()) throw RuntimeError(latest + " names " + name + ", which has no " + listed(missing));
  return dir;
}

std::string resolve_checkpoint_dir(const std::string& path) {
  // A step directory: its trainer state (the other files are named when they
  // are loaded), else any checkpoint file in it, or its name.
  if (fs::exists(fs::join(path, "trainer_state.safetensors"))) return path;
  std::string base = path;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  bool step_dir = is_step_dir_name(base.substr(base.rfind('/') == std::string::npos ? 0 : base.rfind('/') + 1));
  for (const auto& f : checkpoint_files()) step_dir = step_dir || fs::exists(fs::join(path, f));
  if (step_dir && fs::is_directory(path))
    throw UsageError("no checkpoint at " + path + ": the step directory has no " +
                     listed(missing_checkpoint_files(path)) +
                     " (a checkpoint is model.safetensors, ema.safetensors and trainer_state.safetensors)");
  for (const std::string& root : {fs::join(path, "ckpt"), path})
    if (fs::exists(fs::join(root, "latest"))) return latest_checkpoint_dir(root);
  throw UsageError("no checkpoint at " + path +
                   " (expected a run directory with ckpt/latest, or a step_* directory)");
}

namespace {

void load_weights_from(const io::SafetensorsFile& file, nn::Module& module) {
  // Copies into the existing tensors (not new ones), so that an optimizer or
  // EMA already holding them keeps updating the model's own weights.
  const std::string& path = file.path();
  std::set<std::string> expected;
  at::NoGradGuard no_grad;
  for (auto& [name, current] : module.state()) {
    expected.insert(name);
    if (!file.contains(name)) throw RuntimeError(path + ": missing tensor '" + name + "'");
    at::Tensor t = file.get(name);
    if (t.sizes() != current.sizes())
      throw RuntimeError(path + ": tensor '" + name + "' has shape " + shape_str(t.sizes()) +
                         " but the model expects " + shape_str(current.sizes()));
    // copy_ would cast an integer or bool tensor into a float weight silently.
    if (at::isFloatingType(t.scalar_type()) != at::isFloatingType(current.scalar_type()))
      throw RuntimeError(path + ": tensor '" + name + "' has dtype " + io::safetensors_dtype_name(t.scalar_type()) +
                         " but the model's is " + io::safetensors_dtype_name(current.scalar_type()) +
                         (at::isFloatingType(current.scalar_type()) ? " (a weight takes F16, BF16, F32 or F64)"
                                                                    : ""));
    current.copy_(t);
  }
  for (const auto& name : file.names())
    if (!expected.count(name)) throw RuntimeError(path + ": unexpected tensor '" + name + "' for this model");
}

}  // namespace

void load_weights(const std::string& path, nn::Module& module) {
  auto file = io::SafetensorsFile::open(path);
  file.verify_checksums();
  load_weights_from(file, module);
}

TrainConfig config_from_weights(const std::string& path) {
  auto file = io::SafetensorsFile::open(path);
  file.verify_header_checksum();  // the config is in the header
  auto it = file.metadata().find("perftrain.config");
  if (it == file.metadata().end())
    throw UsageError(path + " has no perftrain config in its metadata; pass --config with the model settings");
  TrainConfig cfg = default_config(false);
  apply_toml(cfg, it->second, path + " (metadata)");
  return cfg;
}

TrainerState load_checkpoint(const std::string& step_dir, models::DiffusionModel& model, models::DiffusionModel& ema,
                             const std::function<void(const io::NamedTensors&)>& load_optimizer,
                             at::Generator& gen) {
  const std::string& dir = step_dir;
  // Every file is checked before anything is loaded.
  const auto model_file = io::SafetensorsFile::open(fs::join(dir, "model.safetensors"));
  const auto ema_file = io::SafetensorsFile::open(fs::join(dir, "ema.safetensors"));
  const std::string state_path = fs::join(dir, "trainer_state.safetensors");
  const auto file = io::SafetensorsFile::open(state_path);
  for (const auto* f : {&model_file, &ema_file, &file}) f->verify_checksums();
  load_weights_from(model_file, model);
  load_weights_from(ema_file, ema);

  io::NamedTensors state;
  for (const auto& name : file.names())
    if (name != "rng.train") state.emplace_back(name, file.get(name));
  load_optimizer(state);
  if (!file.contains("rng.train")) throw RuntimeError(state_path + ": missing tensor 'rng.train'");
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(file.get("rng.train").clone());
  }
  auto meta = [&](const std::string& key) -> int64_t {
    auto it = file.metadata().find(key);
    if (it == file.metadata().end()) throw RuntimeError(state_path + ": metadata has no '" + key + "'");
    try {
      return std::stoll(it->second);
    } catch (const std::exception&) {
      throw RuntimeError(state_path + ": metadata '" + key + "' is not an integer");
    }
  };
  TrainerState s;
  s.step = meta("step");
  s.position.epoch = meta("data.epoch");
  s.position.index = meta("data.index");
  return s;
}

}  // namespace perftrain::train
