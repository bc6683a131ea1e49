// The training loop: data from a background loader, the diffusion objective
// on a DiT (bf16 autocast on CUDA, fp32 on CPU), AdamW, optional gradient
// clipping and LR warm-up, the EMA, then metrics, sample grids and
// checkpoints into the run directory. A resumed run continues exactly: on the
// CPU, N steps then N resumed steps give bit-identical weights to 2N steps.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>
#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "distributed/launch_env.h"
#include "models/diffusion_model.h"
#include "observe/grad_health.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/run_segments.h"
#include "train/sampling.h"
#include "train/signals.h"
#include "train/step_runner.h"

namespace perftrain::distributed {
class Group;
}
namespace perftrain::data {
class BatchLoader;
}
namespace perftrain::observe::log {
class Loggers;
class WandbLogger;
}

namespace perftrain::train {

class Progress;
class RunDirectory;
namespace eval {
class Evaluator;
}
class RunProfiler;

struct TrainOptions {
  std::string resume;  // run dir, ckpt dir or step dir; empty: fresh run
  // A fresh run's weights (train/init_from.h): a .pt, a safetensors file or
  // a run directory; empty: the model's initialisation.
  std::string init_from;
  std::chrono::steady_clock::time_point process_start = std::chrono::steady_clock::now();
  bool interactive = false;  // redraw the progress line in place
  // A first SIGINT/SIGTERM ends the run after its current step with a
  // checkpoint and the report (summary.stop_signal says which); a second
  // exits at once (train/signals.h). false: the signals keep their defaults.
  bool save_on_signal = true;
  // --profile: a profiler schedule ("wait=1,warmup=1,active=2,repeat=1",
  // observe/profile/schedule.h) over this run's steps; empty: none.
  std::string profile;
  bool profile_scopes_only = false;  // --profile-scopes-only: the perftrain scopes, not each ATen op
};

// What one run_training call (a segment of the run: the fresh start or one
// resume) did; report.md describes the whole run.
struct TrainSummary {
  std::string run_dir;
  std::string last_checkpoint;
  std::string last_samples;
  int64_t first_step = 0, last_step = 0;
  double final_loss = 0;     // mean loss over the last logging window
  double first_loss = 0;     // mean loss over the first logging window
  double steps_per_s = 0;    // after the first step
  double first_step_s = 0;   // process start to the end of the first step
  std::optional<double> peak_memory_gib;  // CUDA only
  std::string step_mode;     // how the step ran: "captured at step 4" (CUDA graph) or "eager: <why>"
  int stop_signal = 0;       // SIGINT / SIGTERM that stopped the run before train.steps; 0: it ran to the end
  // Training health (docs/guide/health.md): how gradients were monitored,
  // the detectors' warnings, steps skipped for a non-finite loss or gradient
  // and where the first one came from.
  std::string health_monitor;
  std::vector<std::string> health_warnings;
  int64_t nonfinite_steps = 0;
  std::string nonfinite_site;
};

// Sets up a Trainer for cfg and runs it (the one entry point).
TrainSummary run_training(const TrainConfig& cfg, const TrainOptions& opts, std::ostream& log);

// The trainer's parts, in the order a run goes through them:
//  - set-up (trainer_setup.cpp): the config checked, device and precision,
//    the memory check, the stop signals, the data-parallel group, the
//    dataset, the run directory and its lock, the model and its EMA, the
//    step runner, the resume from a checkpoint, then the run's outputs
//    opened and what runs on what logged;
//  - the step loop (trainer.cpp): a batch, one step, the stop signal agreed
//    by every rank, the first step timed apart;
//  - one logging window (log_window.cpp): the window's means read back (the
//    one host sync), non-finite steps and health warnings, the metrics.jsonl
//    record and its TensorBoard scalars, the progress line;
//  - outputs between steps (trainer_outputs.cpp): checkpoint, samples,
//    histograms and plots, kept out of the measured speed;
//  - finish and report (trainer_outputs.cpp): the segment's numbers,
//    segments.jsonl and report.md of the whole run.
class Trainer {
 public:
  Trainer(const TrainConfig& cfg, const TrainOptions& opts, std::ostream& log);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Steps until train.steps or a stop signal, then finishes; once.
  TrainSummary run();

 private:
  using Clock = std::chrono::steady_clock;

