#include "models/feature_net.h"

#include <ATen/ops/conv2d.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/max_pool2d.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/zeros.h>

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

FeatureNet::FeatureNet(int64_t in_channels, int64_t classes, at::Generator& gen)
    : in_channels_(in_channels),
      classes_(classes),
      c1_(std::make_unique<Conv>(in_channels, 16, gen)),
      c2_(std::make_unique<Conv>(16, 32, gen)),
      c3_(std::make_unique<Conv>(32, kFeatures, gen)),
      fc_(kFeatures, classes, gen) {
  register_module("conv1", c1_.get());
  register_module("conv2", c2_.get());
  register_module("conv3", c3_.get());
  register_module("fc", &fc_);
}

FeatureNet::~FeatureNet() = default;

at::Tensor FeatureNet::features(const at::Tensor& images) const {
  at::Tensor x = at::max_pool2d(c1_->forward(images.to(at::kFloat)), {2, 2});
  x = at::max_pool2d(c2_->forward(x), {2, 2});
  return c3_->forward(x).mean({2, 3});
}

at::Tensor FeatureNet::logits(const at::Tensor& features) const { return fc_.forward(features); }

}  // namespace perftrain::models
