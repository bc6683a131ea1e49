// One (batch, variant) of `perftrain bench` timed on the trainer's step
// runner: a fresh model, EMA and runner; the first step timed from the start
// of the build; warm-up; repeated windows of timed steps; optionally a kernel
// profile of a few more. Everything it allocated is freed when it returns.
#pragma once

#include <c10/core/Device.h>

#include <optional>
#include <string>
#include <vector>

#include "data/batch_loader.h"
#include "observe/bench/rows.h"
#include "observe/bench/variants.h"
#include "train/config.h"

namespace perftrain::distributed {
class Group;
}

namespace perftrain::train::bench {

// How each variant is timed (bench's --steps, --warmup, --repeats, --ema,
// --profile).
struct Timing {
  int64_t steps = 30, warmup = 6, repeats = 1;
  bool ema = false;            // an EMA update each step, here and in the torch reference
  std::string profile;         // the variant to profile after its timing ("" none)
  std::string profile_dir;     // where its breakdown goes (the run directory)
};

// Distinct synthetic batches reused round-robin.
constexpr int64_t kPoolBatches = 8;

// kPoolBatches synthetic batches of `batch`, in pinned memory on a GPU
// machine so the runner's copies are asynchronous as in training. A model
// with condition features (model.cond_dim > 0) gets synthetic ones, as
// train's synthetic data: lengths in [1, cond_tokens], the rest masked.
std::vector<data::Batch> make_pool(const TrainConfig& cfg, int64_t batch, bool cuda);

// The config of one (batch, variant): the variant's precision and step shape.
TrainConfig variant_config(const TrainConfig& base, const observe::bench::Variant& v, int64_t batch);

// The row of one (batch, variant) on the pool's batches: a failure (out of
// memory, a switch the device lacks) is the row's error, not an exception.
// group: data parallel, the pool's batch per rank (the runner's config holds
// the global batch, as the trainer's).
observe::bench::BenchRow run_variant(const Timing& t, const TrainConfig& base, const observe::bench::Variant& v,
                                     const std::vector<data::Batch>& pool, at::Device device,
                                     std::optional<double> peak_tflops, distributed::Group* group = nullptr);

}  // namespace perftrain::train::bench
