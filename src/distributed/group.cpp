#include "distributed/group.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#ifdef PERFTRAIN_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef PERFTRAIN_HAVE_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdio>

#include "base/error.h"
#include "compat/compat.h"

namespace perftrain::distributed {

struct Group::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> gloo;  // host tensors, scalars, barrier
  c10::intrusive_ptr<c10d::Backend> nccl;  // CUDA tensors
};

namespace {

bool loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

}  // namespace

Group::Group(const LaunchEnv& env, c10::Device device, const GroupOptions& opts)
    : env_(env), opts_(opts), impl_(std::make_unique<Impl>()) {
#ifndef PERFTRAIN_HAVE_GLOO
  throw UsageError(
      "this perftrain was built without Gloo's headers (CMake found no gloo/allreduce.h), so a multi-process run "
      "cannot start; install libgloo-dev (tools/setup.sh) or carry them (tools/fill_carry.sh) and rebuild");
#endif
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(opts.timeout_s * 1000));
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(env.master_port);
    so.isServer = env.rank == 0;
    so.numWorkers = static_cast<std::size_t>(env.world_size);
    so.waitWorkers = true;
    so.timeout = timeout;
    impl_->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  } catch (const std::exception& e) {
    throw RuntimeError(env.describe() + ": " +
                       (env.rank == 0 ? "cannot host the store, or not all " + std::to_string(env.world_size) +
                                            " ranks joined"
                                      : std::string("cannot reach the master")) +
                       " within distributed.timeout_s = " + seconds_text(opts.timeout_s) + " s: " + compat::error_message(e));
  }
#ifdef PERFTRAIN_HAVE_GLOO
  try {
    auto o = c10d::ProcessGroupGloo::Options::create();
    o->timeout = timeout;
    o->devices.push_back(loopback(env.master_addr) ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                                   : c10d::ProcessGroupGloo::createDefaultDevice());
    impl_->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<c10d::PrefixStore>("gloo", impl_->store), env.rank, env.world_size, o);
  } catch (const std::exception& e) {
    throw RuntimeError(env.describe() + ": cannot connect the Gloo group within distributed.timeout_s = " +
                       seconds_text(opts.timeout_s) + " s: " + compat::error_message(e));
  }
#endif
  if (device.is_cuda()) {
#ifdef PERFTRAIN_HAVE_NCCL
    c10::cuda::set_device(device.index());
    auto o = c10d::ProcessGroupNCCL::Options::create();
    o->timeout = timeout;
    impl_->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
        c10::make_intrusive<c10d::PrefixStore>("nccl", impl_->store), env.rank, env.world_size, o);
#else
    throw UsageError(
        "this perftrain was built without NCCL (CMake found no nccl.h), so a multi-process run on CUDA cannot "
        "start; rebuild where the Python with torch has the nvidia-nccl package, or set train.device = cpu");
#endif
  }
}

Group::~Group() {
  impl_->nccl.reset();
  impl_->gloo.reset();
  impl_->store.reset();
}

