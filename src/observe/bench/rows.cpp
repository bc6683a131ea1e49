#include "observe/bench/rows.h"

#include <algorithm>

#include "observe/bench/stats.h"

namespace perftrain::observe::bench {

void fill_timing(BenchRow& row, const std::vector<double>& all_ms) {
  const auto s = summarize(all_ms);
  row.ms = s.median;
  row.ms_p10 = s.p10;
  row.ms_p90 = s.p90;
  row.ms_min = s.min;
  row.ms_max = s.max;
  row.ms_mean = s.mean;
  row.ms_ci_low = s.ci.low;
  row.ms_ci_high = s.ci.high;
  row.ci_coverage = s.ci.coverage;
  row.rel_iqr = s.rel_iqr;
  row.run_to_run = run_to_run_spread(row.repeat_median_ms);
}

void fill_rates(BenchRow& row, double train_flops, std::optional<double> peak_tflops) {
  if (!row.ms || *row.ms <= 0) return;
  const double s = *row.ms / 1e3;
  row.images_per_s = static_cast<double>(row.batch) / s;
  row.tflops = train_flops / s / 1e12;
  if (peak_tflops && *peak_tflops > 0) row.mfu = *row.tflops / *peak_tflops;
}

void fill_rates(TorchRow& row, std::optional<double> peak_tflops) {
  if (row.tflops && peak_tflops && *peak_tflops > 0) row.mfu = *row.tflops / *peak_tflops;
}

std::vector<SummaryRow> summarize_batches(std::vector<BenchRow>& rows, const std::vector<TorchRow>& torch) {
  std::vector<int64_t> batches;
  for (const auto& r : rows)
    if (std::find(batches.begin(), batches.end(), r.batch) == batches.end()) batches.push_back(r.batch);

  std::vector<SummaryRow> out;
  for (int64_t b : batches) {
    SummaryRow s;
    s.batch = b;
    // The best PyTorch mode: the fastest of every mode that ran at this batch.
    const TorchRow* best_torch = nullptr;
    for (const auto& t : torch)
      if (t.batch == b && t.ok() && t.ms && (best_torch == nullptr || *t.ms < *best_torch->ms)) best_torch = &t;
    // Ours: the full stack when it ran, else the fastest variant that did.
    const BenchRow* ours = nullptr;
    for (auto& r : rows) {
      if (r.batch != b) continue;
      if (s.model.empty()) s.model = r.model;
      if (!r.ok() || !r.ms) continue;
      if (best_torch != nullptr) r.speedup_vs_best_torch = *best_torch->ms / *r.ms;
      if (r.variant == "all") ours = &r;
      else if (ours == nullptr || (ours->variant != "all" && *r.ms < *ours->ms)) ours = &r;
    }
    if (best_torch != nullptr) {
      s.best_torch_mode = best_torch->mode;
      s.best_torch_ms = best_torch->ms;
      s.best_torch_peak_gib = best_torch->peak_gib;
      s.best_torch_first_step_s = best_torch->first_step_s;
      s.best_torch_cache = best_torch->torch_cache;
    }
    if (ours == nullptr) {
      s.error = "no variant ran";
    } else {
      s.variant = ours->variant;
      s.ms = ours->ms;
      s.images_per_s = ours->images_per_s;
      s.tflops = ours->tflops;
      s.mfu = ours->mfu;
      s.peak_gib = ours->peak_gib;
      s.first_step_s = ours->first_step_s;
      s.graph_status = ours->graph_status;
      s.speedup_vs_best_torch = ours->speedup_vs_best_torch;
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace perftrain::observe::bench
