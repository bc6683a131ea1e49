// The names a user may give on the command line or in a config for the
// training objective and, for flow matching, how training times are drawn.
#pragma once

#include <string>

namespace perftrain::diffusion {

enum class Objective { Ddpm, Flow };            // "ddpm" | "flow"
enum class TimeSampling { Uniform, LogitNormal };  // "uniform" | "logit-normal"

// Throw UsageError naming the allowed values for anything else.
Objective parse_objective(const std::string& name);
TimeSampling parse_time_sampling(const std::string& name);

// Inverses of the parsers (for logs, configs and checkpoints).
std::string to_string(Objective objective);
std::string to_string(TimeSampling sampling);

}  // namespace perftrain::diffusion
