#include "train/checkpoint.h"

#include <ATen/core/grad_mode.h>
#include <fcntl.h>
#include <stdio.h>
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
#include "io/atomic_file.h"
#include "io/safetensors.h"

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

// Keeps the newest `keep` step directories, the one just written among them.
void prune(const std::string& root, int64_t keep, const std::string& current) {
  std::vector<std::string> others;
  for (const auto& name : fs::list_directory(root))
    if (name != current && name.rfind("step_", 0) == 0 && fs::is_directory(fs::join(root, name)))
      others.push_back(name);
  for (size_t i = 0; i + static_cast<size_t>(keep) < others.size() + 1; ++i) remove_step_dir(root, others[i]);
}

}  // namespace

const std::vector<std::string>& checkpoint_files() {
  static const std::vector<std::string> files = {"model.safetensors", "ema.safetensors",
                                                 "trainer_state.safetensors"};
  return files;
}

bool is_interrupted_step_dir(const std::string& ckpt_root, const std::string& name) {
  if (name.rfind(".step_", 0) == 0) return true;
  if (name.rfind("step_", 0) != 0 || !fs::is_directory(fs::join(ckpt_root, name))) return false;
  for (const auto& f : checkpoint_files())
    if (!fs::is_regular_file(fs::join(fs::join(ckpt_root, name), f))) return true;
  return false;
}

std::string save_checkpoint(const std::string& ckpt_root, const TrainConfig& cfg,
                            const TrainerState& state, const models::DiffusionModel& model,
                            const models::DiffusionModel& ema, const io::NamedTensors& optimizer_state,
                            at::Generator gen, int64_t keep) {
  const std::string name = step_dir_name(state.step);
  const std::string dir = fs::join(ckpt_root, name);
  const std::string tmp = fs::join(ckpt_root, "." + name + ".tmp." + std::to_string(::getpid()));
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

std::string resolve_checkpoint_dir(const std::string& path) {
  if (fs::exists(fs::join(path, "trainer_state.safetensors"))) return path;
  for (const std::string& root : {fs::join(path, "ckpt"), path}) {
    if (fs::exists(fs::join(root, "latest"))) {
      std::ifstream in(fs::join(root, "latest"));
      std::string name;
      in >> name;
      const std::string dir = fs::join(root, name);
      for (const auto& f : checkpoint_files())
        if (!fs::exists(fs::join(dir, f))) throw RuntimeError(root + "/latest names " + name + ", which has no " + f);
      return dir;
    }
  }
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
