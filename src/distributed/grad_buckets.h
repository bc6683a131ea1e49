// Data parallel's gradient averaging, overlapped with backward.
//
// The parameters' gradients travel in flat buckets of at most bucket_mb
// (one all-reduce each; a tensor larger than that alone in its own), formed
// in reverse parameter order, the order backward produces them, as PyTorch
// DDP does; a bucket holds one dtype and device. A hook after each
// parameter's gradient accumulation counts the arrivals, and a bucket whose
// parameters have all arrived is sent at once while backward goes on: on
// CUDA on a communication stream of its own (ordered after the stream that
// produced the gradients, and after the weight-gradient stream through
// `before_send`), the mean copied back into the gradients there too; on the
// CPU in Gloo's threads. Buckets are sent in their order only, so every rank
// issues the same collectives in the same order whatever its hooks' order.
//
// The first backward only observes: everything is sent at its end, and the
// parameters whose gradient arrived once are those later buckets wait for. A
// parameter that never got a gradient there (unused) does not hold its bucket
// back; one whose gradient arrives twice in a backward turns the overlap off
// (all sent at the end, as the first backward). finish() sends what is left
// (nothing is left waiting: no deadlock on a gradient that never comes) and
// joins. Each element's result is the sum over the ranks divided by their
// number, as Group::allreduce_mean gives.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace perftrain::distributed {

class Group;

struct GradBucketOptions {
  double bucket_mb = 25;  // distributed.bucket_mb
  // Called on the communication stream (current) before a bucket's
  // gradients are read there: makes it wait for gradient writes on other
  // streams (the step runner passes the weight-gradient stream's join).
  std::function<void()> before_send;
};

class GradBuckets {
 public:
  // Hooks every parameter that requires a gradient; the hooks do nothing
  // outside begin() .. finish().
  GradBuckets(Group& group, std::vector<at::Tensor> params, GradBucketOptions opts);
  ~GradBuckets();  // removes the hooks
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // Before a backward: arms the hooks.
  void begin();
  // After it: sends the buckets not sent yet, then every gradient holds its
  // mean over the ranks for the current stream (CUDA: the current stream
  // waits for the communication stream; the host does not wait).
  // RuntimeError when a gradient arrived after its bucket had left.
  void finish();

  // The buckets, in sending order: indices into the parameters given.
  const std::vector<std::vector<size_t>>& buckets() const { return layout_; }
  // Whether buckets leave during backward (from the second backward on,
  // unless a gradient arrived twice; note() says why not).
  bool overlapping() const { return overlap_ && backwards_ > 1; }
  const std::string& note() const { return note_; }
  // One line for the log: how many buckets, and whether they leave during
  // backward (or note()).
  std::string describe() const;
  // The last backward, in order: a parameter's gradient arriving (its index
  // i >= 0) and a bucket sent (-(k + 1) for bucket k), finish() included.
  std::vector<int64_t> trace() const;
  // Buckets of the last backward sent before finish().
  int64_t sent_during_backward() const { return sent_early_; }

 private:
  struct Bucket;
  struct Hook;
  void arrived(size_t index);
  void send(size_t k);  // under mutex_

  Group& group_;
  std::vector<at::Tensor> params_;
  GradBucketOptions opts_;
  std::vector<std::vector<size_t>> layout_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<size_t> bucket_of_;          // per parameter
  std::vector<int> fired_;                 // per parameter, this backward
  std::vector<bool> awaited_;              // per parameter: counted for its bucket
  mutable std::mutex mutex_;
  bool armed_ = false, overlap_ = true;
  int64_t backwards_ = 0, sent_early_ = 0;
  size_t next_ = 0;                        // the next bucket to send
  std::string late_, note_;
  std::vector<int64_t> trace_;
  struct Cuda;
  std::unique_ptr<Cuda> cuda_;             // the communication stream (CUDA parameters)
};

}  // namespace perftrain::distributed
