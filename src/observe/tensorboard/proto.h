// Protocol-buffer wire format, the few pieces TensorBoard's Event, Summary
// and the plugins' messages need (little-endian hosts only: x86-64, aarch64).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace perftrain::observe::tensorboard::proto {

inline void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
inline void put_tag(std::string& out, int field, int wire_type) { put_varint(out, (uint64_t(field) << 3) | wire_type); }
inline void put_fixed(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
inline void put_double(std::string& out, int field, double v) {
  put_tag(out, field, 1);
  put_fixed(out, &v, 8);
}
inline void put_float(std::string& out, int field, float v) {
  put_tag(out, field, 5);
  put_fixed(out, &v, 4);
}
inline void put_int(std::string& out, int field, int64_t v) {
  put_tag(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));
}
// A string, bytes or an embedded message.
inline void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}
inline void put_packed_doubles(std::string& out, int field, const std::vector<double>& v) {
  put_tag(out, field, 2);
  put_varint(out, v.size() * 8);
  for (double d : v) put_fixed(out, &d, 8);
}

}  // namespace perftrain::observe::tensorboard::proto
