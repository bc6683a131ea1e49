// Runs a Python script given as text with the build's Python
// (PERFTRAIN_PYTHON), for tests that compare with a Python library's result.
// A script exits 77 where the library is not installed; the test then skips.
#pragma once

#include <string>

#include "support/test_support.h"

namespace perftrain::testing {

inline CommandResult run_python_script(const TempDir& dir, const std::string& script, const std::string& args) {
  const std::string path = dir.file("script.py");
  write_raw(path, script);
  return run_shell(std::string("'") + PERFTRAIN_PYTHON + "' '" + path + "' " + args);
}

constexpr int kPythonSkip = 77;

}  // namespace perftrain::testing
