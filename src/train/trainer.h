// The training loop: data from a background loader, the diffusion objective
// on a DiT (bf16 autocast on CUDA, fp32 on CPU), AdamW, optional gradient
// clipping and LR warm-up, the EMA, then metrics, sample grids and
// checkpoints into the run directory. A resumed run continues exactly: on the
// CPU, N steps then N resumed steps give bit-identical weights to 2N steps.
#pragma once

#include <chrono>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "train/config.h"

namespace perftrain::train {

struct TrainOptions {
  std::string resume;  // run dir, ckpt dir or step dir; empty: fresh run
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

TrainSummary run_training(const TrainConfig& cfg, const TrainOptions& opts, std::ostream& log);

}  // namespace perftrain::train
