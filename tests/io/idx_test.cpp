#include "io/idx.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <fstream>
#include <functional>

#include "base/error.h"
#include "support/test_support.h"

namespace perftrain::io {
namespace {

using perftrain::testing::error_of;
using perftrain::testing::TempDir;
using perftrain::testing::write_raw;

std::string idx_bytes(const std::vector<uint32_t>& dims, const std::string& data, uint8_t type = 0x08) {
  std::string out = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>(d >> s));
  }
  return out + data;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile gz = gzopen(path.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(gz), Z_OK);
}

std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 7 + 3);
  return s;
}

void expect_pattern(const IdxArray& a, std::vector<int64_t> dims) {
  EXPECT_EQ(a.dims, dims);
  const std::string p = pattern(a.data.size());
  ASSERT_EQ(a.data.size(), p.size());
  EXPECT_TRUE(std::equal(a.data.begin(), a.data.end(), reinterpret_cast<const uint8_t*>(p.data())));
}

TEST(Idx, ReadsRaw) {
  TempDir dir;
  write_raw(dir.file("a"), idx_bytes({3, 4, 5}, pattern(60)));
  expect_pattern(read_idx(dir.file("a")), {3, 4, 5});
}

TEST(Idx, ReadsGzip) {
  TempDir dir;
  write_gz(dir.file("a.gz"), idx_bytes({1000, 28, 28}, pattern(1000 * 28 * 28)));
  expect_pattern(read_idx(dir.file("a.gz")), {1000, 28, 28});
}

TEST(Idx, ReadsEmptyDimension) {
  TempDir dir;
  write_raw(dir.file("a"), idx_bytes({0}, ""));
  EXPECT_EQ(read_idx(dir.file("a")).dims, std::vector<int64_t>{0});
}

// Each bad file fails with a RuntimeError naming it and the listed phrases.
void expect_corrupt(const std::string& path, const std::vector<std::string>& phrases) {
  const std::string msg = error_of<RuntimeError>([&] { read_idx(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  for (const auto& p : phrases) EXPECT_NE(msg.find(p), std::string::npos) << "want '" << p << "' in: " << msg;
}

TEST(Idx, MissingFile) {
  TempDir dir;
  expect_corrupt(dir.file("nope"), {"no such file"});
}

TEST(Idx, BadMagic) {
  TempDir dir;
  write_raw(dir.file("a"), "\x01\x02\x08\x01\0\0\0\0");
  expect_corrupt(dir.file("a"), {"bad idx magic", "01 02"});
}

TEST(Idx, UnsupportedType) {
  TempDir dir;
  write_raw(dir.file("a"), idx_bytes({2}, std::string(8, 'x'), 0x0D));
  expect_corrupt(dir.file("a"), {"unsupported", "0x0d"});
}

TEST(Idx, TruncatedHeader) {
  TempDir dir;
  write_raw(dir.file("a"), idx_bytes({2, 2, 2}, "").substr(0, 9));
  expect_corrupt(dir.file("a"), {"truncated", "16-byte header", "found 9"});
  write_raw(dir.file("b"), std::string("\0\0", 2));
  expect_corrupt(dir.file("b"), {"truncated", "found 2"});
}

TEST(Idx, TruncatedData) {
  TempDir dir;
  write_raw(dir.file("a"), idx_bytes({10, 10}, pattern(64)));
  expect_corrupt(dir.file("a"), {"truncated", "expected 100", "found 64"});
  write_gz(dir.file("b.gz"), idx_bytes({10, 10}, pattern(64)));
  expect_corrupt(dir.file("b.gz"), {"truncated", "expected 100", "found 64", "decompressed"});
}

TEST(Idx, TrailingGarbage) {
  TempDir dir;
  write_raw(dir.file("a"), idx_bytes({4}, pattern(4) + "junk!"));
  expect_corrupt(dir.file("a"), {"trailing garbage", "5 bytes", "byte 12"});
}

TEST(Idx, CutGzipStream) {
  TempDir dir;
  write_gz(dir.file("a.gz"), idx_bytes({100, 100}, pattern(10000)));
  const std::string whole = perftrain::testing::read_raw(dir.file("a.gz"));
  write_raw(dir.file("a.gz"), whole.substr(0, whole.size() / 2));
  expect_corrupt(dir.file("a.gz"), {"gzip"});
}

// The exit code of f run in a child process whose address space may grow by
// at most extra_bytes: 0 when f returned, 1 when it threw the RuntimeError
// that names path, 2 for std::bad_alloc, 3 for anything else.
int exit_code_with_memory_limit(const std::string& path, size_t extra_bytes, const std::function<void()>& f) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    size_t pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t limit = pages * static_cast<size_t>(::sysconf(_SC_PAGESIZE)) + extra_bytes;
    const struct rlimit rl{limit, limit};
    ::setrlimit(RLIMIT_AS, &rl);
    int code = 0;
    try {
      f();
    } catch (const RuntimeError& e) {
      code = std::string(e.what()).find(path) == std::string::npos ? 3 : 1;
    } catch (const std::bad_alloc&) {
      code = 2;
    } catch (...) {
      code = 3;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A gzip bomb: a 4-byte idx array, then 512 MiB of zeros (as 512 gzip members
// of 1 MiB each, about 1 MB on disk). With 64 MiB to spare the read fails on
// the first byte past the announced data, where it used to inflate all of it.
TEST(Idx, GzipBombStopsAtTheAnnouncedSize) {
  TempDir dir;
  write_gz(dir.file("head.gz"), idx_bytes({4}, pattern(4)));
  write_gz(dir.file("zeros.gz"), std::string(1 << 20, '\0'));
  std::string bomb = perftrain::testing::read_raw(dir.file("head.gz"));
  const std::string zeros = perftrain::testing::read_raw(dir.file("zeros.gz"));
  for (int i = 0; i < 512; ++i) bomb += zeros;
  const std::string path = dir.file("train-images-idx3-ubyte.gz");
  write_raw(path, bomb);
  EXPECT_EQ(exit_code_with_memory_limit(path, size_t(64) << 20, [&] { read_idx(path); }), 1);
  expect_corrupt(path, {"trailing garbage", "past the 4 data bytes its header announces", "from byte 12"});
}

TEST(Idx, HeaderAnnouncingMoreThanTheMaximumIsRefusedBeforeReading) {
  TempDir dir;
  write_gz(dir.file("a.gz"), idx_bytes({0x10000, 0x10000, 2}, pattern(16)));
  expect_corrupt(dir.file("a.gz"), {"announce more than 4294967296 data bytes"});
}

// A corrupt file's name is echoed as printable text.
TEST(Idx, NamesAFileWithControlCharactersPrintably) {
  TempDir dir;
  const std::string msg = error_of<RuntimeError>([&] { read_idx(dir.file("a\x1b[2J")); });
  EXPECT_NE(msg.find("a\\x1b[2J: no such file"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg;
}

}  // namespace
}  // namespace perftrain::io
