// What the data-parallel CLI tests share: running build/perftrain under a
// hard timeout, a run's logged losses, and its latest checkpoint's folder.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace perftrain::testing::dist_runs {

inline CommandResult run(const std::string& args) {
  return run_shell("timeout -k 5 120 " + std::string(PERFTRAIN_BINARY) + " " + args);
}

inline std::vector<double> losses(const std::string& run_dir) {
  std::ifstream f(run_dir + "/metrics.jsonl");
  std::vector<double> out;
  std::string line;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

inline std::string latest(const std::string& run_dir) {
  std::string name = read_raw(run_dir + "/ckpt/latest");
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return run_dir + "/ckpt/" + name;
}

}  // namespace perftrain::testing::dist_runs
