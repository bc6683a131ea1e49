// Helpers shared by the tests: a temporary directory that cleans
// itself up, raw file writing, and catching an error of one exact type.
// No std::filesystem here: libtorch 2.11 exports its own copies of some of its
// functions, and remove_all from there crashes (calls a null pointer).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

#include "base/fs.h"

namespace perftrain::testing {

// Whether `part` occurs in s (a report, a log, an error).
inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every one of `present` occurs in text and none of `absent` (a report, a
// DOT graph); a failure names the part and shows the text.
inline void expect_text(const std::string& text, std::initializer_list<std::string> present,
                        std::initializer_list<std::string> absent = {}) {
  for (const std::string& p : present) EXPECT_TRUE(contains(text, p)) << "missing \"" << p << "\" in:\n" << text;
  for (const std::string& a : absent) EXPECT_FALSE(contains(text, a)) << "unexpected \"" << a << "\" in:\n" << text;
}

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/perftrain-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() { fs::remove_tree(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Names of everything in the directory (to spot leftover temporary files).
  std::vector<std::string> entries() const { return fs::list_directory(path_); }
  void mkdir(const std::string& name) const { ::mkdir(file(name).c_str(), 0777); }

 private:
  std::string path_;
};

// Runs a shell command line (so that it can set environment variables) and
// returns its exit code (-1 if it did not exit normally) and its stdout and
// stderr together.
struct CommandResult {
  int code = -1;
  std::string output;
};
inline CommandResult run_shell(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.output.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

inline std::string read_raw(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Runs f and returns the message of the exception of type E it throws; any
// other outcome fails the test (and returns ""). PERFTRAIN_PRINT_ERRORS=1
// prints each message, to review what users would read.
template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    if (std::getenv("PERFTRAIN_PRINT_ERRORS") != nullptr) std::fprintf(stderr, "    error: %s\n", e.what());
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

// Exit status of a shell command (-1 when it did not exit normally).
inline int run_command(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace perftrain::testing
