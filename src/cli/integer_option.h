// A CLI11 check for integer options: CLI11 turns a number that does not fit
// the option's type into its largest value without a word, so a value is
// checked as text first ("--classes: 99999999999999999999 is not an integer
// from 1 to 65536").
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace perftrain::cli {

inline CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& v) -> std::string {
        size_t used = 0;
        long long n = 0;
        try {
          n = std::stoll(v, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == v.size() && !v.empty() && n >= lo && n <= hi) return "";
        return v + " is not an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
      },
      lo == 1 ? "POSITIVE" : lo == 0 ? "NONNEGATIVE" : "");  // --help: INT:POSITIVE=8, as CLI::PositiveNumber
}

}  // namespace perftrain::cli
