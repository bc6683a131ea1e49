#include "io/atomic_file.h"

#include <gtest/gtest.h>

#include "base/error.h"
#include "support/test_support.h"

namespace perftrain::io {
namespace {

using perftrain::testing::error_of;
using perftrain::testing::read_raw;
using perftrain::testing::TempDir;

TEST(AtomicFile, WritesAndOverwrites) {
  TempDir dir;
  const std::string path = dir.file("a.txt");
  write_text_atomic(path, "first");
  EXPECT_EQ(read_raw(path), "first");
  write_text_atomic(path, "second, longer");
  EXPECT_EQ(read_raw(path), "second, longer");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"a.txt"});  // no temporary left behind
}

TEST(AtomicFile, FailedWriteKeepsOldFileAndRemovesTemp) {
  TempDir dir;
  const std::string path = dir.file("ckpt.bin");
  write_text_atomic(path, "good");
  const std::string msg = error_of<RuntimeError>([&] {
    write_file_atomic(path, [](std::FILE* f) {
      std::fputs("half", f);
      throw std::runtime_error("disk on fire");
    });
  });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("disk on fire"), std::string::npos) << msg;
  EXPECT_EQ(read_raw(path), "good");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt.bin"});
}

TEST(AtomicFile, PerftrainErrorsPassThroughUnchanged) {
  TempDir dir;
  const std::string msg = error_of<UsageError>([&] {
    write_file_atomic(dir.file("x"), [](std::FILE*) { throw UsageError("bad option"); });
  });
  EXPECT_EQ(msg, "bad option");
  EXPECT_TRUE(dir.entries().empty());
}

TEST(AtomicFile, MissingDirectoryNamesThePath) {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/file.txt");
  const std::string msg = error_of<RuntimeError>([&] { write_text_atomic(path, "x"); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

TEST(AtomicFile, DirectoryNameIsAUsageError) {
  TempDir dir;
  error_of<UsageError>([&] { write_text_atomic(dir.path() + "/", "x"); });
}

}  // namespace
}  // namespace perftrain::io
