#include "models/feature_net.h"

#include <ATen/ops/conv2d.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/max_pool2d.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/zeros.h>

#include <string>

#include "base/error.h"
#include "nn/init.h"

namespace perftrain::models {

// A 3x3 convolution with bias, padding 1 ("weight", "bias").
struct FeatureNet::Conv : nn::Module {
  Conv(int64_t in, int64_t out, at::Generator& gen) {
    weight = at::empty({out, in, 3, 3}, nn::param_options(gen));
    nn::xavier_uniform_(weight, gen);
    bias = at::zeros({out}, nn::param_options(gen));
    register_parameter("weight", &weight);
    register_parameter("bias", &bias);
  }
  at::Tensor forward(const at::Tensor& x) const { return at::relu(at::conv2d(x, weight, bias, {1, 1}, {1, 1})); }
  at::Tensor weight, bias;
};

namespace {
constexpr int64_t kLastChannels = 64;

int64_t checked_size(int64_t image_size) {
  if (image_size <= 0 || image_size % 8 != 0)
    throw UsageError("the feature network needs images of a multiple of 8 pixels (got " + std::to_string(image_size) +
                     ")");
  return image_size;
}
}  // namespace

FeatureNet::FeatureNet(int64_t in_channels, int64_t image_size, int64_t classes, at::Generator& gen)
    : in_channels_(in_channels),
      image_size_(checked_size(image_size)),
      classes_(classes),
      c1_(std::make_unique<Conv>(in_channels, 16, gen)),
      c2_(std::make_unique<Conv>(16, 32, gen)),
      c3_(std::make_unique<Conv>(32, kLastChannels, gen)),
      hidden_(kLastChannels * (image_size / 8) * (image_size / 8), kFeatures, gen),
      fc_(kFeatures, classes, gen) {
  register_module("conv1", c1_.get());
  register_module("conv2", c2_.get());
  register_module("conv3", c3_.get());
  register_module("hidden", &hidden_);
  register_module("fc", &fc_);
}

FeatureNet::~FeatureNet() = default;

at::Tensor FeatureNet::features(const at::Tensor& images) const {
  at::Tensor x = at::max_pool2d(c1_->forward(images.to(at::kFloat)), {2, 2});
  x = at::max_pool2d(c2_->forward(x), {2, 2});
  x = at::max_pool2d(c3_->forward(x), {2, 2});
  return at::relu(hidden_.forward(x.flatten(1)));
}

at::Tensor FeatureNet::logits(const at::Tensor& features) const { return fc_.forward(features); }

}  // namespace perftrain::models
