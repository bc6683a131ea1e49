// On a GPU: route_select / route_combine (fp32 stream, fp32 and bf16 y)
// against their references on the CPU, values and every gradient through a
// whole routed loop and through combine alone; the kernels write every output
// element (outputs pre-filled with NaN through the kernel launches). Skips
// without a GPU.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <string>
#include <vector>

#include "compat/compat.h"
#include "kernels/route_tokens.h"
#include "ops/route_tokens.h"
#include "route_tokens_cases.h"
#include "support/kernel_launch.h"
#include "support/row_op_checks.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

using perftrain::testing::expect_close;
using perftrain::testing::KernelLaunch;
using perftrain::testing::row_ops::gen;
using perftrain::testing::row_ops::cpu::output_and_grads;
using namespace perftrain::testing::route_tokens;

at::Tensor cuda(const at::Tensor& t) { return t.to(at::kCUDA); }
std::vector<at::Tensor> cuda(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : ts) out.push_back(cuda(t));
  return out;
}
at::Tensor nans(at::IntArrayRef sizes, at::ScalarType t) { return at::full(sizes, NAN, at::dtype(t).device(at::kCUDA)); }

// Tolerance: fp32 sums of <= D terms (1e-4); a bf16 y rounds dy (1e-2).
TEST(RouteTokensGpu, RoutedLoopMatchesReference) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 40;
  for (const at::ScalarType y_dt : {at::kFloat, at::kBFloat16}) {
    for (const RouteShape& s : kRouteShapes) {
      at::Generator g = gen(seed++);
      const std::vector<at::Tensor> in = {at::randn({s.b, s.t, s.d}, g), at::randn({1, s.d}, g) * 0.1,
                                          at::randn({1}, g), at::randn({s.d}, g)};
      const at::Tensor dout = at::randn({s.b, s.t, s.d}, g);
      const auto ref = output_and_grads(in, dout, [&](const std::vector<at::Tensor>& x) {
        return routed_loop(x, s.k, y_dt, false);
      });
      const auto ours = output_and_grads(cuda(in), cuda(dout), [&](const std::vector<at::Tensor>& x) {
        return routed_loop(x, s.k, y_dt, true);
      });
      const double tol = y_dt == at::kFloat ? 1e-4 : 2e-2;
      const char* what[] = {"out", "du", "dweight", "dbias", "dscale"};
      for (size_t i = 0; i < ours.size(); ++i) expect_close(ours[i], ref[i], tol, tol, name(s) + what[i]);
    }
  }
}

TEST(RouteTokensGpu, CombineMatchesReferenceWithAllGradients) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 50;
  for (const at::ScalarType y_dt : {at::kFloat, at::kBFloat16}) {
    for (const RouteShape& s : kRouteShapes) {
      at::Generator g = gen(seed++);
      const std::vector<at::Tensor> in = {at::randn({s.b, s.t, s.d}, g), at::randn({s.b, s.k, s.d}, g),
                                          at::randn({s.b, s.k, s.d}, g).to(y_dt), at::randn({s.b, s.k}, g)};
      const at::Tensor index = random_index(s, g), dout = at::randn({s.b, s.t, s.d}, g);
      const auto ref = output_and_grads(in, dout, [&](const std::vector<at::Tensor>& x) {
        return route_combine_reference(x[0], x[1], x[2], x[3], index);
      });
      const at::Tensor index_gpu = cuda(index);
      const auto ours = output_and_grads(cuda(in), cuda(dout), [&](const std::vector<at::Tensor>& x) {
        return route_combine(x[0], x[1], x[2], x[3], index_gpu);
      });
      const double tol = y_dt == at::kFloat ? 1e-5 : 1e-2;
      const char* what[] = {"out", "du", "dkept", "dy", "dgate"};
      for (size_t i = 0; i < ours.size(); ++i) expect_close(ours[i], ref[i], tol, tol, name(s) + what[i]);
    }
  }
}

// Every output element written: the kernels on NaN-filled outputs.
TEST(RouteTokensGpu, KernelsWriteEveryElement) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const KernelLaunch launch;
  uint64_t seed = 60;
  for (const RouteShape& s : kRouteShapes) {
    at::Generator g = gen(seed++);
    const int B = int(s.b), T = int(s.t), k = int(s.k), D = int(s.d);
    const at::Tensor u = cuda(at::randn({s.b, s.t, s.d}, g)), y = cuda(at::randn({s.b, s.k, s.d}, g));
    const at::Tensor gate = cuda(at::randn({s.b, s.k}, g)), index = cuda(random_index(s, g));
    const at::Tensor ds = cuda(at::randn({s.b, s.t}, g)), w = cuda(at::randn({s.d}, g));
    const at::Tensor dout = cuda(at::randn({s.b, s.t, s.d}, g));
    at::Tensor slots = at::full({s.b, s.t}, 7, index.options().dtype(at::kInt));
    kernels::route_slots(index.data_ptr<int64_t>(), slots.data_ptr<int32_t>(), B, T, k, launch.stream);
    at::Tensor kept = nans({s.b, s.k, s.d}, at::kFloat), out = nans({s.b, s.t, s.d}, at::kFloat);
    kernels::route_gather_rows(u.data_ptr<float>(), index.data_ptr<int64_t>(), kept.data_ptr<float>(), B, T, k, D,
                               launch.stream);
    kernels::route_combine_forward<float>(u.data_ptr<float>(), slots.data_ptr<int32_t>(), kept.data_ptr<float>(),
                                          y.data_ptr<float>(), gate.data_ptr<float>(), out.data_ptr<float>(), B, T, k,
                                          D, launch.stream);
    at::Tensor dy = nans({s.b, s.k, s.d}, at::kFloat), dkept = nans({s.b, s.k, s.d}, at::kFloat);
    at::Tensor dgate = nans({s.b, s.k}, at::kFloat), du = nans({s.b, s.t, s.d}, at::kFloat);
    kernels::route_combine_backward<float>(dout.data_ptr<float>(), index.data_ptr<int64_t>(), kept.data_ptr<float>(),
                                           y.data_ptr<float>(), gate.data_ptr<float>(), dy.data_ptr<float>(),
                                           dkept.data_ptr<float>(), dgate.data_ptr<float>(), B, T, k, D,
                                           launch.stream);
    kernels::route_select_backward(dout.data_ptr<float>(), ds.data_ptr<float>(), w.data_ptr<float>(),
                                   slots.data_ptr<int32_t>(), dkept.data_ptr<float>(), du.data_ptr<float>(), B, T, k,
                                   D, launch.stream);
    // slot_of inverts index.
    const at::Tensor cpu_slots = slots.cpu(), cpu_index = index.cpu();
    EXPECT_EQ((cpu_slots >= 0).sum().item<int64_t>(), s.b * s.k) << name(s);
    for (const auto& [t, what] : std::vector<std::pair<at::Tensor, std::string>>{
             {kept, "kept"}, {out, "out"}, {dy, "dy"}, {dkept, "dkept"}, {dgate, "dgate"}, {du, "du"}})
      EXPECT_FALSE(t.isnan().any().item<bool>()) << name(s) << what;
    const at::Tensor ref_out = route_combine_reference(u.cpu(), kept.cpu(), y.cpu(), gate.cpu(), cpu_index);
    expect_close(out, ref_out, 1e-5, 1e-5, name(s) + "out");
  }
}

}  // namespace
}  // namespace perftrain::ops
