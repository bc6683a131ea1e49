// The same training step in plain PyTorch (bench/reference_dit.py bench, or
// bench/reference_single_stream.py bench for the single-stream family), run
// as a subprocess per (batch, mode) so that each mode starts from a fresh
// process as in the anchors, and so that torch.compile's caches, threads and
// memory never touch the process that measures perftrain.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "observe/bench/rows.h"

namespace perftrain::observe::bench {

struct TorchBenchRequest {
  std::string model;  // a registry name of ours, e.g. "DiT-S/2"
  std::string family = "dit";  // dit | single-stream | looped (models::DiTConfig::family)
  int64_t depth = 0, hidden = 0, heads = 0, patch = 0;  // its architecture
  // Single-stream: condition tokens (class tokens, or features of cond_dim
  // channels with synthetic lengths in [1, cond_tokens]).
  int64_t cond_tokens = 1, cond_dim = 0;
  int64_t image_size = 32, in_channels = 4, num_classes = 1000;
  double class_dropout = 0.1;
  int64_t batch = 0, steps = 30, warmup = 6;
  std::string mode = "eager-bf16";
  double ema_decay = 0;  // > 0: an EMA update after each optimizer step (--ema)
  std::string device = "cuda";  // cuda | cpu
  // > 0: DistributedDataParallel over this many processes on this host,
  // started by python -m torch.distributed.run (--batch per rank).
  int64_t nproc = 0;
  // Looped: the loop structure as the reference's flags ("--loops", "8");
  // an empty value passes the flag alone ("--lora-bias").
  std::vector<std::pair<std::string, std::string>> model_flags;
  // Not empty: torch.compile's caches live here, set in the child's
  // environment (TORCHINDUCTOR_CACHE_DIR, and TRITON_CACHE_DIR its triton/),
  // so that a later call finds what an earlier one compiled (--torch-cache).
  std::string cache_dir;
};

// The reference's --mode choices: eager-fp32, eager-bf16, and torch.compile's
// compile (its default mode), reduce-overhead, max-autotune,
// max-autotune-no-cudagraphs; float8-tensorwise and float8-rowwise (torchao's
// float8 training of the blocks' linears under compile's default mode: the
// anchor of train.precision = "fp8"); each compiled mode also as
// "<mode>-regional": torch.compile on each block alone (PyTorch's regional
// compilation; the blocks share one graph, so the cold compile does not grow
// with the depth).
std::vector<std::string> torch_mode_names();
// Throws UsageError naming an unknown mode (list as for split_list).
std::vector<std::string> parse_torch_modes(const std::string& list);

// Python to run it with: build_python (the build's, base/build_info.h) when
// it is an executable file, else <source_dir>/.venv/bin/python when it
// exists, else "python3".
std::string reference_python(const std::string& build_python, const std::string& source_dir);
// A --python the user gave: a path to an executable file, or a name found
// on PATH. UsageError naming --python otherwise.
void check_python(const std::string& python);

// --torch-cache's default: $XDG_CACHE_HOME/perftrain/inductor, else
// $HOME/.cache/perftrain/inductor; "" when neither is set (torch's own
// default then). getenv: a function for the tests.
std::string default_torch_cache_dir(const std::function<const char*(const char*)>& getenv);
std::string default_torch_cache_dir();
// A directory, or a path one can be made at (its nearest existing folder
// writable). UsageError naming --torch-cache otherwise.
void check_torch_cache_dir(const std::string& dir);
// Files under dir, at any depth (0 for a missing or unreadable one): how
// warm the cache is.
int64_t count_files(const std::string& dir);
// <source_dir>/bench/reference_dit.py, or reference_single_stream.py for
// family "single-stream", reference_looped.py for "looped".
std::string reference_script(const std::string& source_dir, const std::string& family = "dit");
// The file name alone ("reference_looped.py").
std::string reference_script_name(const std::string& family);

// The command line (shell words quoted). With cache_dir: under env with
// TORCHINDUCTOR_CACHE_DIR=<cache_dir> TRITON_CACHE_DIR=<cache_dir>/triton.
// With nproc: python -m
// torch.distributed.run --standalone --nproc-per-node N <script> bench ...
// --ddp, without this process's own launch variables (RANK, MASTER_PORT,
// ...: under torchrun they name perftrain's group, not the reference's). DiT-S/B/L/XL names go as they are;
// any other model (DiT-T) goes as a registry name with explicit --depth /
// --hidden / --heads / --patch, which the reference accepts. A single-stream
// model always goes with its explicit architecture (so a --set
// model.depth=... reaches the reference) and --cond-tokens / --cond-dim.
std::string torch_bench_command(const std::string& python, const std::string& script, const TorchBenchRequest& r);

// Parses the reference's `--json` output (the last line of stdout that is a
// JSON object: model, batch, mode, ms_median, ms_p10, ms_p90, images_per_s,
// tflops, peak_gib, first_step_s, torch, device, and for a compiled mode
// torch_cache, torch_cache_hits, torch_cache_misses). Output with no such line,
// or a line that does not parse, gives a row whose error says so.
TorchRow parse_torch_bench_output(const std::string& stdout_text, const TorchBenchRequest& r);

// Runs it; stderr goes to log_path. A failed run becomes a row with its error
// (the exit status and the last line of the log).
TorchRow run_torch_bench(const std::string& python, const std::string& script, const TorchBenchRequest& r,
                         const std::string& log_path);

}  // namespace perftrain::observe::bench
