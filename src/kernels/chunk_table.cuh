// The chunk lookup of the multi-tensor kernels (multi_tensor_adamw, grad_stats):
// a table holds `count` tensors and chunk_end[t], the inclusive prefix sum of
// each tensor's chunk count, so block c finds its tensor by binary search.
#pragma once

namespace perftrain::kernels::detail {

// The tensor holding chunk c: the first t with chunk_end[t] > c.
template <typename Table>
__device__ __forceinline__ int tensor_of_chunk(const Table& table, int c) {
  int lo = 0, hi = table.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (table.chunk_end[mid] > c) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

}  // namespace perftrain::kernels::detail
