#include "ops/attention_choice.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <utility>

#include "ops/cuda_capture.h"
#include "ops/cuda_timing.h"
#include "ops/cudnn_attention.h"
#include "ops/qkv_attention.h"

namespace perftrain::ops {
namespace {

std::atomic<bool> auto_on{false};

std::mutex& choices_mutex() {
  static std::mutex m;
  return m;
}
std::map<AttentionChoiceKey, AttentionChoiceRecord>& choices() {
  static std::map<AttentionChoiceKey, AttentionChoiceRecord> m;
  return m;
}

thread_local const AttentionPlan* forced = nullptr;

// Each plan's qkv_attention forward + backward on fresh random inputs of the key's shape (packed qkv; a key
// mask with every sample's first key attended); the tensors are freed on return.
detail::AttentionTimes time_plans(const AttentionChoiceKey& k) {
  const at::AutoGradMode grad(true);
  const auto device = static_cast<c10::DeviceIndex>(k.device);
  const auto opts = at::TensorOptions().dtype(k.dtype).device(at::Device(at::kCUDA, device));
  const int64_t D = k.heads * k.head_dim;
  // A generator of its own: the run's random streams advance the same with "auto" as without.
  at::Generator gen = at::cuda::detail::createCUDAGenerator(device);
  gen.set_current_seed(0);
  const at::Tensor qkv = at::randn({k.batch, k.tokens, 3 * D}, gen, opts).requires_grad_(true);
  const at::Tensor grad_out = at::randn({k.batch, k.tokens, D}, gen, opts);
  at::Tensor mask, bias;
  if (k.masked) {
    mask = at::rand({k.batch, k.tokens}, gen, opts.dtype(at::kFloat)) < 0.9;
    mask.select(1, 0).fill_(true);
    bias = attention_key_bias(mask, k.dtype);
  }
  auto timed = [&](AttentionPlan plan) {
    const detail::ForcedAttentionPlan force(plan);
    return median_cuda_ms([&] {
      qkv.mutable_grad() = at::Tensor();
      qkv_attention(qkv, k.heads, mask, bias).backward(grad_out);
    });
  };
  detail::AttentionTimes t;
  t.tiled_ms = timed(kTiledPlan);
  t.cudnn_ms = timed(kCudnnPlan);
  t.mixed_ms = timed(kMixedPlan);
  return t;
}

// The fastest of the timed plans; a tie goes to the earlier in ours, mixed, cuDNN's.
AttentionPlan fastest(const detail::AttentionTimes& t) {
  AttentionPlan best = kTiledPlan;
  double best_ms = t.tiled_ms;
  for (const auto& [plan, ms] : {std::pair<AttentionPlan, double>{kMixedPlan, t.mixed_ms}, {kCudnnPlan, t.cudnn_ms}})
    if (ms > 0 && ms < best_ms) {
      best = plan;
      best_ms = ms;
    }
  return best;
}

std::string ms_text(double ms) {
  std::ostringstream s;
  s.precision(3);
  s << ms;
  return s.str();
}

}  // namespace

bool AttentionChoiceKey::operator<(const AttentionChoiceKey& o) const {
  return std::tie(tokens, head_dim, masked, dtype, batch, heads, device) <
         std::tie(o.tokens, o.head_dim, o.masked, o.dtype, o.batch, o.heads, o.device);
}

bool attention_auto() { return auto_on.load(std::memory_order_relaxed); }
void set_attention_auto(bool on) { auto_on.store(on, std::memory_order_relaxed); }

std::vector<AttentionChoiceRecord> attention_choice_records() {
  const std::lock_guard<std::mutex> lock(choices_mutex());
  std::vector<AttentionChoiceRecord> out;
  for (const auto& [key, record] : choices()) out.push_back(record);
  return out;
}

void reset_attention_choices() {
  const std::lock_guard<std::mutex> lock(choices_mutex());
  choices().clear();
}

std::string attention_choice_note(int64_t tokens, int64_t head_dim, bool masked, c10::ScalarType dtype) {
  std::string note;
  for (const AttentionChoiceRecord& r : attention_choice_records()) {
    if (r.key.tokens != tokens || r.key.head_dim != head_dim || r.key.masked != masked || r.key.dtype != dtype)
      continue;
    note += r.timed ? " (auto, fwd+bwd: tiled " + ms_text(r.tiled_ms) + " ms, cuDNN " + ms_text(r.cudnn_ms) +
                          " ms, cuDNN then tiled " + ms_text(r.mixed_ms) + " ms)"
                    : std::string(" (auto: not timed, chosen during a capture)");
  }
  return note;
}

namespace detail {

AttentionPlan choose_attention_plan(const AttentionChoiceKey& key, bool capturing, const AttentionTimer& timer) {
  const std::lock_guard<std::mutex> lock(choices_mutex());
  if (const auto it = choices().find(key); it != choices().end()) return it->second.choice;
  AttentionChoiceRecord r;
  r.key = key;
  if (!capturing) {
    const AttentionTimes t = timer(key);
    r.tiled_ms = t.tiled_ms;
    r.cudnn_ms = t.cudnn_ms;
    r.mixed_ms = t.mixed_ms;
    r.timed = true;
    r.choice = fastest(t);
  }
  choices().emplace(key, r);
  return r.choice;
}

AttentionPlan auto_attention_plan(const at::Tensor& q, int64_t heads, bool masked) {
  const int64_t T = q.size(1), head_dim = q.size(2) / heads;
  // cuDNN's masked backward at T % 128 == 64 (ops/qkv_attention.cpp's route): only ours applies.
  if (!cudnn_eligible(q, head_dim, masked) || (masked && T % 128 == 64)) return kTiledPlan;
  AttentionChoiceKey key;
  key.batch = q.size(0);
  key.tokens = T;
  key.heads = heads;
  key.head_dim = head_dim;
  key.masked = masked;
  key.dtype = q.scalar_type();
  key.device = q.device().index();
  return choose_attention_plan(key, current_stream_capturing(), time_plans);
}

const AttentionPlan* forced_attention_plan() { return forced; }

ForcedAttentionPlan::ForcedAttentionPlan(AttentionPlan plan) : plan_(plan), before_(forced) { forced = &plan_; }
ForcedAttentionPlan::~ForcedAttentionPlan() { forced = before_; }

}  // namespace detail

}  // namespace perftrain::ops
