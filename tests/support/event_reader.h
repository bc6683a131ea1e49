// A reader for the TensorBoard event files observe/tensorboard writes, for
// the tests: TFRecord framing with both CRCs computed bit by bit (not
// through base/crc32c), and a protobuf decoder for Event, Summary.Value,
// HistogramProto and Image.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/fs.h"

namespace perftrain::testing::event_reader {

inline uint32_t crc32c_bitwise(const std::string& s) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : s) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}
inline uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A protobuf message as field number -> raw values (varints as numbers,
// fixed64/fixed32 and length-delimited as bytes).
struct Field {
  int wire = 0;
  uint64_t varint = 0;
  std::string bytes;
};
using Message = std::multimap<int, Field>;

inline uint64_t get_varint(const std::string& s, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    if (i >= s.size()) throw std::runtime_error("varint runs past the end");
    const auto b = static_cast<unsigned char>(s[i++]);
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

inline Message decode(const std::string& s) {
  Message m;
  size_t i = 0;
  while (i < s.size()) {
    const uint64_t key = get_varint(s, i);
    Field f;
    f.wire = int(key & 7);
    const size_t n = f.wire == 1 ? 8 : f.wire == 5 ? 4 : 0;
    if (f.wire == 0) {
      f.varint = get_varint(s, i);
    } else if (f.wire == 2) {
      const uint64_t len = get_varint(s, i);
      if (i + len > s.size()) throw std::runtime_error("field runs past the end");
      f.bytes = s.substr(i, len);
      i += len;
    } else if (n) {
      if (i + n > s.size()) throw std::runtime_error("fixed field runs past the end");
      f.bytes = s.substr(i, n);
      i += n;
    } else {
      throw std::runtime_error("unexpected wire type " + std::to_string(f.wire));
    }
    m.emplace(int(key >> 3), f);
  }
  return m;
}

inline const Field& one(const Message& m, int field) {
  EXPECT_EQ(m.count(field), 1u) << "field " << field;
  auto it = m.find(field);
  if (it == m.end()) throw std::runtime_error("missing field " + std::to_string(field));
  return it->second;
}
inline double as_double(const Field& f) {
  EXPECT_EQ(f.wire, 1);
  double d;
  std::memcpy(&d, f.bytes.data(), 8);
  return d;
}
inline float as_float(const Field& f) {
  EXPECT_EQ(f.wire, 5);
  float x;
  std::memcpy(&x, f.bytes.data(), 4);
  return x;
}
inline std::vector<double> as_doubles(const Field& f) {
  EXPECT_EQ(f.wire, 2);
  EXPECT_EQ(f.bytes.size() % 8, 0u);
  std::vector<double> v(f.bytes.size() / 8);
  std::memcpy(v.data(), f.bytes.data(), f.bytes.size());
  return v;
}

// Splits a file's bytes into records; "" or the first framing/CRC fault.
inline std::string split_records(const std::string& s, std::vector<std::string>& out) {
  size_t i = 0;
  while (i < s.size()) {
    const std::string at = "record " + std::to_string(out.size()) + ": ";
    if (i + 12 > s.size()) return at + "truncated header";
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, s.data() + i, 8);
    std::memcpy(&len_crc, s.data() + i + 8, 4);
    if (len_crc != masked(crc32c_bitwise(s.substr(i, 8)))) return at + "length CRC";
    if (i + 12 + len + 4 > s.size()) return at + "truncated data";
    const std::string data = s.substr(i + 12, len);
    std::memcpy(&data_crc, s.data() + i + 12 + len, 4);
    if (data_crc != masked(crc32c_bitwise(data))) return at + "data CRC";
    out.push_back(data);
    i += 12 + len + 4;
  }
  return "";
}

inline std::vector<std::string> read_records(const std::string& path) {
  std::vector<std::string> out;
  const std::string fault = split_records(read_all(path), out);
  if (!fault.empty()) throw std::runtime_error(path + ": " + fault);
  return out;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::string tag;
  Message value;  // the one Summary.Value
};

inline std::vector<Event> read_events(const std::string& path) {
  std::vector<Event> out;
  for (const std::string& rec : read_records(path)) {
    const Message m = decode(rec);
    Event e;
    e.wall_time = as_double(one(m, 1));
    if (m.count(2)) e.step = int64_t(one(m, 2).varint);
    if (m.count(3)) e.file_version = one(m, 3).bytes;
    if (m.count(5)) {
      const Message summary = decode(one(m, 5).bytes);
      e.value = decode(one(summary, 1).bytes);
      e.tag = one(e.value, 1).bytes;
    }
    out.push_back(e);
  }
  return out;
}

inline std::string only_event_file(const std::string& dir) {
  const auto names = fs::list_directory(dir);
  EXPECT_EQ(names.size(), 1u);
  return dir + "/" + names.at(0);
}

// The scalar value of an event (Summary.Value.simple_value).
inline float scalar_of(const Event& e) { return as_float(one(e.value, 2)); }

}  // namespace perftrain::testing::event_reader
