// ZeRO-1 (distributed.shard_optimizer; docs/guide/multi-gpu.md): optimizer-state
// sharding over the ranks of a data-parallel run.
//
// Each parameter tensor has one owner rank: whole tensors, assigned largest
// first to the rank holding the fewest elements so far (ties: the earlier
// parameter, the lower rank), so every rank derives the same assignment from
// the parameter order and the world size alone. A rank keeps the AdamW moments
// (and step counters) of its own parameters only and updates only those; every
// rank still holds the whole gradient (averaged), so the gradient norm and
// clipping see all of it. After the update each owner broadcasts its updated
// fp32 weights (in flat buckets of distributed.bucket_mb) and every rank then holds
// the same weights. Replicated on every rank: the fp32 weights (the model's
// parameters, which every forward reads), the bf16 copies the device
// optimizer keeps (each rank casts the received weights: no traffic) and the
// EMA, which each rank updates for every parameter (owners in the fused
// update, the rest right after the broadcast, with the same lerp): the EMA is
// the sampled and saved model, not optimizer state, and keeping it whole
// costs no communication, while sharding it would need a gather before every
// sample and checkpoint.
//
// Checkpoints hold the whole state under the unsharded names: full_state()
// gathers it on rank 0 (over the host, Gloo), so a sharded run resumes
// unsharded, sharded again, or with another number of ranks; on load each
// rank takes its own parameters' tensors from the full state.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace perftrain::distributed {
class Group;
}

namespace perftrain::train {

// The owner rank of each tensor of these sizes (element counts), as above.
std::vector<int> shard_owners(const std::vector<int64_t>& numels, int world_size);

class OptimizerShards {
 public:
  // params: the model's parameters in the optimizer's order; bucket_mb: the
  // broadcast's bucket size (distributed.bucket_mb).
  OptimizerShards(distributed::Group& group, std::vector<std::pair<std::string, at::Tensor>> params, double bucket_mb);

  // Per parameter: whether this rank owns it (DeviceOptimizer's `owned`).
  const std::vector<bool>& owned() const { return owned_; }
  // The owned parameters, for the host AdamW.
  std::vector<std::pair<std::string, at::Tensor>> owned_params() const;

  // Every parameter set to its owner's value (collective; every rank calls it
  // after its update). CUDA tensors travel through NCCL, no host sync.
  void broadcast_weights();

  // The whole optimizer state from each rank's local one (collective): on
  // rank 0, for every parameter in order "exp_avg.<n>", "exp_avg_sq.<n>",
  // "step.<n>" (host copies), then local's other tensors ("loss_scale"); on
  // the other ranks empty.
  std::vector<std::pair<std::string, at::Tensor>> full_state(
      const std::vector<std::pair<std::string, at::Tensor>>& local);

  // "optimizer state sharded over 2 ranks: 41.2 KiB here of 83.0 KiB (...)".
  // state_bytes_here: of this rank's local state (what the optimizer holds).
  std::string describe(int64_t state_bytes_here) const;
  int64_t full_state_bytes() const;  // the unsharded AdamW moments and step counters, fp32

 private:
  distributed::Group& group_;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::vector<int> owner_;
  std::vector<bool> owned_;
  int64_t bucket_bytes_;
};

// The bytes of a list of state tensors.
int64_t state_bytes(const std::vector<std::pair<std::string, at::Tensor>>& state);

}  // namespace perftrain::train
