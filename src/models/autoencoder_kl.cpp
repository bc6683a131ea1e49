#include "models/autoencoder_kl.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/group_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/upsample_nearest2d.h>
#include <ATen/ops/zeros.h>

#include <set>
#include <utility>

#include "base/error.h"

namespace perftrain::models {
namespace {

constexpr double kNormEps = 1e-6;

// nn.Conv2d with a bias ("weight", "bias").
class Conv2d : public nn::Module {
 public:
  Conv2d(int64_t in, int64_t out, int64_t k, int64_t stride = 1, int64_t pad = -1)
      : weight(at::zeros({out, in, k, k})), bias(at::zeros({out})), stride_(stride), pad_(pad < 0 ? k / 2 : pad) {
    register_parameter("weight", &weight, false);
    register_parameter("bias", &bias, false);
  }
  at::Tensor forward(const at::Tensor& x) const { return at::conv2d(x, weight, bias, {stride_, stride_}, {pad_, pad_}); }
  at::Tensor weight, bias;

 private:
  int64_t stride_, pad_;
};

class GroupNorm : public nn::Module {
 public:
  GroupNorm(int64_t channels, int64_t groups) : weight(at::zeros({channels})), bias(at::zeros({channels})), groups_(groups) {
    register_parameter("weight", &weight, false);
    register_parameter("bias", &bias, false);
  }
  at::Tensor forward(const at::Tensor& x) const { return at::group_norm(x, groups_, weight, bias, kNormEps); }
  at::Tensor weight, bias;

 private:
  int64_t groups_;
};

class Linear : public nn::Module {
 public:
  explicit Linear(int64_t dim) : weight(at::zeros({dim, dim})), bias(at::zeros({dim})) {
    register_parameter("weight", &weight, false);
    register_parameter("bias", &bias, false);
  }
  at::Tensor forward(const at::Tensor& x) const { return at::linear(x, weight, bias); }
  at::Tensor weight, bias;
};

// ResnetBlock2D without a time embedding: x + conv2(silu(norm2(conv1(silu(norm1(x)))))),
// x through a 1x1 conv_shortcut when the channel count changes.
class ResnetBlock : public nn::Module {
 public:
  ResnetBlock(int64_t in, int64_t out, int64_t groups)
      : norm1_(in, groups), conv1_(in, out, 3), norm2_(out, groups), conv2_(out, out, 3) {
    register_module("norm1", &norm1_);
    register_module("conv1", &conv1_);
    register_module("norm2", &norm2_);
    register_module("conv2", &conv2_);
    if (in != out) {
      shortcut_ = std::make_unique<Conv2d>(in, out, 1);
      register_module("conv_shortcut", shortcut_.get());
    }
  }
  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor h = conv1_.forward(at::silu(norm1_.forward(x)));
    h = conv2_.forward(at::silu(norm2_.forward(h)));
    return (shortcut_ ? shortcut_->forward(x) : x) + h;
  }

 private:
  GroupNorm norm1_;
  Conv2d conv1_;
  GroupNorm norm2_;
  Conv2d conv2_;
  std::unique_ptr<Conv2d> shortcut_;
};

// The mid block's Attention (one head of all channels over the H*W
// positions, GroupNorm first, residual added).
class SpatialAttention : public nn::Module {
 public:
  SpatialAttention(int64_t channels, int64_t groups)
      : group_norm_(channels, groups), to_q_(channels), to_k_(channels), to_v_(channels), to_out_(channels) {
    register_module("group_norm", &group_norm_);
    register_module("to_q", &to_q_);
    register_module("to_k", &to_k_);
    register_module("to_v", &to_v_);
    register_module("to_out.0", &to_out_);
  }
  at::Tensor forward(const at::Tensor& x) const {
    const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
    const at::Tensor t = group_norm_.forward(x).view({n, c, h * w}).transpose(1, 2);  // [N, HW, C]
    const at::Tensor q = to_q_.forward(t).unsqueeze(1), k = to_k_.forward(t).unsqueeze(1),
                     v = to_v_.forward(t).unsqueeze(1);
    const at::Tensor a = at::scaled_dot_product_attention(q, k, v).squeeze(1);
    return to_out_.forward(a).transpose(1, 2).reshape({n, c, h, w}) + x;
  }

