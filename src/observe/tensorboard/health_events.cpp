#include "observe/tensorboard/health_events.h"

#include <cstddef>

namespace perftrain::observe::tensorboard {

void add_grad_health(EventWriter& writer, const GradHealthSample& sample) {
  const int64_t step = sample.step;
  writer.add_scalar("grad/global_norm", step, sample.global.norm);
  writer.add_scalar("grad/global_update_ratio", step, sample.global.update_ratio());
  writer.add_scalar("grad/nonfinite", step, double(sample.global.nonfinite));
  for (const NamedGradStats& m : sample.modules) {
    writer.add_scalar("grad_norm/" + m.name, step, m.stats.norm);
    writer.add_scalar("grad_max/" + m.name, step, m.stats.max_abs);
    writer.add_scalar("grad_zero_share/" + m.name, step, m.stats.zero_share);
    writer.add_scalar("update_ratio/" + m.name, step, m.stats.update_ratio());
    if (m.stats.nonfinite > 0) writer.add_scalar("grad_nonfinite/" + m.name, step, double(m.stats.nonfinite));
  }
  // A looped model's loops: grad/loop3/adapters, grad/loop3/router (norms).
  for (const NamedGradStats& l : sample.loops) writer.add_scalar("grad/" + l.name, step, l.stats.norm);
}

void add_grad_histograms(EventWriter& writer, const GradHealthSample& sample) {
  const std::vector<double>& limits = grad_histogram_limits();
  for (const NamedGradHistogram& m : sample.module_histograms) {
    const GradHistogram& g = m.hist;
    if (!g.finite || g.num <= 0 || g.counts.size() != limits.size()) continue;
    size_t first = 0, last = g.counts.size();
    while (first < last && g.counts[first] == 0) ++first;
    while (last > first && g.counts[last - 1] == 0) --last;
    if (first == last) continue;
    Histogram h;
    h.min = g.min, h.max = g.max, h.num = g.num, h.sum = g.sum, h.sum_squares = g.sum_squares;
    h.bucket_limit.assign(limits.begin() + static_cast<std::ptrdiff_t>(first),
                          limits.begin() + static_cast<std::ptrdiff_t>(last));
    h.bucket.assign(g.counts.begin() + static_cast<std::ptrdiff_t>(first),
                    g.counts.begin() + static_cast<std::ptrdiff_t>(last));
    writer.add_histogram("grad/" + m.name, sample.step, h);
  }
}

}  // namespace perftrain::observe::tensorboard
