// The fp8 casts' CPU reference (ops/fp8_cast.h) against the formats decoded
// by hand and the correct-by-definition encoding (fp8_test_codes.h): every
// code's value, round to nearest even on random values over the whole range
// and on every midpoint (subnormals included), saturation at the max finite
// (+-Inf too), NaN; cuda_fp8.h's saturating conversion (what the kernels
// call, here its host form) gives the same bits; the amax with NaN and Inf;
// the CPU ops (cast, cast-transpose, amax accumulation) and their errors.
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/exp2.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "base/error.h"
#include "fp8_test_codes.h"
#include "ops/fp8_cast.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

using namespace fp8_codes;

const Fp8Format kFormats[] = {Fp8Format::kE4M3, Fp8Format::kE5M2};
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

at::Tensor one(float v) { return at::full({1}, v, at::kFloat); }

// The reference's codes for values v (float32) at scale 1.
std::vector<uint8_t> reference_codes(const std::vector<float>& v, Fp8Format f, float scale = 1.f) {
  const at::Tensor x = at::tensor(v, at::kFloat).reshape({1, -1});
  const at::Tensor q = fp8_quantize_reference(x, one(scale), f).view(at::kByte).contiguous();
  return std::vector<uint8_t>(q.data_ptr<uint8_t>(), q.data_ptr<uint8_t>() + q.numel());
}

// Values over the whole range: N(0, 1) times 2^e, e uniform in [-24, 20]
// (subnormals of both formats, normals, beyond the max finite).
std::vector<float> wide_values(uint64_t seed, int64_t n) {
  at::Generator g = perftrain::testing::seeded_cpu_generator(seed);
  const at::Tensor e = at::randint(-24, 21, {n}, g, at::kFloat);
  const at::Tensor x = (at::randn({n}, g) * at::exp2(e)).contiguous();
  return std::vector<float>(x.data_ptr<float>(), x.data_ptr<float>() + n);
}

TEST(Fp8Cast, AtenDecodesEveryCodeAsTheFormatSays) {
  for (const Fp8Format f : kFormats) {
    const at::Tensor codes = at::arange(256, at::kInt).to(at::kByte);
    const at::Tensor values = codes.view(fp8_dtype(f)).to(at::kDouble);
    for (int c = 0; c < 256; ++c) {
      const double want = decode(uint8_t(c), f), got = values[c].item<double>();
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << kernels::fp8_format_name(f) << " code " << c;
      } else {
        EXPECT_EQ(got, want) << kernels::fp8_format_name(f) << " code " << c;
      }
    }
  }
  EXPECT_EQ(decode(0x7e, Fp8Format::kE4M3), 448.0);
  EXPECT_EQ(decode(0x7b, Fp8Format::kE5M2), 57344.0);
  EXPECT_EQ(decode(0x01, Fp8Format::kE4M3), std::ldexp(1.0, -9));   // smallest subnormal
  EXPECT_EQ(decode(0x01, Fp8Format::kE5M2), std::ldexp(1.0, -16));
}

TEST(Fp8Cast, ReferenceRoundsToNearestEvenOnRandomValues) {
  for (const Fp8Format f : kFormats) {
    for (const float scale : {1.f, 0.37f, 300.f}) {
      const std::vector<float> v = wide_values(f == Fp8Format::kE4M3 ? 1 : 2, 20000);
      const std::vector<uint8_t> got = reference_codes(v, f, scale);
      int bad = 0;
      for (size_t i = 0; i < v.size(); ++i) bad += got[i] != encode(v[i] * scale, f);
      EXPECT_EQ(bad, 0) << kernels::fp8_format_name(f) << " scale " << scale;
    }
  }
}

// Every midpoint between neighbouring finite magnitudes (and just either
// side of it) goes to the even code, or to the nearer one.
TEST(Fp8Cast, ReferenceTiesGoToEvenIncludingSubnormals) {
  for (const Fp8Format f : kFormats) {
    std::vector<float> v;
    for (int c = 0; c + 1 < 0x80; ++c) {
      const double lo = decode(uint8_t(c), f), hi = decode(uint8_t(c + 1), f);
      if (!std::isfinite(hi)) break;
      const float mid = float((lo + hi) / 2);
      ASSERT_EQ(double(mid), (lo + hi) / 2) << "midpoints are floats";
      for (const float x : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, kInf)}) {
        v.push_back(x);
        v.push_back(-x);
      }
    }
    const std::vector<uint8_t> got = reference_codes(v, f);
    for (size_t i = 0; i < v.size(); ++i)
      EXPECT_EQ(int(got[i]), int(encode(v[i], f))) << kernels::fp8_format_name(f) << " value " << v[i];
    // The midpoint between 0 and the smallest subnormal goes to (signed) zero.
    const float half_min = float(decode(0x01, f) / 2);
    EXPECT_EQ(reference_codes({half_min, -half_min}, f), (std::vector<uint8_t>{0x00, 0x80}));
  }
}

