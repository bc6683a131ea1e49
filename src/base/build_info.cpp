#include "base/build_info.h"

// src/CMakeLists.txt defines these for this file alone.
#ifndef PERFTRAIN_BUILD_PYTHON
#define PERFTRAIN_BUILD_PYTHON ""
#endif
#ifndef PERFTRAIN_BUILD_SOURCE_DIR
#define PERFTRAIN_BUILD_SOURCE_DIR ""
#endif
#ifndef PERFTRAIN_BUILD_COMMIT
#define PERFTRAIN_BUILD_COMMIT ""
#endif

namespace perftrain::base {

std::string build_python() { return PERFTRAIN_BUILD_PYTHON; }
std::string build_source_dir() { return PERFTRAIN_BUILD_SOURCE_DIR; }
std::string build_commit() { return PERFTRAIN_BUILD_COMMIT; }

}  // namespace perftrain::base
