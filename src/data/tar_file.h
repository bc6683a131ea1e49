// Tar archives as WebDataset writes them (Python's tarfile, GNU tar): the
// regular-file members of a ustar file with its pax ('x') and GNU long-name
// ('L') extensions, listed by reading the headers only; a member's bytes
// read later with pread. No compression (WebDataset shards are plain .tar).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace perftrain::data {

struct TarMember {
  std::string name;    // the path inside the archive
  int64_t offset = 0;  // its first data byte in the file
  int64_t size = 0;
};

// Regular files of the archive at `path`, in archive order. RuntimeError
// naming the file and the byte for a header whose checksum is wrong, a size
// field that is not a number, or a member that runs past the end of the file.
std::vector<TarMember> list_tar(const std::string& path);

// The bytes of one member (from list_tar). RuntimeError naming the file and
// member when they cannot be read (the file shrank).
std::vector<uint8_t> read_tar_member(const std::string& path, const TarMember& member);

// WebDataset's (the braceexpand package's) shard patterns:
// "shards-{000000..000009}.tar" counts (zero-padded to the wider bound when
// a bound has leading zeros; down as well as up), "{a,b}" lists, several
// braces multiply, and "::" separates patterns. UsageError for an
// unbalanced brace.
std::vector<std::string> expand_braces(const std::string& pattern);

}  // namespace perftrain::data
