#include "train/fp8_training.h"

#include <ATen/ops/stack.h>

#include <limits>

#include "base/error.h"
#include "distributed/group.h"
#include "ops/fp8_linear.h"

namespace perftrain::train {

std::unique_ptr<models::Fp8States> fp8_states_for(const models::DiffusionModel& model, const TrainConfig& cfg,
                                                  models::DiTExecution& exec) {
  if (!model.has_fused_path())
    throw UsageError("train.precision = fp8 needs a model with a fused schedule; model.family = " +
                     cfg.model.family + " has none");
  if (cfg.speed.recompute || !cfg.speed.fused_kernels)
    throw UsageError("train.precision = fp8 runs the blocks' linears in the fused schedule: leave "
                     "speed.fused_kernels on and speed.recompute off");
  auto states = std::make_unique<models::Fp8States>(cfg.optim.fp8_amax_history, int(cfg.optim.fp8_margin));
  exec.fused_kernels = true;
  exec.recompute = false;
  exec.fp8 = states.get();
  return states;
}

void fp8_states_made(models::Fp8States& states) {
  states.freeze();
  const std::vector<std::string> unused = states.unused_loaded();
  if (!unused.empty())
    throw UsageError("resume: the checkpoint holds fp8 scaling state for " + unused[0] +
                     (unused.size() > 1 ? " and " + std::to_string(unused.size() - 1) + " more" : "") +
                     ", which this model's forward does not run");
}

void reduce_fp8_amax(const models::Fp8States& states, distributed::Group& group) {
  const double inf = std::numeric_limits<double>::infinity();
  for (const at::Tensor& amax : states.amax_tensors()) {
    amax.nan_to_num_(inf, inf);  // a NaN might lose to a number in the maximum; +inf does not
    group.start_allreduce_max(amax)();
  }
}

std::string describe_fp8(const models::Fp8States& states) {
  std::string out = "fp8 products in " + std::to_string(states.states().size()) +
                    " linears (delayed scaling, amax history " + std::to_string(states.history_len()) + ", margin " +
                    std::to_string(states.margin()) + ")";
  const auto& fb = states.fallbacks();
  if (fb.empty()) return out;
  out += "; " + std::to_string(fb.size()) + " ran bf16 (shapes not multiples of 16):";
  const char* sep = " ";
  for (const std::string& name : fb) {
    out += sep + name;
    sep = ", ";
  }
  return out;
}

std::vector<observe::Fp8LayerHealth> fp8_health(const models::Fp8States& states) {
  std::vector<observe::Fp8LayerHealth> out;
  if (states.states().empty()) return out;
  std::vector<at::Tensor> scales, events;
  for (const auto& [name, s] : states.states()) scales.push_back(s.scale), events.push_back(s.events.sum(0));
  const at::Tensor sc = at::stack(scales).cpu(), ev = at::stack(events).cpu();  // [n, 3], [n, 2]
  const auto scale = sc.accessor<float, 2>();
  const auto event = ev.accessor<float, 2>();
  int64_t i = 0;
  for (const auto& [name, s] : states.states()) {
    observe::Fp8LayerHealth h;
    h.name = name;
    h.scale_x = scale[i][ops::kFp8X], h.scale_w = scale[i][ops::kFp8W], h.scale_dy = scale[i][ops::kFp8Dy];
    h.overflows = event[i][0], h.underflows = event[i][1];
    out.push_back(h);
    ++i;
  }
  return out;
}

Fp8Split split_fp8_state(const std::vector<std::pair<std::string, at::Tensor>>& all, bool fp8_run) {
  Fp8Split out;
  const std::string prefix = kFp8Prefix;
  for (const auto& [name, t] : all) {
    if (name.compare(0, prefix.size(), prefix) == 0) out.fp8.emplace_back(name.substr(prefix.size()), t);
    else out.rest.emplace_back(name, t);
  }
  if (!fp8_run && !out.fp8.empty())
    throw UsageError("resume: the checkpoint was saved with train.precision = fp8 (it holds fp8 scaling state); "
                     "resume it with train.precision = fp8");
  if (fp8_run && out.fp8.empty())
    throw UsageError("resume: the checkpoint holds no fp8 scaling state (it was not saved with train.precision = "
                     "fp8); resume it with its own train.precision");
  return out;
}

}  // namespace perftrain::train
