// The variant names of `perftrain bench` and what each switches on.
#include <gtest/gtest.h>

#include "base/error.h"
#include "observe/bench/variants.h"
#include "support/test_support.h"

namespace {

using namespace perftrain::observe::bench;

TEST(BenchVariants, EachVariantAddsItsSwitches) {
  const auto v = parse_variants("eager-fp32,eager-bf16,fused,graph,all");
  ASSERT_EQ(v.size(), 5u);
  auto expect = [](const Variant& x, const char* name, const char* prec, bool fk, bool fo, bool g) {
    EXPECT_EQ(x.name, name);
    EXPECT_EQ(x.precision, prec) << name;
    EXPECT_EQ(x.fused_kernels, fk) << name;
    EXPECT_EQ(x.fused_optimizer, fo) << name;
    EXPECT_EQ(x.graph, g) << name;
  };
  expect(v[0], "eager-fp32", "fp32", false, false, false);
  expect(v[1], "eager-bf16", "bf16", false, false, false);
  expect(v[2], "fused", "bf16", true, true, false);
  expect(v[3], "graph", "bf16", false, true, true);
  expect(v[4], "all", "bf16", true, true, true);
  EXPECT_EQ(variant_names(), (std::vector<std::string>{"eager-fp32", "eager-bf16", "fused", "graph", "all"}));
}

TEST(BenchVariants, OrderKeptRepeatsDroppedPrecisionReplaced) {
  const auto v = parse_variants(" all, eager-fp32 ,all,,", "fp16");
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].name, "all");
  EXPECT_EQ(v[0].precision, "fp16");
  EXPECT_EQ(v[1].name, "eager-fp32");
  EXPECT_EQ(v[1].precision, "fp32");  // fp32 stays fp32
  EXPECT_EQ(split_list("a, b,,c ,"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(split_list("").empty());
}

TEST(BenchVariants, UnknownNamesListTheKnownOnes) {
  using perftrain::testing::error_of;
  auto msg = error_of<perftrain::UsageError>([] { parse_variants("eager-bf16,turbo"); });
  EXPECT_NE(msg.find("'turbo'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("eager-fp32, eager-bf16, fused, graph, all"), std::string::npos) << msg;
  msg = error_of<perftrain::UsageError>([] { parse_variants(" , "); });
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
  msg = error_of<perftrain::UsageError>([] { parse_variants("all", "fp4"); });
  EXPECT_NE(msg.find("--precision"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fp8"), std::string::npos) << msg;
}

// fp8 runs in the fused schedule: the variants with fused kernels take it,
// the others stay bf16.
TEST(BenchVariants, Fp8GoesToTheVariantsWithFusedKernels) {
  const auto v = parse_variants("eager-fp32,eager-bf16,fused,graph,all", "fp8");
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v[0].precision, "fp32");
  EXPECT_EQ(v[1].precision, "bf16");
  EXPECT_EQ(v[2].precision, "fp8");
  EXPECT_EQ(v[3].precision, "bf16");
  EXPECT_EQ(v[4].precision, "fp8");
}

}  // namespace
