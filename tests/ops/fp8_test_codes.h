// What the fp8 tests share: the formats' codes decoded by hand (sign,
// exponent, mantissa: independent of ATen and cuda_fp8.h) and the encoding
// that is correct by definition: the nearest finite code to a value clamped
// to +-max, ties to the even code, the sign kept (also for zero).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/fp8_cast.h"

namespace perftrain::fp8_codes {

using kernels::Fp8Format;

struct Layout {
  int man_bits, bias;
};
inline Layout layout(Fp8Format f) { return f == Fp8Format::kE4M3 ? Layout{3, 7} : Layout{2, 15}; }

inline bool is_nan_code(uint8_t c, Fp8Format f) {
  const uint8_t mag = c & 0x7f;
  return f == Fp8Format::kE4M3 ? mag == 0x7f : mag > 0x7c;
}
inline bool is_inf_code(uint8_t c, Fp8Format f) { return f == Fp8Format::kE5M2 && (c & 0x7f) == 0x7c; }

inline double decode(uint8_t c, Fp8Format f) {
  if (is_nan_code(c, f)) return std::numeric_limits<double>::quiet_NaN();
  const double sign = (c & 0x80) ? -1.0 : 1.0;
  if (is_inf_code(c, f)) return sign * std::numeric_limits<double>::infinity();
  const Layout l = layout(f);
  const int e = (c & 0x7f) >> l.man_bits, m = c & ((1 << l.man_bits) - 1);
  const double frac = double(m) / double(1 << l.man_bits);
  return sign * (e == 0 ? std::ldexp(frac, 1 - l.bias) : std::ldexp(1.0 + frac, e - l.bias));
}

// The saturating round-to-nearest-even encoding of a non-NaN float.
inline uint8_t encode(float v, Fp8Format f) {
  const double max = kernels::fp8_max(f);
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const double a = std::fmin(std::fabs(double(v)), max);
  uint8_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 0x80; ++c) {  // magnitudes, increasing with the code
    const double d = decode(uint8_t(c), f);
    if (!std::isfinite(d)) continue;
    const double err = std::fabs(d - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = uint8_t(c);
      best_err = err;
    }
  }
  return best | sign;
}

}  // namespace perftrain::fp8_codes
