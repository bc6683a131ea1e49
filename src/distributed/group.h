// The processes of one data-parallel run, on PyTorch's c10d: a TCPStore that
// rank 0 hosts at MASTER_ADDR:MASTER_PORT, Gloo for host tensors and small
// scalars, NCCL for CUDA tensors (where perftrain was built with nccl.h).
// Every collective waits at most `timeout_s`; a peer that died or stopped
// answering, or a master that cannot be reached, is a RuntimeError naming this
// rank and the master's address. Every rank must call the same collectives in
// the same order with tensors of the same shapes.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/launch_env.h"

namespace perftrain::distributed {

struct GroupOptions {
  double timeout_s = 300;  // distributed.timeout_s: connecting, and each collective
  double bucket_mb = 25;   // distributed.bucket_mb: tensors all-reduced together, flattened into buckets of this size
};

class Group {
 public:
  // Connects (rank 0 first hosts the store and waits for the others).
  // device: where the tensors given to all-reduce and broadcast live; a CUDA
  // device needs NCCL (UsageError in a build without it).
  Group(const LaunchEnv& env, c10::Device device, const GroupOptions& opts);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  const LaunchEnv& env() const { return env_; }

  // Each tensor replaced, in place, by its mean over the ranks; tensors of one
  // dtype and device travel together in flat buckets of bucket_mb.
  void allreduce_mean(const std::vector<at::Tensor>& tensors);
  // Starts the sum over the ranks of one contiguous tensor, in place, and
  // returns what finishes it: for a CUDA tensor (NCCL) the collective is
  // ordered after the current stream's work and the finisher makes the
  // current stream wait for it (the host never waits; capturable); for a host
  // tensor (Gloo) it runs in Gloo's threads and the finisher waits on the host.
  // Every rank must start the same sums in the same order.
  std::function<void()> start_allreduce_sum(const at::Tensor& flat);
  // The same for the elementwise maximum over the ranks (fp8's amax).
  std::function<void()> start_allreduce_max(const at::Tensor& flat);
  // Each tensor replaced, in place, by root's.
  void broadcast(const std::vector<at::Tensor>& tensors, int root = 0);
  void barrier();
  // Sums and maxima of a few host numbers over the ranks (Gloo, no device sync).
  std::vector<double> allreduce_sum(const std::vector<double>& values);
  double allreduce_max(double value);

 private:
  struct Impl;
  enum class Reduction { kSum, kMax };
  std::function<void()> start_allreduce(const at::Tensor& flat, Reduction reduction);

  LaunchEnv env_;
  GroupOptions opts_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace perftrain::distributed
