#include "nn/embeddings.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <vector>

#include "nn/init.h"
#include "ops/linear.h"

namespace perftrain::nn {

PatchEmbed::PatchEmbed(int64_t in_channels, int64_t hidden, int64_t patch, at::Generator& gen)
    : patch_(patch) {
  weight = at::empty({hidden, in_channels, patch, patch}, param_options(gen));
  xavier_uniform_(weight, gen);  // as the reference: on the [hidden, C*p*p] view
  bias = at::zeros({hidden}, param_options(gen));
  register_module("proj", &proj_);
}

at::Tensor PatchEmbed::forward(const at::Tensor& x) const {
  return hooked({x}, [this](at::TensorList in) {
    auto y = at::conv2d(in[0], weight, bias, {patch_, patch_});  // [B, hidden, H/p, W/p]
    return y.flatten(2).transpose(1, 2);                         // [B, T, hidden]
  });
}

at::Tensor PatchEmbed::forward_as_product(const at::Tensor& x, at::ScalarType act) const {
  return hooked({x}, [this, act](at::TensorList in) {
    const at::Tensor& x = in[0];
    const int64_t B = x.size(0), C = x.size(1), p = patch_, gh = x.size(2) / p, gw = x.size(3) / p;
    // [B, C, gh, p, gw, p] -> [B, gh, gw, C, p, p]: each token's patch in the
    // weight's (c, i, j) order, cast and made contiguous in one copy.
    at::Tensor patches = at::empty({B, gh, gw, C, p, p}, x.options().dtype(act));
    patches.copy_(x.reshape({B, C, gh, p, gw, p}).permute({0, 2, 4, 1, 3, 5}));
    patches = patches.view({B, gh * gw, C * p * p});
    return ops::linear(patches, weight.view({weight.size(0), C * p * p}), bias);  // [B, T, hidden]
  });
}

TimestepEmbedder::Mlp::Mlp(int64_t hidden, at::Generator& gen, bool bias)
    : l0(kFrequencies, hidden, gen, bias), l2(hidden, hidden, gen, bias) {
  normal_(l0.weight, 0.02, gen);
  normal_(l2.weight, 0.02, gen);
  register_module("0", &l0);
  register_module("2", &l2);
}

TimestepEmbedder::TimestepEmbedder(int64_t hidden, at::Generator& gen, bool bias) : mlp_(hidden, gen, bias) {
  register_module("mlp", &mlp_);
}

at::Tensor timestep_frequencies(const at::Tensor& t, int64_t dim) {
  const int64_t half = dim / 2;
  auto opts = t.options().dtype(at::kFloat);
  // Same operation order as the reference, so that fp32 rounding matches.
  auto freqs = ((at::arange(half, opts) * -std::log(10000.0)) / half).exp();  // [half]
  auto args = t.to(at::kFloat).unsqueeze(1) * freqs.unsqueeze(0);            // [B, half]
  return at::cat({args.cos(), args.sin()}, -1);                              // [B, dim]
}

at::Tensor TimestepEmbedder::forward(const at::Tensor& t) const {
  return hooked({t}, [this](at::TensorList in) {
    auto h = mlp_.l0.forward(timestep_frequencies(in[0], kFrequencies));
    return mlp_.l2.forward(at::silu(h));
  });
}

LabelEmbedder::LabelEmbedder(int64_t num_classes, int64_t hidden, bool with_null_class,
                             at::Generator& gen) {
  embedding_table = at::empty({num_classes + (with_null_class ? 1 : 0), hidden}, param_options(gen));
  normal_(embedding_table, 0.02, gen);
  register_parameter("embedding_table.weight", &embedding_table);
}

at::Tensor LabelEmbedder::forward(const at::Tensor& y) const {
  return hooked({y}, [this](at::TensorList in) { return at::embedding(embedding_table, in[0]); });
}

at::Tensor sincos_pos_embed_2d(int64_t dim, int64_t grid) {
  // As MAE/DiT: the first dim/2 channels encode the column coordinate (w),
  // the second dim/2 the row (h); each half is [sin(p w_k), cos(p w_k)] with
  // w_k = 1 / 10000^(k / (dim/4)).
  const int64_t quarter = dim / 4;
  std::vector<float> out(static_cast<size_t>(grid * grid * dim));
  for (int64_t h = 0; h < grid; ++h) {
    for (int64_t w = 0; w < grid; ++w) {
      float* row = out.data() + (h * grid + w) * dim;
      const double coords[2] = {static_cast<double>(w), static_cast<double>(h)};
      for (int axis = 0; axis < 2; ++axis) {
        for (int64_t k = 0; k < quarter; ++k) {
          const double omega = 1.0 / std::pow(10000.0, static_cast<double>(k) / quarter);
          const double a = coords[axis] * omega;
          row[axis * 2 * quarter + k] = static_cast<float>(std::sin(a));
          row[axis * 2 * quarter + quarter + k] = static_cast<float>(std::cos(a));
        }
      }
    }
  }
  auto t = at::empty({grid * grid, dim}, at::kFloat);
  std::copy(out.begin(), out.end(), t.data_ptr<float>());
  return t;
}

}  // namespace perftrain::nn
