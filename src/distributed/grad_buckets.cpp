#include "distributed/grad_buckets.h"

#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "base/error.h"
#include "distributed/group.h"

namespace perftrain::distributed {

struct GradBuckets::Bucket {
  std::vector<size_t> params;
  std::vector<int64_t> offsets;
  at::Tensor flat;
  int awaited = 0, arrived = 0;
  bool sent = false;
  std::function<void()> finisher;  // host buckets: waits for the sum
};

struct GradBuckets::Cuda {
  c10::cuda::CUDAStream comm;
};

struct GradBuckets::Hook : torch::autograd::PostAccumulateGradHook {
  GradBuckets* self;
  size_t index;
  Hook(GradBuckets* s, size_t i) : self(s), index(i) {}
  void operator()(const torch::autograd::Variable& /*param*/) override { self->arrived(index); }
};

GradBuckets::GradBuckets(Group& group, std::vector<at::Tensor> params, GradBucketOptions opts)
    : group_(group), opts_(std::move(opts)) {
  for (auto& p : params)
    if (p.requires_grad()) params_.push_back(p);
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(opts_.bucket_mb * (1 << 20)));
  bucket_of_.assign(params_.size(), 0);
  fired_.assign(params_.size(), 0);
  awaited_.assign(params_.size(), true);
  int64_t bytes = 0;
  for (size_t r = params_.size(); r-- > 0;) {  // reverse: backward's order
    const at::Tensor& p = params_[r];
    const int64_t b = p.numel() * static_cast<int64_t>(p.element_size());
    bool fresh = layout_.empty() || bytes + b > cap;
    if (!fresh) {
      const at::Tensor& first = params_[layout_.back().front()];
      fresh = first.scalar_type() != p.scalar_type() || first.device() != p.device();
    }
    if (fresh) layout_.emplace_back(), bytes = 0;
    layout_.back().push_back(r);
    bytes += b;
  }
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < layout_.size(); ++k) {
    auto bucket = std::make_unique<Bucket>();
    bucket->params = layout_[k];
    int64_t n = 0;
    for (size_t i : bucket->params) {
      bucket->offsets.push_back(n);
      n += params_[i].numel();
      bucket_of_[i] = k;
    }
    bucket->awaited = static_cast<int>(bucket->params.size());
    const at::Tensor& first = params_[bucket->params.front()];
    bucket->flat = at::empty({n}, first.options().requires_grad(false));
    buckets_.push_back(std::move(bucket));
  }
  if (!params_.empty() && params_.front().is_cuda())
    cuda_ = std::make_unique<Cuda>(Cuda{c10::cuda::getStreamFromPool(false, params_.front().device().index())});
  for (size_t i = 0; i < params_.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(params_[i], std::make_unique<Hook>(this, i));
}

GradBuckets::~GradBuckets() {
  for (auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

void GradBuckets::begin() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++backwards_;
  armed_ = true;
  next_ = 0;
  sent_early_ = 0;
  late_.clear();
  trace_.clear();
  std::fill(fired_.begin(), fired_.end(), 0);
  for (auto& b : buckets_) b->arrived = 0, b->sent = false, b->finisher = nullptr;
}

std::string GradBuckets::describe() const {
  std::lock_guard<std::mutex> lock(mutex_);
  char mb[32];
  std::snprintf(mb, sizeof mb, "%g", opts_.bucket_mb);
  std::string line = "gradients all-reduced in " + std::to_string(buckets_.size()) + " bucket" +
                     (buckets_.size() == 1 ? "" : "s") + " of at most " + mb + " MB (distributed.bucket_mb), ";
  return line + (overlap_ ? "each sent as soon as backward has filled it" : note_);
}

std::vector<int64_t> GradBuckets::trace() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return trace_;
}

