// The tensors a block's forward reads, held apart from the block object: a
// block's own parameters (weights_of), or a looped model's per-loop weights
// (models/looped.h: the shared block's W merged with the loop's low-rank
// adapter, W + alpha/r * B A, plus the loop's bias delta). The plain and the
// fused forward of a block take one of these, so one block object runs with
// a different set of weights at each loop; gradients reach the block's
// parameters (and the adapters) through whatever made the tensors.
// Matrices are [out, in] as nn::Linear's; a bias may be undefined.
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::models {

class DiTBlock;
class SingleStreamBlock;

struct DiTBlockWeights {
  at::Tensor qkv_w, qkv_b;    // attn.qkv            [3D, D], [3D]
  at::Tensor proj_w, proj_b;  // attn.proj           [D, D], [D]
  at::Tensor fc1_w, fc1_b;    // mlp.fc1             [M, D], [M]
  at::Tensor fc2_w, fc2_b;    // mlp.fc2             [D, M], [D]
  at::Tensor ada_w, ada_b;    // adaLN_modulation.1  [6D, D], [6D]
};
DiTBlockWeights weights_of(const DiTBlock& block);

// Single-stream linears have no bias; the norms' weights stay the block's own.
struct SingleStreamBlockWeights {
  at::Tensor qkv_w;   // attn.qkv          [3D, D]
  at::Tensor proj_w;  // attn.proj         [D, D]
  at::Tensor gate_w;  // ffn.gate          [F, D]
  at::Tensor up_w;    // ffn.up            [F, D]
  at::Tensor down_w;  // ffn.down          [D, F]
  at::Tensor ada_w;   // adaLN_modulation  [4D, D]
};
SingleStreamBlockWeights weights_of(const SingleStreamBlock& block);

}  // namespace perftrain::models
