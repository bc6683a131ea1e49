#include "train/report.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "compat/compat.h"
#include "io/atomic_file.h"
#include "train/signals.h"

namespace perftrain::train {
namespace {

// "graph = true, ..., attention = 'whole_head', ...": every [speed] key as resolved.
std::string speed_settings(const TrainConfig& cfg) {
  std::string out;
  for (const auto& [key, value] : config_fields(cfg, "speed")) out += (out.empty() ? "" : ", ") + key + " = " + value;
  return out;
}

std::string number(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

// "1.25 GiB", or "n/a" where the allocator keeps no statistics (the CPU).
std::string gib(const std::optional<double>& v) { return v ? number(*v) + " GiB" : "n/a"; }

// "1 process, batch 8" / "2 processes (data parallel), global batch 6 = 2 x 3 per rank".
std::string ranks_and_batch(int ranks, int64_t batch) {
  if (ranks <= 1) return "1 process, batch " + std::to_string(batch);
  return std::to_string(ranks) + " processes (data parallel), global batch " + std::to_string(batch) + " = " +
         std::to_string(ranks) + " x " + std::to_string(batch / ranks) + " per rank";
}

// The run's speed after each segment's first step (timed apart): its steps
// and images over the time they took. "n/a" where no segment ran two steps.
std::string run_speed(const std::vector<RunSegment>& segments) {
  double steps = 0, images = 0, seconds = 0;
  for (const RunSegment& s : segments) {
    if (!s.recorded() || s.timed_steps() <= 0 || !(s.steps_per_s > 0)) continue;
    steps += static_cast<double>(s.timed_steps());
    images += static_cast<double>(s.timed_steps() * s.batch_size);
    seconds += static_cast<double>(s.timed_steps()) / s.steps_per_s;
  }
  if (seconds <= 0) return "n/a (no segment ran more than its first step, which is timed apart)";
  return number(steps / seconds) + " steps/s, " + number(images / seconds) + " images/s";
}

std::optional<double> peak_memory(const std::vector<RunSegment>& segments) {
  std::optional<double> peak;
  for (const RunSegment& s : segments)
    if (s.peak_memory_gib) peak = std::max(peak.value_or(0.0), *s.peak_memory_gib);
  return peak;
}

// The newest non-empty value of a segment's field.
std::string newest(const std::vector<RunSegment>& segments, std::string RunSegment::*field) {
  for (auto it = segments.rbegin(); it != segments.rend(); ++it)
    if (!((*it).*field).empty()) return (*it).*field;
  return "";
}

std::string loss_range(const MetricsTotals& m) {
  if (!m.first_loss || !m.final_loss) return "n/a (no logging window yet)";
  return number(*m.first_loss) + " (first window) to " + number(*m.final_loss) + " (last window)";
}

// One row per segment: a fresh start and each resume.
std::string segments_section(const std::vector<RunSegment>& segments) {
  std::ostringstream r;
  r << "\n## Segments\n\n"
    << "The fresh start and each resume (kept in segments.jsonl).\n\n"
    << "| steps | ranks | device | speed | first step | step | end |\n"
    << "|---|---|---|---|---|---|---|\n";
  for (const RunSegment& s : segments) {
    r << "| " << s.first_step << " to " << s.last_step << " | ";
    if (!s.recorded()) {
      r << "not recorded (trained before the run kept segments.jsonl) | | | | | |\n";
      continue;
    }
    r << ranks_and_batch(s.ranks, s.batch_size) << " | " << s.device << " | "
      << (s.timed_steps() > 0 ? number(s.steps_per_s) + " steps/s" : std::string("n/a (one step)")) << " | "
      << s.first_step_s << " s after start | " << s.step_mode << " | "
      << (s.end.empty() ? std::string("ended without a report after its last checkpoint") : s.end) << " |\n";
  }
  return r.str();
}

// The training-health section: how gradients were monitored, the
// detectors' warnings, non-finite steps and where the first one came from.
std::string health_section(const TrainSummary& segment, const std::vector<RunSegment>& segments,
                           const MetricsTotals& m) {
  std::vector<std::string> warnings = m.health_warnings;
  for (const RunSegment& s : segments)
    warnings.insert(warnings.end(), s.checkpoint_warnings.begin(), s.checkpoint_warnings.end());
  std::string site;
  for (const RunSegment& s : segments)
    if (site.empty()) site = s.nonfinite_site;
  std::ostringstream r;
  r << "\n## Training health\n\n"
    << "- gradient monitoring: " << (segment.health_monitor.empty() ? "off" : segment.health_monitor) << "\n"
    << "- non-finite steps (update skipped): " << m.nonfinite_steps << "\n";
  if (!site.empty()) r << "- first non-finite value: " << site << "\n";
  if (warnings.empty()) {
    r << "- warnings: none\n";
  } else {
    r << "- warnings (" << warnings.size() << "):\n";
    const size_t shown = std::min<size_t>(warnings.size(), 50);
    for (size_t i = 0; i < shown; ++i) r << "  - " << warnings[i] << "\n";
    if (shown < warnings.size()) r << "  - ... and " << warnings.size() - shown << " more in metrics.jsonl\n";
  }
  return r.str();
}

std::string precision_text(const std::string& precision, const std::string& fp8) {
  if (precision == "fp32") return "fp32 (TF32 matrix products on CUDA)";
  if (precision == "fp8") return "fp8 in the blocks' linears, bf16 autocast elsewhere on CUDA (fp32 on the CPU): " + fp8;
  return precision + " autocast, fp32 weights and optimizer state" + (precision == "fp16" ? ", dynamic loss scale" : "");
}

}  // namespace

MetricsTotals read_metrics_totals(const std::string& metrics_path) {
  MetricsTotals m;
  std::ifstream in(metrics_path);
  for (std::string line; std::getline(in, line);) {
    const auto rec = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!rec.is_object()) continue;
    if (rec.contains("loss") && rec["loss"].is_number()) {
      if (!m.first_loss) m.first_loss = rec["loss"].get<double>();
      m.final_loss = rec["loss"].get<double>();
    }
    if (rec.contains("nonfinite_steps") && rec["nonfinite_steps"].is_number_integer())
      m.nonfinite_steps += rec["nonfinite_steps"].get<int64_t>();
    if (rec.contains("health_warnings") && rec["health_warnings"].is_array())
      for (const auto& w : rec["health_warnings"])
        if (w.is_string()) m.health_warnings.push_back(w.get<std::string>());
  }
  return m;
}

void write_report(const std::string& run_dir, const TrainConfig& cfg, const TrainSummary& segment,
                  const std::vector<RunSegment>& segments, const ReportFacts& facts) {
  const MetricsTotals m = read_metrics_totals(run_dir + "/metrics.jsonl");
  const int64_t first = segments.empty() ? segment.first_step : segments.front().first_step;
  const int ranks = segments.empty() ? 1 : segments.back().ranks;
  std::ostringstream r;
  r << "# perftrain run report\n\n"
    << "| | |\n|---|---|\n"
    << "| model | " << cfg.model.name << " (depth " << cfg.model.depth << ", hidden " << cfg.model.hidden
    << ", heads " << cfg.model.heads << ", patch " << cfg.model.patch << "), " << facts.params
    << " trainable parameters |\n"
    << "| input | " << cfg.model.in_channels << "x" << cfg.model.image_size << "x" << cfg.model.image_size << ", "
    << cfg.model.num_classes << " classes, learn_sigma " << (cfg.model.learn_sigma ? "on" : "off") << " |\n"
    << "| data | " << facts.data << " |\n"
    << "| objective | " << cfg.diffusion.objective << " |\n"
    << "| device | " << facts.device << " |\n"
    << "| precision | " << precision_text(facts.precision, facts.fp8) << " |\n"
    << "| step | " << segment.step_mode << " |\n"
    << "| speed settings | " << speed_settings(cfg) << " |\n"
    << "| torch | " << compat::torch_version() << " |\n"
    << "| steps | " << first << " to " << segment.last_step << ", batch " << cfg.optim.batch_size
    << (cfg.optim.accumulate > 1 ? " x " + std::to_string(cfg.optim.accumulate) + " micro-batches accumulated" : "")
    << (segment.stop_signal != 0 ? std::string(", stopped by ") + stop_signal_name(segment.stop_signal) : "") << "; "
    << segment.last_step - first + 1 << " steps in " << std::max<size_t>(segments.size(), 1)
    << (segments.size() > 1 ? " segments (below)" : " segment") << " |\n"
    << "| ranks | " << ranks_and_batch(ranks, cfg.optim.step_batch()) << " |\n"
    << "| loss | " << loss_range(m) << " |\n"
    << "| speed | " << run_speed(segments) << " |\n"
    << "| first step | " << segment.first_step_s << " s after start"
    << (segments.size() > 1 ? " (this segment)" : "") << " |\n"
    << "| peak memory | " << gib(peak_memory(segments)) << " |\n"
    << "| last checkpoint | " << newest(segments, &RunSegment::last_checkpoint) << " |\n"
    << "| last samples | " << newest(segments, &RunSegment::last_samples) << " |\n\n"
    << "Metrics per logging window are in metrics.jsonl; the resolved config is config.toml.\n"
    << segments_section(segments) << health_section(segment, segments, m);
  io::write_text_atomic(run_dir + "/report.md", r.str());
}

}  // namespace perftrain::train
