#include "train/bench/step_setup.h"

#include "base/error.h"
#include "compat/compat.h"
#include "models/dit_config.h"
#include "observe/bench/variants.h"
#include "train/memory_estimate.h"

namespace perftrain::train::bench {

bool use_cuda(const std::string& device) {
  if (device == "cpu") return false;  // asks nothing of CUDA
  if (device != "auto" && device != "cuda")
    throw UsageError("--device must be auto, cpu or cuda (got '" + device + "')");
  const bool visible = compat::cuda_available();
  if (device == "cuda" && !visible) throw UsageError("--device cuda but no CUDA GPU is visible");
  return visible;
}

std::vector<int64_t> parse_batch_sizes(const std::string& list) {
  std::vector<int64_t> out;
  for (const auto& item : observe::bench::split_list(list)) {
    size_t used = 0;
    long long b = 0;
    try {
      b = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || b < 1)
      throw UsageError("--batch-size takes positive integers separated by commas (got '" + item + "')");
    out.push_back(b);
  }
  if (out.empty()) throw UsageError("--batch-size is empty");
  return out;
}

TrainConfig anchor_config(const StepSetup& s, bool cuda) {
  TrainConfig cfg = default_config(cuda);
  cfg.model = models::model_config(s.model);
  cfg.model.image_size = s.image_size;
  cfg.model.in_channels = s.in_channels;
  cfg.model.num_classes = s.num_classes;
  cfg.model.learn_sigma = false;
  cfg.model.class_dropout = 0.1;
  cfg.data.source = "synthetic";
  cfg.diffusion.objective = "ddpm";
  cfg.optim.device = cuda ? "cuda" : "cpu";
  cfg.optim.lr = 1e-4;
  cfg.optim.weight_decay = 0;
  cfg.optim.grad_clip = 0;
  cfg.optim.warmup_steps = 0;
  cfg.optim.seed = s.seed;
  return cfg;
}

std::string mixed_precision(const StepSetup& s, const TrainConfig& cfg) {
  return cfg.optim.precision == "fp8" ? "fp8" : s.precision;
}

void finish_config(TrainConfig& cfg, const StepSetup& s) {
  for (const auto& o : s.overrides) apply_override(cfg, o);
  cfg.validate();
  check_one_micro_batch(cfg);
}

void check_one_micro_batch(const TrainConfig& cfg) {
  if (cfg.optim.accumulate != 1)
    throw UsageError("train.accumulate = " + std::to_string(cfg.optim.accumulate) +
                     ": bench and profile time the step of one batch; measure accumulation with perftrain train");
}

void check_batch_fits(const TrainConfig& cfg, bool cuda, int optimizer_shards) {
  const double available = memory_available_for_training(cuda);
  const MemoryEstimate est = estimate_training_memory(cfg, cuda, cfg.optim.precision, optimizer_shards);
  if (est.total_bytes() <= available) return;
  const int64_t largest = largest_batch_that_fits(est, available);
  throw UsageError("--batch-size " + std::to_string(cfg.optim.batch_size) + " needs about " +
                   bytes_text(est.total_bytes()) + " for " + cfg.model.name + "'s step but " +
                   (cuda ? "the GPU has " : "this machine has ") + bytes_text(available) + "; " +
                   (largest > 0 ? "the largest batch that fits is " + std::to_string(largest)
                                : std::string("not even a batch of 1 fits: choose a smaller model")));
}

}  // namespace perftrain::train::bench
