// report.md of a run: what ran, on what, how fast, and where its outputs are,
// for the whole run across its resumes: the run's segments (run_segments.h)
// and its metrics.jsonl, with this process's segment last.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/run_segments.h"
#include "train/trainer.h"

namespace perftrain::train {

// What the run's metrics.jsonl says of the whole run: the mean loss of its
// first and last logging windows, its non-finite (skipped) steps and its
// health warnings in order.
struct MetricsTotals {
  std::optional<double> first_loss, final_loss;
  int64_t nonfinite_steps = 0;
  std::vector<std::string> health_warnings;
};
MetricsTotals read_metrics_totals(const std::string& metrics_path);

// What the report says of this process beside its summary.
struct ReportFacts {
  std::string device, precision, data;
  int64_t params = 0;  // trainable
  std::string fp8;     // StepRunner::fp8_note() ("" unless train.precision = fp8)
};

// Writes run_dir/report.md from the config, this segment's summary, the
// run's segments (this one last) and run_dir/metrics.jsonl.
void write_report(const std::string& run_dir, const TrainConfig& cfg, const TrainSummary& segment,
                  const std::vector<RunSegment>& segments, const ReportFacts& facts);

}  // namespace perftrain::train
