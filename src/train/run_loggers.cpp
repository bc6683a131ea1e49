#include "train/run_loggers.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <type_traits>

#include "base/build_info.h"
#include "base/error.h"
#include "observe/bench/environment.h"
#include "observe/bench/torch_reference.h"
#include "observe/log/mlflow_logger.h"
#include "observe/log/tensorboard_logger.h"
#include "train/run_directory.h"

namespace perftrain::train {

void MetricsFile::record(const nlohmann::json& rec) { run_.log_metrics(rec); }

observe::log::Params config_params(const TrainConfig& cfg) {
  observe::log::Params out;
  for (const ConfigValue& c : config_values(cfg)) {
    observe::log::Param p;
    p.key = c.key;
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::string>) {
            p.value = v;
            p.text = v;
          } else if constexpr (std::is_same_v<T, bool>) {
            p.value = v;
            p.text = v ? "true" : "false";
          } else if constexpr (std::is_same_v<T, double>) {
            p.value = v;
            p.text = nlohmann::json(v).dump();  // the shortest text that reads back exactly
          } else if constexpr (std::is_same_v<T, int64_t>) {
            p.value = v;
            p.text = std::to_string(v);
          } else {  // the seed: a number W&B and TensorBoard can hold as it is where it fits
            p.value = v <= uint64_t(INT64_MAX) ? observe::log::Param::Value(static_cast<int64_t>(v))
                                               : observe::log::Param::Value(static_cast<double>(v));
            p.text = std::to_string(v);
          }
        },
        c.value);
    out.push_back(std::move(p));
  }
  return out;
}

std::unique_ptr<observe::log::WandbLogger> check_loggers(const LogConfig& log, std::ostream& warnings) {
  observe::log::check_mlflow_tracking_dir(log.mlflow);
  if (log.wandb == "off") return nullptr;
  const std::string source_dir = observe::bench::find_source_dir(base::build_source_dir());
  observe::log::WandbOptions o;
  o.mode = log.wandb;
  o.project = log.wandb_project;
  o.python = observe::bench::reference_python(base::build_python(), source_dir);
  o.script = observe::log::wandb_sidecar_script(source_dir);
  return std::make_unique<observe::log::WandbLogger>(o, warnings);
}

std::unique_ptr<observe::log::Loggers> open_loggers(const TrainConfig& cfg, RunDirectory& run,
                                                    std::unique_ptr<observe::log::WandbLogger> wandb,
                                                    std::ostream& warnings) {
  auto loggers = std::make_unique<observe::log::Loggers>(warnings);
  loggers->add(std::make_unique<MetricsFile>(run));
  if (cfg.log.tensorboard) loggers->add(std::make_unique<observe::log::TensorBoardLogger>(run.file("tb")));
  if (!cfg.log.mlflow.empty()) {
    try {
      loggers->add(std::make_unique<observe::log::MlflowLogger>(cfg.log.mlflow, cfg.log.mlflow_experiment));
    } catch (const RuntimeError& e) {
      throw UsageError("log.mlflow " + cfg.log.mlflow + ": " + e.what());
    }
  }
  if (wandb) loggers->add(std::move(wandb));
  return loggers;
}

observe::log::Scalars record_scalars(const nlohmann::json& rec, const std::string& prefix) {
  observe::log::Scalars out;
  for (auto it = rec.begin(); it != rec.end(); ++it)
    if (it.key() != "step" && it.value().is_number()) out.emplace_back(prefix + it.key(), it.value().get<double>());
  return out;
}

}  // namespace perftrain::train
