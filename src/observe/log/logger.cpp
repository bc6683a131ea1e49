#include "observe/log/logger.h"

#include <exception>
#include <sstream>

namespace perftrain::observe::log {

Loggers::~Loggers() {
  if (!started_ || closed_) return;
  try {
    close(RunEnd::failed);
  } catch (const std::exception&) {  // a required sink's close while unwinding: the first error is the one shown
  }
}

void Loggers::add(std::unique_ptr<Logger> logger) { sinks_.push_back(std::move(logger)); }

std::string Loggers::names() const {
  std::string out;
  for (const auto& s : sinks_) out += (out.empty() ? "" : ", ") + s->name();
  return out;
}

bool Loggers::takes_histograms() const {
  for (const auto& s : sinks_)
    if (s->takes_histograms()) return true;
  return false;
}

// Runs call on every sink; an optional sink that throws is warned about once and dropped.
template <typename Call>
void Loggers::each(const char* what, Call&& call) {
  for (size_t i = 0; i < sinks_.size();) {
    try {
      call(*sinks_[i]);
      ++i;
    } catch (const std::exception& e) {
      if (sinks_[i]->required()) throw;
      warnings_ << "warning: " << sinks_[i]->name() << " logging stopped (" << what << "): " << e.what()
                << "; training goes on\n";
      sinks_.erase(sinks_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
}

void Loggers::start(const RunStart& run) {
  started_ = true;
  each("start", [&](Logger& l) { l.start(run); });
}
void Loggers::record(const nlohmann::json& rec) {
  each("record", [&](Logger& l) { l.record(rec); });
}
void Loggers::scalars(int64_t step, const Scalars& values) {
  each("scalars", [&](Logger& l) { l.scalars(step, values); });
}
void Loggers::text(const std::string& tag, int64_t step, const std::string& markdown) {
  each("text", [&](Logger& l) { l.text(tag, step, markdown); });
}
void Loggers::image(const std::string& tag, int64_t step, const std::string& png_path) {
  each("image", [&](Logger& l) { l.image(tag, step, png_path); });
}
void Loggers::histograms(int64_t step, const NamedHistograms& named) {
  each("histograms", [&](Logger& l) {
    if (l.takes_histograms()) l.histograms(step, named);
  });
}
void Loggers::flush() {
  each("flush", [&](Logger& l) { l.flush(); });
}
void Loggers::close(RunEnd end) {
  if (closed_) return;
  closed_ = true;
  each("close", [&](Logger& l) { l.close(end); });
}

std::string config_markdown(const std::string& config_toml) {
  std::istringstream in(config_toml);
  std::string out, line;
  while (std::getline(in, line)) out += "    " + line + "\n";  // an indented code block
  return out;
}

}  // namespace perftrain::observe::log
