// A run's segments: its fresh start and each resume, from the first step
// each trained to the last, with what they ran on and how they ended. The
// trainer keeps them in segments.jsonl of the run directory (one JSON object
// a line, rewritten whole and atomically at each checkpoint and at the end),
// so that report.md describes the whole run, not only the latest process.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace perftrain::train {

struct RunSegment {
  int64_t first_step = 0, last_step = 0;
  int ranks = 0;                // processes; 0: not recorded (steps before segments.jsonl)
  int64_t batch_size = 0;       // the global batch of a step (train.batch_size x train.accumulate)
  double steps_per_s = 0;       // after its first step (0: it ran one step)
  double first_step_s = 0;      // process start to the end of its first step
  std::optional<double> peak_memory_gib;  // CUDA only
  std::string device, step_mode;
  // How it ended: "reached train.steps = N", "stopped by SIGTERM", ...;
  // "" in a record written at a checkpoint, for a process that wrote no
  // report after it.
  std::string end;
  std::string last_checkpoint, last_samples;
  std::string nonfinite_site;                    // where its first non-finite value came from
  std::vector<std::string> checkpoint_warnings;  // checkpoints refused for NaN/Inf weights

  bool recorded() const { return ranks > 0; }
  int64_t steps() const { return last_step - first_step + 1; }
  int64_t timed_steps() const { return last_step - first_step; }  // the first step is timed apart
};

// The segments a resume at `resume_step` continues: those of `path`
// (segments.jsonl; none when absent) that began at or before it, the last cut
// at it ("continued from step N" where steps past it are dropped), and, where
// they stop short of it, one unrecorded segment up to it.
std::vector<RunSegment> read_run_segments(const std::string& path, int64_t resume_step);
void write_run_segments(const std::string& path, const std::vector<RunSegment>& segments);

}  // namespace perftrain::train
