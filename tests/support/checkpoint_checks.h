// Checkpoint files compared tensor by tensor (a resumed run against an
// uninterrupted one).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "io/safetensors.h"

namespace perftrain::testing {

// Every tensor of the two safetensors files equal, with the same names.
inline void expect_identical(const std::string& a, const std::string& b) {
  auto fa = io::SafetensorsFile::open(a), fb = io::SafetensorsFile::open(b);
  ASSERT_EQ(fa.names(), fb.names());
  for (const auto& n : fa.names()) EXPECT_TRUE(fa.get(n).equal(fb.get(n))) << a << " vs " << b << ": " << n;
}

}  // namespace perftrain::testing
