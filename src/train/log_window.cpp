// One logging window of the Trainer (trainer.h): every log.every steps, at
// the last step and at a stop. The window's means come back in one host
// sync; non-finite steps are reported (and with health.nan_policy = stop end
// the run), the monitored steps' gradient statistics go through the
// detectors and to TensorBoard, and one metrics.jsonl record is written with
// its numbers as TensorBoard scalars.
#include <nlohmann/json.hpp>

#include <cmath>

#include "base/error.h"
#include "base/scope.h"
#include "compat/compat.h"
#include "data/batch_loader.h"
#include "distributed/group.h"
#include "observe/log/logger.h"
#include "observe/tensorboard/health_events.h"
#include "ops/cublaslt_workspace.h"
#include "train/progress.h"
#include "train/run_directory.h"
#include "train/run_loggers.h"
#include "train/trainer.h"

namespace perftrain::train {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// One line on how the matrix products' algorithms were chosen in the
// warm-up steps (nothing on the CPU, where none are tuned).
void log_gemm_tuning(std::ostream& log) {
  const auto records = ops::gemm_tune_records();
  if (records.empty()) return;
  size_t changed = 0;
  for (const auto& r : records) changed += r.chosen != 0;
  log << "matrix products: " << records.size() << " shapes tuned on first use, " << changed
      << " on a faster algorithm than cuBLASLt's first pick (speed.gemm_tune = 0: no tuning)\n";
}

nlohmann::json grad_stats_json(const observe::GradStats& g) {
  return nlohmann::json{{"norm", g.norm},           {"mean_abs", g.mean_abs}, {"max_abs", g.max_abs},
                        {"zero_share", g.zero_share}, {"nonfinite", g.nonfinite}, {"update_ratio", g.update_ratio()}};
}

// fp8's scaling: the overflow / underflow totals, and per linear its scales and counts.
nlohmann::json fp8_record(const std::vector<observe::Fp8LayerHealth>& layers) {
  double overflows = 0, underflows = 0;
  nlohmann::json per = nlohmann::json::object();
  for (const auto& f : layers) {
    overflows += f.overflows, underflows += f.underflows;
    per[f.name] = {{"scale_x", f.scale_x}, {"scale_w", f.scale_w}, {"scale_dy", f.scale_dy},
                   {"overflows", f.overflows}, {"underflows", f.underflows}};
  }
  return {{"overflows", overflows}, {"underflows", underflows}, {"layers", per}};
}

// grad_norm is the last step's, before clipping; NaN/Inf are written too
// (null in JSON), -1 means the step runner keeps none.
bool has_grad_norm(const WindowStats& w) { return !(w.grad_norm < 0); }

}  // namespace

void Trainer::log_window(int64_t step) {
  PERFTRAIN_SCOPE("log_window");
  const WindowStats w = take_window();
  const int64_t runner_offset = step - runner_->steps_done();  // runner step + this = run step (resumed runs)
  std::vector<std::string> warnings;
  if (w.nonfinite_steps > 0) note_nonfinite(w, step, runner_offset, warnings);
  const std::optional<observe::GradHealthSample> grad_health = take_grad_health(runner_offset, warnings);
  if (!std::isfinite(w.loss) && w.nonfinite_steps == 0)
    throw RuntimeError("loss became " + std::to_string(w.loss) + " in the steps up to " + std::to_string(step) +
                       "; lower train.lr or set train.grad_clip");
  const double steps_per_s = w.steps / seconds_since(window_start_);
  if (!tuning_logged_) log_gemm_tuning(log_);  // the warm-up steps after the first one tuned
  tuning_logged_ = true;
  if (summary_.first_loss == 0) summary_.first_loss = w.loss;
  summary_.final_loss = w.loss;
  const nlohmann::json record = window_record(w, step, steps_per_s, grad_health, warnings);
  log_record(record);
  write_scalars(record, step);
  if (grad_health) flow_sample_ = grad_health;
  progress_->report(step, w.loss, steps_per_s * cfg_.optim.step_batch(), steps_per_s);
  window_start_ = Clock::now();
  wait_at_window_start_ = loader_->wait_seconds();
}

// The window's means: the one host sync per window; data parallel, the
// ranks' means (each rank's loss is over its slice).
WindowStats Trainer::take_window() {
  WindowStats w = runner_->take_window();
  if (group_) {
    const auto sums = group_->allreduce_sum({w.loss, w.mse, w.vb, w.aux});
    const double n = launch_.world_size;
    w.loss = sums[0] / n, w.mse = sums[1] / n, w.vb = sums[2] / n, w.aux = sums[3] / n;
  }
  return w;
}

void Trainer::warn(const std::string& message, std::vector<std::string>* window_warnings) {
  log_ << "warning: " << message << "\n";
  if (window_warnings != nullptr) window_warnings->push_back(message);
  summary_.health_warnings.push_back(message);
}

