// perftrain sample: a PNG grid of class-conditional samples from a checkpoint,
// or (--npz) the sample batch ADM's evaluation suite reads.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <string>

#include "base/error.h"
#include "cli/checkpoint_model.h"
#include "cli/command.h"
#include "cli/option_checks.h"
#include "train/sampling.h"

namespace perftrain::cli {
namespace {

struct SampleArgs {
  CheckpointArgs source;
  SamplerArgs sampler;
  std::string out = "samples.png", npz;
  int64_t classes = 10, per_class = 8, samples = 50000, batch_size = 250;
};

void write_npz(const SampleArgs& a, const CheckpointModel& m, const train::SampleOptions& o) {
  train::write_sample_npz(a.npz, *m.model, m.cfg, o, a.samples, a.batch_size, m.device, [&](int64_t done) {
    std::cerr << "\rsampled " << done << "/" << a.samples << std::flush;
  });
  std::cerr << "\n";
  const int64_t size = train::image_size_of(m.cfg, o);
  std::cout << "wrote " << a.npz << ": arr_0 uint8 [" << a.samples << ", " << size << ", " << size
            << ", 3], arr_1 labels, " << o.steps << " "
            << (m.cfg.diffusion.objective == "flow" ? "Euler" : "DDIM") << " steps, guidance " << o.cfg_scale
            << ", from " << m.path << "\n";
}

void run(const SampleArgs& a) {
  const CheckpointModel m = load_checkpoint_model(a.source, [&](const train::TrainConfig& cfg) {
    if (!a.npz.empty() && a.sampler.vae.empty()) train::require_images(cfg, {}, "--npz");
  });
  train::SampleOptions o = sampler_options(a.sampler, m);
  if (!a.npz.empty()) return write_npz(a, m, o);
  o.classes = a.classes;
  o.per_class = a.per_class;
  if (std::min(o.classes, m.cfg.model.num_classes) * o.per_class > 65536)
    throw UsageError("--classes x --per-class must be at most 65536 images in a grid");
  train::write_sample_grid(a.out, *m.model, m.cfg, o, m.device);
  std::cout << "wrote " << a.out << ": " << std::min(o.classes, m.cfg.model.num_classes) << " classes x "
            << o.per_class << " samples, " << o.steps << " "
            << (m.cfg.diffusion.objective == "flow" ? "Euler" : "DDIM") << " steps, guidance " << o.cfg_scale
            << ", from " << m.path << "\n";
}

}  // namespace

void add_sample_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("sample", "write a PNG grid of class-conditional samples (one row per class), "
                                           "or with --npz the sample batch of ADM's evaluation suite");
  auto a = std::make_shared<SampleArgs>();
  add_checkpoint_options(cmd, a->source);
  add_sampler_options(cmd, a->sampler);
  cmd->add_option("--out", a->out, "PNG file to write")->check(printable_text());
  cmd->add_option("--classes", a->classes, "the first N classes, one row each")->check(integer_in(1, 65536));
  cmd->add_option("--per-class", a->per_class, "samples per class")->check(integer_in(1, 1024));
  cmd->add_option("--npz", a->npz,
                  "write --samples images as an .npz instead of a grid: arr_0 uint8 [N, H, W, 3] (ADM's evaluation "
                  "suite), arr_1 labels (the classes in turn)")
      ->check(printable_text())
      ->default_str("none");
  cmd->add_option("--samples", a->samples, "images in the --npz batch")->check(integer_in(1, 10000000));
  cmd->add_option("--batch-size", a->batch_size, "images sampled at once")->check(integer_in(1, 65536));
  cmd->callback([a] { run(*a); });
}

}  // namespace perftrain::cli