 private:
  GroupNorm group_norm_;
  Linear to_q_, to_k_, to_v_, to_out_;
};

// UNetMidBlock2D: resnet, (attention), resnet.
class MidBlock : public nn::Module {
 public:
  MidBlock(int64_t channels, int64_t groups, bool attention) {
    resnets_.add(std::make_unique<ResnetBlock>(channels, channels, groups));
    resnets_.add(std::make_unique<ResnetBlock>(channels, channels, groups));
    if (attention) attentions_.add(std::make_unique<SpatialAttention>(channels, groups));
    register_module("attentions", &attentions_);
    register_module("resnets", &resnets_);
  }
  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor h = resnets_[0].forward(x);
    if (attentions_.size() > 0) h = attentions_[0].forward(h);
    return resnets_[1].forward(h);
  }

 private:
  nn::ModuleList<SpatialAttention> attentions_;
  nn::ModuleList<ResnetBlock> resnets_;
};

// Downsample2D / Upsample2D: their convolution is "conv".
class Resample : public nn::Module {
 public:
  Resample(int64_t channels, bool down) : conv(channels, channels, 3, down ? 2 : 1, down ? 0 : 1) {
    register_module("conv", &conv);
  }
  Conv2d conv;
};

// DownEncoderBlock2D (resample: a stride-2 3x3 conv after zero padding on the
// right and bottom) or UpDecoderBlock2D (resample: nearest 2x, then a 3x3 conv).
class ResampleBlock : public nn::Module {
 public:
  enum class Kind { kDown, kUp };
  ResampleBlock(Kind kind, int64_t in, int64_t out, int64_t layers, int64_t groups, bool resample) : kind_(kind) {
    for (int64_t i = 0; i < layers; ++i) resnets_.add(std::make_unique<ResnetBlock>(i == 0 ? in : out, out, groups));
    register_module("resnets", &resnets_);
    if (!resample) return;
    resample_.add(std::make_unique<Resample>(out, kind == Kind::kDown));
    register_module(kind == Kind::kDown ? "downsamplers" : "upsamplers", &resample_);
  }
  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor h = x;
    for (size_t i = 0; i < resnets_.size(); ++i) h = resnets_[i].forward(h);
    if (resample_.size() == 0) return h;
    const Conv2d& conv = resample_[0].conv;
    if (kind_ == Kind::kDown) return conv.forward(at::constant_pad_nd(h, {0, 1, 0, 1}, 0));
    return conv.forward(at::upsample_nearest2d(h, {h.size(2) * 2, h.size(3) * 2}));
  }

 private:
  Kind kind_;
  nn::ModuleList<ResnetBlock> resnets_;
  nn::ModuleList<Resample> resample_;  // "downsamplers.0" / "upsamplers.0", as diffusers' ModuleList
};

