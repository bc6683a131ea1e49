#include "diffusion/objective.h"

#include <gtest/gtest.h>

#include <string>

#include "base/error.h"

namespace perftrain::diffusion {
namespace {

TEST(Objective, ParsesKnownNamesAndRoundTrips) {
  EXPECT_EQ(parse_objective("ddpm"), Objective::Ddpm);
  EXPECT_EQ(parse_objective("flow"), Objective::Flow);
  EXPECT_EQ(parse_time_sampling("uniform"), TimeSampling::Uniform);
  EXPECT_EQ(parse_time_sampling("logit-normal"), TimeSampling::LogitNormal);
  for (auto o : {Objective::Ddpm, Objective::Flow}) EXPECT_EQ(parse_objective(to_string(o)), o);
  for (auto s : {TimeSampling::Uniform, TimeSampling::LogitNormal})
    EXPECT_EQ(parse_time_sampling(to_string(s)), s);
}

TEST(Objective, UnknownNamesListAllowedValues) {
  try {
    parse_objective("edm");
    FAIL() << "no throw";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("edm"), std::string::npos);
    EXPECT_NE(msg.find("ddpm, flow"), std::string::npos);
    EXPECT_EQ(msg.find('\n'), std::string::npos);
  }
  try {
    parse_time_sampling("lognormal");
    FAIL() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("uniform, logit-normal"), std::string::npos);
  }
  EXPECT_THROW(parse_objective("DDPM"), UsageError);
}

}  // namespace
}  // namespace perftrain::diffusion
