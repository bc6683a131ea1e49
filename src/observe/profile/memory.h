// The CUDA caching allocator's view of a run: statistics (peaks, device
// allocations and frees, retries) and a memory snapshot that PyTorch's memory
// viewer (pytorch.org/memory_viz) opens: libtorch's allocation history
// (torch::cuda::_record_memory_history) pickled by
// torch::cuda::_memory_snapshot_pickled. Without a CUDA device every call
// returns empty values and records nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace perftrain::observe::profile {

struct AllocatorStats {
  bool valid = false;  // false without CUDA
  double allocated_gib = 0, reserved_gib = 0;            // now
  double peak_allocated_gib = 0, peak_reserved_gib = 0;  // since the last reset
  int64_t device_allocs = 0, device_frees = 0;           // cudaMalloc / cudaFree by the allocator
  int64_t alloc_retries = 0, ooms = 0;
  int64_t segments = 0;
  double total_gib = 0;  // the device's memory
};

AllocatorStats allocator_stats(int device = 0);
// "peak 12.3 GiB allocated, 14.0 reserved of 139.8; 3 cudaMalloc, 0 cudaFree, 0 retries"
std::string describe(const AllocatorStats& s);

// Starts recording allocations (with C++ stacks when with_stacks; they cost
// time at each allocation); stops with stop_memory_history.
void start_memory_history(bool with_stacks, size_t max_entries = 100000);
void stop_memory_history();
// Writes the pickled snapshot to path (the allocator's segments and the
// recorded history). False without CUDA or history.
bool save_memory_snapshot(const std::string& path);

}  // namespace perftrain::observe::profile
