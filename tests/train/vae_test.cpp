// The VAE (models/autoencoder_kl, read by train/vae) against diffusers'
// AutoencoderKL: the real diffusers package builds two small randomly
// initialised VAEs (with mid-block attention and quant convs, and without
// either over three blocks), save_pretrained writes their folders, and its
// encode (posterior mean and logvar) and decode of a fixed input are the
// expectation. Skipped where diffusers is not installed. Then the folder
// errors: each names the option, the folder or the file and the tensors.
#include <ATen/TensorOperators.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <map>

#include "base/error.h"
#include "io/safetensors.h"
#include "support/python_script.h"
#include "support/vae_folder.h"
#include "train/vae.h"

namespace perftrain::train {
namespace {

using perftrain::testing::contains;
using perftrain::testing::error_of;
using perftrain::testing::kPythonSkip;
using perftrain::testing::run_python_script;
using perftrain::testing::TempDir;
using perftrain::testing::write_raw;

constexpr const char* kReference = R"(
import os, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never the network
try:
    import torch
    from diffusers import AutoencoderKL
except ImportError:
    sys.exit(77)
from safetensors.torch import save_file
out = sys.argv[1]
torch.manual_seed(0)
def build(name, **kw):
    n = len(kw["block_out_channels"])
    vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * n, up_block_types=("UpDecoderBlock2D",) * n,
                        latent_channels=4, sample_size=16, **kw)
    with torch.no_grad():  # the norms and biases away from 1 and 0, so that each one counts
        for pname, p in vae.named_parameters():
            if "norm" in pname:
                p.add_(torch.randn_like(p) * 0.2)
            elif pname.endswith("bias"):
                p.normal_(0, 0.05)
    vae.eval().save_pretrained(out + "/" + name, safe_serialization=True)
    x = torch.rand(2, 3, 16, 24) * 2 - 1
    with torch.no_grad():
        post = vae.encode(x).latent_dist
        image = vae.decode(post.mean).sample
    save_file({"x": x, "mean": post.mean.contiguous(), "logvar": post.logvar.contiguous(),
               "image": image.contiguous()}, out + "/" + name + ".expected.safetensors")
build("vae", block_out_channels=(16, 32), layers_per_block=1, norm_num_groups=8, scaling_factor=0.3,
      shift_factor=0.1)
build("plain", block_out_channels=(8, 16, 16), layers_per_block=2, norm_num_groups=4, use_quant_conv=False,
      use_post_quant_conv=False, mid_block_add_attention=False)
)";

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

void expect_matches(const std::string& dir, const std::string& expected) {
  const Vae vae = load_vae(dir, at::kCPU, false);
  const auto want = io::SafetensorsFile::open(expected);
  const auto post = vae.net->encode(want.get("x"));
  ASSERT_EQ(post.mean.sizes(), want.get("mean").sizes()) << dir;
  EXPECT_GT(want.get("mean").abs().max().item<double>(), 0.05) << dir;  // not a vanished signal
  EXPECT_LT(max_diff(post.mean, want.get("mean")), 1e-4) << dir;
  EXPECT_LT(max_diff(post.logvar, want.get("logvar")), 1e-4) << dir;
  const at::Tensor image = vae.net->decode(want.get("mean"));
  ASSERT_EQ(image.sizes(), want.get("image").sizes()) << dir;
  EXPECT_LT(max_diff(image, want.get("image")), 1e-4) << dir;
}

TEST(Vae, EqualsDiffusersAutoencoderKL) {
  TempDir dir;
  const auto r = run_python_script(dir, kReference, "'" + dir.path() + "'");
  if (r.code == kPythonSkip) GTEST_SKIP() << "diffusers is not installed";
  ASSERT_EQ(r.code, 0) << r.output;
  expect_matches(dir.file("vae"), dir.file("vae.expected.safetensors"));
  expect_matches(dir.file("plain"), dir.file("plain.expected.safetensors"));
  const Vae vae = load_vae(dir.file("vae"), at::kCPU, false);
  EXPECT_DOUBLE_EQ(vae.scale.scale, 0.3);
  EXPECT_DOUBLE_EQ(vae.scale.shift, 0.1);
  EXPECT_EQ(vae.net->config().downsample_factor(), 2);
}

