// perftrain profile: where one training step's time goes, and why. Builds the
// step `perftrain train` runs (model, batch, variant, [speed] keys), times it
// without the profiler, then records windows of it with the step-window
// profiler (observe/profile): the breakdown, the top kernels or ops and the
// diagnosis, printed and written with the traces into the output directory.
// On the CPU nothing asks anything of CUDA: the profiler records CPU
// activity only, and the op table's shares are of CPU time.
//
//   const ProfilePlan plan = plan_profile(options);  // every usage error, nothing run or written
//   run_profile(plan);
#pragma once

#include <string>

#include "observe/bench/variants.h"
#include "observe/profile/schedule.h"
#include "observe/profile/timeline.h"
#include "train/bench/step_setup.h"
#include "train/config.h"

namespace perftrain::train::profile {

// The most steps `perftrain profile` runs under its schedule (longer runs
// are profiled with train --profile); the longest --slow-data-ms.
constexpr int64_t kMaxScheduleSteps = 1000;
constexpr double kMaxSlowDataMs = 10000;

struct ProfileOptions {
  bench::StepSetup step;           // one batch size
  std::string variant = "all";     // one of bench's variants
  std::string graph, fused;        // on | off over the variant ("": the variant's)
  std::string schedule = "wait=1,warmup=1,active=3,repeat=1";
  std::string group_by = "kernel";
  int64_t top = 15, timed_steps = 20;
  bool uncaptured = false, record_shapes = false, profile_memory = false, with_stack = false, gzip = false;
  bool memory_snapshot = false, scopes_only = false;
  double slow_data_ms = 0;         // the synthetic loader's time per batch
};

struct ProfilePlan {
  ProfileOptions options;
  bool cuda = false;
  observe::bench::Variant variant;
  observe::profile::Schedule schedule;
  observe::profile::GroupBy group_by = observe::profile::GroupBy::kKernel;
  TrainConfig config;  // the step: the anchors' with the variant, --graph / --fused, then --set
};

// Resolves and checks everything (UsageError naming the option): the device,
// the group-by, the schedule (a finite count of at most kMaxScheduleSteps
// steps), the batch size (its memory estimate against the device), the
// variant, the config, --slow-data-ms, and that options.step.out holds no
// profile.md yet. Runs and writes nothing.
ProfilePlan plan_profile(const ProfileOptions& options);

// Profiles the step (and with --profile-uncaptured, a captured step again
// eagerly) and writes profile.md beside the traces.
void run_profile(const ProfilePlan& plan);

}  // namespace perftrain::train::profile
