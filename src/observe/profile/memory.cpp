#include "observe/profile/memory.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/memory_snapshot.h>

#include <cstdio>

#include "compat/compat.h"
#include "io/atomic_file.h"

namespace perftrain::observe::profile {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr size_t kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);

}  // namespace

AllocatorStats allocator_stats(int device) {
  AllocatorStats s;
  if (!compat::cuda_available()) return s;
  const auto d = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  s.valid = true;
  s.allocated_gib = d.allocated_bytes[kAll].current / kGiB;
  s.reserved_gib = d.reserved_bytes[kAll].current / kGiB;
  s.peak_allocated_gib = d.allocated_bytes[kAll].peak / kGiB;
  s.peak_reserved_gib = d.reserved_bytes[kAll].peak / kGiB;
  s.device_allocs = d.num_device_alloc;
  s.device_frees = d.num_device_free;
  s.alloc_retries = d.num_alloc_retries;
  s.ooms = d.num_ooms;
  s.segments = d.segment[kAll].current;
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) s.total_gib = total_b / kGiB;
  return s;
}

std::string describe(const AllocatorStats& s) {
  if (!s.valid) return "n/a (no CUDA device)";
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "peak %.2f GiB allocated, %.2f GiB reserved of %.1f GiB; now %.2f allocated, %.2f reserved in %lld "
                "segments; %lld cudaMalloc, %lld cudaFree, %lld retries, %lld out-of-memory",
                s.peak_allocated_gib, s.peak_reserved_gib, s.total_gib, s.allocated_gib, s.reserved_gib,
                static_cast<long long>(s.segments), static_cast<long long>(s.device_allocs),
                static_cast<long long>(s.device_frees), static_cast<long long>(s.alloc_retries),
                static_cast<long long>(s.ooms));
  return buf;
}

void start_memory_history(bool with_stacks, size_t max_entries) {
  if (!compat::cuda_available()) return;
  // "all": allocations and frees with their state; stacks "all" adds C++
  // frames (symbolized when the snapshot is taken), "python" records none here.
  torch::cuda::_record_memory_history(std::string("all"), std::string("all"), with_stacks ? "all" : "python",
                                      max_entries);
}

void stop_memory_history() {
  if (!compat::cuda_available()) return;
  torch::cuda::_record_memory_history(std::nullopt, std::nullopt, "python", 0);
}

bool save_memory_snapshot(const std::string& path) {
  if (!compat::cuda_available()) return false;
  io::write_text_atomic(path, torch::cuda::_memory_snapshot_pickled());
  return true;
}

}  // namespace perftrain::observe::profile
