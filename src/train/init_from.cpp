#include "train/init_from.h"

#include <ATen/core/grad_mode.h>

#include <map>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/text.h"
#include "train/weights_source.h"

namespace perftrain::train {
namespace {

constexpr const char* kClassTable = "y_embedder.embedding_table.weight";

std::string shape_text(at::IntArrayRef s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

// "2 missing (first 'a')" for a non-empty list.
std::string counted(const std::vector<std::string>& names, const char* kind) {
  return std::to_string(names.size()) + " " + kind + " (first '" + base::printable(names.front()) + "')";
}

struct Mismatches {
  std::vector<std::string> missing, unexpected, reshaped;
  std::string first_reshape;  // its shapes, for the message
  bool any() const { return !missing.empty() || !unexpected.empty() || !reshaped.empty(); }
  std::string text() const {
    std::string out;
    for (const auto& [list, kind] : {std::pair{&missing, "missing"}, {&unexpected, "unexpected"},
                                     {&reshaped, "of another shape"}})
      if (!list->empty()) out += (out.empty() ? "" : ", ") + counted(*list, kind);
    return out + first_reshape;
  }
};

}  // namespace

LoadReport load_named_weights(const io::NamedTensors& source, models::DiffusionModel& model, bool new_class_count,
                              const std::string& what) {
  std::map<std::string, at::Tensor> from(source.begin(), source.end());
  std::set<std::string> trainable;
  for (const auto& [name, t] : model.named_parameters()) trainable.insert(name);
  LoadReport report;
  Mismatches bad;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (model's, source's): copied once all match
  for (auto& [name, current] : model.state()) {
    auto it = from.find(name);
    const bool fixed = trainable.count(name) == 0;
    if (it == from.end()) {
      if (fixed) report.kept.push_back(name + " (fixed, absent from the weights)");
      else bad.missing.push_back(name);
      continue;
    }
    const at::Tensor t = it->second;
    from.erase(it);
    if (!at::isFloatingType(t.scalar_type()))
      throw UsageError(what + ": tensor '" + base::printable(name) + "' has dtype " +
                       io::safetensors_dtype_name(t.scalar_type()) + "; a weight takes F16, BF16, F32 or F64");
    if (t.sizes() == current.sizes()) {
      copies.emplace_back(current, t);
      continue;
    }
    const std::string shapes = shape_text(t.sizes()) + " in the weights, " + shape_text(current.sizes()) + " here";
    if (fixed) {
      report.kept.push_back(name + " (fixed: " + shapes + ")");
    } else if (name == kClassTable && new_class_count && t.dim() == 2 && t.size(1) == current.size(1)) {
      report.reinitialised.push_back(name + " (" + shapes + ": a new class count, initialised as the model does)");
    } else {
      if (bad.reshaped.empty()) bad.first_reshape = ": '" + base::printable(name) + "' is " + shapes;
      bad.reshaped.push_back(name);
    }
  }
  for (const auto& [name, t] : source)
    if (from.count(name)) bad.unexpected.push_back(name);
  if (bad.any()) throw UsageError(what + ": the weights do not fit model " + model.config().name + ": " + bad.text());
  at::NoGradGuard no_grad;
  for (auto& [to, t] : copies) to.copy_(t);
  report.loaded = static_cast<int64_t>(copies.size());
  return report;
}

std::string describe(const LoadReport& r) {
  std::string out = "loaded " + std::to_string(r.loaded) + " tensors";
  for (const auto& s : r.reinitialised) out += "; re-initialised " + s;
  for (const auto& s : r.kept) out += "; kept the model's " + s;
  return out;
}

std::string init_from_weights(const std::string& path, models::DiffusionModel& model, models::DiffusionModel& ema) {
  const WeightsSource source = read_weights(path);
  const LoadReport report = load_named_weights(source.tensors, model, /*new_class_count=*/true, source.description);
  at::NoGradGuard no_grad;
  const auto weights = model.state();
  auto ema_state = ema.state();
  for (size_t i = 0; i < weights.size(); ++i) ema_state[i].second.copy_(weights[i].second);
  return "initialised from " + source.description + ": " + describe(report);
}

}  // namespace perftrain::train
