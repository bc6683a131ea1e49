// The folder a command writes into when --out is not given:
// runs/<kind>-<model with '/' as '-'>-<local date and time>.
#pragma once

#include <ctime>
#include <string>

namespace perftrain::cli {

inline std::string default_out_dir(const std::string& kind, const std::string& model) {
  std::string m = model;
  for (char& c : m)
    if (c == '/') c = '-';
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  return "runs/" + kind + "-" + m + "-" + stamp;
}

}  // namespace perftrain::cli
