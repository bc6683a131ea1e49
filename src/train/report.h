// report.md of a run: what ran, on what, how fast, and where its outputs are.
#pragma once

#include <string>

#include "train/config.h"
#include "train/trainer.h"

namespace perftrain::train {

void write_report(const std::string& path, const TrainConfig& cfg, const TrainSummary& s,
                  const std::string& device, const std::string& precision, int64_t params, const std::string& data);

}  // namespace perftrain::train
