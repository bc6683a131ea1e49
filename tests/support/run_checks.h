// What a training run wrote, read back for the tests: checkpoint files
// compared tensor by tensor (a resumed run against an uninterrupted one),
// metrics.jsonl's records.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace perftrain::testing {

// Every tensor of the two safetensors files equal, with the same names.
inline void expect_identical(const std::string& a, const std::string& b) {
  auto fa = io::SafetensorsFile::open(a), fb = io::SafetensorsFile::open(b);
  ASSERT_EQ(fa.names(), fb.names());
  for (const auto& n : fa.names()) EXPECT_TRUE(fa.get(n).equal(fb.get(n))) << a << " vs " << b << ": " << n;
}

// <run_dir>/metrics.jsonl, one record per line.
inline std::vector<nlohmann::json> metrics_lines(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace perftrain::testing
