// What CMake knew when this program was built, the one place src/ reads it
// (nothing of it comes from the environment at run time):
//  - build_python: the Python with torch the build was configured with
//    (PERFTRAIN_PYTHON), the default of bench's --python and the W&B sidecar's;
//  - build_source_dir: the checkout it was built from (bench/ and tools/
//    scripts are found there when the program is not in <checkout>/build/);
//  - build_commit: PERFTRAIN_BUILD_COMMIT when it was given (a copy whose git
//    metadata may be stale, as on the GPU machine: tools/gpu_run.sh passes
//    it), else "" (ask git at run time).
#pragma once

#include <string>

namespace perftrain::base {

std::string build_python();
std::string build_source_dir();
std::string build_commit();

}  // namespace perftrain::base
