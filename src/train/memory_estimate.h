// How much memory a training step takes, from the config alone (closed form,
// nothing allocated): the parameters, their gradients, the optimizer's state
// (AdamW moments, the EMA model, the bf16 weight copies the fused path keeps),
// the activations autograd saves for backward (by path: the fused chained
// blocks, per-block recompute, or the plain ATen blocks; DiT and the
// single-stream family each by its own formulas, the latter over condition
// plus image tokens) and the backward's working set. It counts what the step
// runner and the device optimizer really create (train/step_runner.cpp,
// train/device_optimizer.cpp, the ops' save_for_backward lists). Measured against the caching allocator's peak on
// an H200 (tests/train/memory_estimate_gpu_test.cpp); the estimate aims at
// the peak within about 10%. batch_size is the micro-batch (train.batch_size):
// with train.accumulate = N the activations stay one micro-batch's, the
// batch buffers and the step's noise count N of them.
//
// run_training uses it to refuse, before anything is allocated, a batch that
// cannot fit: on CUDA against the device's free memory, on the CPU against
// the machine's physical memory (sysconf) or what the process's memory
// cgroup still allows (containers, Slurm), whichever is less, with the
// largest batch that fits and whether speed.recompute would.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/config.h"

namespace perftrain::train {

struct MemoryEstimate {
  // (what, bytes), in a fixed order: "parameters", "gradients", "optimizer
  // moments", "EMA model", "bf16 weight copies" ("16-bit weight casts" in
  // fp16, "stacked weight copies" in fp32, "bf16 weight copies and fp8 codes"
  // in fp8), "activations", "backward working
  // set", "batches". Parts that do not exist for the config are 0.
  std::vector<std::pair<std::string, double>> parts;
  double fixed_bytes = 0;       // independent of the batch size
  double per_sample_bytes = 0;  // grows with each sample of the batch
  int64_t batch_size = 0;

  double total_bytes() const { return fixed_bytes + per_sample_bytes * static_cast<double>(batch_size); }
  // "parameters 0.13 GiB, gradients 0.13 GiB, ..., activations 9.8 GiB" (parts that are 0 left out).
  std::string breakdown() const;
};

// The step of cfg on a CUDA device (cuda) or the CPU. precision is
// train.precision ("auto" resolves to bf16 on CUDA, fp32 on the CPU). In
// doubles, so an absurd batch gives an absurd number rather than an overflow.
// optimizer_shards: the ranks the AdamW moments are spread over
// (distributed.shard_optimizer: WORLD_SIZE; 1 otherwise).
MemoryEstimate estimate_training_memory(const TrainConfig& cfg, bool cuda, const std::string& precision,
                                        int optimizer_shards = 1);

// The largest batch whose estimate fits in available_bytes (0 when not even
// one sample does).
int64_t largest_batch_that_fits(const MemoryEstimate& estimate, double available_bytes);

// Bytes a run may use: on CUDA the device's free memory less a reserve for
// the CUDA context and library workspaces that the caching allocator does
// not count; on the CPU the physical memory less the program's own, or
// cgroup_memory_available("/sys/fs/cgroup", /proc/self/cgroup) if less.
double memory_available_for_training(bool cuda);

// Bytes the memory cgroup of a process still lets it use: the least
// limit - usage over its cgroup and the cgroups above it, cgroup v2
// (memory.max, memory.current) or v1 (memory.limit_in_bytes,
// memory.usage_in_bytes under <root>/memory); infinity where no limit is set
// or none can be read. cgroup_root: where the hierarchy is mounted;
// proc_cgroup: the text of /proc/<pid>/cgroup ("0::/user.slice/..." lines).
double cgroup_memory_available(const std::string& cgroup_root, const std::string& proc_cgroup);

// Throws UsageError naming train.batch_size, the estimate with its breakdown,
// the memory available and a suggestion that fits (speed.recompute = true,
// or the largest batch that fits) when the estimate exceeds available_bytes.
void check_memory_fits(const TrainConfig& cfg, bool cuda, const std::string& precision, double available_bytes,
                       int optimizer_shards = 1);

// "1.50 GiB" (or MiB, TiB, PiB).
std::string bytes_text(double bytes);

}  // namespace perftrain::train
