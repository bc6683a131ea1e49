// What the profiling tests share: a diagnosis finding looked up by its id.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "observe/profile/diagnosis.h"

namespace perftrain::testing {

// The finding with this id, or none; a copy, since the findings are often a temporary.
inline std::optional<observe::profile::Finding> find_finding(const std::vector<observe::profile::Finding>& f,
                                                             const std::string& id) {
  auto it = std::find_if(f.begin(), f.end(), [&](const observe::profile::Finding& x) { return x.id == id; });
  if (it == f.end()) return std::nullopt;
  return *it;
}

}  // namespace perftrain::testing
