#include "observe/bench/subprocess.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>

namespace perftrain::observe::bench {

std::string shell_quote(const std::string& text) {
  std::string q = "'";
  for (char c : text) {
    if (c == '\'') q += "'\\''";
    else q += c;
  }
  return q + "'";
}

CommandOutput run_command_capture(const std::string& command, const std::string& stderr_path) {
  CommandOutput r;
  const std::string full =
      "(" + command + ") 2>>" + (stderr_path.empty() ? std::string("/dev/null") : shell_quote(stderr_path));
  std::fflush(nullptr);  // a child must not inherit and re-flush our buffered output
  FILE* p = popen(full.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) r.out.append(buf.data(), n);
  const int status = pclose(p);
  if (status != -1 && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  r.ok = r.exit_code == 0;
  return r;
}

}  // namespace perftrain::observe::bench
