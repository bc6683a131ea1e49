// The outputs of `perftrain bench`: the table printed on stdout, and in the
// run directory bench.json (everything, for tools and for docs/PERFORMANCE.md:
// its "summary" list is the rows the docs keep) and bench.md (the same for
// people: environment, method, results, ratios).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <utility>
#include <vector>

#include "observe/bench/environment.h"
#include "observe/bench/matmul_peak.h"
#include "observe/bench/rows.h"

namespace perftrain::observe::bench {

// What was benchmarked and how (the "config" of bench.json).
struct BenchSettings {
  std::string model;
  std::string family = "dit";  // dit | single-stream
  int64_t depth = 0, hidden = 0, heads = 0, patch = 0;
  int64_t image_size = 32, in_channels = 4, num_classes = 1000;
  // The condition: DiT a class label through adaLN (cond_tokens and cond_dim
  // 0); single-stream cond_tokens class tokens (cond_dim 0) or features of
  // cond_dim channels; condition says which in words.
  int64_t cond_tokens = 0, cond_dim = 0;
  std::string condition;
  int64_t image_tokens = 0, sequence_tokens = 0;  // per sample: image, and all through the blocks
  bool learn_sigma = false;
  double class_dropout = 0.1;
  std::string objective = "ddpm";
  int64_t parameters = 0;            // of the model, trainable
  double train_flops_per_image = 0;  // 3 x forward
  std::vector<int64_t> batches;
  std::vector<std::string> variants;
  std::string precision = "bf16";  // of the mixed-precision variants
  // The [speed] config every variant ran with, key and value as config.toml
  // writes them ("attention", "'whole_head'"); graph, fused_kernels and
  // fused_optimizer are each variant's own (its row says).
  std::vector<std::pair<std::string, std::string>> speed;
  int64_t steps = 30, warmup = 6, repeats = 1;
  std::string device;
  int64_t data_pool = 8;  // distinct batches reused round-robin
  std::string optimizer;  // "AdamW lr 1e-4, betas (0.9, 0.999), wd 0; EMA 0.9999"
  double cooldown_s = 0;  // idle GPU before each variant and torch run
  bool against_torch = false;
  std::vector<std::string> torch_modes;
  std::string torch_python;  // the interpreter used for them
  // Where torch.compile kept its caches (--torch-cache; "" torch's own
  // default) and how many files were there when the torch runs began.
  std::string torch_cache_dir;
  int64_t torch_cache_files = 0;
  // Data parallel: the ranks' group (0: one process, no group) and its
  // backend for the gradients (nccl | gloo).
  int64_t world_size = 0;
  std::string dist_backend;
};

// One matrix-product shape whose cuBLASLt algorithm was chosen by timing
// (ops::gemm_tune_records): why a product runs on the kernel it does.
struct GemmTuning {
  std::string what;  // "DGELU m=65536 n=1536 k=384 A=bf16 B=bf16 D=bf16"
  int candidates = 0, chosen = 0;  // chosen: rank in the heuristic's list, 0 = its first pick
  double heuristic_ms = 0, chosen_ms = 0;
};

struct BenchReport {
  Environment environment;
  MatmulPeak matmul_peak;
  BenchSettings settings;
  std::vector<BenchRow> rows;
  // Data parallel: the same (batch, variant)s run by rank 0 alone, without
  // the group, just before each multi-process row (the scaling baseline).
  std::vector<BenchRow> single_process;
  std::vector<TorchRow> torch;
  std::vector<SummaryRow> summary;
  std::vector<GemmTuning> gemm_tuning;  // every shape timed, in the order tuned
};

nlohmann::ordered_json to_json(const BenchRow& r);
nlohmann::ordered_json to_json(const TorchRow& r);
nlohmann::ordered_json to_json(const SummaryRow& r);
// In this key order: {"environment", "matmul_peak_tflops", "matmul_peak", "config", "method",
//  "rows", "single_process", "torch", "summary", "gemm_tuning"}
nlohmann::ordered_json to_json(const BenchReport& report);

// Data parallel: "DiT-S/2 batch 256 per rank, all, 2 ranks: 101.20 ms (alone
// 98.10 ms), 2529.6 img/s per GPU, 5059.3 img/s total, scaling efficiency
// 96.9%, exposed communication 3.10 ms".
std::string data_parallel_line(const BenchReport& report, const BenchRow& row);
// One line per row (ours, then torch), data parallel a line per
// multi-process row, then one summary line per batch.
std::string format_table(const BenchReport& report);
// "DiT-S/2 batch 256: all 30.10 ms ... vs torch reduce-overhead 35.30 ms: 1.17x faster"
std::string format_summary_line(const SummaryRow& s);
std::string to_markdown(const BenchReport& report);

// "n/a" for an empty value, else the number with `digits` decimals.
std::string format_number(const std::optional<double>& v, int digits);
// TFLOP/s: one decimal from 10 up, else three significant digits (a CPU
// run's 0.0123, not "0.0").
std::string format_rate(const std::optional<double>& v);
std::string format_gib(const std::optional<double>& v);  // "3.25 GiB" or "n/a"
// How a row's step ran: its graph status, and the second stream when it was on.
std::string execution_note(const BenchRow& r);
// The line bench prints as a row is done: "  batch 32 all<label>: 30.10 ms
// (p10 ..., p90 ...), ... TFLOP/s, peak ..., first step ... s (build ... s),
// <execution note>[; GPU ...][; error: ...]\n", or its error alone.
std::string format_row_line(const BenchRow& r, const std::string& label = "");

// Writes bench.json and bench.md into dir (which exists), each atomically.
void write_report_files(const std::string& dir, const BenchReport& report);

}  // namespace perftrain::observe::bench