// Steps of the window whose loss or gradient was NaN/Inf (their update was
// skipped): a warning, and an eager re-run that names where the first one
// came from (every time with nan_policy stop, which then ends the run; the
// first few times with skip).
void Trainer::note_nonfinite(const WindowStats& w, int64_t step, int64_t runner_offset,
                             std::vector<std::string>& warnings) {
  const int64_t first_bad = w.first_nonfinite_step + runner_offset;
  std::string msg = "step " + std::to_string(first_bad) + ": non-finite loss or gradients; " +
                    std::to_string(w.nonfinite_steps) + " step(s) up to step " + std::to_string(step) +
                    " skipped their update";
  if (w.first_nonfinite_step > 0 && (cfg_.health.nan_policy == "stop" || locates_ < 3)) {
    ++locates_;
    const NonFiniteSite site = runner_->locate_nonfinite(w.first_nonfinite_step);
    summary_.nonfinite_site = "step " + std::to_string(first_bad) + ": " + site.message();
    msg += "\n" + site.message();
  }
  summary_.nonfinite_steps += w.nonfinite_steps;
  warn(msg, &warnings);
  if (cfg_.health.nan_policy == "stop") stop_on_nonfinite(w, step, first_bad, warnings);
}

// health.nan_policy = stop: the window's line, the report, and the error.
void Trainer::stop_on_nonfinite(const WindowStats& w, int64_t step, int64_t first_bad,
                                const std::vector<std::string>& warnings) {
  if (run_) {
    nlohmann::json record = {{"step", step},
                             {"nonfinite_steps", w.nonfinite_steps},
                             {"first_nonfinite_step", first_bad},
                             {"health_warnings", warnings}};
    if (has_grad_norm(w)) record["grad_norm"] = w.grad_norm;
    log_record(record);
  }
  progress_->finish();
  summary_.last_step = step;
  summary_.step_mode = runner_->graph_status();
  write_report("stopped at a non-finite step (health.nan_policy = stop)");
  throw RuntimeError(warnings.back() + "\nstopped (health.nan_policy = stop): lower train.lr or set train.grad_clip; "
                                       "health.nan_policy = skip skips such steps and goes on");
}

// The window's monitored steps (their copies finished: take_window synced):
// TensorBoard scalars, gradient histograms next to the weight ones (the
// first monitored step at or after each multiple of log.histogram_every),
// the detectors. Returns the latest.
std::optional<observe::GradHealthSample> Trainer::take_grad_health(int64_t runner_offset,
                                                                   std::vector<std::string>& warnings) {
  std::optional<observe::GradHealthSample> latest;
  for (auto& sample : runner_->take_grad_health()) {
    sample.step += runner_offset;
    if (loggers_) loggers_->scalars(sample.step, observe::tensorboard::grad_health_scalars(sample));
    const int64_t every = cfg_.log.histogram_every;
    if (loggers_ && loggers_->takes_histograms() && every > 0 && sample.step / every * every > grad_histograms_at_) {
      loggers_->histograms(sample.step, observe::tensorboard::grad_health_histograms(sample));
      grad_histograms_at_ = sample.step / every * every;
    }
    for (const auto& h : detectors_.observe(sample)) warn(h.message, &warnings);
    latest = std::move(sample);
  }
  return latest;
}

// The window's metrics.jsonl record (docs/guide/health.md lists the keys).
nlohmann::json Trainer::window_record(const WindowStats& w, int64_t step, double steps_per_s,
                                      const std::optional<observe::GradHealthSample>& grad_health,
                                      const std::vector<std::string>& warnings) const {
  nlohmann::json rec = {{"step", step},
                        {"loss", w.loss},
                        {"mse", w.mse},
                        {"lr", w.lr},
                        {"images_per_s", steps_per_s * cfg_.optim.step_batch()},
                        {"steps_per_s", steps_per_s},
                        {"data_wait_s", loader_->wait_seconds() - wait_at_window_start_},
                        {"elapsed_s", seconds_since(loop_start_)},
                        {"epoch", state_.position.epoch}};
  if (cfg_.model.learn_sigma) rec["vb"] = w.vb;
  if (cfg_.model.routing()) rec["aux"] = w.aux;  // the routers' balancing loss, in loss
  if (has_grad_norm(w)) rec["grad_norm"] = w.grad_norm;
  if (grad_health) {  // compact: the global values, then per module
    rec["grad"] = grad_stats_json(grad_health->global);
    rec["grad"]["step"] = grad_health->step;
    nlohmann::json modules = nlohmann::json::object();
    for (const auto& m : grad_health->modules) modules[m.name] = grad_stats_json(m.stats);
    rec["grad_modules"] = modules;
    if (!grad_health->fp8.empty()) rec["fp8"] = fp8_record(grad_health->fp8);
  }
  if (w.nonfinite_steps > 0) rec["nonfinite_steps"] = w.nonfinite_steps;
  if (!warnings.empty()) rec["health_warnings"] = warnings;
  if (precision_ == "fp16") {
    rec["loss_scale"] = w.loss_scale;
    rec["skipped_steps"] = w.skipped_steps;
  }
  if (device_.is_cuda()) rec["peak_memory_gib"] = compat::peak_memory_bytes(device_) / double(1 << 30);
  return rec;
}

// Every number of the record as train/<key> at the window's step, to every
// logger that takes scalars; then they flush.
void Trainer::write_scalars(const nlohmann::json& record, int64_t step) {
  if (!loggers_) return;
  loggers_->scalars(step, record_scalars(record, "train/"));
  loggers_->flush();
}

// The record as a metrics.jsonl line (rank 0).
void Trainer::log_record(const nlohmann::json& record) {
  if (loggers_) loggers_->record(record);
}

}  // namespace perftrain::train
