// Draws batches from a Dataset on a background thread, in an order that
// depends only on (seed, epoch): each epoch is a fresh permutation of all
// samples, and batches run on across epoch boundaries. The position (epoch,
// index of the next sample in that epoch's permutation) is all that a resumed
// run needs to continue the exact same stream.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "data/dataset.h"

namespace perftrain::data {

struct Batch {
  at::Tensor x;  // float32 [B, C, H, W], CPU (pinned when asked)
  at::Tensor y;  // int64 [B], CPU (pinned when asked)
  // Condition features float32 [B, Tc, Dc] and valid lengths int64 [B],
  // when the dataset has them (Dataset::cond_shape); undefined otherwise.
  at::Tensor cond, cond_len;
};

struct LoaderPosition {
  int64_t epoch = 0;
  int64_t index = 0;  // next sample within the epoch's permutation
};

// Data parallel: which slice of every batch this process reads. The order
// and the position stay those of the whole (global) batch, so that every
// world size walks the same stream; rank `index` of `count` gets samples
// [index * B / count, (index + 1) * B / count) of each batch of B.
struct LoaderShard {
  int64_t index = 0;
  int64_t count = 1;
};

// How the loader prepares each batch. Neither changes which samples a batch
// holds, nor their order.
struct LoaderOptions {
  // Threads that read (decode) a batch's samples, each a contiguous part of
  // the rows; the batch is the same for every count.
  int workers = 1;
  // Mirror each sample left-right with probability 1/2 (DiT's random
  // horizontal flip, for image inputs): sample_flipped(seed, epoch, index) of
  // its position in the stream, so a resumed run and every rank and worker
  // count see the same flips.
  bool flip = false;
};

class BatchLoader {
 public:
  // depth: batches prepared ahead. pin_memory: allocate batches in page-locked
  // memory so that a copy to the GPU can be asynchronous (plain memory where
  // there is no CUDA). start (e, size) means (e + 1, 0). Throws UsageError on
  // an empty dataset, batch_size or depth < 1, or a position outside it.
  // batch_size is the global batch; a shard whose count does not divide it
  // is a UsageError too. Batches hold batch_size / shard.count samples.
  // options.workers < 1 is a UsageError.
  BatchLoader(const Dataset& dataset, int64_t batch_size, uint64_t seed,
              LoaderPosition start = {}, bool pin_memory = false, int depth = 3, LoaderShard shard = {},
              LoaderOptions options = {});
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Blocks until a batch is ready. When the dataset threw on the background
  // thread, the batches made before still come first, then every call
  // rethrows that exception.
  Batch next();
  // Position after the last batch next() returned (a batch that ends an epoch
  // leaves it at (epoch + 1, 0)); a loader started there continues the stream.
  LoaderPosition position() const;
  double wait_seconds() const;  // total time next() spent blocked

 private:
  void produce();  // the background thread: fills queue_ up to depth_
  // Rows [lo, hi) of a batch: their samples read, then flipped where drawn.
  void fill_rows(Batch& batch, const int64_t* indices, const LoaderPosition* places, int64_t lo,
                 int64_t hi) const;
  // The batch's rows over options_.workers threads (this one among them).
  void fill(Batch& batch, const int64_t* indices, const LoaderPosition* places) const;

  const Dataset& dataset_;
  int64_t batch_size_;
  LoaderShard shard_;
  LoaderOptions options_;
  uint64_t seed_;
  bool pin_memory_ = false;  // asked for and CUDA present
  int depth_;
  // mutex_ guards the members below; cv_ wakes both the producer (room in
  // the queue, or stop_) and next() (a batch, or error_).
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  LoaderPosition produced_pos_, consumed_pos_;
  std::deque<std::pair<Batch, LoaderPosition>> queue_;
  bool stop_ = false;
  std::exception_ptr error_;
  double wait_seconds_ = 0.0;
  std::thread thread_;
};

// The permutation of [0, n) for one epoch: Fisher-Yates driven by a splitmix64
// stream seeded from (seed, epoch), identical on every platform. Exactly:
//   mix(z)  = splitmix64's finalizer: z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
//             z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31
//   state   = mix(seed ^ mix(uint64(epoch) + 0x9E3779B97F4A7C15))
//   next()  = state += 0x9E3779B97F4A7C15; return mix(state)
//   draw(b) = uniform in [0, b) without bias: r = next() until
//             r >= (2^64 - b) mod b, then r mod b
//   p = [0, 1, ..., n-1]; for i = n-1 down to 1: swap(p[i], p[draw(i + 1)])
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

// Whether the sample at position `index` of epoch `epoch`'s permutation is
// flipped (LoaderOptions::flip): the top bit of
//   mix(mix(mix(seed ^ 0xF11F11F11F11F11F) ^ uint64(epoch)) ^ uint64(index))
// with epoch_permutation's mix.
bool sample_flipped(uint64_t seed, int64_t epoch, int64_t index);

}  // namespace perftrain::data
