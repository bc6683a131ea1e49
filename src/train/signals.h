// SIGINT, SIGTERM and SIGHUP during a training run (Ctrl-C, preemption, a
// closed terminal or SSH session). While a StopSignals is alive, the first of
// them only sets a flag: the trainer checks it between steps, lets the
// current step finish, writes a checkpoint and the report, and the program
// exits 128 + the signal (130, 143, 129). A second
// one ends the process at once with that code; checkpoints are written into a
// temporary directory and renamed into place, so an exit in the middle of a
// save leaves no partial step directory (train/checkpoint.h).
#pragma once

namespace perftrain::train {

class StopSignals {
 public:
  // Installs the handlers for SIGINT, SIGTERM and SIGHUP (SA_RESTART, so
  // that a blocking read or write in progress goes on) and clears the flag.
  StopSignals();
  // Restores the handlers that were there before.
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received (SIGINT, SIGTERM or SIGHUP), 0 while none.
  int received() const;
};

// "SIGINT", "SIGTERM", "SIGHUP", or "a signal".
const char* stop_signal_name(int sig);

}  // namespace perftrain::train
