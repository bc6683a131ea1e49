#include "compat/compat.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/ops/_fused_adamw.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/version.h>

#include <sstream>

namespace perftrain::compat {

AutocastGuard::AutocastGuard(at::DeviceType device, at::ScalarType dtype, bool enabled)
    : device_(device), enabled_(enabled) {
  if (!enabled_) return;
  prev_enabled_ = at::autocast::is_autocast_enabled(device_);
  prev_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::set_autocast_dtype(device_, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  // Leaving the outermost region drops the cache of casted weights, as
  // torch.autocast's __exit__ does.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_, prev_dtype_);
}

void fused_adamw_(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                  const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                  const std::vector<at::Tensor>& state_steps, double lr, double beta1, double beta2,
                  double weight_decay, double eps) {
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, state_steps, lr,
                    beta1, beta2, weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false);
}

std::optional<at::ScalarType> autocast_dtype(at::DeviceType device) {
  if (!at::autocast::is_autocast_enabled(device)) return std::nullopt;
  return at::autocast::get_autocast_dtype(device);
}

void set_autocast_cache_enabled(bool enabled) { at::autocast::set_autocast_cache_enabled(enabled); }

void empty_cuda_cache() {
  if (cuda_available()) c10::cuda::CUDACachingAllocator::emptyCache();
}

bool cuda_available() { return at::globalContext().hasCUDA() && at::cuda::device_count() > 0; }

bool current_device_is_sm90() {
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  return props->major == 9 && props->minor == 0;
}

std::string device_description(const at::Device& device) {
  std::ostringstream s;
  if (device.is_cuda()) {
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index());
    s << p->name << " (sm_" << p->major << p->minor << ", " << p->multiProcessorCount << " SMs, "
      << (p->totalGlobalMem >> 30) << " GiB)";
  } else {
    s << "CPU (" << at::get_num_threads() << " threads)";
  }
  return s.str();
}

int64_t peak_memory_bytes(const at::Device& device) {
  if (!device.is_cuda()) return 0;
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
  return stats.allocated_bytes[0].peak;  // [0]: all pools
}

int64_t allocated_bytes(const at::Device& device) {
  if (!device.is_cuda()) return 0;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
  return stats.allocated_bytes[0].current;  // [0]: all pools
}

void reset_peak_memory(const at::Device& device) {
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index() < 0 ? 0 : device.index());
}

void synchronize(const at::Device& device) {
  if (device.is_cuda()) at::cuda::device_synchronize();
}

std::string torch_version() { return TORCH_VERSION; }

std::string error_message(const std::exception& e) {
  if (auto* c10e = dynamic_cast<const c10::Error*>(&e)) {
    std::string m = c10e->what_without_backtrace();
    auto nl = m.find('\n');
    return nl == std::string::npos ? m : m.substr(0, nl);
  }
  return e.what();
}

void isolate_thread_from_graph_captures() {
  if (!cuda_available()) return;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;  // per thread, kept for its life
  C10_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
}

void renew_generator_state(at::Generator& gen) {
  if (!gen.defined() || !gen.device().is_cuda()) return;
  auto* impl = at::check_generator<at::CUDAGeneratorImpl>(gen);
  const uint64_t seed = impl->current_seed();
  const uint64_t offset = impl->philox_offset_per_thread();
  auto fresh = c10::make_intrusive<at::CUDAGeneratorImpl>(impl->device().index());
  fresh->set_current_seed(seed);
  fresh->set_philox_offset_per_thread(offset);
  impl->graphsafe_set_state(fresh);
}

}  // namespace perftrain::compat