  // Set-up.
  void check_config();
  void choose_device();
  // Whether sampling autocasts to bf16: on CUDA, unless the run is fp32
  // (an fp8 run samples in bf16; the CPU samples in fp32).
  bool samples_in_bf16() const { return device_.is_cuda() && precision_ != "fp32"; }
  void check_memory() const;
  void check_loggers();
  void open_dataset();
  void open_image_decoder();
  void open_evaluator();
  void open_run_directory();
  void build_model_and_runner();
  void resume();
  void start_outputs();
  void log_start() const;
  void start_loop();

  // The step loop.
  int train_step(int64_t step);  // the stop signal (0: none) after it
  void note_step_mode();
  void first_step_done();
  bool window_due(int64_t step, int stop) const;

  // One logging window.
  void log_window(int64_t step);
  WindowStats take_window();
  void note_nonfinite(const WindowStats& w, int64_t step, int64_t runner_offset, std::vector<std::string>& warnings);
  [[noreturn]] void stop_on_nonfinite(const WindowStats& w, int64_t step, int64_t first_bad,
                                      const std::vector<std::string>& warnings);
  std::optional<observe::GradHealthSample> take_grad_health(int64_t runner_offset, std::vector<std::string>& warnings);
  nlohmann::json window_record(const WindowStats& w, int64_t step, double steps_per_s,
                               const std::optional<observe::GradHealthSample>& grad_health,
                               const std::vector<std::string>& warnings) const;
  void write_scalars(const nlohmann::json& record, int64_t step);
  void log_record(const nlohmann::json& record);
  void warn(const std::string& message, std::vector<std::string>* window_warnings = nullptr);

  // Outputs between steps.
  void outputs_after_step(int64_t step, int stop);
  void save();
  void write_samples();
  void write_eval();
  void write_histograms(bool last);
  void write_plots();

  // Finish and report.
  TrainSummary finish();
  RunSegment this_segment(const std::string& end) const;
  std::vector<RunSegment> record_segment(const std::string& end);
  void write_report(const std::string& end);
  void report_failure(const std::exception& e);

  // Declared in the order they are made, so destroyed in reverse: the loader
  // before the dataset, the runner before the group, the run directory
  // (which removes a fresh run that kept no checkpoint) after all that
  // writes into it.
  TrainConfig cfg_;
  TrainOptions opts_;
  std::ostream& log_;
  distributed::LaunchEnv launch_;
  at::Device device_{at::kCPU};
  std::string precision_;
  std::optional<StopSignals> stop_signals_;
  // log.wandb: the sidecar, started at set-up; start_outputs hands it to loggers_.
  std::unique_ptr<observe::log::WandbLogger> wandb_;
  std::unique_ptr<distributed::Group> group_;
  std::unique_ptr<data::Dataset> dataset_;
  ImageDecoder image_decoder_;                  // eval.vae's decoder, rank 0: sample grids and eval.every
  std::unique_ptr<eval::Evaluator> evaluator_;  // eval.every > 0, rank 0
  std::string run_path_, resume_dir_;
  std::unique_ptr<RunDirectory> run_;  // rank 0's; null on the other ranks
  models::DiffusionModelAndEma built_;
  at::Generator gen_;
  std::unique_ptr<StepRunner> runner_;
  TrainerState state_;
  std::vector<RunSegment> earlier_segments_;  // the run's segments before this one
  // The run's loggers (train/run_loggers.h): metrics.jsonl, TensorBoard,
  // MLflow, W&B; rank 0's, null on the other ranks.
  std::unique_ptr<observe::log::Loggers> loggers_;
  std::unique_ptr<data::BatchLoader> loader_;
  std::unique_ptr<Progress> progress_;
  SampleOptions sample_opts_;
  TrainSummary summary_;
  std::vector<std::string> checkpoint_warnings_;  // the warnings metrics.jsonl does not hold
  std::unique_ptr<RunProfiler> profiler_;
  observe::HealthDetectors detectors_;
  std::optional<observe::GradHealthSample> flow_sample_;  // the latest monitored step, for gradient_flow.svg

  // Timing: samples and checkpoints are kept out of the measured speed.
  Clock::time_point window_start_, loop_start_, pause_start_;
  double wait_at_window_start_ = 0;
  std::string graph_status_;
  bool tuning_logged_ = false, monitor_noted_ = false, reported_ = false;
  int64_t grad_histograms_at_ = 0;  // the multiple of log.histogram_every whose gradient histograms were written
  int64_t locates_ = 0;             // eager re-runs for a non-finite step so far
};

}  // namespace perftrain::train
