// The one logger interface a run's outputs sit behind: metrics.jsonl (the
// trainer's run directory), TensorBoard, MLflow's local file store and
// Weights & Biases. The trainer calls a Loggers (all the run's sinks) at set
// points: start (the resolved config: hparams, params, text), each logging
// window (its metrics record, its scalars), samples (images), histograms,
// flush after each window, close at the end. A sink takes what it can and
// ignores the rest (the defaults do nothing). Nothing here runs inside a step.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "observe/tensorboard/event_writer.h"

namespace perftrain::observe::log {

// One key of the resolved config ("train.lr"): its value typed (what
// TensorBoard's hparams, as numbers, and W&B's config take) and as exact
// text (MLflow's params; strings unquoted).
struct Param {
  using Value = std::variant<double, int64_t, bool, std::string>;
  std::string key;
  Value value;
  std::string text;
};
using Params = std::vector<Param>;
using Scalars = std::vector<std::pair<std::string, double>>;
using NamedHistograms = std::vector<std::pair<std::string, tensorboard::Histogram>>;

// What every sink learns when the run starts.
struct RunStart {
  std::string run_dir;                   // the run directory (absolute or as given)
  std::string run_name;                  // its last component
  Params params;                         // the resolved config, in config.toml's order
  std::string config_toml;               // config.toml's text
  int64_t resume_step = -1;              // a resumed run: the checkpoint's step; -1: a fresh run
  std::vector<std::string> metric_tags;  // the scalars that judge a run (TensorBoard's hparams metrics)
};

// How the run ended: reached train.steps, stopped by a signal, or failed.
enum class RunEnd { finished, stopped, failed };

class Logger {
 public:
  virtual ~Logger() = default;
  // "metrics.jsonl", "tensorboard", "mlflow", "wandb": for warnings.
  virtual std::string name() const = 0;
  // A failure of a required sink ends the run; an optional one's is a
  // warning, and that sink is dropped (Loggers).
  virtual bool required() const { return false; }
  virtual void start(const RunStart&) {}
  // A whole metrics record ({"step": N, ...}) as metrics.jsonl holds it.
  virtual void record(const nlohmann::json&) {}
  virtual void scalars(int64_t /*step*/, const Scalars&) {}
  virtual void text(const std::string& /*tag*/, int64_t /*step*/, const std::string& /*markdown*/) {}
  virtual void image(const std::string& /*tag*/, int64_t /*step*/, const std::string& /*png_path*/) {}
  virtual bool takes_histograms() const { return false; }
  virtual void histograms(int64_t /*step*/, const NamedHistograms&) {}
  virtual void flush() {}
  virtual void close(RunEnd) {}
};

// The run's sinks in the order added; each call goes to each. An optional
// sink that throws is dropped with one warning on `warnings`; a required
// one's error goes up. Closes the started sinks as failed if close() was
// never called (an error unwinding the trainer).
class Loggers {
 public:
  explicit Loggers(std::ostream& warnings) : warnings_(warnings) {}
  ~Loggers();
  Loggers(const Loggers&) = delete;
  Loggers& operator=(const Loggers&) = delete;

  void add(std::unique_ptr<Logger> logger);
  bool empty() const { return sinks_.empty(); }
  // "metrics.jsonl, tensorboard, mlflow": the sinks' names, in order.
  std::string names() const;
  // Whether any sink takes histograms (so that none are computed for nobody).
  bool takes_histograms() const;

  void start(const RunStart& run);
  void record(const nlohmann::json& rec);
  void scalars(int64_t step, const Scalars& values);
  void text(const std::string& tag, int64_t step, const std::string& markdown);
  void image(const std::string& tag, int64_t step, const std::string& png_path);
  void histograms(int64_t step, const NamedHistograms& named);
  void flush();
  void close(RunEnd end);

 private:
  template <typename Call>
  void each(const char* what, Call&& call);

  std::ostream& warnings_;
  std::vector<std::unique_ptr<Logger>> sinks_;
  bool started_ = false, closed_ = false;
};

// The markdown of a config.toml text (a code block), for text summaries.
std::string config_markdown(const std::string& config_toml);

}  // namespace perftrain::observe::log
