#include "train/signals.h"

#include <signal.h>
#include <unistd.h>

#include <csignal>

namespace perftrain::train {
namespace {

volatile std::sig_atomic_t g_received = 0;
// The signals that stop a run, and the handlers they had before.
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
constexpr int kCount = sizeof kStopSignals / sizeof kStopSignals[0];
struct sigaction g_previous[kCount];

// Async-signal-safe only: a flag, write(2) and _exit(2).
extern "C" void on_stop_signal(int sig) {
  // A closed stdout raises SIGPIPE at every write after the first: those
  // writes fail with EPIPE instead, and only the first stops the run.
  if (sig == SIGPIPE && g_received != 0) return;
  if (g_received != 0) {
    static const char again[] = "\nperftrain: second signal: exiting now\n";
    (void)!::write(STDERR_FILENO, again, sizeof again - 1);
    ::_exit(128 + sig);
  }
  g_received = sig;
  static const char first[] =
      "\nperftrain: finishing this step, then saving a checkpoint and the report (signal again to exit now)\n";
  (void)!::write(STDERR_FILENO, first, sizeof first - 1);
}

}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int i = 0; i < kCount; ++i) {
    ::sigaction(kStopSignals[i], nullptr, &g_previous[i]);
    // Ignored when the program started (nohup, a background job of a
    // script): it stays ignored, as the one who started the run asked.
    if (g_previous[i].sa_handler != SIG_IGN) ::sigaction(kStopSignals[i], &sa, nullptr);
  }
}

StopSignals::~StopSignals() {
  for (int i = 0; i < kCount; ++i) ::sigaction(kStopSignals[i], &g_previous[i], nullptr);
  // The output is closed: the last words (flushing stdout) must fail, not kill.
  if (g_received == SIGPIPE) ::signal(SIGPIPE, SIG_IGN);
}

int StopSignals::received() const { return g_received; }

const char* stop_signal_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    case SIGPIPE:
      return "SIGPIPE";
    default:
      return "a signal";
  }
}

}  // namespace perftrain::train