// Encoder and Decoder: conv_in, the blocks (the decoder's mid block first),
// GroupNorm, SiLU, conv_out.
class Coder : public nn::Module {
 public:
  Coder(const AutoencoderKLConfig& c, bool encoder) : encoder_(encoder) {
    const auto& ch = c.block_out_channels;
    const int64_t blocks = static_cast<int64_t>(ch.size()), g = c.norm_num_groups;
    conv_in_ = std::make_unique<Conv2d>(encoder ? c.in_channels : c.latent_channels, encoder ? ch.front() : ch.back(), 3);
    mid_ = std::make_unique<MidBlock>(ch.back(), g, c.mid_block_add_attention);
    using Kind = ResampleBlock::Kind;
    for (int64_t i = 0; i < blocks; ++i) {
      const bool last = i == blocks - 1;
      if (encoder) {
        blocks_.add(std::make_unique<ResampleBlock>(Kind::kDown, ch[i == 0 ? 0 : i - 1], ch[i], c.layers_per_block, g,
                                                    !last));
      } else {
        const size_t from = ch.size() - static_cast<size_t>(i == 0 ? 1 : i), to = ch.size() - 1 - static_cast<size_t>(i);
        blocks_.add(std::make_unique<ResampleBlock>(Kind::kUp, ch[from], ch[to], c.layers_per_block + 1, g, !last));
      }
    }
    const int64_t out_ch = encoder ? ch.back() : ch.front();
    norm_out_ = std::make_unique<GroupNorm>(out_ch, g);
    conv_out_ = std::make_unique<Conv2d>(out_ch, encoder ? 2 * c.latent_channels : c.out_channels, 3);
    register_module("conv_in", conv_in_.get());
    register_module(encoder ? "down_blocks" : "up_blocks", &blocks_);
    register_module("mid_block", mid_.get());
    register_module("conv_norm_out", norm_out_.get());
    register_module("conv_out", conv_out_.get());
  }
  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor h = conv_in_->forward(x);
    if (!encoder_) h = mid_->forward(h);
    for (size_t i = 0; i < blocks_.size(); ++i) h = blocks_[i].forward(h);
    if (encoder_) h = mid_->forward(h);
    return conv_out_->forward(at::silu(norm_out_->forward(h)));
  }

 private:
  bool encoder_;
  std::unique_ptr<Conv2d> conv_in_;
  nn::ModuleList<ResampleBlock> blocks_;
  std::unique_ptr<MidBlock> mid_;
  std::unique_ptr<GroupNorm> norm_out_;
  std::unique_ptr<Conv2d> conv_out_;
};

}  // namespace

void AutoencoderKLConfig::validate(const std::string& origin) const {
  const auto bad = [&](const std::string& what) { throw UsageError(origin + ": " + what); };
  if (block_out_channels.empty() || block_out_channels.size() > 8)
    bad("block_out_channels must list 1 to 8 widths");
  for (const auto& t : down_block_types)
    if (t != "DownEncoderBlock2D") bad("down_block_types '" + t + "': only DownEncoderBlock2D is supported");
  for (const auto& t : up_block_types)
    if (t != "UpDecoderBlock2D") bad("up_block_types '" + t + "': only UpDecoderBlock2D is supported");
  if (down_block_types.size() != block_out_channels.size() || up_block_types.size() != block_out_channels.size())
    bad("down_block_types and up_block_types need one entry per block_out_channels width");
  if (act_fn != "silu" && act_fn != "swish") bad("act_fn '" + act_fn + "': only silu is supported");
  if (in_channels < 1 || out_channels < 1 || latent_channels < 1 || layers_per_block < 1 || norm_num_groups < 1)
    bad("in_channels, out_channels, latent_channels, layers_per_block and norm_num_groups must be positive");
  for (int64_t c : block_out_channels)
    if (c < 1 || c % norm_num_groups != 0)
      bad("block_out_channels " + std::to_string(c) + " is not a multiple of norm_num_groups " +
          std::to_string(norm_num_groups));
  if (!(scaling_factor > 0)) bad("scaling_factor must be positive");
}

at::Tensor AutoencoderKL::Posterior::sample(const at::Tensor& noise) const { return mean + at::exp(0.5 * logvar) * noise; }

struct AutoencoderKL::Parts {
  explicit Parts(const AutoencoderKLConfig& c) : encoder(c, true), decoder(c, false) {
    if (c.use_quant_conv) quant_conv = std::make_unique<Conv2d>(2 * c.latent_channels, 2 * c.latent_channels, 1);
    if (c.use_post_quant_conv) post_quant_conv = std::make_unique<Conv2d>(c.latent_channels, c.latent_channels, 1);
  }
  Coder encoder, decoder;
  std::unique_ptr<Conv2d> quant_conv, post_quant_conv;
};

