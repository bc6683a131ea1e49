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

TEST(AtomicDirectory, WholeOrNotAtAllAndReplacesOnlyItsOwnFiles) {
  TempDir dir;
  const std::string out = dir.file("export");
  auto fill = [](const std::string& text) {
    return [text](const std::string& tmp) {
      write_text_atomic(tmp + "/a.json", text);
      write_text_atomic(tmp + "/b.bin", text);
    };
  };
  write_directory_atomic(out, fill("one"));
  EXPECT_EQ(read_raw(out + "/a.json"), "one");
  // A fill that fails halfway leaves the earlier directory and no temporary.
  EXPECT_EQ(error_of<RuntimeError>([&] {
              write_directory_atomic(out, [](const std::string& tmp) {
                write_text_atomic(tmp + "/a.json", "half");
                throw RuntimeError("disk full");
              });
            }),
            "disk full");
  EXPECT_EQ(read_raw(out + "/a.json"), "one");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"export"});
  write_directory_atomic(out + "/", fill("two"));  // its own files: replaced
  EXPECT_EQ(read_raw(out + "/b.bin"), "two");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"export"});
  perftrain::testing::write_raw(out + "/notes.txt", "mine");
  const std::string msg = error_of<UsageError>([&] { write_directory_atomic(out, fill("three")); });
  EXPECT_NE(msg.find(out + " exists and holds other things"), std::string::npos) << msg;
  EXPECT_EQ(read_raw(out + "/a.json"), "two");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"export"});
  EXPECT_NO_THROW(check_directory_replaceable(dir.file("new"), {"a.json"}));
  EXPECT_THROW(check_directory_replaceable(dir.file("missing/new"), {"a.json"}), UsageError);
}

}  // namespace
}  // namespace perftrain::io
