#include "cli/step_options.h"

#include <CLI/CLI.hpp>

#include "cli/option_checks.h"
#include "cli/out_dir.h"

namespace perftrain::cli {

void add_step_options(CLI::App* cmd, train::bench::StepSetup& s, const std::string& kind) {
  cmd->add_option("--model", s.model,
                  "model name (perftrain models lists them); SS-* models take their condition from --set "
                  "model.cond_tokens=N [--set model.cond_dim=D: features, synthetic lengths]")
      ->check(known_model());
  cmd->add_option("--batch-size,--batch", s.batch_sizes,
                  kind == "bench" ? "batch sizes, comma-separated" : "batch size");
  cmd->add_option("--image-size", s.image_size, "latent height = width")
      ->check(integer_in(1, models::kMaxImageSize));
  cmd->add_option("--in-channels", s.in_channels, "latent channels")->check(integer_in(1, models::kMaxInChannels));
  cmd->add_option("--num-classes", s.num_classes, "classes")->check(integer_in(1, models::kMaxNumClasses));
  cmd->add_option("--precision", s.precision, "bf16 | fp16 | fp8: the mixed-precision variants' dtype (fp8: those with fused kernels; "
                  "--set train.precision=fp8 the same)");
  cmd->add_option("--device", s.device, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--seed", s.seed, "model and data seed")->check(integer_in(0, INT64_MAX));
  cmd->add_option("--set", s.overrides,
                  "override a config key: section.key=value, e.g. speed.attention=cudnn (repeatable; last word)");
  cmd->add_option("--out", s.out, "output directory (default runs/" + kind + "-<model>-<date>)")
      ->check(printable_text());
}

std::string out_dir_or_default(const train::bench::StepSetup& s, const std::string& kind) {
  return s.out.empty() ? default_out_dir(kind, s.model) : s.out;
}

}  // namespace perftrain::cli
