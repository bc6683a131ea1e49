// The hybrid loss against tests/diffusion/vlb_reference.py, an independent
// float64 numpy implementation of guided-diffusion's formulas, on random
// data, random model outputs and timesteps that include t = 0.
#include <ATen/ops/cat.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "diffusion/ddpm.h"
#include "test_util.h"

namespace perftrain::diffusion {
namespace {

void write_raw(const std::string& path, const at::Tensor& x) {
  const at::Tensor c = x.contiguous();
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  ASSERT_TRUE(f.good()) << path;
}

std::vector<double> read_f64(const std::string& path, size_t n) {
  std::vector<double> v(n);
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(double)));
  EXPECT_TRUE(f.good()) << path;
  return v;
}

TEST(VlbReference, HybridLossMatchesNumpyGuidedDiffusion) {
  const int64_t B = 24, C = 4, H = 8, W = 8;
  at::Generator gen = testing::cpu_gen(2024);
  // Latent-like data (N(0,1)) exercises all three decoder branches at t = 0.
  const at::Tensor x0 = at::randn({B, C, H, W}, gen);
  const at::Tensor noise = at::randn({B, C, H, W}, gen);
  std::vector<int64_t> ts = {0, 0, 0, 0, 0, 0, 1, 2, 999, 998, 500};
  const at::Tensor rest = at::randint(1000, {B - static_cast<int64_t>(ts.size())}, gen);
  for (int64_t i = 0; i < rest.size(0); ++i) ts.push_back(rest[i].item<int64_t>());
  const at::Tensor t = at::tensor(ts, at::TensorOptions().dtype(at::kLong));
  // A model that is roughly right (so the t = 0 likelihood is not saturated
  // at the 1e-12 clamp, where float32 and float64 legitimately disagree),
  // with v uniform over [-1, 1].
  const at::Tensor eps = noise.add(at::randn({B, C, H, W}, gen).mul(0.5));
  const at::Tensor v = at::rand({B, C, H, W}, gen).mul(2.0).sub(1.0);
  const at::Tensor out = at::cat({eps, v}, 1);

  char tmpl[] = "/tmp/perftrain_vlb_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  // std::filesystem is avoided: libtorch.so exports its own copies of some
  // of its symbols (remove_all crashed when resolved there).
  const std::string dir(tmpl);
  const std::vector<std::string> files = {"x0.f32", "noise.f32", "t.i64", "out.f32", "mse.f64", "vb.f64"};
  auto file = [&](const char* name) { return dir + "/" + name; };
  write_raw(file("x0.f32"), x0);
  write_raw(file("noise.f32"), noise);
  write_raw(file("t.i64"), t);
  write_raw(file("out.f32"), out);
  const std::string cmd = std::string("\"") + PERFTRAIN_PYTHON + "\" \"" + PERFTRAIN_SOURCE_DIR +
                          "/tests/diffusion/vlb_reference.py\" \"" + dir + "\" " +
                          std::to_string(B) + " " + std::to_string(C) + " " + std::to_string(H) +
                          " " + std::to_string(W);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::vector<double> mse_ref = read_f64(file("mse.f64"), B);
  const std::vector<double> vb_ref = read_f64(file("vb.f64"), B);
  for (const std::string& f : files) std::remove((dir + "/" + f).c_str());
  rmdir(dir.c_str());

  GaussianDiffusion d;
  // Per sample: the vb function on the library's own x_t.
  const at::Tensor x_t = d.q_sample(x0, t, noise);
  const at::Tensor vb = d.vb_terms_bpd(eps, v, x0, x_t, t);
  double mse_mean = 0, vb_mean = 0;
  for (int64_t i = 0; i < B; ++i) {
    // float32 vs float64: observed relative error ~5e-6.
    EXPECT_NEAR(vb[i].item<double>(), vb_ref[i], 3e-5 * std::abs(vb_ref[i]))
        << "sample " << i << " t=" << ts[i];
    mse_mean += mse_ref[i] / B;
    vb_mean += vb_ref[i] / B;
  }
  // The whole training loss with this output.
  const ModelFn model = [&](const at::Tensor&, const at::Tensor&, const at::Tensor&) { return out; };
  const LossTerms terms = d.training_loss_at(model, x0, at::zeros({B}, at::kLong), t, noise, true);
  EXPECT_NEAR(terms.mse.item<double>(), mse_mean, 1e-5 * mse_mean);
  EXPECT_NEAR(terms.vb.item<double>(), vb_mean, 3e-5 * vb_mean);
  EXPECT_NEAR(terms.loss.item<double>(), mse_mean + vb_mean, 3e-5 * (mse_mean + vb_mean));
}

}  // namespace
}  // namespace perftrain::diffusion
