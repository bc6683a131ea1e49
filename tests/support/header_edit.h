// Editing a safetensors file's header in place, as a user or a tool might:
// what the header checksum must catch (tests of io/safetensors and of the
// checkpoints through the program).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "support/test_support.h"

namespace perftrain::testing {

// Replaces the first `from` by `to` (of the same length, so that nothing
// moves) inside the header of the safetensors file at `path`.
inline void edit_header(const std::string& path, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  std::string bytes = read_raw(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in " << path;
  ASSERT_LT(at, 8 + n) << from << " is not in the header of " << path;
  bytes.replace(at, from.size(), to);
  write_raw(path, bytes);
}

}  // namespace perftrain::testing
