#include "ops/weight_grad_stream.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "base/error.h"
#include "ops/cublaslt_workspace.h"
#include "ops/cuda_capture.h"

namespace perftrain::ops {
namespace {

struct HandOff {
  at::cuda::CUDAEvent done;        // recorded on the side stream after the work
  std::vector<at::Tensor> reads;   // released once the current stream has waited on `done`
};

// Process-wide: the scope is opened by the step runner's thread, the work
// handed off from autograd's.
struct StreamState {
  std::mutex mutex;
  bool active = false;
  std::optional<c10::cuda::CUDAStream> side;  // the active scope's device's
  std::deque<HandOff> in_flight;
  std::map<int, c10::cuda::CUDAStream> streams;  // one per device, made once and kept
};

StreamState& stream_state() {
  static auto* l = new StreamState();  // outlives every static that might use it
  return *l;
}

thread_local bool t_on_side = false;

// The device's side stream, or nullopt when it does not exist yet and cannot
// be made now (inside a capture). Non-blocking: it never waits for the legacy
// default stream. Same priority as the training stream.
std::optional<c10::cuda::CUDAStream> side_stream(StreamState& l, int device) {
  auto it = l.streams.find(device);
  if (it != l.streams.end()) return it->second;
  if (current_stream_capturing()) return std::nullopt;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  cudaStream_t s = nullptr;
  const cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err != cudaSuccess)
    throw RuntimeError(std::string("weight-gradient stream: cudaStreamCreateWithFlags: ") + cudaGetErrorString(err));
  auto stream = c10::cuda::getStreamFromExternal(s, static_cast<c10::DeviceIndex>(device));
  l.streams.emplace(device, stream);
  return stream;
}

}  // namespace

namespace {
std::atomic<WeightGradStreamMode> g_stream_mode{WeightGradStreamMode::kAuto};
}  // namespace

void set_weight_grad_stream_mode(WeightGradStreamMode mode) { g_stream_mode.store(mode); }
WeightGradStreamMode weight_grad_stream_mode() { return g_stream_mode.load(); }

bool weight_grad_stream_for(int64_t rows, int64_t hidden) {
  switch (weight_grad_stream_mode()) {
    case WeightGradStreamMode::kOn: return true;
    case WeightGradStreamMode::kOff: return false;
    case WeightGradStreamMode::kAuto: break;
  }
  return weight_grad_stream_size_rule(rows, hidden);
}

bool weight_grad_stream_size_rule(int64_t rows, int64_t hidden) {
  return rows * hidden <= kWeightGradStreamMaxElements;
}

bool on_weight_grad_stream() { return t_on_side; }

WeightGradStream::WeightGradStream(bool enabled, const at::Device& device) {
  if (!enabled || !device.is_cuda()) return;
  StreamState& l = stream_state();
  std::lock_guard<std::mutex> lock(l.mutex);
  if (l.active) return;
  const int index = device.has_index() ? device.index() : c10::cuda::current_device();
  auto side = side_stream(l, index);
  if (!side) return;
  if (!current_stream_capturing()) {  // the side stream's cuBLASLt workspace, before any capture needs it
    const c10::cuda::CUDAStreamGuard on_side(*side);
    t_on_side = true;
    (void)cublaslt_context();
    t_on_side = false;
  }
  l.side = side;
  l.active = active_ = true;
}

WeightGradStream::~WeightGradStream() {
  if (!active_) return;
  StreamState& l = stream_state();
  std::lock_guard<std::mutex> lock(l.mutex);
  try {
    at::cuda::CUDAEvent all_done;
    all_done.record(*l.side);
    all_done.block(at::cuda::getCurrentCUDAStream(l.side->device_index()));
  } catch (...) {  // a failed capture: it is abandoned anyway; the caller reports it
  }
  l.in_flight.clear();  // after the join: what they read may be reused now
  l.active = false;
  l.side.reset();
}

void current_stream_waits_for_weight_grads() {
  StreamState& l = stream_state();
  std::lock_guard<std::mutex> lock(l.mutex);
  if (!l.active) return;
  at::cuda::CUDAEvent so_far;
  so_far.record(*l.side);
  so_far.block(at::cuda::getCurrentCUDAStream(l.side->device_index()));
}

void run_weight_grads(const std::function<void()>& work, std::vector<at::Tensor> reads) {
  StreamState& l = stream_state();
  std::unique_lock<std::mutex> lock(l.mutex);
  if (!l.active) {
    lock.unlock();
    work();
    return;
  }
  const c10::cuda::CUDAStream side = *l.side;
  const c10::cuda::CUDAStream main = at::cuda::getCurrentCUDAStream(side.device_index());
  at::cuda::CUDAEvent ready;
  ready.record(main);  // everything the work reads is produced by now
  ready.block(side);
  HandOff h;
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    t_on_side = true;
    try {
      work();
    } catch (...) {
      t_on_side = false;
      throw;
    }
    t_on_side = false;
    h.done.record(side);
  }
  h.reads = std::move(reads);
  l.in_flight.push_back(std::move(h));
  // Bound what is held: the oldest hand-off must finish before the current
  // stream goes on, and what it read is free after that.
  while (int(l.in_flight.size()) > kWeightGradLag) {
    l.in_flight.front().done.block(main);
    l.in_flight.pop_front();
  }
}

std::vector<std::string> leaves_used_more_than_once(const at::Tensor& root,
                                                    const std::vector<std::pair<std::string, at::Tensor>>& names) {
  using torch::autograd::AccumulateGrad;
  using torch::autograd::Node;
  std::vector<std::string> out;
  const std::shared_ptr<Node> start = root.defined() ? root.grad_fn() : nullptr;
  if (!start) return out;
  // Every node once; every edge into an AccumulateGrad counted.
  std::unordered_set<const Node*> seen{start.get()};
  std::vector<const Node*> todo{start.get()};
  std::unordered_map<const AccumulateGrad*, int> uses;
  std::vector<const AccumulateGrad*> order;  // first-reached order, for a stable message
  while (!todo.empty()) {
    const Node* node = todo.back();
    todo.pop_back();
    for (const auto& edge : node->next_edges()) {
      const Node* next = edge.function.get();
      if (next == nullptr) continue;
      if (const auto* acc = dynamic_cast<const AccumulateGrad*>(next)) {
        if (uses[acc]++ == 0) order.push_back(acc);
      }
      if (seen.insert(next).second) todo.push_back(next);
    }
  }
  std::unordered_map<const void*, std::string> name_of;
  for (const auto& [name, t] : names) name_of[t.unsafeGetTensorImpl()] = name;
  int unnamed = 0;
  for (const AccumulateGrad* acc : order) {
    if (uses[acc] < 2) continue;
    auto it = name_of.find(acc->variable.unsafeGetTensorImpl());
    out.push_back(it != name_of.end() ? it->second : "leaf " + std::to_string(unnamed++));
  }
  return out;
}

}  // namespace perftrain::ops
