#include "base/text.h"

#include <cstdint>
#include <cstdio>

namespace perftrain::base {
namespace {

// The length of the printable UTF-8 character at s[i], or 0 when the byte
// there must be escaped.
size_t printable_char_length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b = byte(i);
  if (b >= 0x20 && b < 0x7f) return 1;
  if (b < 0xc2 || b > 0xf4) return 0;  // controls, DEL, continuation bytes, overlong 2-byte leads, above U+10FFFF
  const size_t n = b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
  if (i + n > s.size()) return 0;
  uint32_t cp = b & (0xff >> (n + 1));
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3f);
  }
  const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < smallest[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;  // overlong, range, surrogates
  if (cp >= 0x80 && cp <= 0x9f) return 0;                                            // C1 controls
  return n;
}

}  // namespace

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (const size_t n = printable_char_length(s, i)) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned>(static_cast<uint8_t>(s[i])));
    out += hex;
    ++i;
  }
  return out;
}

bool is_printable(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = printable_char_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace perftrain::base
