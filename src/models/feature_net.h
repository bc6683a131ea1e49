// The small feature network that evaluates a run on a small data set
// (Fashion-MNIST) in seconds where the Inception network is out of place:
// a CNN classifier (three 3x3 conv + ReLU stages of 16, 32 and 64 channels,
// each followed by a 2x2 max pool, then a linear layer + ReLU giving 128-d
// features, then a linear classifier), trained once on the run's training set
// (train/eval/feature_net_training.h). Its features give a Fréchet distance,
// its predictions the class consistency of class-conditional samples.
// Inputs are images in model space ([-1, 1]), [N, C, H, W] of the size it
// was made for (a multiple of 8).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <memory>

#include "nn/linear.h"
#include "nn/module.h"

namespace perftrain::models {

class FeatureNet : public nn::Module {
 public:
  static constexpr int64_t kFeatures = 128;
  // UsageError when image_size is not a positive multiple of 8.
  FeatureNet(int64_t in_channels, int64_t image_size, int64_t classes, at::Generator& gen);
  ~FeatureNet() override;
  // [N, kFeatures]
  at::Tensor features(const at::Tensor& images) const;
  // [N, classes] from features().
  at::Tensor logits(const at::Tensor& features) const;
  int64_t in_channels() const { return in_channels_; }
  int64_t image_size() const { return image_size_; }
  int64_t classes() const { return classes_; }

 private:
  struct Conv;
  int64_t in_channels_, image_size_, classes_;
  std::unique_ptr<Conv> c1_, c2_, c3_;
  nn::Linear hidden_, fc_;
};

}  // namespace perftrain::models
