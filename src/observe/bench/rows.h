// The records a benchmark run produces: one BenchRow per (batch, variant)
// measured here, one TorchRow per (batch, mode) of the plain-PyTorch
// reference, and one SummaryRow per batch that sets our best against the best
// PyTorch mode. Numbers that could not be measured are empty optionals (null
// in JSON, "n/a" in text); a row that failed keeps its error message.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "observe/bench/gpu_sampler.h"

namespace perftrain::observe::bench {

struct BenchRow {
  std::string model;
  int64_t batch = 0;
  std::string variant, precision;
  bool fused_kernels = false, fused_optimizer = false, graph = false, recompute = false, gelu_recompute = false;
  bool weight_grad_stream = false;  // the backward's weight gradients ran on a second stream
  int64_t warmup = 0, steps = 0, repeats = 0;  // warm-up steps actually run, timed steps per repeat
  // Step time statistics over all timed steps of all repeats (ms).
  std::optional<double> ms, ms_p10, ms_p90, ms_min, ms_max, ms_mean;
  std::optional<double> ms_ci_low, ms_ci_high, ci_coverage;  // order-statistic interval of the median
  std::optional<double> rel_iqr, run_to_run;                 // spreads as fractions of the median
  std::vector<double> repeat_median_ms, step_ms;
  std::optional<double> images_per_s, tflops, mfu;
  std::optional<double> peak_gib, first_step_s, loss;
  // peak_gib split by phase: building, the first step and the warm-up (graph
  // capture included); the timed steps alone; what earlier rows of the same
  // process still held allocated when this one started (counted in both).
  std::optional<double> peak_gib_warmup, peak_gib_steady, held_gib_before;
  std::optional<double> build_s;  // of first_step_s: model and EMA built and on the device
  std::optional<double> speedup_vs_best_torch;  // best torch ms / this row's ms
  std::string graph_status;
  // The attention kernel each shape took (ops/attention_paths.h), one line per
  // (kernel, tokens, head dim, mask, dtype): the per-shape choice, as it ran.
  std::vector<std::string> attention;
  GpuSamples gpu;     // SM clock, power and temperature during the timed steps
  // Data parallel (bench --nproc-per-node N, or under torchrun): the step
  // of a rank among world_size, batch per rank. The ms statistics above and
  // images_per_s / tflops / mfu are rank 0's, per GPU; rank_ms every rank's
  // median; images_per_s_total world_size x batch at the slowest rank's
  // median. Against the same variant and batch timed in one process alone:
  // scaling_efficiency = its ms / this ms, exposed_comm_ms = this ms - its
  // ms (what the multi-process step costs beyond compute).
  bool data_parallel = false;
  int64_t world_size = 1;
  std::vector<double> rank_ms;
  std::optional<double> images_per_s_total, scaling_efficiency, exposed_comm_ms;
  std::string error;  // empty: the row ran
  bool ok() const { return error.empty(); }
};

struct TorchRow {
  std::string model;  // as the reference names it
  int64_t batch = 0;
  std::string mode;  // eager-fp32 | eager-bf16 | compile | reduce-overhead | max-autotune[-no-cudagraphs]
  // first_step_s counts from the reference's process start: with a compiled
  // mode its compilation, which the torch cache (--torch-cache) shortens.
  std::optional<double> ms, ms_p10, ms_p90, images_per_s, tflops, mfu, peak_gib, first_step_s;
  // A compiled mode's graphs found in the torch cache (hits) and compiled
  // (misses): torch_cache "warm" (all found), "cold" (none), "partial"; ""
  // for an eager mode (or a reference that does not say).
  std::string torch_cache;
  std::optional<int64_t> torch_cache_hits, torch_cache_misses;
  std::string torch_version, device, log_path;
  // DistributedDataParallel over world_size ranks (the rates rank 0's, per
  // GPU; images_per_s_total all ranks' at the slowest rank's median).
  int64_t world_size = 1;
  std::optional<double> images_per_s_total;
  std::string error;
  bool ok() const { return error.empty(); }
};

struct SummaryRow {
  std::string model;
  int64_t batch = 0;
  std::string variant;  // ours: "all" when it ran, else the fastest that did
  std::optional<double> ms, images_per_s, tflops, mfu, peak_gib, first_step_s;
  std::string graph_status;
  std::string best_torch_mode;  // empty: no torch row ran; else the fastest of every mode measured
  std::optional<double> best_torch_ms, best_torch_peak_gib, best_torch_first_step_s;
  std::string best_torch_cache;  // its TorchRow::torch_cache
  std::optional<double> speedup_vs_best_torch;  // best_torch_ms / ms
  std::string error;  // "no variant ran" when none did
};

// Fills the step time statistics of a row (ms, its quantiles, the median's
// interval, the spreads) from every timed step of every repeat, and
// run_to_run from row.repeat_median_ms.
void fill_timing(BenchRow& row, const std::vector<double>& all_ms);

// Fills images_per_s, tflops and mfu of a row from its ms: train_flops is the
// step's FLOPs (3 x forward x batch), peak_tflops the measured matrix peak.
void fill_rates(BenchRow& row, double train_flops, std::optional<double> peak_tflops);
void fill_rates(TorchRow& row, std::optional<double> peak_tflops);  // mfu from its own tflops

// One SummaryRow per batch (in the order batches first appear in `rows`), and
// speedup_vs_best_torch on every row of ours that ran. Torch rows count for
// the batch of the same number.
std::vector<SummaryRow> summarize_batches(std::vector<BenchRow>& rows, const std::vector<TorchRow>& torch);

}  // namespace perftrain::observe::bench
