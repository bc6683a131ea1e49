#include "models/inception.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/avg_pool2d.h>
#include <ATen/ops/batch_norm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/max_pool2d.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/upsample_bilinear2d.h>
#include <ATen/ops/zeros.h>

#include <vector>

#include "base/error.h"

namespace perftrain::models {
namespace {

constexpr double kBatchNormEps = 0.001;
constexpr int64_t kInputSize = 299;

// TensorFlow's average pool leaves the padding out of the mean (FID blocks A, C, E_1).
at::Tensor avg_pool_3x3(const at::Tensor& x) {
  return at::avg_pool2d(x, {3, 3}, {1, 1}, {1, 1}, /*ceil_mode=*/false, /*count_include_pad=*/false);
}
at::Tensor max_pool_3x3(const at::Tensor& x, int64_t stride, int64_t pad) {
  return at::max_pool2d(x, {3, 3}, {stride, stride}, {pad, pad});
}

using K = BasicConv2d::Shape;
const K k1{1, 1};
const K k3{3, 3};
const K k3p{3, 3, 1, 1, 1};
const K k3s2{3, 3, 2};
const K k1x7{1, 7, 1, 0, 3};
const K k7x1{7, 1, 1, 3, 0};
const K k1x3{1, 3, 1, 0, 1};
const K k3x1{3, 1, 1, 1, 0};

}  // namespace

BasicConv2d::Conv::Conv(at::Tensor w) : weight(std::move(w)) { register_parameter("weight", &weight, false); }

BasicConv2d::BatchNorm::BatchNorm(int64_t c)
    : weight(at::ones({c})), bias(at::zeros({c})), running_mean(at::zeros({c})), running_var(at::ones({c})) {
  register_parameter("weight", &weight, false);
  register_parameter("bias", &bias, false);
  register_parameter("running_mean", &running_mean, false);
  register_parameter("running_var", &running_var, false);
}

BasicConv2d::BasicConv2d(int64_t in, int64_t out, Shape k)
    : k_(k), conv_(at::zeros({out, in, k.kh, k.kw})), bn_(out) {
  register_module("conv", &conv_);
  register_module("bn", &bn_);
}

at::Tensor BasicConv2d::forward(const at::Tensor& x) const {
  const at::Tensor y = at::conv2d(x, conv_.weight, {}, {k_.stride, k_.stride}, {k_.ph, k_.pw});
  return at::relu(at::batch_norm(y, bn_.weight, bn_.bias, bn_.running_mean, bn_.running_var, /*training=*/false,
                                 0.1, kBatchNormEps, /*cudnn_enabled=*/true));
}

namespace {

// A module whose children are registered under the given names.
class Mixed : public nn::Module {
 protected:
  void add(const char* name, BasicConv2d& c) { register_module(name, &c); }
};

// FIDInceptionA.
class BlockA : public Mixed {
 public:
  BlockA(int64_t in, int64_t pool)
      : b1(in, 64, k1), b5_1(in, 48, k1), b5_2(48, 64, {5, 5, 1, 2, 2}), d1(in, 64, k1), d2(64, 96, k3p),
        d3(96, 96, k3p), bp(in, pool, k1) {
    add("branch1x1", b1), add("branch5x5_1", b5_1), add("branch5x5_2", b5_2), add("branch3x3dbl_1", d1);
    add("branch3x3dbl_2", d2), add("branch3x3dbl_3", d3), add("branch_pool", bp);
  }
  at::Tensor forward(const at::Tensor& x) const {
    return at::cat({b1.forward(x), b5_2.forward(b5_1.forward(x)), d3.forward(d2.forward(d1.forward(x))),
                    bp.forward(avg_pool_3x3(x))}, 1);
  }
  BasicConv2d b1, b5_1, b5_2, d1, d2, d3, bp;
};

// InceptionB (Mixed_6a).
class BlockB : public Mixed {
 public:
  explicit BlockB(int64_t in) : b3(in, 384, k3s2), d1(in, 64, k1), d2(64, 96, k3p), d3(96, 96, k3s2) {
    add("branch3x3", b3), add("branch3x3dbl_1", d1), add("branch3x3dbl_2", d2), add("branch3x3dbl_3", d3);
  }
  at::Tensor forward(const at::Tensor& x) const {
    return at::cat({b3.forward(x), d3.forward(d2.forward(d1.forward(x))), max_pool_3x3(x, 2, 0)}, 1);
  }
  BasicConv2d b3, d1, d2, d3;
};

// FIDInceptionC.
class BlockC : public Mixed {
 public:
  BlockC(int64_t in, int64_t c7)
      : b1(in, 192, k1), s1(in, c7, k1), s2(c7, c7, k1x7), s3(c7, 192, k7x1), d1(in, c7, k1), d2(c7, c7, k7x1),
        d3(c7, c7, k1x7), d4(c7, c7, k7x1), d5(c7, 192, k1x7), bp(in, 192, k1) {
    add("branch1x1", b1), add("branch7x7_1", s1), add("branch7x7_2", s2), add("branch7x7_3", s3);
    add("branch7x7dbl_1", d1), add("branch7x7dbl_2", d2), add("branch7x7dbl_3", d3), add("branch7x7dbl_4", d4);
    add("branch7x7dbl_5", d5), add("branch_pool", bp);
  }
  at::Tensor forward(const at::Tensor& x) const {
    const at::Tensor seven = s3.forward(s2.forward(s1.forward(x)));
    const at::Tensor dbl = d5.forward(d4.forward(d3.forward(d2.forward(d1.forward(x)))));
    return at::cat({b1.forward(x), seven, dbl, bp.forward(avg_pool_3x3(x))}, 1);
  }
  BasicConv2d b1, s1, s2, s3, d1, d2, d3, d4, d5, bp;
};

// InceptionD (Mixed_7a).
class BlockD : public Mixed {
 public:
  explicit BlockD(int64_t in)
      : t1(in, 192, k1), t2(192, 320, k3s2), s1(in, 192, k1), s2(192, 192, k1x7), s3(192, 192, k7x1),
        s4(192, 192, k3s2) {
    add("branch3x3_1", t1), add("branch3x3_2", t2), add("branch7x7x3_1", s1), add("branch7x7x3_2", s2);
    add("branch7x7x3_3", s3), add("branch7x7x3_4", s4);
  }
  at::Tensor forward(const at::Tensor& x) const {
    return at::cat({t2.forward(t1.forward(x)), s4.forward(s3.forward(s2.forward(s1.forward(x)))),
                    max_pool_3x3(x, 2, 0)}, 1);
  }
  BasicConv2d t1, t2, s1, s2, s3, s4;
};

// FIDInceptionE_1 (average pool) and FIDInceptionE_2 (max pool).
class BlockE : public Mixed {
 public:
  BlockE(int64_t in, bool max_pool)
      : max_pool_(max_pool), b1(in, 320, k1), t1(in, 384, k1), t2a(384, 384, k1x3), t2b(384, 384, k3x1),
        d1(in, 448, k1), d2(448, 384, k3p), d3a(384, 384, k1x3), d3b(384, 384, k3x1), bp(in, 192, k1) {
    add("branch1x1", b1), add("branch3x3_1", t1), add("branch3x3_2a", t2a), add("branch3x3_2b", t2b);
    add("branch3x3dbl_1", d1), add("branch3x3dbl_2", d2), add("branch3x3dbl_3a", d3a);
    add("branch3x3dbl_3b", d3b), add("branch_pool", bp);
  }
  at::Tensor forward(const at::Tensor& x) const {
    const at::Tensor t = t1.forward(x);
    const at::Tensor d = d2.forward(d1.forward(x));
    const at::Tensor pooled = max_pool_ ? max_pool_3x3(x, 1, 1) : avg_pool_3x3(x);
    return at::cat({b1.forward(x), at::cat({t2a.forward(t), t2b.forward(t)}, 1),
                    at::cat({d3a.forward(d), d3b.forward(d)}, 1), bp.forward(pooled)}, 1);
  }
  bool max_pool_;
  BasicConv2d b1, t1, t2a, t2b, d1, d2, d3a, d3b, bp;
};

}  // namespace

struct InceptionV3::Blocks {
  BasicConv2d c1a{3, 32, k3s2}, c2a{32, 32, k3}, c2b{32, 64, k3p}, c3b{64, 80, k1}, c4a{80, 192, k3};
  BlockA m5b{192, 32}, m5c{256, 64}, m5d{288, 64};
  BlockB m6a{288};
  BlockC m6b{768, 128}, m6c{768, 160}, m6d{768, 160}, m6e{768, 192};
  BlockD m7a{768};
  BlockE m7b{1280, false}, m7c{2048, true};
};

InceptionV3::InceptionV3(bool with_fc) : b_(std::make_unique<Blocks>()) {
  Blocks& b = *b_;
  const std::vector<std::pair<const char*, nn::Module*>> children = {
      {"Conv2d_1a_3x3", &b.c1a}, {"Conv2d_2a_3x3", &b.c2a}, {"Conv2d_2b_3x3", &b.c2b}, {"Conv2d_3b_1x1", &b.c3b},
      {"Conv2d_4a_3x3", &b.c4a}, {"Mixed_5b", &b.m5b},      {"Mixed_5c", &b.m5c},      {"Mixed_5d", &b.m5d},
      {"Mixed_6a", &b.m6a},      {"Mixed_6b", &b.m6b},      {"Mixed_6c", &b.m6c},      {"Mixed_6d", &b.m6d},
      {"Mixed_6e", &b.m6e},      {"Mixed_7a", &b.m7a},      {"Mixed_7b", &b.m7b},      {"Mixed_7c", &b.m7c}};
  for (const auto& [name, m] : children) register_module(name, m);
  if (with_fc) {
    fc_weight_ = at::zeros({kClasses, kFeatures});
    fc_bias_ = at::zeros({kClasses});
    register_parameter("fc.weight", &fc_weight_, false);
    register_parameter("fc.bias", &fc_bias_, false);
  }
}

InceptionV3::~InceptionV3() = default;

InceptionV3::Output InceptionV3::forward(const at::Tensor& images) const {
  at::NoGradGuard no_grad;
  const Blocks& b = *b_;
  at::Tensor x = at::upsample_bilinear2d(images.to(at::kFloat), {kInputSize, kInputSize}, /*align_corners=*/false);
  x = 2 * x - 1;
  x = max_pool_3x3(b.c2b.forward(b.c2a.forward(b.c1a.forward(x))), 2, 0);
  x = max_pool_3x3(b.c4a.forward(b.c3b.forward(x)), 2, 0);
  x = b.m6a.forward(b.m5d.forward(b.m5c.forward(b.m5b.forward(x))));
  x = b.m6e.forward(b.m6d.forward(b.m6c.forward(b.m6b.forward(x))));
  x = b.m7c.forward(b.m7b.forward(b.m7a.forward(x)));
  Output out;
  out.pool3 = x.mean({2, 3});
  if (has_fc()) out.logits = at::linear(out.pool3, fc_weight_, fc_bias_);
  return out;
}

std::unique_ptr<InceptionV3> inception_from(const std::map<std::string, at::Tensor>& weights,
                                            const std::string& origin, const c10::Device& device) {
  auto net = std::make_unique<InceptionV3>(weights.count("fc.weight") > 0);
  net->transform([&](const std::string& name, const at::Tensor& t) {
    auto it = weights.find(name);
    if (it == weights.end())
      throw UsageError(origin + ": no tensor " + name +
                       " (expected pytorch-fid's pt_inception-2015-12-05 weights as safetensors)");
    if (it->second.sizes() != t.sizes())
      throw UsageError(origin + ": tensor " + name + " has shape " + c10::str(it->second.sizes()) + ", expected " +
                       c10::str(t.sizes()));
    return it->second.to(device, at::kFloat).contiguous();
  });
  return net;
}

}  // namespace perftrain::models
