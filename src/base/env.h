// The PERFTRAIN_* environment switches: each compares one implementation
// choice with its alternative on a GPU (docs/guide/speed.md lists them). The
// callers read them once, at first use, and keep the value.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace perftrain {

// Whether environment variable `name` is set to exactly `value`.
inline bool env_equals(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// The non-negative integer in `name`, or `fallback` when it is unset
// (a value that is not a number reads as 0).
inline int env_count(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : std::max(0, std::atoi(v));
}

// Whether `value` (switch `name`'s value, nullptr when unset) picks our own
// implementation over cuDNN's: unset or "own" does, "cudnn" does not; any
// other value throws std::invalid_argument, so that a misspelling is an
// error instead of a silent default.
inline bool own_or_cudnn(const char* name, const char* value) {
  const std::string v = value == nullptr ? "own" : value;
  if (v != "own" && v != "cudnn")
    throw std::invalid_argument(std::string(name) + " must be own or cudnn, not '" + v + "'");
  return v == "own";
}

}  // namespace perftrain
