// The launch protocol of torchrun and Slurm-style launchers: RANK, LOCAL_RANK,
// WORLD_SIZE, MASTER_ADDR and MASTER_PORT say which of how many processes
// this is and where rank 0's store listens. All five or none: none is one
// process on its own (rank 0 of 1).
#pragma once

#include <functional>
#include <string>

namespace perftrain::distributed {

struct LaunchEnv {
  int rank = 0;
  int local_rank = 0;  // the GPU index on this host
  int world_size = 1;
  // Processes on this host: LOCAL_WORLD_SIZE where set (torchrun and
  // perftrain's launcher set it), else world_size.
  int local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  bool from_env = false;  // the variables were set (also with WORLD_SIZE=1)

  bool distributed() const { return world_size > 1; }
  // "rank 1 of 3 (master 127.0.0.1:29500)"
  std::string describe() const;
};

// Reads the five variables through getenv (a function for the tests), and
// LOCAL_WORLD_SIZE, optional, in [1, WORLD_SIZE].
// UsageError naming the variable when some are set and others not, a value
// is not an integer in range (RANK and LOCAL_RANK in [0, WORLD_SIZE),
// LOCAL_RANK <= RANK, MASTER_PORT in 1..65535) or MASTER_ADDR is empty.
LaunchEnv launch_env_from(const std::function<const char*(const char*)>& getenv);
LaunchEnv launch_env();  // from the process environment

// A TCP port on 127.0.0.1 free at the time of asking (bound to port 0 and
// released), for a one-host group's MASTER_PORT. RuntimeError naming `who` if
// none can be had.
int free_loopback_port(const std::string& who);

}  // namespace perftrain::distributed
