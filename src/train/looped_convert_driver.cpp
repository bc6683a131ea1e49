#include "train/looped_convert_driver.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/full.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <ostream>
#include <sstream>

#include "base/error.h"
#include "base/fs.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "models/looped_convert.h"
#include "train/checkpoint.h"

namespace perftrain::train {
namespace {

bool sets_key(const std::vector<std::string>& overrides, const std::string& key) {
  for (const auto& o : overrides)
    if (o.rfind(key + "=", 0) == 0) return true;
  return false;
}

// "DiT-S/2" / "SS-S/2" -> "Looped-S/2"
std::string looped_name(const std::string& source) {
  const auto dash = source.find('-');
  if (dash == std::string::npos) throw UsageError("convert --to looped: no looped name for model " + source);
  return "Looped-" + source.substr(dash + 1);
}

// A weights file, or a run / ckpt / step directory (then its `weights`).
std::string weights_file(const LoopedConvertOptions& o) {
  if (fs::is_regular_file(o.input)) return o.input;
  if (!fs::exists(o.input)) throw UsageError("convert: " + o.input + " does not exist");
  if (o.weights != "ema" && o.weights != "model") throw UsageError("--weights must be ema or model, got " + o.weights);
  return resolve_checkpoint_dir(o.input) + "/" + o.weights + ".safetensors";
}

// A batch of two random inputs of the config's shapes, the same every run.
struct Probe {
  at::Tensor x, t;
  models::Condition cond;
};
Probe random_probe(const models::DiTConfig& m) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  Probe p;
  p.x = at::randn({2, m.in_channels, m.image_size, m.image_size}, gen, at::kFloat);
  p.t = at::rand({2}, gen, at::kFloat) * 999;
  p.cond.labels = at::randint(m.num_classes, {2}, gen, at::kLong);
  if (m.single_stream() && m.cond_dim > 0) {
    p.cond.features = at::randn({2, m.cond_tokens, m.cond_dim}, gen, at::kFloat);
    p.cond.lengths = at::full({2}, m.cond_tokens, at::kLong);
  }
  return p;
}

// The tensors of `converted` copied into `model` by name; the model keeps its
// own where the conversion has none (loop_embed, routers, reinject).
void load_converted(const nn::NamedTensors& converted, models::DiffusionModel& model) {
  std::map<std::string, at::Tensor> by_name(converted.begin(), converted.end());
  size_t used = 0;
  at::NoGradGuard no_grad;
  for (auto& [name, current] : model.state()) {
    auto it = by_name.find(name);
    if (it == by_name.end()) continue;
    if (it->second.sizes() != current.sizes()) {
      std::ostringstream o;
      o << "convert --to looped: " << name << " converted as " << it->second.sizes() << ", the looped model's is "
        << current.sizes();
      throw RuntimeError(o.str());
    }
    current.copy_(it->second);
    ++used;
  }
  if (used != by_name.size()) {
    for (auto& [name, current] : model.state()) by_name.erase(name);
    throw RuntimeError("convert --to looped: the looped model has no tensor " + by_name.begin()->first);
  }
}

void write_weights(const std::string& path, const models::DiffusionModel& model, const TrainConfig& cfg) {
  io::save_safetensors(path, model.state(), {{"perftrain.config", cfg.to_toml()}, {"format", "pt"}},
                       io::SaveOptions{/*checksums=*/true});
}

// OUT.safetensors: the weights file; another path: a new directory with
// model.safetensors and config.toml, made under a temporary name and renamed.
std::string write_output(const std::string& out, const models::DiffusionModel& model, const TrainConfig& cfg) {
  const bool file = out.size() > 12 && out.compare(out.size() - 12, 12, ".safetensors") == 0;
  if (file) {
    write_weights(out, model, cfg);
    return out;
  }
  if (fs::exists(out)) throw UsageError("--out " + out + " exists; give a new directory or a .safetensors file");
  const std::string tmp = out + ".tmp." + std::to_string(::getpid());
  fs::remove_tree(tmp);
  fs::create_directories(tmp);
  try {
    write_weights(fs::join(tmp, "model.safetensors"), model, cfg);
    io::write_text_atomic(fs::join(tmp, "config.toml"), cfg.to_toml());
    if (std::rename(tmp.c_str(), out.c_str()) != 0) throw RuntimeError("cannot rename " + tmp + " to " + out);
  } catch (...) {
    fs::remove_tree(tmp);
    throw;
  }
  return fs::join(out, "model.safetensors") + " and " + fs::join(out, "config.toml");
}

}  // namespace

TrainConfig looped_config_for(const TrainConfig& source, const std::vector<std::string>& overrides,
                              const std::string& shared) {
  TrainConfig cfg = source;
  models::DiTConfig& m = cfg.model;
  m.name = looped_name(source.model.name);
  m.loop_block = source.model.single_stream() ? "single_stream" : "dit";
  m.family = "looped";
  m.lora_bias = !source.model.single_stream();  // the bias deltas (single-stream linears have none)
  for (const auto& o : overrides) apply_override(cfg, o);
  if (!sets_key(overrides, "model.loops") && m.shared_group > 0 &&
      (source.model.depth - m.prelude - m.coda) % m.shared_group == 0)
    m.loops = (source.model.depth - m.prelude - m.coda) / m.shared_group;
  models::check_looped_conversion(source.model, m, shared);
  m.depth = m.looped_depth();
  cfg.validate();
  return cfg;
}

std::unique_ptr<models::DiffusionModel> convert_model_to_looped(const models::DiffusionModel& source,
                                                                const TrainConfig& looped, const std::string& shared,
                                                                uint64_t seed, std::ostream& log) {
  const models::LoopedConversion c = models::convert_to_looped(source.state(), source.config(), looped.model, shared);
  auto model = models::make_diffusion_model(looped.model, seed);
  load_converted(c.state, *model);
  log << models::format_reconstruction(c);
  for (const auto& note : c.notes) log << "note: " << note << "\n";
  at::NoGradGuard no_grad;
  const Probe p = random_probe(source.config());
  const at::Tensor a = source.forward(p.x, p.t, p.cond), b = model->forward(p.x, p.t, p.cond);
  const double scale = a.norm().item<double>();
  char buf[160];
  std::snprintf(buf, sizeof buf, "output on 2 random inputs: ||looped - source|| / ||source|| = %.3e\n",
                (b - a).norm().item<double>() / (scale > 0 ? scale : 1.0));
  log << buf;
  return model;
}

void run_looped_convert(const LoopedConvertOptions& o, std::ostream& log) {
  if (o.out.empty()) throw UsageError("--out: give a .safetensors file or a new directory");
  const std::string path = weights_file(o);
  const TrainConfig source_cfg = config_from_weights(path);
  source_cfg.validate();
  const TrainConfig looped = looped_config_for(source_cfg, o.overrides, o.shared);
  const auto source = models::make_diffusion_model(source_cfg.model, 0);
  load_weights(path, *source);
  const models::DiTConfig& m = looped.model;
  log << "converting " << path << " (" << source_cfg.model.name << ", depth " << source_cfg.model.depth << ") to "
      << m.name << ": prelude " << m.prelude << ", " << m.shared_group << " shared block(s) x " << m.loops
      << " loops, coda " << m.coda << ", shared weights " << o.shared << ", LoRA rank " << m.lora_rank << " on "
      << m.lora_targets << (m.lora_bias ? " with bias deltas" : "") << "\n";
  const auto model = convert_model_to_looped(*source, looped, o.shared, o.seed, log);
  log << "wrote " << write_output(o.out, *model, looped) << "\n";
}

}  // namespace perftrain::train
