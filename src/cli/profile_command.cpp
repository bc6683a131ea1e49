// perftrain profile: parses the options into train::profile::ProfileOptions
// and profiles the step (train/profile/profile_driver.h).
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/command.h"
#include "cli/option_checks.h"
#include "cli/step_options.h"
#include "train/profile/profile_driver.h"

namespace perftrain::cli {
namespace {

void run(train::profile::ProfileOptions o) {
  o.step.out = out_dir_or_default(o.step, "profile");
  train::profile::run_profile(train::profile::plan_profile(o));
}

}  // namespace

void add_profile_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("profile", "profile a training step: breakdown, top kernels or ops, diagnosis, "
                                            "Chrome/Perfetto traces (docs/guide/profiling.md)");
  auto o = std::make_shared<train::profile::ProfileOptions>();
  add_step_options(cmd, o->step, "profile");
  cmd->add_option("--variant", o->variant, "eager-fp32 | eager-bf16 | fused | graph | all (perftrain bench's)");
  cmd->add_option("--graph", o->graph, "on | off: capture the step in a CUDA graph (over the variant)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--fused", o->fused, "on | off: fused kernels and the device optimizer (over the variant)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--schedule", o->schedule,
                  "which steps to record, as torch.profiler.schedule: skip_first, wait, warmup, active, repeat "
                  "(repeat at least 1; at most 1000 steps in all)");
  cmd->add_flag("--profile-uncaptured", o->uncaptured,
                "when the step is captured (one graph launch), also profile the same step eagerly: the same "
                "kernels, split into forward, backward and optimizer");
  cmd->add_option("--top", o->top, "rows of the op table")->check(integer_in(1, 100000));
  cmd->add_option("--group-by", o->group_by,
                  "kernel | op | scope: the op table's rows (kernel: CUDA runs only; on the CPU use op or scope)");
  cmd->add_option("--timed-steps", o->timed_steps, "steps timed without the profiler first")
      ->check(integer_in(1, 10000));
  cmd->add_flag("--record-shapes", o->record_shapes, "record each op's input shapes and dtypes");
  cmd->add_flag("--profile-memory", o->profile_memory, "record allocator events: peak memory per phase");
  cmd->add_flag("--with-stack", o->with_stack, "record call stacks (and C++ stacks in the memory snapshot)");
  cmd->add_flag("--gzip", o->gzip, "write the traces as .json.gz");
  cmd->add_flag("--profile-scopes-only", o->scopes_only,
                "record the perftrain scopes, not each ATen op (and no per-op CUPTI correlation): less profiler "
                "cost in eager steps; --group-by op is then empty");
  cmd->add_flag("--memory-snapshot", o->memory_snapshot,
                "record allocations during the profiled steps and write memory_snapshot.pickle "
                "(pytorch.org/memory_viz opens it; CUDA runs only)");
  cmd->add_option("--slow-data-ms", o->slow_data_ms,
                  "make the synthetic loader take this long per batch, at most 10000 (to see a data-bound step)")
      ->check(finite_in(0, train::profile::kMaxSlowDataMs));
  cmd->callback([o] { run(*o); });
}

}  // namespace perftrain::cli
