// The Trainer's step loop (trainer.h); set-up in trainer_setup.cpp, the
// logging window in log_window.cpp, outputs and the report in
// trainer_outputs.cpp.
#include "train/trainer.h"

#include "base/scope.h"
#include "data/batch_loader.h"
#include "distributed/group.h"
#include "train/run_profiler.h"

namespace perftrain::train {

TrainSummary run_training(const TrainConfig& cfg, const TrainOptions& opts, std::ostream& log) {
  Trainer trainer(cfg, opts, log);
  return trainer.run();
}

TrainSummary Trainer::run() {
  try {
    while (state_.step < cfg_.optim.steps) {
      const int64_t step = state_.step + 1;
      const int stop = train_step(step);  // then this step is the last
      if (step == summary_.first_step) first_step_done();
      if (group_ && step == summary_.first_step + 1) log_ << runner_->data_parallel_note() << "\n";  // after the observing step
      if (window_due(step, stop)) log_window(step);
      outputs_after_step(step, stop);
      if (stop) {
        summary_.stop_signal = stop;
        break;
      }
    }
  } catch (const std::exception& e) {
    report_failure(e);
    throw;
  }
  return finish();
}

// One step on the next batch: no host sync (the runner queues it), except
// the ranks agreeing on a stop signal (data parallel: a signal on any rank
// stops every rank after this step).
int Trainer::train_step(int64_t step) {
  if (profiler_) profiler_->begin_step(step - summary_.first_step);
  data::Batch batch;
  {
    PERFTRAIN_SCOPE("data_wait");
    batch = loader_->next();
  }
  runner_->step(batch);
  state_.step = step;
  state_.position = loader_->position();
  int stop = stop_signals_ ? stop_signals_->received() : 0;
  if (group_) stop = static_cast<int>(group_->allreduce_max(stop));
  note_step_mode();
  return stop;
}

// Says once how the step runs, and when that changes; the monitor's note once.
void Trainer::note_step_mode() {
  if (runner_->graph_status() != graph_status_) {
    graph_status_ = runner_->graph_status();
    if (graph_status_ != "eager: warming up") log_ << "step: " << graph_status_ << "\n";
  }
  if (!monitor_noted_ && !runner_->monitor_note().empty()) {
    monitor_noted_ = true;
    log_ << runner_->monitor_note() << "\n";
    summary_.health_monitor += "; " + runner_->monitor_note();
  }
}

// The first step is timed apart (one sync): the windows' speed starts after it.
void Trainer::first_step_done() {
  runner_->take_window();
  summary_.first_step_s = std::chrono::duration<double>(Clock::now() - opts_.process_start).count();
  loop_start_ = window_start_ = Clock::now();
  wait_at_window_start_ = loader_->wait_seconds();
  log_ << "first step done " << summary_.first_step_s << " s after start\n";
  if (!runner_->weight_grad_note().empty()) log_ << runner_->weight_grad_note() << "\n";
  if (!runner_->fp8_note().empty()) log_ << runner_->fp8_note() << "\n";
}

bool Trainer::window_due(int64_t step, int stop) const {
  return step > summary_.first_step && (step % cfg_.log.every == 0 || step == cfg_.optim.steps || stop);
}

}  // namespace perftrain::train
