// What a checkpoint of DiT-XL/2 costs (the weights, the EMA and AdamW's two
// moments in fp32, about 10.8 GB) with and without the per-tensor CRC32Cs;
// every file is fsynced either way. A measurement, not a check: disabled, run
// by name (docs/design.md, run directory) with
//   test_train_gpu --gtest_also_run_disabled_tests --gtest_filter='*CheckpointOverhead*'
// It writes into a folder under the current directory (the disk runs go to)
// and removes it.
#include <ATen/ops/randn.h>
#include <ATen/ops/randn_like.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <functional>

#include "base/crc32c.h"
#include "base/fs.h"
#include "compat/compat.h"
#include "io/safetensors.h"

namespace perftrain::train {
namespace {

// Tensors of DiT-XL/2's sizes (28 blocks of hidden 1152, MLP ratio 4, adaLN
// of 6 x 1152, patch 2 on 4 latent channels): about 675M values.
io::NamedTensors xl2_like(const at::Device& device) {
  const int64_t h = 1152;
  const auto o = at::TensorOptions().device(device).dtype(at::kFloat);
  io::NamedTensors t;
  t.emplace_back("x_embedder.proj.weight", at::randn({h, 4, 2, 2}, o));
  t.emplace_back("t_embedder.mlp.0.weight", at::randn({h, 256}, o));
  t.emplace_back("t_embedder.mlp.2.weight", at::randn({h, h}, o));
  t.emplace_back("y_embedder.embedding_table.weight", at::randn({1001, h}, o));
  for (int b = 0; b < 28; ++b) {
    const std::string p = "blocks." + std::to_string(b) + ".";
    t.emplace_back(p + "attn.qkv.weight", at::randn({3 * h, h}, o));
    t.emplace_back(p + "attn.qkv.bias", at::randn({3 * h}, o));
    t.emplace_back(p + "attn.proj.weight", at::randn({h, h}, o));
    t.emplace_back(p + "attn.proj.bias", at::randn({h}, o));
    t.emplace_back(p + "mlp.fc1.weight", at::randn({4 * h, h}, o));
    t.emplace_back(p + "mlp.fc1.bias", at::randn({4 * h}, o));
    t.emplace_back(p + "mlp.fc2.weight", at::randn({h, 4 * h}, o));
    t.emplace_back(p + "mlp.fc2.bias", at::randn({h}, o));
    t.emplace_back(p + "adaLN_modulation.1.weight", at::randn({6 * h, h}, o));
    t.emplace_back(p + "adaLN_modulation.1.bias", at::randn({6 * h}, o));
  }
  t.emplace_back("final_layer.adaLN_modulation.1.weight", at::randn({2 * h, h}, o));
  t.emplace_back("final_layer.linear.weight", at::randn({32, h}, o));
  return t;
}

double seconds(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(CheckpointOverheadGpu, DISABLED_DiTXL2SaveWithAndWithoutChecksums) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no CUDA GPU";
  const at::Device cuda(at::kCUDA, 0);
  const io::NamedTensors weights = xl2_like(cuda), ema = xl2_like(cuda);
  io::NamedTensors moments;
  for (const auto& [n, w] : weights) {
    moments.emplace_back("adamw.exp_avg." + n, at::randn_like(w));
    moments.emplace_back("adamw.exp_avg_sq." + n, at::randn_like(w));
  }
  compat::synchronize(cuda);
  int64_t params = 0;
  for (const auto& [n, w] : weights) params += w.numel();

  char tmpl[] = "ckpt-overhead-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto save_all = [&](bool checksums) {
    const io::SaveOptions opt{checksums};
    io::save_safetensors(dir + "/model.safetensors", weights, {{"format", "pt"}}, opt);
    io::save_safetensors(dir + "/ema.safetensors", ema, {{"format", "pt"}}, opt);
    io::save_safetensors(dir + "/trainer_state.safetensors", moments, {}, opt);
  };
  save_all(false);  // warm-up: file creation, page cache, pinned paths
  const double plain = seconds([&] { save_all(false); });
  const double summed = seconds([&] { save_all(true); });
  // The checksums alone, over CPU copies of the same bytes.
  double crc = 0;
  volatile uint32_t sink = 0;
  for (const io::NamedTensors* set : std::initializer_list<const io::NamedTensors*>{&weights, &ema, &moments}) {
    for (const auto& [n, t] : *set) {
      const at::Tensor c = t.to(at::kCPU);
      crc += seconds([&] { sink = sink ^ base::crc32c(c.data_ptr(), c.nbytes()); });
    }
  }
  const double verify = seconds([&] {
    for (const char* f : {"/model.safetensors", "/ema.safetensors", "/trainer_state.safetensors"})
      io::SafetensorsFile::open(dir + f).verify_checksums();
  });
  fs::remove_tree(dir);
  const double gb = 4.0 * params * 4 / 1e9;
  std::printf("DiT-XL/2-sized checkpoint: %lld parameters, %.1f GB in 3 files, every file fsynced\n"
              "  save without checksums  %.2f s\n  save with checksums     %.2f s (+%.2f s)\n"
              "  CRC32C alone (one thread, hardware=%d) %.2f s; verify on load (parallel) %.2f s\n",
              static_cast<long long>(params), gb, plain, summed, summed - plain, base::crc32c_hardware() ? 1 : 0, crc,
              verify);
  std::printf("  share of training time at log.checkpoint_every=1000: save / (1000 x step seconds)\n");
  EXPECT_GT(summed, 0);
}

}  // namespace
}  // namespace perftrain::train
