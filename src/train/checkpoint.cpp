#include "train/checkpoint.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdio>
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

void prune(const std::string& root, int64_t keep) {
  std::vector<std::string> steps;
  for (const auto& name : fs::list_directory(root))
    if (name.rfind("step_", 0) == 0 && fs::is_directory(fs::join(root, name))) steps.push_back(name);
  for (size_t i = 0; i + keep < steps.size(); ++i) fs::remove_tree(fs::join(root, steps[i]));
}

}  // namespace

std::string save_checkpoint(const std::string& ckpt_root, const TrainConfig& cfg,
                            const TrainerState& state, const models::DiT& model,
                            const models::DiT& ema, const io::NamedTensors& optimizer_state,
                            at::Generator gen, int64_t keep) {
  const std::string dir = fs::join(ckpt_root, step_dir_name(state.step));
  fs::create_directories(dir);
  const std::map<std::string, std::string> meta = {
      {"perftrain.config", cfg.to_toml()},
      {"perftrain.step", std::to_string(state.step)},
      {"format", "pt"},
  };
  io::save_safetensors(fs::join(dir, "model.safetensors"), model.state(), meta);
  io::save_safetensors(fs::join(dir, "ema.safetensors"), ema.state(), meta);

  io::NamedTensors trainer = optimizer_state;
  at::Tensor rng;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
  }
  trainer.emplace_back("rng.train", rng);
  io::save_safetensors(fs::join(dir, "trainer_state.safetensors"), trainer,
                       {{"step", std::to_string(state.step)},
                        {"data.epoch", std::to_string(state.position.epoch)},
                        {"data.index", std::to_string(state.position.index)},
                        {"rng.device", gen.device().str()}});
  io::write_text_atomic(fs::join(ckpt_root, "latest"), step_dir_name(state.step) + "\n");
  prune(ckpt_root, keep);
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
      if (!fs::exists(fs::join(dir, "trainer_state.safetensors")))
        throw RuntimeError(root + "/latest names " + name + ", which has no trainer_state.safetensors");
      return dir;
    }
  }
  throw UsageError("no checkpoint at " + path +
                   " (expected a run directory with ckpt/latest, or a step_* directory)");
}

void load_weights(const std::string& path, nn::Module& module) {
  // Copies into the existing tensors (not new ones), so that an optimizer or
  // EMA already holding them keeps updating the model's own weights.
  auto file = io::SafetensorsFile::open(path);
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

TrainConfig config_from_weights(const std::string& path) {
  auto file = io::SafetensorsFile::open(path);
  auto it = file.metadata().find("perftrain.config");
  if (it == file.metadata().end())
    throw UsageError(path + " has no perftrain config in its metadata; pass --config with the model settings");
  TrainConfig cfg = default_config(false);
  apply_toml(cfg, it->second, path + " (metadata)");
  return cfg;
}

TrainerState load_checkpoint(const std::string& step_dir, models::DiT& model, models::DiT& ema,
                             const std::function<void(const io::NamedTensors&)>& load_optimizer,
                             at::Generator& gen) {
  const std::string& dir = step_dir;
  load_weights(fs::join(dir, "model.safetensors"), model);
  load_weights(fs::join(dir, "ema.safetensors"), ema);

  const std::string state_path = fs::join(dir, "trainer_state.safetensors");
  auto file = io::SafetensorsFile::open(state_path);
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
