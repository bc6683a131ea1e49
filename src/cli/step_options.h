// The options `perftrain bench` and `perftrain profile` share, added once so
// that both spell and check them the same: --model, --batch-size (also
// --batch), --image-size, --in-channels, --num-classes, --precision,
// --device, --seed, --set, --out. Their defaults are the struct's values
// when the options are added.
#pragma once

#include <string>

#include "train/bench/step_setup.h"

namespace CLI {
class App;
}

namespace perftrain::cli {

// kind: "bench" or "profile", for the help of --batch-size and --out.
void add_step_options(CLI::App* cmd, train::bench::StepSetup& s, const std::string& kind);

// s.out, or runs/<kind>-<model>-<date> when it is empty.
std::string out_dir_or_default(const train::bench::StepSetup& s, const std::string& kind);

}  // namespace perftrain::cli
