// `perftrain convert SOURCE --to looped` (train/looped_convert_driver.h):
// its options, parsed here and handed to the driver. Registered for now as
// the command `convert-looped`; `perftrain convert`'s --to looped calls
// run_convert_looped with the same options.
#pragma once

#include <string>
#include <vector>

#include "train/looped_convert_driver.h"

namespace CLI {
class App;
}

namespace perftrain::cli {

// The options of a looped conversion on `cmd` (SOURCE positional, --out,
// --weights, --shared, --set, --seed), filled into `o`.
void add_convert_looped_options(CLI::App* cmd, train::LoopedConvertOptions& o);

// Runs the conversion, printing to stdout; 0 (errors are thrown as
// UsageError / RuntimeError, which main turns into a line and an exit code).
int run_convert_looped(const train::LoopedConvertOptions& o);

}  // namespace perftrain::cli
