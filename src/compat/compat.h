// The one place that knows which torch release we build against (2.11) and
// how its C++ API spells things that differ between 2.x releases: the autocast
// TLS switches, the fused AdamW entry point, the device queries. A user on
// another 2.x release looks here first.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

namespace perftrain::compat {

// Mixed precision for the forward pass: matrix products and convolutions in
// `dtype` (bf16/fp16), reductions in fp32, as torch.autocast does. Scoped;
// nests; a no-op when !enabled.
class AutocastGuard {
 public:
  AutocastGuard(at::DeviceType device, at::ScalarType dtype, bool enabled);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  at::DeviceType device_;
  bool enabled_;
  bool prev_enabled_;
  at::ScalarType prev_dtype_;
};

// The dtype autocast gives matrix products on `device` right now, or
// std::nullopt when autocast is off there (the fused DiT path then computes
// in its inputs' dtype).
std::optional<at::ScalarType> autocast_dtype(at::DeviceType device);
// Autocast keeps bf16 copies of weights across ops in a cache; a CUDA graph
// capture must not (the cached copies would be freed memory at replay).
void set_autocast_cache_enabled(bool enabled);
// Returns cached blocks of the CUDA caching allocator to the driver (between
// benchmark variants, so each starts from the same state).
void empty_cuda_cache();

// After a CUDA graph capture that failed (an op the capture refused), the
// generator registered with it stays marked as capturing: libtorch ends its
// capture only in a successful capture_end, and every later replay or eager
// random op then throws "Offset increment outside graph capture". This gives
// the generator a fresh state at the same seed and offset; graphs captured
// before it keep the old state, so they must be captured again. No-op for a
// CPU generator.
void renew_generator_state(at::Generator& gen);

// A CUDA graph is captured in global mode: while one thread captures, a
// "potentially unsafe" CUDA call from any other thread (cudaEventQuery among
// them) invalidates that capture. The caching pinned-memory allocator queries
// the events of freed pinned blocks on every allocation, so a thread that
// allocates pinned memory while another captures (the batch loader) breaks
// the capture. Called on such a thread, this switches it to thread-local
// mode: captures on other threads no longer constrain it (and it captures
// nothing itself). No-op without CUDA.
void isolate_thread_from_graph_captures();

// One AdamW step over all tensors in a single fused launch per dtype/device
// group (ATen's _fused_adamw_, which has CPU and CUDA kernels). state_steps
// are float32 scalars already incremented for this step.
void fused_adamw_(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                  const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                  const std::vector<at::Tensor>& state_steps, double lr, double beta1, double beta2,
                  double weight_decay, double eps);

bool cuda_available();
// Whether the current CUDA device is sm_90 (H100/H200), where our Hopper
// kernels (wgmma, TMA) run; the ops fall back elsewhere.
bool current_device_is_sm90();
// "NVIDIA H200 (sm_90, 132 SMs, 141 GB)" or "CPU (N threads)".
std::string device_description(const at::Device& device);
// Peak bytes allocated on a CUDA device since the last reset (0 on CPU).
int64_t peak_memory_bytes(const at::Device& device);
void reset_peak_memory(const at::Device& device);
// Bytes currently allocated by the caching allocator on a CUDA device (0 on CPU).
int64_t allocated_bytes(const at::Device& device);
void synchronize(const at::Device& device);
std::string torch_version();  // "2.11.0"
// The first line of a c10::Error's message, without the C++ backtrace.
std::string error_message(const std::exception& e);

}  // namespace perftrain::compat
