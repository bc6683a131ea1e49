#include "train/progress.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace perftrain::train {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[32];
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

std::string progress_bar(int64_t done, int64_t total) {
  const int width = 24;
  const int filled = static_cast<int>(width * std::min(done, total) / std::max<int64_t>(total, 1));
  return "[" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
}

Progress::Progress(std::ostream& out, int64_t total_steps, bool interactive)
    : out_(out), total_(total_steps), interactive_(interactive) {}

void Progress::report(int64_t step, double loss, double images_per_s, double steps_per_s) {
  char line[256];
  std::snprintf(line, sizeof line, "%s step %lld/%lld | loss %.4f | %.0f img/s | %.2f steps/s | ETA %s",
                progress_bar(step, total_).c_str(), static_cast<long long>(step), static_cast<long long>(total_), loss,
                images_per_s, steps_per_s, format_duration((total_ - step) / std::max(steps_per_s, 1e-9)).c_str());
  if (interactive_) out_ << "\r" << line << "\x1b[K" << std::flush;
  else out_ << line << "\n" << std::flush;
}

void Progress::finish() {
  if (interactive_) out_ << "\n" << std::flush;
}

}  // namespace perftrain::train
