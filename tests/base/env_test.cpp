// The environment-switch helpers (base/env.h): exact matches only, counts
// with their fallback when unset.
#include <gtest/gtest.h>

#include <cstdlib>

#include "base/env.h"

namespace perftrain {
namespace {

TEST(Env, EqualsMatchesTheWholeValueOnly) {
  ::unsetenv("PERFTRAIN_TEST_ENV_SWITCH");
  EXPECT_FALSE(env_equals("PERFTRAIN_TEST_ENV_SWITCH", "1")) << "unset";
  ::setenv("PERFTRAIN_TEST_ENV_SWITCH", "1", 1);
  EXPECT_TRUE(env_equals("PERFTRAIN_TEST_ENV_SWITCH", "1"));
  EXPECT_FALSE(env_equals("PERFTRAIN_TEST_ENV_SWITCH", "10"));
  ::setenv("PERFTRAIN_TEST_ENV_SWITCH", "packed ", 1);
  EXPECT_FALSE(env_equals("PERFTRAIN_TEST_ENV_SWITCH", "packed")) << "no trimming";
  ::unsetenv("PERFTRAIN_TEST_ENV_SWITCH");
}

TEST(Env, CountFallsBackWhenUnsetAndIsNeverNegative) {
  ::unsetenv("PERFTRAIN_TEST_ENV_COUNT");
  EXPECT_EQ(env_count("PERFTRAIN_TEST_ENV_COUNT", 8), 8);
  ::setenv("PERFTRAIN_TEST_ENV_COUNT", "3", 1);
  EXPECT_EQ(env_count("PERFTRAIN_TEST_ENV_COUNT", 8), 3);
  ::setenv("PERFTRAIN_TEST_ENV_COUNT", "0", 1);
  EXPECT_EQ(env_count("PERFTRAIN_TEST_ENV_COUNT", 8), 0);
  ::setenv("PERFTRAIN_TEST_ENV_COUNT", "-4", 1);
  EXPECT_EQ(env_count("PERFTRAIN_TEST_ENV_COUNT", 8), 0);
  ::setenv("PERFTRAIN_TEST_ENV_COUNT", "off", 1);
  EXPECT_EQ(env_count("PERFTRAIN_TEST_ENV_COUNT", 8), 0);
  ::unsetenv("PERFTRAIN_TEST_ENV_COUNT");
}

}  // namespace
}  // namespace perftrain
