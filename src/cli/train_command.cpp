// perftrain train: resolve the config (device defaults < --config file <
// shortcut flags < --set / positional section.key=value) and run training.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <iostream>
#include <optional>
#include <sstream>

#include "cli/command.h"
#include "compat/compat.h"
#include "ops/switches.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace perftrain::cli {
namespace {

struct TrainArgs {
  std::string config_file, resume;
  std::vector<std::string> overrides;  // section.key=value
  // Shortcuts for the most used keys; each becomes an override.
  std::string model, data, data_path, device, precision, objective, run_name, runs_dir;
  // Unset unless given (so that an explicit 0 reaches validation).
  std::optional<int64_t> steps, batch_size, seed;
  std::optional<double> lr;
  std::optional<std::string> graph, fused;  // on | off
  bool recompute = false, gelu_recompute = false;
};

std::vector<std::string> shortcut_overrides(const TrainArgs& a) {
  std::vector<std::string> o;
  auto str = [&](const std::string& key, const std::string& v) {
    if (!v.empty()) o.push_back(key + "=\"" + v + "\"");
  };
  str("model.name", a.model);
  str("data.source", a.data);
  str("data.path", a.data_path);
  str("train.device", a.device);
  str("train.precision", a.precision);
  str("diffusion.objective", a.objective);
  str("run.name", a.run_name);
  str("run.dir", a.runs_dir);
  if (a.steps) o.push_back("train.steps=" + std::to_string(*a.steps));
  if (a.batch_size) o.push_back("train.batch_size=" + std::to_string(*a.batch_size));
  if (a.lr) {
    std::ostringstream v;
    v.precision(17);
    v << std::showpoint << *a.lr;  // always a TOML float
    o.push_back("train.lr=" + v.str());
  }
  if (a.seed) o.push_back("train.seed=" + std::to_string(*a.seed));
  if (a.graph) o.push_back(std::string("speed.graph=") + (*a.graph == "on" ? "true" : "false"));
  if (a.fused) {
    const char* v = *a.fused == "on" ? "true" : "false";
    o.push_back(std::string("speed.fused_kernels=") + v);
    o.push_back(std::string("speed.fused_optimizer=") + v);
  }
  if (a.recompute) o.push_back("speed.recompute=true");
  if (a.gelu_recompute) o.push_back("speed.gelu_recompute=true");
  return o;
}

void run(const TrainArgs& a) {
  const auto start = std::chrono::steady_clock::now();
  ops::check_switches();
  train::TrainConfig cfg;
  if (!a.resume.empty()) {
    // A resumed run keeps the config it was started with; flags may change it
    // (most often train.steps, to train longer).
    const auto dir = train::resolve_checkpoint_dir(a.resume);
    cfg = train::config_from_weights(dir + "/model.safetensors");
  } else {
    const bool cuda = a.device == "cuda" || (a.device != "cpu" && compat::cuda_available());
    cfg = train::default_config(cuda);
  }
  if (!a.config_file.empty()) train::apply_toml_file(cfg, a.config_file);
  for (const auto& o : shortcut_overrides(a)) train::apply_override(cfg, o);
  for (const auto& o : a.overrides) train::apply_override(cfg, o);

  train::TrainOptions opts;
  opts.resume = a.resume;
  opts.process_start = start;
  opts.interactive = isatty(STDOUT_FILENO);
  auto s = train::run_training(cfg, opts, std::cout);
  std::cout << "done: steps " << s.first_step << "-" << s.last_step << ", loss " << s.first_loss << " -> "
            << s.final_loss << ", " << s.steps_per_s << " steps/s\n"
            << "samples: " << s.last_samples << "\ncheckpoint: " << s.last_checkpoint
            << "\nreport: " << s.run_dir << "/report.md\n";
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "train a DiT (default: DiT-S/2 on Fashion-MNIST on the GPU, "
                                          "DiT-T/4 on the CPU)");
  auto a = std::make_shared<TrainArgs>();
  cmd->add_option("--config", a->config_file, "TOML config file")->check(CLI::ExistingFile);
  cmd->add_option("--resume", a->resume, "continue a run: its directory, or a ckpt/step_* directory");
  cmd->add_option("--set", a->overrides, "override a config key: section.key=value (repeatable)");
  cmd->add_option("overrides", a->overrides, "more section.key=value overrides");
  cmd->add_option("--model", a->model, "model name (perftrain models lists them)");
  cmd->add_option("--data", a->data, "data source: fashion-mnist | latents | synthetic");
  cmd->add_option("--data-path", a->data_path, "dataset directory or latent shard file/directory");
  cmd->add_option("--device", a->device, "auto | cpu | cuda");
  cmd->add_option("--precision", a->precision, "auto | bf16 | fp16 | fp32");
  cmd->add_option("--graph", a->graph, "on | off: capture the whole step in one CUDA graph (default on)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--fused", a->fused, "on | off: fused kernels and the device optimizer (default on)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_flag("--recompute", a->recompute, "recompute block activations in backward (less memory, ~30% slower)");
  cmd->add_flag("--gelu-recompute", a->gelu_recompute,
                "keep only the MLPs' pre-activations, GELU again in backward (~15% less memory, ~3% slower)");
  cmd->add_option("--objective", a->objective, "ddpm | flow");
  cmd->add_option("--steps", a->steps, "total training steps");
  cmd->add_option("--batch-size", a->batch_size, "batch size");
  cmd->add_option("--lr", a->lr, "learning rate");
  cmd->add_option("--seed", a->seed, "random seed");
  cmd->add_option("--run-name", a->run_name, "run directory name under --runs-dir");
  cmd->add_option("--runs-dir", a->runs_dir, "where run directories go (default runs)");
  cmd->callback([a] { run(*a); });
}

}  // namespace perftrain::cli
