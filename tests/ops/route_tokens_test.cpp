// route_select / route_combine on the CPU (the same autograd split as on the
// GPU, in ATen) against their references with autograd through them: values
// and every gradient (u, kept, y, gate; through a whole routed loop u and the
// router's weight and bias); bad inputs raise UsageError.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "ops/route_tokens.h"
#include "route_tokens_cases.h"
#include "support/row_op_checks.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

using perftrain::testing::expect_close;
using perftrain::testing::row_ops::gen;
using perftrain::testing::row_ops::cpu::output_and_grads;
using namespace perftrain::testing::route_tokens;

TEST(RouteTokens, CombineMatchesReferenceWithAllGradients) {
  uint64_t seed = 10;
  for (const RouteShape& s : kRouteShapes) {
    at::Generator g = gen(seed++);
    const at::Tensor u = at::randn({s.b, s.t, s.d}, g), kept = at::randn({s.b, s.k, s.d}, g);
    const at::Tensor y = at::randn({s.b, s.k, s.d}, g), gate = at::randn({s.b, s.k}, g);
    const at::Tensor index = random_index(s, g), dout = at::randn({s.b, s.t, s.d}, g);
    auto run = [&](bool ours) {
      return output_and_grads({u, kept, y, gate}, dout, [&](const std::vector<at::Tensor>& in) {
        return ours ? route_combine(in[0], in[1], in[2], in[3], index)
                    : route_combine_reference(in[0], in[1], in[2], in[3], index);
      });
    };
    const auto ours = run(true), ref = run(false);
    const char* what[] = {"out", "du", "dkept", "dy", "dgate"};
    for (size_t i = 0; i < ours.size(); ++i) expect_close(ours[i], ref[i], 1e-6, 1e-6, name(s) + what[i]);
    // Tokens not kept pass unchanged: at least one differs where kept.
    EXPECT_FALSE(at::equal(ours[0], u)) << name(s);
  }
}

TEST(RouteTokens, SelectMatchesReference) {
  uint64_t seed = 20;
  for (const RouteShape& s : kRouteShapes) {
    at::Generator g = gen(seed++);
    const at::Tensor u = at::randn({s.b, s.t, s.d}, g), w = at::randn({1, s.d}, g), b = at::randn({1}, g);
    const RouteSelection ours = route_select(u, w, b, s.k), ref = route_select_reference(u, w, b, s.k);
    EXPECT_TRUE(at::equal(ours.scores, ref.scores)) << name(s);
    EXPECT_TRUE(at::equal(ours.index, ref.index)) << name(s);
    EXPECT_TRUE(at::equal(ours.kept, ref.kept)) << name(s);
    EXPECT_TRUE(at::equal(ours.through, u)) << name(s);
  }
}

// A whole routed loop: the gradient of u arrives by three paths (the
// pass-through, the router's scores, the kept rows) and leaves route_select
// as one tensor; the router's weight and bias and the group's scale too.
TEST(RouteTokens, RoutedLoopGradientsMatchReference) {
  uint64_t seed = 30;
  for (const RouteShape& s : kRouteShapes) {
    at::Generator g = gen(seed++);
    const std::vector<at::Tensor> in = {at::randn({s.b, s.t, s.d}, g), at::randn({1, s.d}, g) * 0.1,
                                        at::randn({1}, g), at::randn({s.d}, g)};
    const at::Tensor dout = at::randn({s.b, s.t, s.d}, g);
    auto run = [&](bool ours) {
      return output_and_grads(in, dout, [&](const std::vector<at::Tensor>& x) {
        return routed_loop(x, s.k, at::kFloat, ours);
      });
    };
    const auto ours = run(true), ref = run(false);
    const char* what[] = {"out", "du", "dweight", "dbias", "dscale"};
    for (size_t i = 0; i < ours.size(); ++i) expect_close(ours[i], ref[i], 1e-5, 1e-5, name(s) + what[i]);
  }
}

TEST(RouteTokens, BadInputsRaiseUsageError) {
  const at::Tensor u = at::randn({2, 5, 8}), w = at::randn({1, 8}), b = at::randn({1});
  EXPECT_THROW(route_select(u, w, b, 0), UsageError);
  EXPECT_THROW(route_select(u, w, b, 6), UsageError);
  EXPECT_THROW(route_select(u, at::randn({1, 7}), b, 2), UsageError);
  EXPECT_THROW(route_select(u.to(at::kDouble), w, b, 2), UsageError);
  const RouteSelection s = route_select(u, w, b, 2);
  const at::Tensor gate = at::ones({2, 2});
  EXPECT_THROW(route_combine(u, s.kept, at::randn({2, 3, 8}), gate, s.index), UsageError);
  EXPECT_THROW(route_combine(u, s.kept, s.kept, at::ones({2, 3}), s.index), UsageError);
  EXPECT_THROW(route_combine(u, s.kept, s.kept, gate, s.index.to(at::kInt)), UsageError);
  EXPECT_THROW(route_combine(u, s.kept.to(at::kDouble), s.kept, gate, s.index), UsageError);
}

}  // namespace
}  // namespace perftrain::ops
