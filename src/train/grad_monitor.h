// Gradient monitoring inside the training step (observe/grad_health.h has
// what it produces). On a monitored step the step runner calls
// before_update() after backward and after_update() after the optimizer: a
// fixed sequence of device ops (the gradient statistics and histograms in
// one fused pass, ops/grad_stats.h; the weights' norms and a copy of them
// for the update's size) that writes
// one float32 [parameters, kStatColumns] tensor allocated up front, so the
// same calls run eagerly and inside a captured CUDA graph. Outside the step,
// queue_readback() copies that tensor to pinned host memory on the current
// stream and records an event; take_ready() hands back the samples whose copy
// has finished, so monitoring never waits on the device.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "observe/grad_health.h"

namespace perftrain::train {

// Columns of the device statistics tensor.
enum GradStatColumn : int64_t {
  kStatNorm = 0,       // ||g||_2
  kStatAbsSum = 1,     // sum |g|
  kStatMaxAbs = 2,     // max |g|
  kStatNonzero = 3,    // elements != 0 (an undefined gradient: none)
  kStatNonfinite = 4,  // NaN and Inf elements
  kStatWeightNorm = 5, // ||w|| before the update
  kStatUpdateNorm = 6, // ||w_after - w_before||
  kStatColumns = 7,
};

// The statistics of grads (one per parameter, each may be undefined: all
// zero then) as [n, kStatColumns] float32 on their device, with the weight
// and update columns 0 (ops::grad_stats_into: one fused pass on CUDA). No
// host sync.
at::Tensor grad_stat_rows(const std::vector<at::Tensor>& grads);

// Gradient histograms: per gradient a row [min, max, sum, counts...] with
// one count per bucket of observe::grad_histogram_limits(), the counts of its
// finite elements, as [n, kHistLead + buckets] float32 on the gradients'
// device. `boundaries`: the limits but the last (float32, on that device).
// Fixed buckets (ops::grad_stats_into: at::bucketize's rule), so nothing is
// sized from the data and there is no host sync. An undefined or empty
// gradient gives a row of zeros.
constexpr int64_t kHistLead = 3;  // min, max, sum
at::Tensor grad_histogram_rows(const std::vector<at::Tensor>& grads, const at::Tensor& boundaries);
// observe::grad_histogram_limits() but the last, as float32 on `options`' device.
at::Tensor grad_histogram_boundaries(const at::TensorOptions& options);

// The host sample of a [n, kStatColumns] tensor (any device; one copy), with
// the histograms of a [n, kHistLead + buckets] tensor when one is given.
observe::GradHealthSample sample_from_rows(int64_t step, const std::vector<std::string>& names,
                                           const std::vector<int64_t>& numels, const at::Tensor& rows,
                                           const at::Tensor& hist_rows = {});

class GradMonitor {
 public:
  // params: the model's trainable parameters, in the optimizer's order;
  // histograms: before_update() also fills the gradient histograms.
  explicit GradMonitor(std::vector<std::pair<std::string, at::Tensor>> params, bool histograms = false);
  ~GradMonitor();
  GradMonitor(const GradMonitor&) = delete;
  GradMonitor& operator=(const GradMonitor&) = delete;

  // Inside the step: before the update (reads every p.grad(), keeps a copy
  // of the weights) and after it (the update's norms). No host sync.
  // grad_scale (0-d, optional): the factor the gradients carry (fp16's loss
  // scale), divided out of the statistics.
  void before_update(const at::Tensor& grad_scale = {});
  void after_update();

  // Outside the step: copies the statistics to pinned host memory on the
  // current stream (asynchronous on CUDA) for training step `step`.
  void queue_readback(int64_t step);
  // The queued samples whose copy has finished, oldest first; wait: all of
  // them, waiting for the device where needed.
  std::vector<observe::GradHealthSample> take_ready(bool wait = false);

  const at::Tensor& device_rows() const { return rows_; }
  const at::Tensor& device_histograms() const { return hist_rows_; }  // undefined without histograms

 private:
  struct Pending;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::vector<std::string> names_;
  std::vector<int64_t> numels_;
  at::Tensor rows_;                   // [n, kStatColumns] on the parameters' device
  at::Tensor hist_rows_, boundaries_; // [n, kHistLead + buckets] and the bucket edges (histograms only)
  std::vector<at::Tensor> snapshot_;  // weights before the update (between the two calls)
  std::vector<std::unique_ptr<Pending>> pending_;
};

}  // namespace perftrain::train
