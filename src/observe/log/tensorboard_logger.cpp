#include "observe/log/tensorboard_logger.h"

#include <chrono>
#include <type_traits>

namespace perftrain::observe::log {
namespace {

double now_secs() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

tensorboard::HParams hparams_of(const Params& params) {
  tensorboard::HParams out;
  out.reserve(params.size());
  for (const Param& p : params)
    std::visit(
        [&](const auto& v) {
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, int64_t>)
            out.emplace_back(p.key, tensorboard::HParamValue(static_cast<double>(v)));
          else
            out.emplace_back(p.key, tensorboard::HParamValue(v));
        },
        p.value);
  return out;
}

TensorBoardLogger::TensorBoardLogger(const std::string& dir)
    : writer_(std::make_unique<tensorboard::EventWriter>(dir)) {}

TensorBoardLogger::~TensorBoardLogger() = default;

const std::string& TensorBoardLogger::path() const { return writer_->path(); }

// A resumed run's file repeats them (TensorBoard reads the run's files as one run).
void TensorBoardLogger::start(const RunStart& run) {
  start_step_ = run.resume_step < 0 ? 0 : run.resume_step;
  const tensorboard::HParams hparams = hparams_of(run.params);
  const double now = now_secs();
  writer_->add_value(start_step_, tensorboard::hparams_experiment_value(hparams, run.metric_tags, now));
  writer_->add_value(start_step_, tensorboard::hparams_session_start_value(hparams, now));
  writer_->add_value(start_step_, tensorboard::text_value("config", config_markdown(run.config_toml)));
  writer_->flush();
}

void TensorBoardLogger::scalars(int64_t step, const Scalars& values) {
  for (const auto& [tag, value] : values) writer_->add_scalar(tag, step, value);
}

void TensorBoardLogger::text(const std::string& tag, int64_t step, const std::string& markdown) {
  writer_->add_value(step, tensorboard::text_value(tag, markdown));
}

void TensorBoardLogger::image(const std::string& tag, int64_t step, const std::string& png_path) {
  writer_->add_png_file(tag, step, png_path);
}

void TensorBoardLogger::histograms(int64_t step, const NamedHistograms& named) {
  for (const auto& [tag, h] : named) writer_->add_histogram(tag, step, h);
}

void TensorBoardLogger::flush() { writer_->flush(); }

void TensorBoardLogger::close(RunEnd end) {
  // A run stopped by a signal can go on (--resume): neither a success nor a failure.
  const auto status = end == RunEnd::finished  ? tensorboard::SessionStatus::success
                      : end == RunEnd::stopped ? tensorboard::SessionStatus::unknown
                                               : tensorboard::SessionStatus::failure;
  writer_->add_value(start_step_, tensorboard::hparams_session_end_value(status, now_secs()));
  writer_->flush();
}

}  // namespace perftrain::observe::log
