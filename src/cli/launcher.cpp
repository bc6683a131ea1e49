#include "cli/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <thread>

#include "base/error.h"
#include "distributed/launch_env.h"

namespace perftrain::cli {
namespace {

volatile std::sig_atomic_t g_signal = 0, g_signals = 0;
extern "C" void on_signal(int sig) {
  g_signal = sig;
  g_signals = g_signals + 1;
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw RuntimeError("--nproc-per-node: cannot read /proc/self/exe");
  return std::string(buf, static_cast<size_t>(n));
}

std::string status_text(int status) {
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + std::to_string(WTERMSIG(status));
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace

std::vector<std::string> arguments_without_nproc() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t i = 0; i < all.size();) {
    const size_t end = all.find('\0', i);
    args.push_back(all.substr(i, end == std::string::npos ? std::string::npos : end - i));
    if (end == std::string::npos) break;
    i = end + 1;
  }
  std::vector<std::string> out;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--nproc-per-node") {
      ++i;  // and its value
      continue;
    }
    if (args[i].rfind("--nproc-per-node=", 0) == 0) continue;
    out.push_back(args[i]);
  }
  return out;
}

int launch_ranks(int nproc, const std::vector<std::string>& args) {
  const std::string exe = self_exe();
  const std::string port = std::to_string(distributed::free_loopback_port("--nproc-per-node"));
  struct sigaction sa {}, old_int, old_term;
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  std::vector<pid_t> pids(static_cast<size_t>(nproc), -1);
  std::vector<int> status(static_cast<size_t>(nproc), 0);
  const pid_t parent = ::getpid();
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw RuntimeError(std::string("--nproc-per-node: fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      ::setpgid(0, 0);                      // a terminal's Ctrl-C reaches the ranks through the launcher only
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);   // and a launcher that dies takes them along
      if (::getppid() != parent) ::_exit(1);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      const std::string rank = std::to_string(r);
      ::setenv("RANK", rank.c_str(), 1);
      ::setenv("LOCAL_RANK", rank.c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      std::vector<char*> argv{const_cast<char*>(exe.c_str())};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(exe.c_str(), argv.data());
      ::_exit(127);
    }
    pids[static_cast<size_t>(r)] = pid;
  }
  int running = nproc, failed = -1, forwarded = 0;
  auto signal_all = [&](int sig) {
    for (int r = 0; r < nproc; ++r)
      if (pids[static_cast<size_t>(r)] > 0) ::kill(pids[static_cast<size_t>(r)], sig);
  };
  while (running > 0) {
    while (forwarded < g_signals) {  // each signal to every rank, once
      ++forwarded;
      signal_all(g_signal);
    }
    int st = 0;
    const pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    for (int r = 0; r < nproc; ++r) {
      if (pids[static_cast<size_t>(r)] != pid) continue;
      pids[static_cast<size_t>(r)] = -1;
      status[static_cast<size_t>(r)] = st;
      --running;
      const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (!ok && failed < 0 && g_signals == 0) {
        failed = r;
        std::cerr << "perftrain: rank " << r << " of " << nproc << " " << status_text(st)
                  << "; stopping the other ranks\n";
        signal_all(SIGTERM);  // they stop after their step, or fail at the next all-reduce
      }
    }
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  if (failed >= 0) return std::max(1, exit_code(status[static_cast<size_t>(failed)]));
  return exit_code(status[0]);
}

void refuse_nproc_under_launcher() {
  if (distributed::launch_env().from_env)
    throw UsageError("--nproc-per-node starts the ranks itself: leave it out under torchrun or Slurm "
                     "(RANK, WORLD_SIZE, ... are set)");
}

}  // namespace perftrain::cli
