#include "ops/fp8_scaling.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>

#include <cmath>
#include <memory>
#include <string>

#include "base/error.h"

namespace perftrain::ops {
namespace {

constexpr int64_t kScaleInvSlotFloats = 4;  // 16 bytes

// The slot table entry for slot i of s.
kernels::Fp8ScalingSlot slot_of(const Fp8Scaling& s, int64_t i) {
  const int64_t h = s.history_len();
  kernels::Fp8ScalingSlot k;
  k.amax = s.amax.data_ptr<float>() + i;
  k.history = s.history.data_ptr<float>() + i * h;
  k.scale = s.scale.data_ptr<float>() + i;
  k.scale_inv = s.scale_inv.data_ptr<float>() + i * s.scale_inv.stride(0);
  k.events = s.events.data_ptr<float>() + 2 * i;
  k.history_len = int32_t(h);
  k.fp8_max = kernels::fp8_max(s.formats[size_t(i)]);
  return k;
}

void check_state(const Fp8Scaling& s) {
  const int64_t n = s.slots();
  auto ok = [&](const at::Tensor& t, std::vector<int64_t> sizes) {
    return t.defined() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.sizes() == at::IntArrayRef(sizes) &&
           t.device() == s.amax.device();
  };
  // scale_inv may have its slots apart (make_fp8_scaling's are 16 bytes apart).
  const bool scale_inv_ok = s.scale_inv.defined() && s.scale_inv.scalar_type() == at::kFloat &&
                            s.scale_inv.dim() == 1 && s.scale_inv.size(0) == n && s.scale_inv.stride(0) >= 1 &&
                            s.scale_inv.device() == s.amax.device();
  if (!s.amax.defined() || !ok(s.amax, {n}) || !ok(s.scale, {n}) || !scale_inv_ok || !s.history.defined() ||
      !ok(s.history, {n, s.history.size(1)}) || !ok(s.events, {n, 2}))
    throw UsageError("fp8_scaling_update: a state's tensors must be float32 amax [S], history [S, H], scale [S], "
                     "scale_inv [S] (any stride), events [S, 2], contiguous and on one device, S = its formats' "
                     "count");
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> Fp8Scaling::named_tensors() const {
  return {{"amax", amax}, {"history", history}, {"scale", scale}, {"scale_inv", scale_inv}, {"events", events}};
}

Fp8Scaling make_fp8_scaling(std::vector<Fp8Format> formats, int64_t history_len, const at::Device& device) {
  if (history_len < 1 || history_len > kernels::kFp8MaxHistory)
    throw UsageError("fp8 scaling: the amax history length must be in [1, " +
                     std::to_string(kernels::kFp8MaxHistory) + "], got " + std::to_string(history_len));
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const int64_t n = int64_t(formats.size());
  Fp8Scaling s;
  s.formats = std::move(formats);
  s.amax = at::zeros({n}, f32);
  s.history = at::zeros({n, history_len}, f32);
  s.scale = at::ones({n}, f32);
  // Each slot 16 bytes from the next: cuBLASLt's fp8 products refuse a scale
  // pointer 4 or 8 bytes past a 16-byte boundary (gemm_lt.h).
  s.scale_inv = at::ones({n, kScaleInvSlotFloats}, f32).select(1, 0);
  s.events = at::zeros({n, 2}, f32);
  return s;
}

void fp8_scaling_update_reference(const Fp8Scaling& s, int margin) {
  check_state(s);
  if (s.amax.is_cuda()) throw UsageError("fp8_scaling_update_reference: the state must be on the CPU");
  const float factor = std::ldexp(1.0f, margin);
  const int64_t h = s.history_len();
  for (int64_t i = 0; i < s.slots(); ++i) {
    const kernels::Fp8ScalingSlot k = slot_of(s, i);
    const float a = *k.amax;
    float m = std::isfinite(a) ? a : 0.f;
    for (int64_t j = h - 1; j > 0; --j) {
      k.history[j] = k.history[j - 1];
      if (std::isfinite(k.history[j])) m = std::fmax(m, k.history[j]);
    }
    k.history[0] = a;
    float scale = *k.scale;
    if (!std::isfinite(a)) {
      k.events[0] += 1.f;
    } else if (a == 0.f) {
      k.events[1] += 1.f;
    } else {
      const float next = k.fp8_max / (m * factor);
      if (std::isfinite(next)) {
        scale = next;
      } else {
        k.events[1] += 1.f;
      }
    }
    *k.scale = scale;
    *k.scale_inv = 1.f / scale;
    *k.amax = 0.f;
  }
}

void fp8_scaling_update(const std::vector<const Fp8Scaling*>& states, int margin) {
  if (states.empty()) return;
  const at::Device device = states[0]->amax.device();
  for (const Fp8Scaling* s : states) {
    check_state(*s);
    if (s->amax.device() != device)
      throw UsageError("fp8_scaling_update: states on " + device.str() + " and " + s->amax.device().str());
  }
  if (!device.is_cuda()) {
    for (const Fp8Scaling* s : states) fp8_scaling_update_reference(*s, margin);
    return;
  }
  const c10::DeviceGuard guard(device);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  auto table = std::make_unique<kernels::Fp8ScalingTable>();  // ~24 KB: not on the stack
  table->count = 0;
  auto flush = [&] {
    kernels::fp8_scaling_update(*table, margin, stream);
    table->count = 0;
  };
  for (const Fp8Scaling* s : states) {
    for (int64_t i = 0; i < s->slots(); ++i) {
      if (table->count == kernels::kFp8ScalingMaxSlots) flush();
      table->slot[table->count++] = slot_of(*s, i);
    }
  }
  if (table->count > 0) flush();
}

}  // namespace perftrain::ops
