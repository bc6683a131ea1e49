// The Trainer's outputs between steps (checkpoints, sample grids, evaluations,
// weight histograms, plots), kept out of the measured speed, and its finish: the
// segment's numbers, segments.jsonl and report.md (trainer.h).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/scope.h"
#include "base/text.h"
#include "compat/compat.h"
#include "distributed/group.h"
#include "observe/plot/svg_plot.h"
#include "observe/log/logger.h"
#include "observe/tensorboard/event_writer.h"
#include "observe/tensorboard/health_events.h"
#include "train/nan_locator.h"
#include "train/progress.h"
#include "train/report.h"
#include "train/run_directory.h"
#include "train/run_loggers.h"
#include "train/run_profiler.h"
#include "train/trainer.h"
#include "train/eval/evaluation.h"

namespace perftrain::train {

// Stopped by a signal: a checkpoint and the report, no samples (a
// preemption's grace period is short).
void Trainer::outputs_after_step(int64_t step, int stop) {
  const bool last = step == cfg_.optim.steps;
  const auto every = [&](int64_t n) { return n > 0 && step % n == 0; };
  pause_start_ = Clock::now();
  if (!stop && (last || every(cfg_.log.sample_every))) write_samples();
  if (!stop && evaluator_ && (last || every(cfg_.eval.every))) write_eval();
  if (last || stop || every(cfg_.log.checkpoint_every)) save();
  if (loggers_ && loggers_->takes_histograms() && (last || every(cfg_.log.histogram_every))) write_histograms(last);
  if (profiler_) profiler_->end_step(step - summary_.first_step);  // a window's trace is written here
  const auto paused = Clock::now() - pause_start_;  // keep samples and checkpoints out of the speed
  window_start_ += paused;
  loop_start_ += paused;
}

// Never a checkpoint from non-finite weights (the guard keeps them finite;
// this is the last line of defence).
void Trainer::save() {
  // distributed.shard_optimizer: gathering the state is a collective (the whole state on rank 0).
  const io::NamedTensors optimizer_state = runner_->optimizer_state();
  if (!run_) return;  // data parallel: rank 0 saves
  PERFTRAIN_SCOPE("checkpoint");
  for (const nn::Module* m : {static_cast<const nn::Module*>(built_.model.get()),
                              static_cast<const nn::Module*>(built_.ema.get())}) {
    const std::string bad = first_nonfinite_tensor(*m);
    if (bad.empty()) continue;
    const std::string msg = "no checkpoint at step " + std::to_string(state_.step) + ": " +
                            (m == built_.model.get() ? "" : "EMA ") + bad + " holds NaN/Inf";
    warn(msg);
    checkpoint_warnings_.push_back(msg);
    return;
  }
  summary_.last_checkpoint = save_checkpoint(run_->ckpt_dir(), cfg_, state_, *built_.model, *built_.ema,
                                             optimizer_state, gen_, cfg_.log.keep_checkpoints);
  run_->keep();
  record_segment("");  // a process that ends without a report leaves this record
  write_plots();
}

void Trainer::write_samples() {
  if (!run_) return;  // data parallel: rank 0 samples
  PERFTRAIN_SCOPE("sampling");
  char name[64];
  std::snprintf(name, sizeof name, "/step_%08lld.png", static_cast<long long>(state_.step));
  summary_.last_samples = run_->samples_dir() + name;
  write_sample_grid(summary_.last_samples, *built_.ema, cfg_, sample_opts_, device_);
  loggers_->image("samples", state_.step, summary_.last_samples);
}

// eval.every: the EMA weights' sample quality, between steps as the sample
// grids are (the captured step is not touched): a metrics.jsonl record
// {"step", "eval": {metric: value}, "eval_s"} and the loggers' scalars eval/<metric>.
void Trainer::write_eval() {
  PERFTRAIN_SCOPE("eval");
  const auto start = Clock::now();
  const eval::Metrics metrics = evaluator_->run(*built_.ema, cfg_);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  nlohmann::json record = {{"step", state_.step}, {"eval_s", seconds}};
  for (const auto& [name, value] : metrics) record["eval"][name] = value;
  log_record(record);
  loggers_->scalars(state_.step, record_scalars(record["eval"], "eval/"));
  loggers_->flush();
}

void Trainer::write_histograms(bool last) {
  loggers_->histograms(state_.step, observe::tensorboard::named_histograms("weights", built_.model->named_parameters()));
  // log.histogram_every = 0: the last monitored step's gradient histograms, at the end.
  if (last && cfg_.log.histogram_every == 0 && flow_sample_)
    loggers_->histograms(flow_sample_->step, observe::tensorboard::grad_health_histograms(*flow_sample_));
  loggers_->flush();
}

// loss.svg, gradient_flow.svg (and .png with a converter) in the run directory.
void Trainer::write_plots() {
  try {
    observe::plot::write_loss_curve(run_->file("metrics.jsonl"), run_->file("loss.svg"));
    if (flow_sample_) observe::plot::write_gradient_flow(*flow_sample_, run_->file("gradient_flow.svg"));
  } catch (const std::exception& e) {
    log_ << "warning: no plot: " << e.what() << "\n";
  }
}

TrainSummary Trainer::finish() {
  progress_->finish();
  if (profiler_) profiler_->finish();
  compat::synchronize(device_);
  summary_.last_step = state_.step;
  const double loop_s = std::chrono::duration<double>(Clock::now() - loop_start_).count();
  summary_.steps_per_s =
      summary_.last_step > summary_.first_step ? (summary_.last_step - summary_.first_step) / loop_s : 0;
  if (device_.is_cuda()) summary_.peak_memory_gib = compat::peak_memory_bytes(device_) / double(1 << 30);
  summary_.step_mode = runner_->graph_status();
  write_report(summary_.stop_signal != 0 ? std::string("stopped by ") + stop_signal_name(summary_.stop_signal)
                                         : "reached train.steps = " + std::to_string(cfg_.optim.steps));
  if (loggers_) loggers_->close(summary_.stop_signal != 0 ? observe::log::RunEnd::stopped : observe::log::RunEnd::finished);
  if (group_) group_->barrier();  // rank 0's last checkpoint is written when any rank returns
  return summary_;
}

// This process's segment so far. Its speed: finish()'s measure, or up to
// this step's pause (a checkpoint) or now (a stop at a non-finite step).
RunSegment Trainer::this_segment(const std::string& end) const {
  RunSegment s;
  s.first_step = summary_.first_step;
  s.last_step = state_.step;
  s.ranks = launch_.world_size;
  s.batch_size = cfg_.optim.step_batch();
  s.steps_per_s = summary_.steps_per_s;
  if (s.steps_per_s == 0 && s.timed_steps() > 0) {
    const Clock::time_point until = end.empty() ? pause_start_ : Clock::now();
    s.steps_per_s = s.timed_steps() / std::chrono::duration<double>(until - loop_start_).count();
  }
  s.first_step_s = summary_.first_step_s;
  s.peak_memory_gib = summary_.peak_memory_gib;
  s.device = compat::device_description(device_);
  s.step_mode = runner_->graph_status();
  s.end = end;
  s.last_checkpoint = summary_.last_checkpoint;
  s.last_samples = summary_.last_samples;
  s.nonfinite_site = summary_.nonfinite_site;
  s.checkpoint_warnings = checkpoint_warnings_;
  return s;
}

// segments.jsonl: the earlier segments and this one, ending `end`.
std::vector<RunSegment> Trainer::record_segment(const std::string& end) {
  std::vector<RunSegment> segments = earlier_segments_;
  segments.push_back(this_segment(end));
  write_run_segments(run_->file("segments.jsonl"), segments);
  return segments;
}

// segments.jsonl and report.md of the whole run (rank 0's; data parallel,
// the other ranks write nothing).
void Trainer::write_report(const std::string& end) {
  if (!run_) return;
  reported_ = true;
  const std::vector<RunSegment> segments = record_segment(end);
  const ReportFacts facts{compat::device_description(device_), precision_, dataset_->describe(),
                          built_.model->parameter_count(true), runner_->fp8_note()};
  train::write_report(run_->path(), cfg_, summary_, segments, facts);
}

// A run that fails once it has logged a metrics line stays: its report says
// why it ended (unless it already did, as a non-finite stop does). Best
// effort: the error itself is what the user is shown.
void Trainer::report_failure(const std::exception& e) {
  if (!run_ || !run_->logged() || reported_) return;
  std::string why = compat::error_message(e);
  why = base::printable(why.substr(0, why.find('\n')).substr(0, 300));
  std::replace(why.begin(), why.end(), '|', '/');  // a cell of the report's table
  try {
    progress_->finish();
    summary_.last_step = state_.step;
    summary_.step_mode = runner_->graph_status();
    write_report("failed after step " + std::to_string(state_.step) + ": " + why);
  } catch (const std::exception&) {
  }
}

}  // namespace perftrain::train
