// What a training run wrote, read back for the tests: checkpoint files
// compared tensor by tensor (a resumed run against an uninterrupted one),
// metrics.jsonl's records.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace perftrain::testing {

// Every tensor of the two safetensors files equal, with the same names.
inline void expect_identical(const std::string& a, const std::string& b) {
  auto fa = io::SafetensorsFile::open(a), fb = io::SafetensorsFile::open(b);
  ASSERT_EQ(fa.names(), fb.names());
  for (const auto& n : fa.names()) EXPECT_TRUE(fa.get(n).equal(fb.get(n))) << a << " vs " << b << ": " << n;
}

// make(name, steps) -> a TrainConfig whose run goes to runs/<name>: a run of
// 2n steps and one of n steps resumed to 2n end with the same model, EMA and
// trainer state, bit for bit.
template <class MakeConfig>
void expect_resume_bit_identical(const MakeConfig& make, const std::string& runs, int64_t n, std::ostream& log) {
  auto whole = train::run_training(make("whole", 2 * n), {}, log);
  auto half = train::run_training(make("half", n), {}, log);
  EXPECT_EQ(half.last_step, n);
  train::TrainConfig more = train::config_from_weights(half.last_checkpoint + "/model.safetensors");
  more.optim.steps = 2 * n;
  train::TrainOptions opts;
  opts.resume = runs + "/half";
  auto resumed = train::run_training(more, opts, log);
  EXPECT_EQ(resumed.first_step, n + 1);
  EXPECT_EQ(resumed.last_step, 2 * n);
  for (const char* f : {"/model.safetensors", "/ema.safetensors", "/trainer_state.safetensors"})
    expect_identical(whole.last_checkpoint + f, resumed.last_checkpoint + f);
}

// <run_dir>/metrics.jsonl, one record per line.
inline std::vector<nlohmann::json> metrics_lines(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace perftrain::testing
