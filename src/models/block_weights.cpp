#include "models/block_weights.h"

#include "models/dit.h"
#include "models/single_stream.h"

namespace perftrain::models {

DiTBlockWeights weights_of(const DiTBlock& b) {
  const nn::Linear& ada = b.adaLN_modulation.linear();
  return {b.attn.qkv.weight, b.attn.qkv.bias, b.attn.proj.weight, b.attn.proj.bias, b.mlp.fc1.weight,
          b.mlp.fc1.bias,    b.mlp.fc2.weight, b.mlp.fc2.bias,     ada.weight,        ada.bias};
}

SingleStreamBlockWeights weights_of(const SingleStreamBlock& b) {
  return {b.attn.qkv.weight, b.attn.proj.weight, b.ffn.gate.weight, b.ffn.up.weight, b.ffn.down.weight,
          b.adaLN_modulation.weight};
}

}  // namespace perftrain::models