void GradBuckets::arrived(size_t i) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;
  trace_.push_back(static_cast<int64_t>(i));
  ++fired_[i];
  if (!overlapping()) return;
  Bucket& b = *buckets_[bucket_of_[i]];
  if (b.sent) {
    if (late_.empty()) late_ = "parameter " + std::to_string(i);
    return;
  }
  if (fired_[i] == 1 && awaited_[i]) ++b.arrived;
  while (next_ < buckets_.size() && buckets_[next_]->arrived >= buckets_[next_]->awaited) {
    send(next_++);
    ++sent_early_;
  }
}

void GradBuckets::send(size_t k) {
  Bucket& b = *buckets_[k];
  b.sent = true;
  trace_.push_back(-static_cast<int64_t>(k) - 1);
  at::NoGradGuard no_grad;
  // The bucket's gradients into its flat buffer (zeros for one without a gradient).
  auto fill = [&] {
    bool all = true;
    std::vector<at::Tensor> parts;
    for (size_t i : b.params) {
      const at::Tensor& g = params_[i].grad();
      if (!g.defined()) {
        all = false;
        break;
      }
      parts.push_back(g.reshape({-1}));
    }
    if (all) {
      at::cat_out(b.flat, parts);
      return;
    }
    for (size_t j = 0; j < b.params.size(); ++j) {
      const at::Tensor& g = params_[b.params[j]].grad();
      at::Tensor part = b.flat.narrow(0, b.offsets[j], params_[b.params[j]].numel());
      if (g.defined()) part.copy_(g.reshape({-1}));
      else part.zero_();
    }
  };
  if (!cuda_) {
    fill();
    b.finisher = group_.start_allreduce_sum(b.flat);
    return;
  }
  // On the communication stream, after what produced the gradients.
  const auto producer = at::cuda::getCurrentCUDAStream(cuda_->comm.device_index());
  at::cuda::CUDAEvent produced;
  produced.record(producer);
  const c10::cuda::CUDAStreamGuard on_comm(cuda_->comm);
  produced.block(cuda_->comm);
  if (opts_.before_send) opts_.before_send();
  fill();
  group_.start_allreduce_sum(b.flat)();  // the comm stream waits; the host does not
  b.flat.div_(group_.world_size());
  for (size_t j = 0; j < b.params.size(); ++j) {
    const at::Tensor& g = params_[b.params[j]].grad();
    if (g.defined()) g.copy_(b.flat.narrow(0, b.offsets[j], g.numel()).view(g.sizes()));
  }
}

void GradBuckets::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
  while (next_ < buckets_.size()) send(next_++);
  at::NoGradGuard no_grad;
  if (cuda_) {
    at::cuda::CUDAEvent done;
    done.record(cuda_->comm);
    done.block(at::cuda::getCurrentCUDAStream(cuda_->comm.device_index()));
  } else {
    for (auto& b : buckets_) {
      b->finisher();
      b->finisher = nullptr;
      b->flat.div_(group_.world_size());
      for (size_t j = 0; j < b->params.size(); ++j) {
        const at::Tensor& g = params_[b->params[j]].grad();
        if (g.defined()) g.copy_(b->flat.narrow(0, b->offsets[j], g.numel()).view(g.sizes()));
      }
    }
  }
  if (backwards_ == 1) {  // the observing backward: what later buckets wait for
    size_t twice = params_.size();
    for (size_t i = 0; i < params_.size(); ++i) {
      awaited_[i] = fired_[i] == 1;
      if (fired_[i] > 1 && twice == params_.size()) twice = i;
    }
    for (auto& b : buckets_) {
      b->awaited = 0;
      for (size_t i : b->params) b->awaited += awaited_[i] ? 1 : 0;
    }
    if (twice < params_.size()) {
      overlap_ = false;
      note_ = "all sent after backward: parameter " + std::to_string(twice) +
              " gets its gradient more than once per backward";
    }
  }
  if (!late_.empty())
    throw RuntimeError(group_.env().describe() + ": the gradient of " + late_ +
                       " arrived after its bucket had been all-reduced (its use changed after the first step)");
}

}  // namespace perftrain::distributed
