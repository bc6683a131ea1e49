// perftrain bench: training-step variants side by side in this one process
// (each optimisation on and off), optionally against the same step in plain
// PyTorch (bench/reference_dit.py, or reference_single_stream.py for the
// single-stream family, in subprocesses), with medians, confidence
// intervals, MFU against the bf16 matrix peak measured here, peak memory and
// time to first step. Writes bench.json and bench.md into the output
// directory. Data parallel (one rank of torchrun's group, or of the ranks
// `bench --nproc-per-node N` starts): the trainer's multi-process step per
// rank, each (batch, variant) beside the same one timed by rank 0 alone;
// against torch's DistributedDataParallel.
//
//   const BenchPlan plan = plan_bench(options);  // every usage error, nothing run or written
//   run_bench(plan);
#pragma once

#include <string>
#include <vector>

#include "distributed/launch_env.h"
#include "observe/bench/variants.h"
#include "train/bench/measure_variant.h"
#include "train/bench/step_setup.h"
#include "train/config.h"

namespace perftrain::train::bench {

struct BenchOptions {
  StepSetup step;              // model, batch sizes, shape, precision, device, seed, --set, out
  std::string variants;        // "" : all five on a GPU, eager-fp32 on the CPU
  std::string torch_modes;     // "" : eager-bf16,compile,reduce-overhead on a GPU, eager-fp32 on the CPU
  std::string python;          // --python: "" the build's (observe/bench/torch_reference.h reference_python)
  std::string torch_cache;     // --torch-cache: "" observe::bench::default_torch_cache_dir()
  Timing timing;               // steps, warm-up, repeats, EMA, the variant to profile
  bool against_torch = false;
  bool recompute = false, gelu_recompute = false;  // speed.recompute, speed.gelu_recompute for all variants
  double cooldown_s = 0;       // the GPU idle this long before each variant and torch run
};

// What the options resolve to, checked.
struct BenchPlan {
  BenchOptions options;
  bool cuda = false;
  distributed::LaunchEnv launch;      // data parallel when launch.from_env
  std::vector<int64_t> batches;
  std::vector<observe::bench::Variant> variants;
  std::vector<std::string> torch_modes;
  std::string source_dir;  // the checkout: bench/'s scripts, the commit
  // With against_torch: the Python and the torch cache folder (checked) the
  // reference runs with.
  std::string torch_python, torch_cache_dir;
  TrainConfig base;            // the anchors' step with --recompute, --set; each variant sets its own switches
  bool lead() const { return launch.rank == 0; }  // prints, measures the one-process rows, writes the report
  bool data_parallel() const { return launch.from_env; }
};

// Resolves and checks everything (UsageError naming the option): the device,
// the batch sizes (each one's memory estimate against the device, for the
// leanest variant), the variants and torch modes, --python and
// --torch-cache, the config, and that options.step.out holds no bench.json
// yet. Runs and writes nothing.
BenchPlan plan_bench(const BenchOptions& options);

// Times every (batch, variant), then the torch reference, and writes the
// report. RuntimeError when no variant ran (the report is written).
void run_bench(const BenchPlan& plan);

}  // namespace perftrain::train::bench
