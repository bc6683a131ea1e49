// The environment-switch helpers (base/env.h): exact matches only, counts
// with their fallback when unset, own-or-cudnn switches.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

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

TEST(Env, OwnOrCudnnTakesOnlyThoseTwoAndNamesTheSwitch) {
  EXPECT_TRUE(own_or_cudnn("PERFTRAIN_X", nullptr));
  EXPECT_TRUE(own_or_cudnn("PERFTRAIN_X", "own"));
  EXPECT_FALSE(own_or_cudnn("PERFTRAIN_X", "cudnn"));
  try {
    own_or_cudnn("PERFTRAIN_X", "CUDNN");
    FAIL() << "no error for a misspelled value";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("PERFTRAIN_X"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace perftrain
