// Waiting on a child process that a fault test started (a real process:
// signals, kills, a second trainer): its exit code, or 128 + the signal that
// ended it, with a limit after which the child is killed.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <chrono>
#include <thread>

namespace perftrain::testing {

// The exit code, or 128 + the signal that ended it; -1 after timeout_s (the
// process is then killed).
inline int wait_exit(pid_t pid, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > end) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace perftrain::testing
