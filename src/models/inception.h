// The FID Inception network: exactly pytorch-fid's InceptionV3 with
// use_fid_inception=True (the port of TensorFlow's 2015-12-05 Inception that
// FID, the Inception score and ADM's evaluation suite use): torchvision's
// Inception3 with the FID variants of its blocks (A, C and E_1 average-pool
// without counting the padding, E_2 max-pools), the input resized to 299 x 299
// bilinearly (align_corners false) and scaled from [0, 1] to [-1, 1], the
// 2048-d pool3 features after the global average pool, and where the weights
// carry it the 1008-way `fc` whose logits give the Inception score.
// The weights come from the user: pytorch-fid's
// pt_inception-2015-12-05-6726825d.pth as safetensors, under its state-dict
// names (Conv2d_1a_3x3.conv.weight, Mixed_5b.branch1x1.bn.running_mean, ...,
// fc.weight):
//   python -c "import torch, safetensors.torch as s; s.save_file(torch.load('pt_inception-2015-12-05-6726825d.pth'), 'inception.safetensors')"
// Nothing is downloaded.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <map>
#include <memory>
#include <string>

#include "nn/module.h"

namespace perftrain::models {

// Conv (no bias), BatchNorm (eps 0.001, inference statistics), ReLU:
// torchvision's BasicConv2d ("conv.weight", "bn.running_var", ...).
class BasicConv2d : public nn::Module {
 public:
  struct Shape {
    int64_t kh, kw, stride = 1, ph = 0, pw = 0;
  };
  BasicConv2d(int64_t in, int64_t out, Shape k);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  struct Conv : nn::Module {
    explicit Conv(at::Tensor w);
    at::Tensor weight;
  };
  struct BatchNorm : nn::Module {
    explicit BatchNorm(int64_t channels);
    at::Tensor weight, bias, running_mean, running_var;
  };
  Shape k_;
  Conv conv_;
  BatchNorm bn_;
};

class InceptionV3 : public nn::Module {
 public:
  // with_fc: hold the 1008-way classifier (for the Inception score).
  explicit InceptionV3(bool with_fc);
  ~InceptionV3() override;
  struct Output {
    at::Tensor pool3;   // [N, 2048] float32
    at::Tensor logits;  // [N, 1008], undefined without fc
  };
  // images: [N, 3, H, W] with values in [0, 1] (any float dtype).
  Output forward(const at::Tensor& images) const;
  bool has_fc() const { return fc_weight_.defined(); }

  static constexpr int64_t kFeatures = 2048;
  static constexpr int64_t kClasses = 1008;

 private:
  struct Blocks;
  std::unique_ptr<Blocks> b_;
  at::Tensor fc_weight_, fc_bias_;
};

// The network with the given weights (by state-dict name; `origin` names
// their file in errors), on `device`. UsageError naming the origin and the
// first missing or mis-shaped tensor; fc is optional (without it, no
// Inception score); num_batches_tracked and AuxLogits tensors are not used.
std::unique_ptr<InceptionV3> inception_from(const std::map<std::string, at::Tensor>& weights,
                                            const std::string& origin, const c10::Device& device);

}  // namespace perftrain::models
