// perftrain train --nproc-per-node N: this program started N times on this
// host as ranks 0..N-1 of one data-parallel run (RANK, LOCAL_RANK,
// WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT a free port), the way
// torchrun --no-python would. SIGINT/SIGTERM are passed on to every rank (they
// run in process groups of their own, so a terminal's Ctrl-C reaches them
// once, through here); when a rank fails the others are stopped.
#pragma once

#include <string>
#include <vector>

namespace perftrain::cli {

// Runs the ranks with `args` (argv without the program, --nproc-per-node
// removed) and returns the exit code: 0 when every rank exited 0; rank 0's
// code when a signal stopped them (130, 143); else the first failed rank's
// code, after a line on stderr naming it.
int launch_ranks(int nproc, const std::vector<std::string>& args);

// UsageError when this process is already a rank (torchrun's or Slurm's
// variables are set): --nproc-per-node starts the ranks itself.
void refuse_nproc_under_launcher();

// This process's arguments after the program name (/proc/self/cmdline),
// without --nproc-per-node and its value.
std::vector<std::string> arguments_without_nproc();

}  // namespace perftrain::cli
