// Weight gradients beside the backward's critical path.
//
// In a layer's backward only the input gradient dX = dY W feeds the next
// (earlier) layer; the weight gradient dW = dY^T X and the bias column sums
// are needed only by the optimizer. Run on a second CUDA stream, they fill
// the SMs that the critical path's small products and kernels leave idle
// (DiT-S/2 at batch 32: many products of 8192 rows have one wave of output
// tiles or less, and the step is a chain of ~700 short kernels). Inside a captured step the two
// streams become two branches of the graph, which the GPU runs concurrently.
//
// While a WeightGradStream scope is alive, the backward ops (linear,
// gelu_mlp, projected_attention) hand their weight-gradient work to
// run_weight_grads(): it forks the side stream from the current one, runs
// the work there and keeps the tensors it reads alive. Memory stays bounded:
// at each hand-off the current stream waits for the work handed off
// kWeightGradLag calls earlier and releases what that work read (released
// after the wait, the caching allocator may reuse it on the current stream
// safely). The scope's end joins: the current stream waits for all of it, so
// the optimizer after it sees every gradient.
//
// What the work writes must be allocated before the hand-off, on the current
// stream, and nothing may read it before the join. Autograd moves a returned
// gradient into .grad without touching it when the weight has one use in the
// step (true of DiT); a weight used twice would have its two gradients added
// on the current stream before the join, so models that share weights must
// not run their backward in a scope (the step runner checks the first step's
// graph with leaves_used_more_than_once() and stays on one stream if so).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace perftrain::ops {

// How many hand-offs may be in flight on the side stream.
constexpr int kWeightGradLag = 2;

// Whether the step runner opens the scope for a model whose activations are
// `rows` (batch x tokens) by `hidden`, under the rule below. Large products
// fill the GPU alone and two at once only share it, so by default (kAuto)
// the scope opens while rows x hidden is at most
// kWeightGradStreamMaxElements, the largest size measured faster on the H200
// (DiT-S/2 at 32768 rows; docs/PERFORMANCE.md). Counting elements rather
// than rows switches wider models off sooner, as their products of the same
// rows fill the GPU sooner (B/2 at half the rows gains as S/2 does).
constexpr int64_t kWeightGradStreamMaxElements = int64_t(32768) * 384;
bool weight_grad_stream_for(int64_t rows, int64_t hidden);
// The size rule alone (rows x hidden <= kWeightGradStreamMaxElements),
// whatever the mode: for choices that must not change with the mode, so that
// one stream and two give the same bits (gelu_mlp's GELU-backward form).
bool weight_grad_stream_size_rule(int64_t rows, int64_t hidden);

// The rule weight_grad_stream_for applies (the [speed] key
// weight_grad_stream): by size (kAuto, the default), at every size, never.
// Process-wide; set before the first step.
enum class WeightGradStreamMode { kAuto, kOn, kOff };
void set_weight_grad_stream_mode(WeightGradStreamMode mode);
WeightGradStreamMode weight_grad_stream_mode();

class WeightGradStream {
 public:
  // Active when `enabled`, on a CUDA device, and no other scope is active.
  // The side stream and its cuBLASLt workspace are made on first use, which
  // must be outside a CUDA graph capture: a scope opened first inside a
  // capture stays inactive (the work then runs inline, still correct).
  WeightGradStream(bool enabled, const at::Device& device);
  ~WeightGradStream();  // joins (the current stream waits for the side stream)
  WeightGradStream(const WeightGradStream&) = delete;
  WeightGradStream& operator=(const WeightGradStream&) = delete;
  bool active() const { return active_; }

 private:
  bool active_ = false;
};

// Runs work() on the side stream when a scope is active (else here, inline);
// `reads` are the tensors it reads, kept alive until the stream has passed
// them. Called from autograd's threads.
void run_weight_grads(const std::function<void()>& work, std::vector<at::Tensor> reads);

// The current stream waits for all the work handed to the side stream so far,
// the scope staying open: for a reader of some gradients before the join
// (data parallel's buckets, sent while backward goes on). Nothing without an
// active scope.
void current_stream_waits_for_weight_grads();

// Whether the calling thread is running work on the side stream now (the
// cuBLASLt context then hands out the side stream's own workspace).
bool on_weight_grad_stream();

// The condition above, checked on a built graph: walks the autograd graph
// of `root` (before its backward) and returns the names of the leaves
// reached by more than one edge (a weight used twice: shared weights, a
// layer applied in a loop), as `names` names them (keyed by the leaf's
// TensorImpl; an unnamed leaf is "leaf <n>"). Empty: each leaf is used once,
// and its gradient may be left on the side stream.
std::vector<std::string> leaves_used_more_than_once(
    const at::Tensor& root, const std::vector<std::pair<std::string, at::Tensor>>& names = {});

}  // namespace perftrain::ops
