// Runs a Python script given as text with the build's Python
// (PERFTRAIN_PYTHON), for tests that compare with a Python library's result.
// A script exits kPythonSkip where the library is not installed; the test then skips.
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

// run_python_script after a prologue that exits kPythonSkip where
// pytorch-fid (with torchvision and scipy) is not installed.
inline CommandResult run_pytorch_fid_script(const TempDir& dir, const std::string& script, const std::string& args) {
  return run_python_script(dir,
                           "import sys\ntry:\n    import pytorch_fid, torchvision, scipy\nexcept ImportError:\n"
                           "    sys.exit(77)\n" + script,
                           args);
}

}  // namespace perftrain::testing
