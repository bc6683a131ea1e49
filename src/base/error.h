// The two kinds of failure a user can meet, so that the program can exit with
// the right code and a one-line message instead of a stack dump:
//   UsageError   - the user asked for something invalid (bad option, unknown
//                  model, missing dataset): exit code 2.
//   RuntimeError - a well-formed request failed while running (corrupt file,
//                  out of memory, NaN loss): exit code 1.
#pragma once

#include <stdexcept>
#include <string>

namespace perftrain {

class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& what) : std::runtime_error(what) {}
};

class RuntimeError : public std::runtime_error {
 public:
  explicit RuntimeError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace perftrain
