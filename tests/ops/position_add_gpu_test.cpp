// ops::position_add and its kernel on the GPU: y + table broadcast over the
// batch against ATen's broadcast add, bit for bit (both are one fp32 addition
// of the same operands), for every y dtype, 16-byte and scalar paths (odd
// widths, a misaligned y), into NaN-poisoned outputs; the gradient is the
// incoming one in y's dtype. Skips without a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <limits>
#include <string>

#include "kernels/position_add.h"
#include "compat/compat.h"
#include "ops/dtype_dispatch.h"
#include "ops/position_add.h"

namespace perftrain::ops {
namespace {

const at::Device kCuda(at::kCUDA, 0);

struct Shape {
  int64_t b, t, d;
};

std::string name(const Shape& s, at::ScalarType dt) {
  return std::string(c10::toString(dt)) + " [" + std::to_string(s.b) + ", " + std::to_string(s.t) + ", " +
         std::to_string(s.d) + "]";
}

TEST(PositionAddGpu, KernelMatchesAtenBitForBitIntoPoisonedOutput) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const c10::cuda::CUDAGuard guard(kCuda);
  at::Generator g = at::cuda::detail::createCUDAGenerator(0);
  g.set_current_seed(11);
  const auto opts = at::TensorOptions().device(kCuda);
  for (const at::ScalarType dt : {at::kBFloat16, at::kHalf, at::kFloat})
    for (const Shape s : {Shape{1, 1, 37}, Shape{3, 5, 8}, Shape{2, 256, 384}, Shape{4, 17, 1000},
                          Shape{256, 256, 384}})
      for (const bool misaligned : {false, true}) {
        // A y that starts one element into its storage takes the scalar path.
        const at::Tensor base = at::randn({s.b * s.t * s.d + 1}, g, opts).to(dt);
        const at::Tensor y = base.narrow(0, misaligned ? 1 : 0, s.b * s.t * s.d).view({s.b, s.t, s.d});
        const at::Tensor table = at::randn({s.t, s.d}, g, opts);
        at::Tensor out = at::full({s.b, s.t, s.d}, std::numeric_limits<double>::quiet_NaN(), opts);
        with_kernel_type("test", dt, [&](auto ty) {
          using T = kernel_type<decltype(ty)>;
          kernels::position_add<T>(static_cast<const T*>(y.data_ptr()), table.data_ptr<float>(),
                                   out.data_ptr<float>(), s.b * s.t, int(s.t), int(s.d),
                                   at::cuda::getCurrentCUDAStream());
        });
        const at::Tensor want = y + table;
        ASSERT_EQ(want.scalar_type(), at::kFloat);
        EXPECT_TRUE(at::equal(out, want)) << name(s, dt) << (misaligned ? " misaligned" : "");
      }
}

TEST(PositionAddGpu, OpForwardAndGradient) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = at::cuda::detail::createCUDAGenerator(0);
  g.set_current_seed(12);
  const auto opts = at::TensorOptions().device(kCuda);
  for (const at::ScalarType dt : {at::kBFloat16, at::kFloat})
    for (const Shape s : {Shape{2, 64, 384}, Shape{3, 9, 37}}) {
      const at::Tensor y = at::randn({s.b, s.t, s.d}, g, opts).to(dt).requires_grad_(true);
      const at::Tensor table = at::randn({1, s.t, s.d}, g, opts);  // as DiT keeps it
      const at::Tensor out = position_add(y, table);
      EXPECT_EQ(out.scalar_type(), at::kFloat) << name(s, dt);
      EXPECT_TRUE(at::equal(out, y.detach() + table)) << name(s, dt);
      const at::Tensor dout = at::randn({s.b, s.t, s.d}, g, opts);
      const at::Tensor dy = torch::autograd::grad({out}, {y}, {dout})[0];
      EXPECT_EQ(dy.scalar_type(), dt) << name(s, dt);
      EXPECT_TRUE(at::equal(dy, dout.to(dt))) << name(s, dt);
    }
}

}  // namespace
}  // namespace perftrain::ops
