#include "observe/tensorboard/health_events.h"

#include <cstddef>

namespace perftrain::observe::tensorboard {

std::vector<std::pair<std::string, double>> grad_health_scalars(const GradHealthSample& sample) {
  std::vector<std::pair<std::string, double>> out = {{"grad/global_norm", sample.global.norm},
                                                     {"grad/global_update_ratio", sample.global.update_ratio()},
                                                     {"grad/nonfinite", double(sample.global.nonfinite)}};
  for (const NamedGradStats& m : sample.modules) {
    out.emplace_back("grad_norm/" + m.name, m.stats.norm);
    out.emplace_back("grad_max/" + m.name, m.stats.max_abs);
    out.emplace_back("grad_zero_share/" + m.name, m.stats.zero_share);
    out.emplace_back("update_ratio/" + m.name, m.stats.update_ratio());
    if (m.stats.nonfinite > 0) out.emplace_back("grad_nonfinite/" + m.name, double(m.stats.nonfinite));
  }
  // A looped model's loops: grad/loop3/adapters, grad/loop3/router (norms).
  for (const NamedGradStats& l : sample.loops) out.emplace_back("grad/" + l.name, l.stats.norm);
  // fp8: per linear its three scales and its overflow / underflow counts.
  for (const Fp8LayerHealth& f : sample.fp8) {
    out.emplace_back("fp8_scale_x/" + f.name, f.scale_x);
    out.emplace_back("fp8_scale_w/" + f.name, f.scale_w);
    out.emplace_back("fp8_scale_dy/" + f.name, f.scale_dy);
    out.emplace_back("fp8_overflows/" + f.name, f.overflows);
    out.emplace_back("fp8_underflows/" + f.name, f.underflows);
  }
  return out;
}

std::vector<std::pair<std::string, Histogram>> grad_health_histograms(const GradHealthSample& sample) {
  std::vector<std::pair<std::string, Histogram>> out;
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
    out.emplace_back("grad/" + m.name, std::move(h));
  }
  return out;
}

}  // namespace perftrain::observe::tensorboard
