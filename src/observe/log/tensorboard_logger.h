// TensorBoard behind the logger interface (observe/log/logger.h): event
// files in <run>/tb (observe/tensorboard/event_writer.h). At start the
// resolved config as hparams (experiment and session_start_info) and as the
// text summary "config"; scalars, images (PNG files), histograms; at close
// the hparams session_end_info with the run's status.
#pragma once

#include <memory>
#include <string>

#include "observe/log/logger.h"
#include "observe/tensorboard/plugins.h"

namespace perftrain::observe::log {

class TensorBoardLogger : public Logger {
 public:
  // Creates the event file in `dir` (RuntimeError if it cannot).
  explicit TensorBoardLogger(const std::string& dir);
  ~TensorBoardLogger() override;

  std::string name() const override { return "tensorboard"; }
  bool required() const override { return true; }  // log.tensorboard is on by default: its errors are the run's
  const std::string& path() const;

  void start(const RunStart& run) override;
  void scalars(int64_t step, const Scalars& values) override;
  void text(const std::string& tag, int64_t step, const std::string& markdown) override;
  void image(const std::string& tag, int64_t step, const std::string& png_path) override;
  bool takes_histograms() const override { return true; }
  void histograms(int64_t step, const NamedHistograms& named) override;
  void flush() override;
  void close(RunEnd end) override;

 private:
  std::unique_ptr<tensorboard::EventWriter> writer_;
  int64_t start_step_ = 0;
};

// The config's params as TensorBoard hparams.
tensorboard::HParams hparams_of(const Params& params);

}  // namespace perftrain::observe::log
