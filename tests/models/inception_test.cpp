// The FID Inception network equals pytorch-fid's InceptionV3 (use_fid_inception)
// on the same images: pytorch-fid builds its network with random weights (its
// weight download patched to return the freshly built network's own state
// dict; BatchNorm statistics set from a calibration batch so that the
// activations keep a sensible scale through the 94 convolutions), writes
// them as safetensors, and its pool3 features and fc logits of random images
// of another size (the bilinear resize to 299 too) are the expectation.
// Skipped where pytorch-fid (and torchvision) is not installed.
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <map>

#include "base/error.h"
#include "io/safetensors.h"
#include "models/inception.h"
#include "support/python_script.h"

namespace perftrain::models {
namespace {

using perftrain::testing::kPythonSkip;
using perftrain::testing::run_pytorch_fid_script;
using perftrain::testing::TempDir;

constexpr const char* kReference = R"(
import torch, torchvision
import pytorch_fid.inception as fi
from safetensors.torch import save_file
out = sys.argv[1]
torch.manual_seed(0)
Inception3 = torchvision.models.inception.Inception3
keep = Inception3.load_state_dict
fi.load_state_dict_from_url = lambda *a, **k: None
Inception3.load_state_dict = lambda self, *a, **k: None
fresh = fi.fid_inception_v3()  # pytorch-fid's FID blocks, random weights
Inception3.load_state_dict = keep
for m in fresh.modules():
    if isinstance(m, torch.nn.BatchNorm2d):
        m.reset_running_stats()
        m.momentum = None
fresh.train()
with torch.no_grad():
    fresh(torch.rand(3, 3, 299, 299) * 2 - 1)
    for m in fresh.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.weight.uniform_(0.8, 1.2)
            m.bias.normal_(0, 0.1)
fresh.eval()
state = {k: v.contiguous() for k, v in fresh.state_dict().items()}
fi.load_state_dict_from_url = lambda *a, **k: state
net = fi.InceptionV3([fi.InceptionV3.BLOCK_INDEX_BY_DIM[2048]]).eval()
images = torch.rand(3, 3, 37, 45)
with torch.no_grad():
    pool3 = net(images)[0].squeeze(-1).squeeze(-1)
    logits = fresh.fc(pool3)
save_file(state, out + "/inception.safetensors")
save_file({"images": images, "pool3": pool3, "logits": logits}, out + "/expected.safetensors")
)";

std::map<std::string, at::Tensor> tensors_of(const std::string& path) {
  const auto f = io::SafetensorsFile::open(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& n : f.names()) out[n] = f.get(n);
  return out;
}

TEST(Inception, EqualsPytorchFidsNetworkOnTheSameImages) {
  TempDir dir;
  const auto r = run_pytorch_fid_script(dir, kReference, "'" + dir.path() + "'");
  if (r.code == kPythonSkip) GTEST_SKIP() << "pytorch-fid is not installed";
  ASSERT_EQ(r.code, 0) << r.output;
  const auto net = inception_from(tensors_of(dir.file("inception.safetensors")), "inception", at::kCPU);
  ASSERT_TRUE(net->has_fc());
  const auto want = tensors_of(dir.file("expected.safetensors"));
  const auto got = net->forward(want.at("images"));
  const at::Tensor& pool3 = want.at("pool3");
  ASSERT_EQ(got.pool3.sizes(), pool3.sizes());
  EXPECT_GT(pool3.abs().max().item<double>(), 0.1);  // not a vanished signal
  const double scale = pool3.abs().max().item<double>();
  EXPECT_LT((got.pool3 - pool3).abs().max().item<double>(), 1e-4 * scale);
  const at::Tensor& logits = want.at("logits");
  EXPECT_LT((got.logits - logits).abs().max().item<double>(), 1e-4 * logits.abs().max().item<double>());
}

TEST(Inception, AMissingTensorIsNamedAndFcIsOptional) {
  InceptionV3 shapes(true);
  std::map<std::string, at::Tensor> weights;
  for (const auto& [name, t] : shapes.state()) weights[name] = t;
  weights.erase("fc.weight");
  weights.erase("fc.bias");
  EXPECT_FALSE(inception_from(weights, "w.safetensors", at::kCPU)->has_fc());  // no Inception score then
  weights.erase("Mixed_7c.branch_pool.conv.weight");
  const std::string msg =
      perftrain::testing::error_of<UsageError>([&] { inception_from(weights, "w.safetensors", at::kCPU); });
  EXPECT_TRUE(perftrain::testing::contains(msg, "w.safetensors: no tensor Mixed_7c.branch_pool.conv.weight")) << msg;
}

}  // namespace
}  // namespace perftrain::models
