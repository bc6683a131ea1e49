// SIGINT, SIGTERM, SIGHUP and SIGPIPE during a training run (Ctrl-C,
// preemption, a closed terminal or SSH session, stdout piped into a `head`
// that has exited). While a StopSignals is alive, the first of them only sets
// a flag: the trainer checks it between steps, lets the current step finish,
// writes a checkpoint and the report, and the program exits 128 + the signal
// (130, 143, 129, 141). A second one (SIGPIPE aside: the closed output's
// writes only fail with EPIPE) ends the process at once with that code;
// checkpoints are written into a temporary directory and renamed into place,
// so an exit in the middle of a save leaves no partial step directory
// (train/checkpoint.h).
#pragma once

namespace perftrain::train {

class StopSignals {
 public:
  // Installs the handlers for SIGINT, SIGTERM, SIGHUP and SIGPIPE
  // (SA_RESTART, so that a blocking read or write in progress goes on) and
  // clears the flag. A signal ignored when this is called (nohup's SIGHUP, a
  // script's background job's SIGINT) stays ignored.
  StopSignals();
  // Restores the handlers that were there before (SIGPIPE stays ignored
  // once it was received).
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received (SIGINT, SIGTERM, SIGHUP or SIGPIPE), 0 while none.
  int received() const;
};

// "SIGINT", "SIGTERM", "SIGHUP", "SIGPIPE", or "a signal".
const char* stop_signal_name(int sig);

}  // namespace perftrain::train
