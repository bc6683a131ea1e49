#include "diffusion/objective.h"

#include "base/error.h"

namespace perftrain::diffusion {

Objective parse_objective(const std::string& name) {
  if (name == "ddpm") return Objective::Ddpm;
  if (name == "flow") return Objective::Flow;
  throw UsageError("unknown objective '" + name + "' (allowed: ddpm, flow)");
}

TimeSampling parse_time_sampling(const std::string& name) {
  if (name == "uniform") return TimeSampling::Uniform;
  if (name == "logit-normal") return TimeSampling::LogitNormal;
  throw UsageError("unknown time sampling '" + name + "' (allowed: uniform, logit-normal)");
}

std::string to_string(Objective objective) {
  return objective == Objective::Ddpm ? "ddpm" : "flow";
}

std::string to_string(TimeSampling sampling) {
  return sampling == TimeSampling::Uniform ? "uniform" : "logit-normal";
}

}  // namespace perftrain::diffusion
