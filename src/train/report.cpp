#include "train/report.h"

#include <algorithm>
#include <sstream>

#include "io/atomic_file.h"
#include "compat/compat.h"
#include "train/progress.h"
#include "train/signals.h"

namespace perftrain::train {
namespace {

// "graph = true, ..., attention = 'own', ...": every [speed] key as resolved.
std::string speed_settings(const TrainConfig& cfg) {
  std::string out;
  for (const auto& [key, value] : config_fields(cfg, "speed")) out += (out.empty() ? "" : ", ") + key + " = " + value;
  return out;
}

// "1.25 GiB", or "n/a" where the allocator keeps no statistics (the CPU).
std::string gib(const std::optional<double>& v) {
  if (!v) return "n/a";
  std::ostringstream o;
  o << *v << " GiB";
  return o.str();
}

// The training-health section: how gradients were monitored, the
// detectors' warnings, non-finite steps and where the first one came from.
std::string health_section(const TrainSummary& s) {
  std::ostringstream r;
  r << "\n## Training health\n\n"
    << "- gradient monitoring: " << (s.health_monitor.empty() ? "off" : s.health_monitor) << "\n"
    << "- non-finite steps (update skipped): " << s.nonfinite_steps << "\n";
  if (!s.nonfinite_site.empty()) r << "- first non-finite value: " << s.nonfinite_site << "\n";
  if (s.health_warnings.empty()) {
    r << "- warnings: none\n";
  } else {
    r << "- warnings (" << s.health_warnings.size() << "):\n";
    const size_t shown = std::min<size_t>(s.health_warnings.size(), 50);
    for (size_t i = 0; i < shown; ++i) r << "  - " << s.health_warnings[i] << "\n";
    if (shown < s.health_warnings.size()) r << "  - ... and " << s.health_warnings.size() - shown << " more in metrics.jsonl\n";
  }
  return r.str();
}

}  // namespace

void write_report(const std::string& path, const TrainConfig& cfg, const TrainSummary& s,
                  const std::string& device, const std::string& precision, int64_t params, const std::string& data) {
  std::ostringstream r;
  r << "# perftrain run report\n\n"
    << "| | |\n|---|---|\n"
    << "| model | " << cfg.model.name << " (depth " << cfg.model.depth << ", hidden " << cfg.model.hidden
    << ", heads " << cfg.model.heads << ", patch " << cfg.model.patch << "), " << params << " trainable parameters |\n"
    << "| input | " << cfg.model.in_channels << "x" << cfg.model.image_size << "x" << cfg.model.image_size << ", "
    << cfg.model.num_classes << " classes, learn_sigma " << (cfg.model.learn_sigma ? "on" : "off") << " |\n"
    << "| data | " << data << " |\n"
    << "| objective | " << cfg.diffusion.objective << " |\n"
    << "| device | " << device << " |\n"
    << "| precision | "
    << (precision == "fp32" ? std::string("fp32 (TF32 matrix products on CUDA)")
                            : precision + " autocast, fp32 weights and optimizer state" +
                                  (precision == "fp16" ? ", dynamic loss scale" : ""))
    << " |\n"
    << "| step | " << s.step_mode << " |\n"
    << "| speed settings | " << speed_settings(cfg) << " |\n"
    << "| torch | " << compat::torch_version() << " |\n"
    << "| steps | " << s.first_step << " to " << s.last_step << ", batch " << cfg.optim.batch_size
    << (s.stop_signal != 0 ? std::string(", stopped by ") + stop_signal_name(s.stop_signal) : std::string()) << " |\n"
    << "| loss | " << s.first_loss << " (first window) to " << s.final_loss << " (last window) |\n"
    << "| speed | " << s.steps_per_s << " steps/s, " << s.steps_per_s * cfg.optim.batch_size << " images/s |\n"
    << "| first step | " << s.first_step_s << " s after start |\n"
    << "| peak memory | " << gib(s.peak_memory_gib) << " |\n"
    << "| last checkpoint | " << s.last_checkpoint << " |\n"
    << "| last samples | " << s.last_samples << " |\n\n"
    << "Metrics per logging window are in metrics.jsonl; the resolved config is config.toml.\n"
    << health_section(s);
  io::write_text_atomic(path, r.str());
}

}  // namespace perftrain::train
