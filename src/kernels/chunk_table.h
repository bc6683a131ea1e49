// The table the multi-tensor kernels (multi_tensor_adamw, grad_stats) take as
// their kernel parameter: up to kMax tensors and, per tensor, the inclusive
// prefix sum of its chunk counts, so that block c finds its tensor by binary
// search (chunk_table.cuh). A kernel parameter holds 32764 bytes at most.
#pragma once

namespace perftrain::kernels {

template <typename Tensor, int kMax>
struct ChunkTable {
  static constexpr int kMaxTensors = kMax;
  int count;             // tensors in t[]
  int chunks;            // chunk_end[count - 1]
  int chunk_end[kMax];   // inclusive prefix sum of each tensor's chunk count
  Tensor t[kMax];
};

}  // namespace perftrain::kernels
