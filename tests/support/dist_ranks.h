// What the data-parallel tests that start ranks as processes share: this
// test program run once per rank on a loopback group.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "distributed/launch_env.h"
#include "support/test_support.h"

namespace perftrain::testing {

// The running test program.
inline std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return std::string(buf, n > 0 ? n : 0);
}

// `world` ranks of this program, each running the tests `filter` with
// `worker_env`=1 and the launch variables of a loopback group, each under a
// hard timeout of 90 s; every rank must exit 0. quiet: the ranks' output is
// dropped, else it is in the failure message.
inline void expect_ranks_pass(int world, const std::string& worker_env, const std::string& filter, bool quiet) {
  const int port = distributed::free_loopback_port("test");
  std::string cmd;
  for (int r = 0; r < world; ++r)
    cmd += "(" + worker_env + "=1 RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) +
           " WORLD_SIZE=" + std::to_string(world) + " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
           " timeout -k 5 90 '" + self_exe() + "' --gtest_filter=" + filter + (quiet ? " > /dev/null" : "") +
           " 2>&1; echo rank" + std::to_string(r) + "=$?) & ";
  cmd += "wait";
  const auto res = run_shell(cmd);
  for (int r = 0; r < world; ++r)
    EXPECT_NE(res.output.find("rank" + std::to_string(r) + "=0"), std::string::npos) << res.output;
}

}  // namespace perftrain::testing
