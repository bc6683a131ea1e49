// What the CPU and GPU tests of ops/route_tokens.h share: the odd shapes, the
// random kept tokens, and a routed loop's maths (router, gate, aux, a group)
// written once over either the ops or their references.
#pragma once

#include <ATen/TensorOperators.h>
#include <ATen/ops/binary_cross_entropy_with_logits.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros_like.h>

#include <string>
#include <tuple>
#include <vector>

#include "ops/route_tokens.h"

namespace perftrain::testing::route_tokens {

struct RouteShape {
  int64_t b, t, k, d;
};
inline const std::vector<RouteShape> kRouteShapes = {{3, 37, 11, 200}, {3, 37, 11, 768}, {2, 5, 5, 7}, {1, 9, 1, 6}};

inline std::string name(const RouteShape& s) {
  return "B " + std::to_string(s.b) + " T " + std::to_string(s.t) + " k " + std::to_string(s.k) + " D " +
         std::to_string(s.d) + " ";
}

// [B, k] int64: k distinct random tokens of each sample, ascending.
inline at::Tensor random_index(const RouteShape& s, at::Generator& g) {
  std::vector<at::Tensor> rows;
  for (int64_t b = 0; b < s.b; ++b) rows.push_back(std::get<0>(at::sort(at::randperm(s.t, g).narrow(0, 0, s.k))));
  return at::stack(rows);
}

// A routed loop on in = {u, router weight, router bias, group scale [D]}:
// the group is y = tanh(kept) * scale in y_dtype; out + 0.1 * aux, so every
// path back to u and the router is exercised.
inline at::Tensor routed_loop(const std::vector<at::Tensor>& in, int64_t k, at::ScalarType y_dtype, bool ours) {
  const ops::RouteSelection s = ours ? ops::route_select(in[0], in[1], in[2], k)
                                     : ops::route_select_reference(in[0], in[1], in[2], k);
  const at::Tensor sig = at::sigmoid(at::gather(s.scores, 1, s.index));
  const at::Tensor gate = 1 + sig - sig.detach();
  const at::Tensor y = (at::tanh(s.kept) * in[3]).to(y_dtype);
  const at::Tensor out = ours ? ops::route_combine(s.through, s.kept, y, gate, s.index)
                              : ops::route_combine_reference(s.through, s.kept, y, gate, s.index);
  const at::Tensor mask = at::zeros_like(s.scores).scatter(1, s.index, 1.0);
  return out + 0.1 * at::binary_cross_entropy_with_logits(s.scores, mask);
}

}  // namespace perftrain::testing::route_tokens
