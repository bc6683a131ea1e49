// The DiT's input embeddings, named as in the reference implementation:
//   PatchEmbed        "proj"            conv p x p, stride p: image -> tokens
//   TimestepEmbedder  "mlp.0", "mlp.2"  256 sinusoidal frequencies -> MLP(SiLU)
//   LabelEmbedder     "embedding_table" one row per class, plus a null class
//                                       (the last row) for classifier-free guidance
// and the fixed 2-D sin-cos positional embedding.
#pragma once

#include "nn/linear.h"

namespace perftrain::nn {

class PatchEmbed : public Module {
 public:
  PatchEmbed(int64_t in_channels, int64_t hidden, int64_t patch, at::Generator& gen);
  at::Tensor forward(const at::Tensor& x) const;  // [B, C, H, W] -> [B, H/p * W/p, hidden]
  // The same map as one matrix product (ops::linear) on the patches, with
  // the weight viewed as [hidden, C*p*p], in `act` (the autocast dtype). The
  // result is contiguous: the conv's is a transposed view that made the
  // positional add and each later reader of the residual stream copy it.
  at::Tensor forward_as_product(const at::Tensor& x, at::ScalarType act) const;

  at::Tensor weight;  // "proj.weight" [hidden, C, p, p]
  at::Tensor bias;    // "proj.bias" [hidden]

 private:
  class Proj : public Module {
   public:
    Proj(at::Tensor* w, at::Tensor* b) {
      register_parameter("weight", w);
      register_parameter("bias", b);
    }
  };
  int64_t patch_;
  Proj proj_{&weight, &bias};
};

class TimestepEmbedder : public Module {
 public:
  static constexpr int64_t kFrequencies = 256;
  // bias false: both linears without bias (the single-stream model's).
  TimestepEmbedder(int64_t hidden, at::Generator& gen, bool bias = true);
  at::Tensor forward(const at::Tensor& t) const;  // [B] float -> [B, hidden]

 private:
  class Mlp : public Module {  // Sequential(Linear, SiLU, Linear)
   public:
    Mlp(int64_t hidden, at::Generator& gen, bool bias);
    Linear l0, l2;
  };
  Mlp mlp_;
};

// [B] float timesteps -> [B, dim]: cat(cos(t f), sin(t f)), f_i = 10000^(-i/(dim/2)).
at::Tensor timestep_frequencies(const at::Tensor& t, int64_t dim);

class LabelEmbedder : public Module {
 public:
  // with_null_class: one more row for the "no label" class num_classes.
  LabelEmbedder(int64_t num_classes, int64_t hidden, bool with_null_class, at::Generator& gen);
  at::Tensor forward(const at::Tensor& y) const;  // [B] int64 -> [B, hidden]

  at::Tensor embedding_table;
};

// [grid*grid, dim] float32: 2-D sin-cos positional embedding (half the
// channels encode the column, half the row), computed in double.
at::Tensor sincos_pos_embed_2d(int64_t dim, int64_t grid);

}  // namespace perftrain::nn
