// A DiT's weights as a looped model's (docs/guide/architectures.md,
// "Converting a DiT to a looped model"): the state dict of a models::DiT (or
// models::SingleStreamDiT) in, the state dict of the models::LoopedDiT of a
// looped config out, by name, so that nothing here builds either model.
//   stem, final layer      copied
//   prelude.i / coda.j     blocks.i / blocks.(P + K*L + j), copied
//   shared.k               the mean of blocks.(P + l*K + k) over the loops l
//                          (shared "mean"), or blocks.(i + k) ("layer:<i>")
//   adapters.l.k.<target>  from a truncated SVD of the loop's layer minus the
//                          shared weight: W_l - W_k ~ U_r S_r V_r^T, lora_B =
//                          U_r sqrt(S_r) / sqrt(s), lora_A = sqrt(S_r) V_r^T /
//                          sqrt(s) with s = alpha / r, so s B A is the
//                          truncation; .bias = b_l - b_k (lora_bias)
//   any other tensor of a shared block (a linear without adapter, the
//   single-stream RMSNorm weights): the shared value; each loop's layer
//   loses its difference, reported as a reconstruction error.
// loop_embed, routers and reinject are not in the result: a fresh
// LoopedDiT's (loop_embed zero, reinject [I | 0]) keep the function.
// At full rank (lora_rank = min(out, in) of every target, here the hidden
// size) with every linear targeted (attn, mlp, adaln) and lora_bias, the
// looped model computes the DiT's function (exactly up to float rounding;
// tests/models/looped_convert_test.cpp).
#pragma once

#include <string>
#include <vector>

#include "models/dit_config.h"
#include "nn/module.h"

namespace perftrain::models {

// How one loop's layer is reconstructed: ||W_layer - W_converted||_F /
// ||W_layer||_F, W_converted = W_shared + s B A for a target with an
// adapter, W_shared for any other tensor (its difference lost).
struct ReconstructionError {
  int64_t layer = 0;   // the source block index
  int64_t loop = 0;    // the loop it became
  std::string tensor;  // its name in the block: "attn.qkv" (an adapter target's weight) or "attn.q_norm.weight"
  bool adapter = false;
  double relative = 0;
};

struct LoopedConversion {
  nn::NamedTensors state;                    // LoopedDiT names
  std::vector<ReconstructionError> errors;   // per loop layer, per target and per other tensor
  std::vector<std::string> notes;            // what the conversion does not carry over, one line each
};

// UsageError, one line naming the keys, when `looped` cannot take the
// source's blocks: family looped, loop_block of the source's family, the
// source's hidden/heads/patch/mlp_ratio/sizes, prelude + shared_group *
// loops + coda equal to the source's depth; `shared` is "mean" or
// "layer:<i>" with i + shared_group <= depth.
void check_looped_conversion(const DiTConfig& source, const DiTConfig& looped, const std::string& shared);

// source: the DiT's state (blocks.<i>.*); looped: a checked looped config.
// The SVDs run in float64 on the tensors' device; the result has the
// source's dtype. RuntimeError naming a tensor the source lacks.
LoopedConversion convert_to_looped(const nn::NamedTensors& source, const DiTConfig& source_cfg, const DiTConfig& looped,
                                   const std::string& shared);

// The errors as a table: one row per loop layer, one column per target
// (and per lost tensor), then the worst of each column.
std::string format_reconstruction(const LoopedConversion& conversion);

}  // namespace perftrain::models
