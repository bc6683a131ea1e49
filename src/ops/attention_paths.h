// Which attention kernels a process ran, per shape: qkv_attention,
// projected_attention and self_attention note each forward's choice (ours,
// cuDNN's, the memory-efficient kernel, ATen's SDPA) with its token count,
// head dim and mask, so that a bench report can say which kernel each shape
// took rather than leave the reader to work out the rules. The backward runs
// the kernel family of its forward, but where "auto" chose cuDNN's forward
// with our tiled backward, which is noted as a path of its own.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace perftrain::ops {

enum class AttentionPath {
  Own,        // our whole-head forward and backward (sm_90, bf16, 256 tokens, head dim 64 or 72)
  Tiled,      // our tiled forward and backward (any T >= 64, head dim 64, 72, 96 or 128, key mask or not; at 256
              // tokens and head dim 64 or 72 the whole-head backward)
  Cudnn,      // cuDNN's fused attention (through ATen's _cudnn_attention ops)
  TiledBackward,  // our tiled backward after cuDNN's forward (attention = "auto" where that plan timed fastest)
  Efficient,  // ATen's memory-efficient kernel by name (masked, T % 128 == 64: cuDNN's NaN there)
  Sdpa,       // at::scaled_dot_product_attention (CPU, fp32, shapes cuDNN refused)
};

// Records one forward's choice (thread-safe; a set lookup per call).
void note_attention_path(AttentionPath path, int64_t tokens, int64_t head_dim, bool masked, c10::ScalarType dtype);

// One line per distinct (path, tokens, head dim, mask, dtype) noted since the
// last reset, in a fixed order, e.g. "cuDNN fused: 288 tokens, head dim 64,
// key mask, bf16"; with attention = "auto" the tiled, cuDNN and tiled
// backward lines end with the timing that chose them, " (auto, fwd+bwd:
// tiled 0.81 ms, cuDNN 0.93 ms, cuDNN then tiled 0.78 ms)"
// (ops/attention_choice).
std::vector<std::string> attention_paths_used();
void reset_attention_paths();

}  // namespace perftrain::ops
