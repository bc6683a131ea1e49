#include "distributed/launch_env.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <vector>

#include "base/error.h"

namespace perftrain::distributed {
namespace {

long parse_int(const char* name, const char* text, long lo, long hi, const std::string& range) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi)
    throw UsageError(std::string(name) + "='" + text + "' must be an integer " + range);
  return v;
}

}  // namespace

std::string LaunchEnv::describe() const {
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (master " + master_addr + ":" +
         std::to_string(master_port) + ")";
}

LaunchEnv launch_env_from(const std::function<const char*(const char*)>& getenv) {
  static const char* const names[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  std::vector<std::string> set, unset;
  for (const char* n : names) (getenv(n) != nullptr ? set : unset).push_back(n);
  LaunchEnv env;
  if (set.empty()) return env;
  if (!unset.empty()) {
    std::string have, missing;
    for (const auto& n : set) have += (have.empty() ? "" : ", ") + n;
    for (const auto& n : unset) missing += (missing.empty() ? "" : ", ") + n;
    throw UsageError(missing + " not set although " + have +
                     " are: a multi-process launch sets all of RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and "
                     "MASTER_PORT (torchrun does), a single process none");
  }
  env.from_env = true;
  env.world_size = static_cast<int>(parse_int("WORLD_SIZE", getenv("WORLD_SIZE"), 1, 1 << 20, ">= 1"));
  const std::string in_world = "in [0, WORLD_SIZE) = [0, " + std::to_string(env.world_size) + ")";
  env.rank = static_cast<int>(parse_int("RANK", getenv("RANK"), 0, env.world_size - 1, in_world));
  env.local_rank = static_cast<int>(parse_int("LOCAL_RANK", getenv("LOCAL_RANK"), 0, env.world_size - 1, in_world));
  if (env.local_rank > env.rank)
    throw UsageError("LOCAL_RANK=" + std::to_string(env.local_rank) + " must not exceed RANK=" +
                     std::to_string(env.rank) + " (a host's processes are numbered within the global ranks)");
  const char* local_world = getenv("LOCAL_WORLD_SIZE");
  env.local_world_size =
      local_world == nullptr
          ? env.world_size
          : static_cast<int>(parse_int("LOCAL_WORLD_SIZE", local_world, 1, env.world_size,
                                       "in [1, WORLD_SIZE] = [1, " + std::to_string(env.world_size) + "]"));
  env.master_port = static_cast<int>(parse_int("MASTER_PORT", getenv("MASTER_PORT"), 1, 65535, "in 1..65535"));
  env.master_addr = getenv("MASTER_ADDR");
  if (env.master_addr.empty()) throw UsageError("MASTER_ADDR is empty: the host name or address of rank 0");
  return env;
}

LaunchEnv launch_env() {
  return launch_env_from([](const char* n) { return static_cast<const char*>(std::getenv(n)); });
}

int free_loopback_port(const std::string& who) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!ok) throw RuntimeError(who + ": no free port on 127.0.0.1: " + std::strerror(err));
  return ntohs(a.sin_port);
}

}  // namespace perftrain::distributed
