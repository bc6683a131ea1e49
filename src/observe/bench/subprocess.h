// Running a helper program (nvidia-smi, git, the PyTorch reference) through
// the shell and keeping what it printed: popen, because the bench only needs
// stdout back and the exit status, and stderr can go to a file.
#pragma once

#include <string>

namespace perftrain::observe::bench {

struct CommandOutput {
  bool ok = false;     // started and exited with status 0
  int exit_code = -1;  // -1: did not start or did not exit normally
  std::string out;     // stdout
};

// Runs `command` with /bin/sh. stderr is appended to `stderr_path` when
// given, else dropped.
CommandOutput run_command_capture(const std::string& command, const std::string& stderr_path = "");

// `text` as one word for a POSIX shell: 'it'\''s'.
std::string shell_quote(const std::string& text);

}  // namespace perftrain::observe::bench
