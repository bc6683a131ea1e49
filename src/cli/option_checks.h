// The CLI11 checks every command uses for the same kind of value, so that
// the same mistake reads the same everywhere ("--cooldown: nan is not a
// finite number from 0 to 3600").
//  - integer_in: CLI11 turns a number that does not fit the option's type
//    into its largest value without a word, so a value is checked as text
//    first ("--classes: 99999999999999999999 is not an integer from 1 to 65536").
//  - finite_in: every floating option; NaN and infinities are refused (they
//    pass comparisons such as x >= 0 and would reach a sleep or a loop).
//  - boolean_text: the value of a true/false option, one of a few words.
//  - known_model: a model name of the registry (models/dit_config.h), every
//    family's names listed when it is not one.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "base/text.h"
#include "models/dit_config.h"

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

// hi may be INFINITY: no upper bound.
inline CLI::Validator finite_in(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& v) -> std::string {
        size_t used = 0;
        double x = NAN;
        try {
          x = std::stod(v, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == v.size() && !v.empty() && std::isfinite(x) && x >= lo && x <= hi) return "";
        std::ostringstream range;
        range << lo;
        if (std::isfinite(hi)) range << " to " << hi;
        else range << " up";
        return v + " is not a finite number from " + range.str();
      },
      "");
}


// A path or name the program echoes: printable text only (no terminal
// escape sequences, valid UTF-8).
inline CLI::Validator printable_text() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        if (base::is_printable(v)) return "";
        return "'" + base::printable(v) + "' holds control characters or bytes that are not UTF-8";
      },
      "");
}

// A true/false option's value: one of the words CLI11 reads as a boolean
// (anything else, a newline included, is refused rather than read or echoed).
inline CLI::Validator boolean_text() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        for (const char* w : {"true", "false", "on", "off", "yes", "no", "1", "0"})
          if (v == w) return "";
        return "'" + base::printable(v) + "' is not true or false (true, false, on, off, yes, no, 1, 0)";
      },
      "");
}

inline CLI::Validator known_model() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        std::string list;
        for (const auto& n : models::model_names()) {
          if (n == v) return "";
          list += " " + n;
        }
        return "unknown model '" + v + "'; known models:" + list;
      },
      "");
}

}  // namespace perftrain::cli
