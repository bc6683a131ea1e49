// The Fréchet distance equals pytorch-fid's calculate_frechet_distance
// (scipy.linalg.sqrtm) on the same random features, full-rank and
// rank-deficient (fewer samples than dimensions, as small evaluations are).
// Skipped where pytorch-fid or scipy is not installed.
#include <gtest/gtest.h>

#include <cmath>

#include "io/npz.h"
#include "observe/eval/metrics.h"
#include "support/python_script.h"

namespace perftrain::observe::eval {
namespace {

using perftrain::testing::kPythonSkip;
using perftrain::testing::run_pytorch_fid_script;
using perftrain::testing::TempDir;

constexpr const char* kReference = R"(
import numpy as np
from pytorch_fid.fid_score import calculate_frechet_distance
out = sys.argv[1]
rng = np.random.default_rng(0)
arrays = {}
for name, (n1, n2, d) in {"full": (300, 200, 32), "deficient": (60, 50, 128)}.items():
    a = rng.standard_normal((n1, d)).astype(np.float32)
    b = (rng.standard_normal((n2, d)) @ rng.standard_normal((d, d)) * 0.3 + 0.2).astype(np.float32)
    s = [(np.mean(x, axis=0), np.cov(x, rowvar=False)) for x in (a, b)]
    arrays[name + "_a"], arrays[name + "_b"] = a, b
    arrays[name + "_sigma_a"] = s[0][1]
    arrays[name + "_fid"] = np.array(calculate_frechet_distance(s[0][0], s[0][1], s[1][0], s[1][1]))
np.savez(out, **arrays)
)";

TEST(FrechetDistance, EqualsPytorchFidOnTheSameFeatures) {
  TempDir dir;
  const auto r = run_pytorch_fid_script(dir, kReference, "'" + dir.file("ref.npz") + "'");
  if (r.code == kPythonSkip) GTEST_SKIP() << "pytorch-fid is not installed";
  ASSERT_EQ(r.code, 0) << r.output;
  const auto ref = io::read_npz(dir.file("ref.npz"));
  for (const std::string name : {"full", "deficient"}) {
    const FeatureStats a = feature_stats(ref.at(name + "_a")), b = feature_stats(ref.at(name + "_b"));
    EXPECT_TRUE(a.sigma.allclose(ref.at(name + "_sigma_a"), 1e-9, 1e-12)) << name << ": np.cov";
    const double want = ref.at(name + "_fid").item<double>(), got = frechet_distance(a, b);
    EXPECT_NEAR(got, want, 1e-6 * std::abs(want)) << name;
  }
}

}  // namespace
}  // namespace perftrain::observe::eval
