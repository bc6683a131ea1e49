// MLflow's local file store, written natively (no mlflow package): under the
// tracking directory (log.mlflow, what `mlflow ui --backend-store-uri` and
// `MlflowClient(tracking_uri="file:PATH")` read)
//   <experiment id>/meta.yaml          the experiment (log.mlflow_experiment; "Default" is id 0)
//   <experiment id>/<run id>/meta.yaml the run: name, status, start and end times
//   <experiment id>/<run id>/params/<section.key>   each config value as text
//   <experiment id>/<run id>/metrics/<tag>          lines "<ms timestamp> <value> <step>"
//   <experiment id>/<run id>/tags/<name>            mlflow.runName, mlflow.source.*, perftrain.run_dir
// A resumed run finds its MLflow run by the tag perftrain.run_dir and appends
// to it, its metric lines after the checkpoint's step cut as metrics.jsonl's are.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "observe/log/logger.h"

namespace perftrain::observe::log {

class MlflowLogger : public Logger {
 public:
  MlflowLogger(const std::string& tracking_dir, const std::string& experiment);

  std::string name() const override { return "mlflow"; }
  void start(const RunStart& run) override;
  void scalars(int64_t step, const Scalars& values) override;
  void close(RunEnd end) override;

  // The run's directory (after start).
  const std::string& run_path() const { return run_path_; }

 private:
  void write_run_meta(const char* status, int64_t end_time_ms);
  void append_metric(const std::string& key, int64_t timestamp_ms, double value, int64_t step);

  std::string root_, experiment_, experiment_id_, run_id_, run_path_, run_name_;
  int64_t start_time_ms_ = 0;
  std::set<std::string> made_dirs_;
};

// UsageError naming log.mlflow when the tracking directory cannot be one (a
// file there). Nothing is created.
void check_mlflow_tracking_dir(const std::string& tracking_dir);

// A metric tag as an MLflow key (letters, digits, _ - . space / : kept; any
// other byte '_'; no empty, "." or ".." component).
std::string mlflow_metric_key(const std::string& tag);

}  // namespace perftrain::observe::log
