#include "observe/bench/variants.h"

#include <algorithm>

#include "base/error.h"

namespace perftrain::observe::bench {
namespace {

std::vector<Variant> all_variants(const std::string& low) {
  const std::string unfused = low == "fp8" ? "bf16" : low;  // fp8 runs in the fused schedule only
  return {
      {"eager-fp32", "fp32", false, false, false},
      {"eager-bf16", unfused, false, false, false},
      {"fused", low, true, true, false},
      {"graph", unfused, false, true, true},
      {"all", low, true, true, true},
  };
}

}  // namespace

std::vector<std::string> variant_names() {
  std::vector<std::string> names;
  for (const auto& v : all_variants("bf16")) names.push_back(v.name);
  return names;
}

std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string item = list.substr(start, comma - start);
    const auto b = item.find_first_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, item.find_last_not_of(" \t") - b + 1));
    start = comma + 1;
  }
  return out;
}

std::vector<Variant> parse_variants(const std::string& list, const std::string& low_precision) {
  if (low_precision != "bf16" && low_precision != "fp16" && low_precision != "fp8")
    throw UsageError("--precision must be bf16, fp16 or fp8 (the precision of the mixed-precision variants), not '" +
                     low_precision + "'");
  const auto known = all_variants(low_precision);
  std::vector<Variant> out;
  for (const auto& name : split_list(list)) {
    auto it = std::find_if(known.begin(), known.end(), [&](const Variant& v) { return v.name == name; });
    if (it == known.end()) {
      std::string names;
      for (const auto& v : known) names += (names.empty() ? "" : ", ") + v.name;
      throw UsageError("unknown variant '" + name + "'; known variants: " + names);
    }
    if (std::none_of(out.begin(), out.end(), [&](const Variant& v) { return v.name == name; })) out.push_back(*it);
  }
  if (out.empty()) throw UsageError("--variants is empty; known variants: eager-fp32, eager-bf16, fused, graph, all");
  return out;
}

}  // namespace perftrain::observe::bench
