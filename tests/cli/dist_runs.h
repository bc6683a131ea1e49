// What the data-parallel CLI tests share: running build/perftrain under a
// hard timeout, a run's logged losses, its latest checkpoint's folder, and
// the fp8 scales of a data-parallel run against one process's.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
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

// train.precision = fp8: the scales in the latest checkpoints of one process
// (one_dir) and of `ranks` data-parallel ranks (many_dir) with the same global
// batch. The ranks' amax reduced by their maximum give the one process's
// scales: x and W alike, dY `ranks` times smaller (a rank's loss is the mean
// of its share of the rows, so its output gradients are `ranks` times the one
// process's); within the last bits, as the all-reduced weights differ there.
// Returns how many states it compared.
inline int expect_fp8_scales_as_one_process(const std::string& one_dir, const std::string& many_dir, int ranks) {
  const auto one = io::SafetensorsFile::open(latest(one_dir) + "/trainer_state.safetensors");
  const auto many = io::SafetensorsFile::open(latest(many_dir) + "/trainer_state.safetensors");
  int states = 0;
  for (const auto& n : one.names()) {
    if (n.rfind("fp8.", 0) != 0 || n.size() < 6 || n.compare(n.size() - 6, 6, ".scale") != 0) continue;
    EXPECT_TRUE(many.contains(n)) << n;
    if (!many.contains(n)) continue;
    const at::Tensor a = one.get(n), b = many.get(n);
    const auto sa = a.accessor<float, 1>(), sb = b.accessor<float, 1>();
    EXPECT_NEAR(sb[0] / sa[0], 1.0, 1e-5) << n << " x";
    EXPECT_NEAR(sb[1] / sa[1], 1.0, 1e-5) << n << " W";
    EXPECT_NEAR(ranks * sb[2] / sa[2], 1.0, 1e-5) << n << " dY";
    ++states;
  }
  return states;
}

}  // namespace perftrain::testing::dist_runs
