// The torch.save files of tests/support/make_torch_files.py, made by PyTorch
// once per build tree and kept beside the program (importing torch takes
// seconds, and ctest runs each test in a process of its own): the first test
// that needs them writes them into a temporary directory and renames it into
// place, so a test running beside it never sees half of them.
#pragma once

#include <unistd.h>

#include <string>

#include "support/test_support.h"

namespace perftrain::testing {

inline std::string make_torch_files_script() { return std::string(PERFTRAIN_SOURCE_DIR) + "/tests/support/make_torch_files.py"; }

// The directory with the small files (state_dict.pt, system.pt, ...).
inline std::string torch_files_dir() {
  const std::string binary = PERFTRAIN_BINARY;
  // Named by the script's size and modification time: an edited script makes new files.
  struct stat st {};
  ::stat(make_torch_files_script().c_str(), &st);
  const std::string dir = binary.substr(0, binary.rfind('/')) + "/test_data/torch_files." +
                          std::to_string(st.st_size) + "." + std::to_string(st.st_mtime);
  if (fs::is_directory(dir)) return dir;
  fs::create_directories(fs::parent_path(dir));
  const std::string tmp = dir + ".tmp." + std::to_string(::getpid());
  fs::create_directories(tmp);
  const int code = run_command("'" + std::string(PERFTRAIN_PYTHON) + "' '" + make_torch_files_script() + "' '" + tmp + "'");
  if (code != 0) throw std::runtime_error("make_torch_files.py failed with exit code " + std::to_string(code));
  if (::rename(tmp.c_str(), dir.c_str()) != 0) fs::remove_tree(tmp);  // another test made them first
  return dir;
}

// What system.pt's object would create if anything ran it.
inline std::string system_pt_marker() { return fs::parent_path(torch_files_dir()) + "/ran-by-system.pt"; }

// A facebookresearch/DiT-shaped state dict of random tensors, written into `dir` as dit.pt.
inline std::string make_dit_pt(const std::string& dir, int depth, int hidden, int patch, int image, int classes,
                               bool learn_sigma) {
  const std::string args = " --dit " + std::to_string(depth) + " " + std::to_string(hidden) + " " +
                           std::to_string(patch) + " " + std::to_string(image) + " " + std::to_string(classes) +
                           (learn_sigma ? " 1" : " 0");
  const int code = run_command("'" + std::string(PERFTRAIN_PYTHON) + "' '" + make_torch_files_script() + "' '" + dir +
                               "'" + args);
  if (code != 0) throw std::runtime_error("make_torch_files.py --dit failed with exit code " + std::to_string(code));
  return dir + "/dit.pt";
}

}  // namespace perftrain::testing