namespace {

// A CUDA tensor's work (NCCL) is waited for on the stream, not the host: a
// wait with a timeout would block the host until the GPU finished; NCCL's own
// watchdog holds the group's timeout there.
void wait_for(const c10::intrusive_ptr<c10d::Work>& work, const LaunchEnv& env, double timeout_s, const char* what,
              bool on_stream = false) {
  try {
    if (on_stream) work->wait();
    else work->wait(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  } catch (const std::exception& e) {
    throw RuntimeError(env.describe() + ": " + what +
                       " failed: another rank exited or did not answer within distributed.timeout_s = " +
                       seconds_text(timeout_s) + " s (" + compat::error_message(e) + ")");
  }
}

}  // namespace

void Group::allreduce_mean(const std::vector<at::Tensor>& tensors) {
  const int64_t bucket_bytes = std::max<int64_t>(1, static_cast<int64_t>(opts_.bucket_mb * (1 << 20)));
  size_t i = 0;
  while (i < tensors.size()) {
    // One bucket: the next tensors of the first one's dtype and device, up to bucket_bytes.
    const at::Tensor& first = tensors[i];
    std::vector<at::Tensor> bucket{first};
    int64_t bytes = first.numel() * static_cast<int64_t>(first.element_size());
    size_t j = i + 1;
    for (; j < tensors.size(); ++j) {
      const at::Tensor& t = tensors[j];
      const int64_t b = t.numel() * static_cast<int64_t>(t.element_size());
      if (t.scalar_type() != first.scalar_type() || t.device() != first.device() || bytes + b > bucket_bytes) break;
      bucket.push_back(t);
      bytes += b;
    }
    i = j;
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : bucket) flat_parts.push_back(t.reshape({-1}));
    std::vector<at::Tensor> flat{at::cat(flat_parts)};
    c10d::AllreduceOptions ao;
    ao.reduceOp = c10d::ReduceOp::SUM;
    auto& pg = first.is_cuda() ? impl_->nccl : impl_->gloo;
    if (!pg) throw RuntimeError(env_.describe() + ": all-reduce of a CUDA tensor in a group made for the CPU");
    wait_for(pg->allreduce(flat, ao), env_, opts_.timeout_s, "all-reduce", first.is_cuda());
    flat[0].div_(env_.world_size);
    int64_t offset = 0;
    for (const auto& t : bucket) {
      t.copy_(flat[0].narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

std::function<void()> Group::start_allreduce_sum(const at::Tensor& flat) {
  return start_allreduce(flat, Reduction::kSum);
}

std::function<void()> Group::start_allreduce_max(const at::Tensor& flat) {
  return start_allreduce(flat, Reduction::kMax);
}

std::function<void()> Group::start_allreduce(const at::Tensor& flat, Reduction reduction) {
  std::vector<at::Tensor> one{flat};
  c10d::AllreduceOptions ao;
  ao.reduceOp = reduction == Reduction::kMax ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
  auto& pg = flat.is_cuda() ? impl_->nccl : impl_->gloo;
  if (!pg) throw RuntimeError(env_.describe() + ": all-reduce of a CUDA tensor in a group made for the CPU");
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = pg->allreduce(one, ao);
  } catch (const std::exception& e) {
    throw RuntimeError(env_.describe() + ": all-reduce failed to start: " + compat::error_message(e));
  }
  const bool on_stream = flat.is_cuda();
  return [work, on_stream, this] { wait_for(work, env_, opts_.timeout_s, "all-reduce", on_stream); };
}

void Group::broadcast(const std::vector<at::Tensor>& tensors, int root) {
  for (const auto& t : tensors) {
    std::vector<at::Tensor> one{t.is_contiguous() ? t : t.contiguous()};
    c10d::BroadcastOptions bo;
    bo.rootRank = root;
    auto& pg = t.is_cuda() ? impl_->nccl : impl_->gloo;
    if (!pg) throw RuntimeError(env_.describe() + ": broadcast of a CUDA tensor in a group made for the CPU");
    wait_for(pg->broadcast(one, bo), env_, opts_.timeout_s, "broadcast", t.is_cuda());
    if (!one[0].is_same(t)) t.copy_(one[0]);
  }
}

void Group::barrier() { wait_for(impl_->gloo->barrier(), env_, opts_.timeout_s, "barrier"); }

std::vector<double> Group::allreduce_sum(const std::vector<double>& values) {
  if (values.empty()) return {};
  std::vector<at::Tensor> t{at::tensor(values, at::TensorOptions().dtype(at::kDouble))};
  c10d::AllreduceOptions ao;
  ao.reduceOp = c10d::ReduceOp::SUM;
  wait_for(impl_->gloo->allreduce(t, ao), env_, opts_.timeout_s, "all-reduce");
  const double* p = t[0].data_ptr<double>();
  return std::vector<double>(p, p + values.size());
}

double Group::allreduce_max(double value) {
  std::vector<at::Tensor> t{at::tensor({value}, at::TensorOptions().dtype(at::kDouble))};
  c10d::AllreduceOptions ao;
  ao.reduceOp = c10d::ReduceOp::MAX;
  wait_for(impl_->gloo->allreduce(t, ao), env_, opts_.timeout_s, "all-reduce");
  return t[0].item<double>();
}

}  // namespace perftrain::distributed
