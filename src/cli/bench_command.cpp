// perftrain bench: parses the options into train::bench::BenchOptions and
// runs the bench (train/bench/bench_driver.h); with --nproc-per-node N it
// starts N ranks of itself instead (cli/launcher.h), once every option is
// checked.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>
#include <memory>

#include "base/build_info.h"
#include "cli/command.h"
#include "cli/launcher.h"
#include "cli/option_checks.h"
#include "cli/step_options.h"
#include "train/bench/bench_driver.h"

namespace perftrain::cli {
namespace {

// The longest --cooldown, in seconds.
constexpr double kMaxCooldownS = 3600;

void run(train::bench::BenchOptions o, int nproc) {
  const bool given_out = !o.step.out.empty();
  o.step.out = out_dir_or_default(o.step, "bench");
  const train::bench::BenchPlan plan = train::bench::plan_bench(o);  // usage errors once, before any rank starts
  if (nproc > 0) {
    refuse_nproc_under_launcher();
    auto args = arguments_without_nproc();
    if (!given_out) args.insert(args.end(), {"--out", o.step.out});  // one folder for every rank
    std::cout.flush();
    std::exit(launch_ranks(nproc, args));
  }
  train::bench::run_bench(plan);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "time training-step variants side by side (and against plain PyTorch)");
  auto o = std::make_shared<train::bench::BenchOptions>();
  o->step.batch_sizes = "32,256";
  add_step_options(cmd, o->step, "bench");
  cmd->add_option("--variants", o->variants,
                  "eager-fp32, eager-bf16, fused, graph, all, comma-separated (default: all five on a GPU, "
                  "eager-fp32 on the CPU)");
  cmd->add_option("--steps", o->timing.steps, "timed steps per repeat")->check(integer_in(1, 100000));
  cmd->add_option("--warmup", o->timing.warmup, "untimed steps first (graph variants: at least capture + 1)")
      ->check(integer_in(0, 100000));
  cmd->add_option("--repeats", o->timing.repeats, "timed windows per variant (run-to-run spread)")
      ->check(integer_in(1, 1000));
  auto* against_torch = cmd->add_flag("--against-torch", o->against_torch,
                "also time bench/reference_dit.py or, for SS-* models, bench/reference_single_stream.py (plain "
                "PyTorch)");
  cmd->add_option("--torch-modes", o->torch_modes,
                  "eager-fp32, eager-bf16, compile, reduce-overhead, max-autotune, max-autotune-no-cudagraphs, "
                  "float8-tensorwise, float8-rowwise (torchao), and each compiled mode as <mode>-regional (each "
                  "block compiled alone, one graph shared by the blocks: a cold compile that does not grow with "
                  "the depth), comma-separated; the ratio "
                  "is to the fastest (default: eager-bf16,compile,reduce-overhead on a GPU, eager-fp32 on the CPU)")
      ->needs(against_torch);  // alone it would do nothing
  cmd->add_option("--torch-cache", o->torch_cache,
                  "folder for torch.compile's caches (Inductor's and Triton's), kept between calls so that a "
                  "second call times the steady state; each torch row says whether its cache was warm "
                  "(default: $XDG_CACHE_HOME/perftrain/inductor, else ~/.cache/perftrain/inductor)")
      ->needs(against_torch);
  cmd->add_option("--python", o->python,
                  "the Python with torch that runs the reference (default: the one the build was configured "
                  "with, " + base::build_python() + ")")
      ->needs(against_torch);
  cmd->add_flag("--recompute", o->recompute,
                "recompute block activations in backward (all variants; speed.recompute)");
  cmd->add_flag("--gelu-recompute", o->gelu_recompute,
                "keep only the MLPs' pre-activations, GELU again in backward (all variants; speed.gelu_recompute)");
  cmd->add_flag("--ema", o->timing.ema,
                "also update an EMA of the weights (decay 0.9999) every step, in every variant and in the torch "
                "reference (default: the anchors' step, AdamW only)");
  cmd->add_option("--cooldown", o->cooldown_s,
                  "seconds of idle GPU (at most 3600) before each variant and each torch run, so that every timed "
                  "window starts from a GPU at rest (power-bound steps run at higher clocks on a cooler GPU); "
                  "default 0: back to back")
      ->check(finite_in(0, kMaxCooldownS));
  cmd->add_option("--profile", o->timing.profile,
                  "after timing this variant (e.g. all), record 5 steps with the PyTorch profiler: kernel time by "
                  "kind and the top kernels (profile-b<batch>-<variant>.md) and a Chrome trace");
  auto nproc = std::make_shared<int>(0);
  cmd->add_option("--nproc-per-node", *nproc,
                  "data parallel: start this many ranks on this host (one per GPU) and time the trainer's "
                  "multi-process step, batch per rank, beside each variant run by one process alone; with "
                  "--against-torch the reference under DistributedDataParallel (docs/guide/multi-gpu.md). "
                  "Under torchrun leave it out: each process is a rank; 0: this process alone")
      ->check(CLI::Range(0, 1024).description(""))
      ->default_str("0");
  cmd->callback([o, nproc] { run(*o, *nproc); });
}

}  // namespace perftrain::cli
