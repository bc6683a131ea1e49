// Weights & Biases behind the logger interface (log.wandb = offline |
// online), through a Python sidecar (tools/wandb_sidecar.py, run by the
// Python the build knows: observe/bench/torch_reference.h reference_python)
// that calls wandb.init / wandb.log / wandb.finish from JSON lines. Never a
// hard dependency and never in the step's way:
//  - the sidecar is started at set-up and imports wandb first; no wandb
//    package is a UsageError naming log.wandb;
//  - lines go over a Unix socket pair written with MSG_DONTWAIT |
//    MSG_NOSIGNAL: a full socket drops the line (one warning), a dead
//    sidecar raises no SIGPIPE;
//  - the sidecar dying is a RuntimeError of this sink, which Loggers turns
//    into one warning (training goes on without W&B).
// The W&B run id is kept in <run>/wandb_run_id, so that --resume continues
// the same W&B run.
#pragma once

#include <sys/types.h>

#include <ostream>
#include <string>

#include "observe/log/logger.h"

namespace perftrain::observe::log {

struct WandbOptions {
  std::string mode;      // offline | online
  std::string project;   // log.wandb_project
  std::string python;    // the interpreter
  std::string script;    // tools/wandb_sidecar.py
  double start_timeout_s = 120;  // for `import wandb`
  double finish_timeout_s = 120; // for wandb.finish (an online run uploads)
};

class WandbLogger : public Logger {
 public:
  // Starts the sidecar and waits until it has imported wandb.
  WandbLogger(const WandbOptions& options, std::ostream& warnings);
  // Ends the sidecar if close() did not (end of input: it finishes the run as failed).
  ~WandbLogger() override;

  std::string name() const override { return "wandb"; }
  void start(const RunStart& run) override;
  void scalars(int64_t step, const Scalars& values) override;
  void image(const std::string& tag, int64_t step, const std::string& png_path) override;
  void close(RunEnd end) override;

  pid_t pid() const { return pid_; }
  int64_t dropped() const { return dropped_; }

 private:
  void spawn();
  std::string read_answer();
  void send(const nlohmann::json& message);
  bool drain();  // false: the socket is full
  void end_sidecar(double timeout_s);
  std::string sidecar_gone() const;

  WandbOptions options_;
  std::ostream& warnings_;
  std::string run_dir_;
  int fd_ = -1;
  pid_t pid_ = -1;
  std::string pending_;  // the rest of a line the socket took only part of
  int64_t dropped_ = 0;
};

// The sidecar script next to the program's source (tools/wandb_sidecar.py);
// UsageError naming log.wandb when it is not there.
std::string wandb_sidecar_script(const std::string& source_dir);

}  // namespace perftrain::observe::log