AutoencoderKL::AutoencoderKL(const AutoencoderKLConfig& cfg) : cfg_(cfg) {
  cfg.validate("AutoencoderKL");
  p_ = std::make_unique<Parts>(cfg);
  register_module("encoder", &p_->encoder);
  register_module("decoder", &p_->decoder);
  if (p_->quant_conv) register_module("quant_conv", p_->quant_conv.get());
  if (p_->post_quant_conv) register_module("post_quant_conv", p_->post_quant_conv.get());
}

AutoencoderKL::~AutoencoderKL() = default;

at::ScalarType AutoencoderKL::dtype() const { return p_->encoder.state().front().second.scalar_type(); }

AutoencoderKL::Posterior AutoencoderKL::encode(const at::Tensor& images) const {
  at::NoGradGuard no_grad;
  at::Tensor h = p_->encoder.forward(images.to(dtype()));
  if (p_->quant_conv) h = p_->quant_conv->forward(h);
  h = h.to(at::kFloat);
  const int64_t c = cfg_.latent_channels;
  return {h.narrow(1, 0, c), at::clamp(h.narrow(1, c, c), -30.0, 20.0)};
}

at::Tensor AutoencoderKL::decode(const at::Tensor& latents) const {
  at::NoGradGuard no_grad;
  at::Tensor z = latents.to(dtype());
  if (p_->post_quant_conv) z = p_->post_quant_conv->forward(z);
  return p_->decoder.forward(z).to(at::kFloat);
}

namespace {

// diffusers' _convert_deprecated_attention_blocks: the mid blocks' old names.
std::string current_attention_name(const std::string& name) {
  static const std::pair<const char*, const char*> renames[] = {
      {".query.", ".to_q."}, {".key.", ".to_k."}, {".value.", ".to_v."}, {".proj_attn.", ".to_out.0."}};
  if (name.find(".attentions.") == std::string::npos) return name;
  for (const auto& [from, to] : renames) {
    const size_t at = name.find(from);
    if (at != std::string::npos) return name.substr(0, at) + to + name.substr(at + std::string(from).size());
  }
  return name;
}

// "a, b, c (and N more)".
std::string first_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 3; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 3) out += " (and " + std::to_string(names.size() - 3) + " more)";
  return out;
}

}  // namespace

std::unique_ptr<AutoencoderKL> autoencoder_kl_from(const AutoencoderKLConfig& cfg,
                                                   std::map<std::string, at::Tensor> weights,
                                                   const std::string& origin, const c10::Device& device,
                                                   at::ScalarType dtype) {
  if (dtype != at::kFloat && !(dtype == at::kBFloat16 && device.is_cuda()))
    throw UsageError(origin + ": the VAE runs in float32, or bfloat16 on CUDA");
  std::map<std::string, at::Tensor> named;
  for (auto& [name, t] : weights) named[current_attention_name(name)] = std::move(t);
  auto net = std::make_unique<AutoencoderKL>(cfg);
  std::vector<std::string> missing, reshaped;
  std::set<std::string> expected;
  for (const auto& [name, t] : net->state()) {
    expected.insert(name);
    const auto it = named.find(name);
    if (it == named.end()) missing.push_back(name);
    else if (it->second.sizes() != t.sizes())
      reshaped.push_back(name + " " + c10::str(it->second.sizes()) + " (expected " + c10::str(t.sizes()) + ")");
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : named)
    if (!expected.count(name)) unexpected.push_back(name);
  std::string problems;
  const auto add = [&](const char* what, const std::vector<std::string>& names) {
    if (!names.empty()) problems += (problems.empty() ? "" : "; ") + std::string(what) + " " + first_names(names);
  };
  add("missing", missing);
  add("unexpected", unexpected);
  add("mis-shaped", reshaped);
  if (!problems.empty())
    throw UsageError(origin + " does not match its config.json's AutoencoderKL: " + problems);
  net->transform([&](const std::string& name, const at::Tensor&) {
    return named.at(name).to(device, dtype).contiguous();
  });
  return net;
}

}  // namespace perftrain::models