// Older diffusers files name the mid-block attention query, key, value and
// proj_attn; they load as the new names.
TEST(Vae, OlderAttentionNamesLoad) {
  TempDir dir;
  const std::string folder = perftrain::testing::write_random_vae(dir.file("vae"));
  const auto c = read_vae_config(folder);
  const auto file = io::SafetensorsFile::open(folder + "/diffusion_pytorch_model.safetensors");
  std::map<std::string, at::Tensor> weights;
  for (const auto& n : file.names()) weights[n] = file.get(n);
  const auto renamed = [](std::map<std::string, at::Tensor> w) {
    std::map<std::string, at::Tensor> out;
    for (auto& [n, t] : w) {
      std::string m = n;
      for (const auto& [from, to] : {std::pair<std::string, std::string>{"to_q", "query"}, {"to_k", "key"},
                                     {"to_v", "value"}, {"to_out.0", "proj_attn"}})
        if (m.find("." + from + ".") != std::string::npos) m.replace(m.find("." + from + "."), from.size() + 2, "." + to + ".");
      out[m] = t;
    }
    return out;
  };
  const auto old = renamed(weights);
  ASSERT_TRUE(old.count("encoder.mid_block.attentions.0.query.weight"));
  const auto a = models::autoencoder_kl_from(c, weights, "new", at::kCPU, at::kFloat);
  const auto b = models::autoencoder_kl_from(c, old, "old", at::kCPU, at::kFloat);
  const at::Tensor x = at::randn({1, 3, 8, 8});
  EXPECT_EQ(max_diff(a->encode(x).mean, b->encode(x).mean), 0.0);
}

TEST(Vae, BadFoldersNameTheFileAndTheProblem) {
  TempDir dir;
  const std::string good = perftrain::testing::write_random_vae(dir.file("good"));
  const auto err = [](const std::string& folder) {
    return error_of<UsageError>([&] { load_vae(folder, at::kCPU, false); });
  };
  std::string msg = err(dir.file("none"));
  EXPECT_TRUE(contains(msg, "--vae " + dir.file("none") + " is not a directory")) << msg;
  dir.mkdir("empty");
  msg = err(dir.file("empty"));
  EXPECT_TRUE(contains(msg, "has no config.json")) << msg;

  perftrain::testing::write_random_vae(dir.file("noweights"));
  ::unlink((dir.file("noweights") + "/diffusion_pytorch_model.safetensors").c_str());
  msg = err(dir.file("noweights"));
  EXPECT_TRUE(contains(msg, "has no diffusion_pytorch_model.safetensors")) << msg;

  const std::string bad_json = perftrain::testing::write_random_vae(dir.file("badjson"));
  write_raw(bad_json + "/config.json", "{\"latent_channels\": \"four\"}");
  msg = err(bad_json);
  EXPECT_TRUE(contains(msg, bad_json + "/config.json: key 'latent_channels' has the wrong type")) << msg;
  write_raw(bad_json + "/config.json", "{\"_class_name\": \"VQModel\"}");
  EXPECT_TRUE(contains(err(bad_json), "_class_name 'VQModel', expected AutoencoderKL"));
  write_raw(bad_json + "/config.json", "{\"down_block_types\": [\"AttnDownEncoderBlock2D\"]}");
  EXPECT_TRUE(contains(err(bad_json), "only DownEncoderBlock2D is supported"));

  // Weights of another shape: the config says 8 latent channels.
  const std::string other = dir.file("other");
  auto c = perftrain::testing::tiny_vae_config();
  c.latent_channels = 8;
  perftrain::testing::write_random_vae(other, c);
  ::rename((good + "/diffusion_pytorch_model.safetensors").c_str(), (other + "/diffusion_pytorch_model.safetensors").c_str());
  msg = err(other);
  EXPECT_TRUE(contains(msg, other + "/diffusion_pytorch_model.safetensors does not match")) << msg;
  EXPECT_TRUE(contains(msg, "mis-shaped encoder.conv_out.weight [8, 32, 3, 3] (expected [16, 32, 3, 3])")) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;

  // A missing and an unexpected tensor.
  const std::string extra = perftrain::testing::write_random_vae(dir.file("extra"));
  const auto w = io::SafetensorsFile::open(extra + "/diffusion_pytorch_model.safetensors");
  io::NamedTensors named;
  for (const auto& n : w.names())
    if (n != "decoder.conv_out.bias") named.emplace_back(n, w.get(n).clone());
  named.emplace_back("encoder.mystery", at::randn({2}));
  io::save_safetensors(extra + "/diffusion_pytorch_model.safetensors", named);
  msg = err(extra);
  EXPECT_TRUE(contains(msg, "missing decoder.conv_out.bias; unexpected encoder.mystery")) << msg;
}

}  // namespace
}  // namespace perftrain::train
