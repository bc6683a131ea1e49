// perftrain summary: a torchinfo-style table of a model (module tree, output
// shapes, parameters, trainable flag, mult-adds, totals) and the training
// memory estimate of train/memory_estimate for the config's step.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "base/error.h"
#include "cli/command.h"
#include "cli/view_options.h"
#include "models/views/module_summary.h"
#include "models/views/view_model.h"
#include "train/memory_estimate.h"

namespace perftrain::cli {

namespace {

struct SummaryArgs {
  int depth = 3;
  std::string format = "table";
  std::string device = "cuda";
};

void run_summary(const ViewArgs& v, const SummaryArgs& a) {
  train::TrainConfig cfg = resolve_view_config(v);
  if (v.batch > 0) cfg.optim.batch_size = v.batch;
  const int64_t batch = cfg.optim.batch_size;
  const models::views::ViewModel model = models::views::meta_model(cfg.model, batch);
  models::views::ModuleSummary s = models::views::summarize_module(*model.model, [&] { model.forward(); });
  s.title = cfg.model.name + ", batch " + std::to_string(batch) + ", input [" + std::to_string(batch) + ", " +
            std::to_string(cfg.model.in_channels) + ", " + std::to_string(cfg.model.image_size) + ", " +
            std::to_string(cfg.model.image_size) + "], eager forward (every module)";
  const bool cuda = a.device == "cuda";
  const std::string precision = cfg.optim.precision == "auto" ? (cuda ? "bf16" : "fp32") : cfg.optim.precision;
  const train::MemoryEstimate m = train::estimate_training_memory(cfg, cuda, precision);
  for (const auto& [what, bytes] : m.parts) {
    if (bytes > 0) s.memory.emplace_back(what, bytes);
  }
  s.memory.emplace_back("total", m.total_bytes());
  s.memory_note = std::string("train/memory_estimate: one training step on ") + (cuda ? "CUDA" : "the CPU") + ", " +
                  precision + ", batch " + std::to_string(batch) + ", [speed] fused_kernels " +
                  (cfg.speed.fused_kernels ? "on" : "off") + ", recompute " + (cfg.speed.recompute ? "on" : "off");
  write_view_output(v, models::views::format_summary(s, a.format, a.depth));
}

}  // namespace

void add_summary_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "summary", "a model's modules with output shapes, parameters, mult-adds and its training memory estimate");
  auto v = std::make_shared<ViewArgs>();
  auto a = std::make_shared<SummaryArgs>();
  add_view_options(cmd, v);
  cmd->add_option("-b,--batch-size,--batch", v->batch, "batch size (default: the config's optim.batch_size)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("-d,--depth", a->depth, "module nesting shown (0: the model only)")->check(CLI::NonNegativeNumber);
  cmd->add_option("-f,--format", a->format, "output format")->check(CLI::IsMember({"table", "csv", "json", "md"}));
  cmd->add_option("--device", a->device, "the device the memory estimate is for")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  cmd->callback([v, a] { run_summary(*v, *a); });
}

}  // namespace perftrain::cli
