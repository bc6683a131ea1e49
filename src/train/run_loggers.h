// The run's loggers (observe/log/logger.h) from the [log] keys: metrics.jsonl
// of the run directory (always), TensorBoard (log.tensorboard), MLflow's local
// file store (log.mlflow) and Weights & Biases (log.wandb). Made by rank 0.
#pragma once

#include <memory>
#include <ostream>

#include "observe/log/logger.h"
#include "observe/log/wandb_logger.h"
#include "train/config.h"

namespace perftrain::train {

class RunDirectory;

// metrics.jsonl behind the interface: each record one line
// (RunDirectory::log_metrics). Required: its errors end the run.
class MetricsFile : public observe::log::Logger {
 public:
  explicit MetricsFile(RunDirectory& run) : run_(run) {}
  std::string name() const override { return "metrics.jsonl"; }
  bool required() const override { return true; }
  void record(const nlohmann::json& rec) override;

 private:
  RunDirectory& run_;
};

// The resolved config as the loggers' params: integers as numbers (exact
// text beside them), strings unquoted.
observe::log::Params config_params(const TrainConfig& cfg);

// log.wandb != off: the sidecar started and its wandb import checked (a
// UsageError naming log.wandb without the package), before the run
// directory is touched; null when off. log.mlflow: its directory checked.
std::unique_ptr<observe::log::WandbLogger> check_loggers(const LogConfig& log, std::ostream& warnings);

// The run's loggers: metrics.jsonl, then TensorBoard, MLflow, W&B (`wandb`,
// from check_loggers) as the config asks.
std::unique_ptr<observe::log::Loggers> open_loggers(const TrainConfig& cfg, RunDirectory& run,
                                                    std::unique_ptr<observe::log::WandbLogger> wandb,
                                                    std::ostream& warnings);

// The scalars of a metrics record: each top-level number as <prefix><key>
// ("train/loss"), "step" left out.
observe::log::Scalars record_scalars(const nlohmann::json& rec, const std::string& prefix);

}  // namespace perftrain::train
