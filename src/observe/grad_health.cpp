#include "observe/grad_health.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

namespace perftrain::observe {
namespace {

bool is_index(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

std::string num(double v) {
  std::ostringstream o;
  o.precision(3);
  o << v;
  return o.str();
}

}  // namespace

std::string module_of_parameter(const std::string& name) {
  const auto dot = name.find('.');
  if (dot == std::string::npos) return name;
  const auto dot2 = name.find('.', dot + 1);
  const std::string second = name.substr(dot + 1, dot2 == std::string::npos ? std::string::npos : dot2 - dot - 1);
  if (dot2 != std::string::npos && is_index(second)) return name.substr(0, dot2);
  return name.substr(0, dot);
}

int64_t loop_of_parameter(const std::string& name) {
  for (const char* list : {"adapters.", "routers."}) {
    const std::string prefix = list;
    if (name.rfind(prefix, 0) != 0) continue;
    const auto dot = name.find('.', prefix.size());
    const std::string index = name.substr(prefix.size(), dot == std::string::npos ? std::string::npos : dot - prefix.size());
    if (is_index(index) && index.size() < 10) return std::stoll(index);
  }
  return -1;
}

// "loop<l>/adapters" or "loop<l>/router" for a per-loop parameter, else "".
static std::string loop_group(const std::string& name) {
  const int64_t loop = loop_of_parameter(name);
  if (loop < 0) return "";
  return "loop" + std::to_string(loop) + (name.rfind("adapters.", 0) == 0 ? "/adapters" : "/router");
}

GradStats combine(const std::vector<const GradStats*>& parts) {
  GradStats out;
  double sq = 0, wsq = 0, usq = 0, abs_sum = 0, zeros = 0;
  for (const GradStats* p : parts) {
    out.numel += p->numel;
    sq += p->norm * p->norm;
    wsq += p->weight_norm * p->weight_norm;
    usq += p->update_norm * p->update_norm;
    abs_sum += p->mean_abs * static_cast<double>(p->numel);
    zeros += p->zero_share * static_cast<double>(p->numel);
    // NaN-propagating: a module with a NaN maximum shows it.
    out.max_abs = std::isnan(p->max_abs) || std::isnan(out.max_abs) ? NAN : std::max(out.max_abs, p->max_abs);
    out.nonfinite += p->nonfinite;
  }
  out.norm = std::sqrt(sq);
  out.weight_norm = std::sqrt(wsq);
  out.update_norm = std::sqrt(usq);
  if (out.numel > 0) {
    out.mean_abs = abs_sum / static_cast<double>(out.numel);
    out.zero_share = zeros / static_cast<double>(out.numel);
  }
  return out;
}

const std::vector<double>& grad_histogram_limits() {
  static const std::vector<double> limits = [] {
    constexpr int kPerSign = 57;  // 10^(-12 + k/4), k = 0..56: 1e-12 .. 1e2
    std::vector<double> l;
    for (int k = kPerSign - 1; k >= 0; --k) l.push_back(-std::pow(10.0, -12.0 + k / 4.0));
    for (int k = 0; k < kPerSign; ++k) l.push_back(std::pow(10.0, -12.0 + k / 4.0));
    l.push_back(std::numeric_limits<double>::max());
    return l;
  }();
  return limits;
}

void summarize_modules(GradHealthSample& s) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<const GradStats*>> groups;
  std::map<std::string, std::vector<const GradHistogram*>> hist_groups;
  std::vector<const GradStats*> all;
  const bool hists = s.param_histograms.size() == s.params.size() && !s.params.empty();
  for (size_t i = 0; i < s.params.size(); ++i) {
    const auto& p = s.params[i];
    const std::string m = module_of_parameter(p.name);
    auto& g = groups[m];
    if (g.empty()) order.push_back(m);
    g.push_back(&p.stats);
    all.push_back(&p.stats);
    if (hists) hist_groups[m].push_back(&s.param_histograms[i].hist);
  }
  s.modules.clear();
  for (const auto& m : order) s.modules.push_back({m, combine(groups[m])});
  std::map<std::pair<int64_t, std::string>, std::vector<const GradStats*>> loops;  // sorted by loop
  for (const auto& p : s.params) {
    const std::string g = loop_group(p.name);
    if (!g.empty()) loops[{loop_of_parameter(p.name), g}].push_back(&p.stats);
  }
  s.loops.clear();
  for (const auto& [key, parts] : loops) s.loops.push_back({key.second, combine(parts)});
  s.global = combine(all);
  s.module_histograms.clear();
  if (!hists) return;
  for (const auto& m : order) {
    GradHistogram h;
    bool any = false;
    for (const GradHistogram* p : hist_groups[m]) {
      if (h.counts.size() < p->counts.size()) h.counts.resize(p->counts.size(), 0.0);
      for (size_t b = 0; b < p->counts.size(); ++b) h.counts[b] += p->counts[b];
      h.finite = h.finite && p->finite;
      if (p->num <= 0) continue;
      h.min = any ? std::min(h.min, p->min) : p->min;
      h.max = any ? std::max(h.max, p->max) : p->max;
      any = true;
      h.num += p->num;
      h.sum += p->sum;
      h.sum_squares += p->sum_squares;
    }
    s.module_histograms.push_back({m, std::move(h)});
  }
}

std::vector<HealthWarning> HealthDetectors::observe(const GradHealthSample& s) {
  std::vector<HealthWarning> out;
  auto warn = [&](const std::string& kind, const std::string& module, const std::string& message) {
    out.push_back({s.step, kind, module, "step " + std::to_string(s.step) + ": " + message});
  };
  if (names_.size() != s.modules.size()) {  // first sample (or another model): start over
    names_.clear();
    for (const auto& m : s.modules) names_.push_back(m.name);
    low_run_.assign(names_.size(), 0);
    zero_run_.assign(names_.size(), 0);
    nonfinite_.assign(names_.size(), false);
  }
  for (size_t i = 0; i < s.modules.size(); ++i) {
    const auto& m = s.modules[i];
    const GradStats& g = m.stats;
    if (!g.finite()) {
      if (!nonfinite_[i])
        warn("nonfinite", m.name, m.name + ": " + std::to_string(g.nonfinite) + " NaN/Inf gradient elements");
      nonfinite_[i] = true;
      low_run_[i] = zero_run_[i] = 0;
      continue;
    }
    nonfinite_[i] = false;
    const bool all_zero = g.numel > 0 && g.zero_share >= 1.0;
    zero_run_[i] = all_zero ? zero_run_[i] + 1 : 0;
    low_run_[i] = !all_zero && g.norm < t_.vanish_norm ? low_run_[i] + 1 : 0;
    if (zero_run_[i] == t_.patience)
      warn("dead", m.name,
           m.name + ": all gradients exactly zero for " + std::to_string(t_.patience) + " monitored steps (dead layer)");
    if (low_run_[i] == t_.patience)
      warn("vanishing", m.name,
           m.name + ": gradient norm " + num(g.norm) + " under health.vanish_norm = " + num(t_.vanish_norm) + " for " +
               std::to_string(t_.patience) + " monitored steps (vanishing gradients)");
  }
  // Exploding: the global norm against the running median of the ones before.
  const double norm = s.global.norm;
  if (std::isfinite(norm)) {
    bool spike = false;
    if (static_cast<int64_t>(recent_norms_.size()) >= t_.median_min) {
      std::vector<double> sorted = recent_norms_;
      std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
      const double median = sorted[sorted.size() / 2];
      spike = median > 0 && norm > t_.explode_factor * median;
      if (spike && !exploding_)
        warn("exploding", "",
             "global gradient norm " + num(norm) + " is " + num(norm / median) + "x its running median " +
                 num(median) + " (health.explode_factor = " + num(t_.explode_factor) + "; exploding gradients)");
    }
    exploding_ = spike;
    recent_norms_.push_back(norm);  // a lasting new level becomes the median within half a window
    if (static_cast<int64_t>(recent_norms_.size()) > t_.median_window) recent_norms_.erase(recent_norms_.begin());
  }
  all_.insert(all_.end(), out.begin(), out.end());
  return out;
}

}  // namespace perftrain::observe
