#include "train/weight_decay.h"

#include <sstream>

namespace perftrain::train {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A name part that marks a parameter outside the decayed group.
bool exempt_part(const std::string& part) {
  return part.find("norm") != std::string::npos || part.find("adaLN") != std::string::npos ||
         part.find("embedding") != std::string::npos || part == "pos_embed" || ends_with(part, "_embed");
}

}  // namespace

bool decays(const std::string& name, const at::Tensor& param) {
  if (param.dim() < 2) return false;
  std::stringstream parts(name);
  std::string part;
  while (std::getline(parts, part, '.'))
    if (exempt_part(part)) return false;
  return true;
}

std::vector<bool> decay_flags(const std::vector<std::pair<std::string, at::Tensor>>& named_params, bool decay_all) {
  std::vector<bool> out;
  out.reserve(named_params.size());
  for (const auto& [name, p] : named_params) out.push_back(decay_all || decays(name, p));
  return out;
}

}  // namespace perftrain::train