TEST(Fp8Cast, ReferenceSaturatesAtTheMaxFiniteAndKeepsNaN) {
  for (const Fp8Format f : kFormats) {
    const float max = kernels::fp8_max(f);
    const uint8_t max_code = f == Fp8Format::kE4M3 ? 0x7e : 0x7b;
    const std::vector<uint8_t> got =
        reference_codes({max, max * 1.04f, max * 1.5f, 1e30f, kInf, -max * 1.04f, -kInf}, f);
    const std::vector<uint8_t> want = {max_code, max_code, max_code, max_code, max_code, uint8_t(max_code | 0x80),
                                       uint8_t(max_code | 0x80)};
    EXPECT_EQ(got, want) << kernels::fp8_format_name(f);
    const std::vector<uint8_t> nan = reference_codes({kNaN, -kNaN}, f);
    for (const uint8_t c : nan) EXPECT_TRUE(is_nan_code(c, f)) << kernels::fp8_format_name(f) << " code " << int(c);
    // An overflow of the scaled value saturates too: 100 * 10 > 448.
    EXPECT_EQ(reference_codes({100.f}, f, 10.f)[0], f == Fp8Format::kE4M3 ? max_code : encode(1000.f, f));
  }
}

// cuda_fp8.h's __NV_SATFINITE conversion, the one the kernels call (here in
// its host form), gives the reference's bits (NaN: any NaN code).
TEST(Fp8Cast, CudaConversionMatchesTheReference) {
  for (const Fp8Format f : kFormats) {
    const __nv_fp8_interpretation_t kind = f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
    std::vector<float> v = wide_values(3, 20000);
    v.insert(v.end(), {0.f, -0.f, kInf, -kInf, kNaN, 1e-40f, -1e-40f});
    const std::vector<uint8_t> ref = reference_codes(v, f);
    int bad = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const uint8_t c = __nv_cvt_float_to_fp8(v[i], __NV_SATFINITE, kind);
      bad += std::isnan(v[i]) ? !(is_nan_code(c, f) && is_nan_code(ref[i], f)) : c != ref[i];
    }
    EXPECT_EQ(bad, 0) << kernels::fp8_format_name(f);
  }
}

TEST(Fp8Cast, AmaxPropagatesNaNAndInf) {
  EXPECT_EQ(fp8_amax_reference(at::tensor({1.f, -3.f, 2.f})).item<float>(), 3.f);
  EXPECT_TRUE(std::isinf(fp8_amax_reference(at::tensor({1.f, -kInf, 2.f})).item<float>()));
  EXPECT_TRUE(std::isnan(fp8_amax_reference(at::tensor({kInf, kNaN, 2.f})).item<float>()));
  EXPECT_EQ(fp8_amax_reference(at::zeros({0, 3})).item<float>(), 0.f);
}

TEST(Fp8Cast, CpuOpsAreTheReferenceAndAccumulateTheAmax) {
  at::Generator g = perftrain::testing::seeded_cpu_generator(5);
  const at::Tensor x = at::randn({7, 13}, g) * 40;
  const at::Tensor scale = one(2.5f), amax = one(0.f);
  for (const Fp8Format f : kFormats) {
    const at::Tensor q = fp8_cast(x, scale, amax, f);
    EXPECT_EQ(q.scalar_type(), fp8_dtype(f));
    EXPECT_TRUE(at::equal(q.view(at::kByte), fp8_quantize_reference(x, scale, f).view(at::kByte)));
    const Fp8Casts both = fp8_cast_transpose(x.to(at::kBFloat16), scale, amax, f);
    EXPECT_EQ(both.q_t.sizes(), (std::vector<int64_t>{13, 7}));
    EXPECT_TRUE(both.q_t.is_contiguous());
    EXPECT_TRUE(at::equal(both.q_t.view(at::kByte), both.q.t().contiguous().view(at::kByte)));
    EXPECT_TRUE(at::equal(both.q.view(at::kByte),
                          fp8_quantize_reference(x.to(at::kBFloat16), scale, f).view(at::kByte)));
    EXPECT_FALSE(fp8_cast_transpose(x, scale, amax, f, false).q.defined());
  }
  EXPECT_EQ(amax.item<float>(), std::max(fp8_amax_reference(x).item<float>(),
                                         fp8_amax_reference(x.to(at::kBFloat16)).item<float>()));
  // A larger earlier amax stays; a NaN sticks.
  const at::Tensor big = one(1e6f);
  fp8_cast(x, scale, big, Fp8Format::kE4M3);
  EXPECT_EQ(big.item<float>(), 1e6f);
  fp8_cast(at::tensor({1.f, kNaN}).reshape({1, 2}), scale, big, Fp8Format::kE4M3);
  fp8_cast(x, scale, big, Fp8Format::kE4M3);
  EXPECT_TRUE(std::isnan(big.item<float>()));
}

TEST(Fp8Cast, BadArgumentsRaiseUsageError) {
  const at::Tensor x = at::zeros({4, 8}), s = one(1.f);
  EXPECT_THROW(fp8_cast(at::zeros({2, 4, 8}), s, at::Tensor(), Fp8Format::kE4M3), UsageError);
  EXPECT_THROW(fp8_cast(x.to(at::kHalf), s, at::Tensor(), Fp8Format::kE4M3), UsageError);
  EXPECT_THROW(fp8_cast(x, at::ones({2}), at::Tensor(), Fp8Format::kE4M3), UsageError);
  EXPECT_THROW(fp8_cast(x, s.to(at::kDouble), at::Tensor(), Fp8Format::kE4M3), UsageError);
  EXPECT_THROW(fp8_cast_transpose(x, s, at::zeros({3}), Fp8Format::kE5M2), UsageError);
}

}  // namespace
}  // namespace perftrain::ops
