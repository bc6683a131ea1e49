// Image inputs made for the tests: PNGs with a pattern that encodes (seed,
// position) and is not left-right symmetric, image folders of them, and
// ustar tar members (WebDataset shards) written byte by byte.
#pragma once

#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "io/png.h"

namespace perftrain::testing {

// w x h pixels of `channels`, row-major, encoding (seed, position).
inline std::vector<uint8_t> image_pattern(int w, int h, int channels, int seed) {
  std::vector<uint8_t> p(static_cast<size_t>(w) * h * channels);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>((i * 37 + seed * 101 + i / channels % w * 7) % 251);
  return p;
}

inline void write_pattern_png(const std::string& path, int w, int h, int channels, int seed) {
  const auto p = image_pattern(w, h, channels, seed);
  io::save_png(path, p.data(), w, h, channels);
}

// root/<class>/<i>.png for the classes given, `per_class` RGB images each of
// assorted odd sizes from 9x9 to 31x27.
inline void write_image_folder(const std::string& root, const std::vector<std::string>& classes, int per_class) {
  ::mkdir(root.c_str(), 0777);
  int seed = 0;
  for (const std::string& c : classes) {
    ::mkdir((root + "/" + c).c_str(), 0777);
    for (int i = 0; i < per_class; ++i, ++seed)
      write_pattern_png(root + "/" + c + "/" + std::to_string(i) + ".png", 9 + (seed * 7) % 23, 9 + (seed * 5) % 19, 3,
                        seed);
  }
}

// One ustar member: its header (checksum filled in) and data padded to 512.
inline std::string tar_member(const std::string& name, const std::string& data) {
  std::string h(512, '\0');
  std::memcpy(&h[0], name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(&h[100], 8, "%07o", 0644);
  std::snprintf(&h[108], 8, "%07o", 0);
  std::snprintf(&h[116], 8, "%07o", 0);
  std::snprintf(&h[124], 12, "%011lo", static_cast<unsigned long>(data.size()));
  std::snprintf(&h[136], 12, "%011o", 0);
  h[156] = '0';
  std::memcpy(&h[257], "ustar", 6);
  std::memcpy(&h[263], "00", 2);
  std::memset(&h[148], ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(&h[148], 8, "%06o", sum);
  std::string padded = data;
  padded.resize((data.size() + 511) / 512 * 512, '\0');
  return h + padded;
}

// The two zero blocks that end an archive.
inline std::string tar_end() { return std::string(1024, '\0'); }

}  // namespace perftrain::testing
