// The loader's pinned batches and CUDA graph captures on the training thread.
// libtorch captures in global mode, where a "potentially unsafe" CUDA call
// from any other thread invalidates the capture; the pinned allocator queries
// the CUDA events of freed pinned blocks (those an asynchronous copy read) on
// every allocation, and the loader allocates a batch whenever one is taken.
// The loader runs in thread-local capture mode
// (compat::isolate_thread_from_graph_captures), so captures on the training
// thread go through while it works. Skips without a GPU.
#include <gtest/gtest.h>

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <c10/cuda/CUDAGuard.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "compat/compat.h"
#include "data/batch_loader.h"
#include "data/dataset.h"

namespace perftrain::data {
namespace {

// Pinned blocks read by queued asynchronous copies, then freed: each leaves
// an event that the pinned allocator's next allocation queries.
void leave_pinned_events(const at::Tensor& dst, const c10::cuda::CUDAStream& side, int n) {
  const c10::cuda::CUDAStreamGuard on_side(side);
  for (int i = 0; i < n; ++i) {
    at::Tensor h = at::empty(dst.sizes(), dst.options().device(at::kCPU).pinned_memory(true));
    h.fill_(1.0f + static_cast<float>(i));
    dst.copy_(h, /*non_blocking=*/true);
  }
}

// Captures a chain of small ops on `stream`, calling during() between them,
// and replays it once: "" or why the capture failed.
std::string capture_while(const c10::cuda::CUDAStream& stream, const at::Tensor& x,
                          const std::function<void()>& during) {
  at::cuda::CUDAEvent ready;
  ready.record(at::cuda::getCurrentCUDAStream());
  ready.block(stream);
  const c10::cuda::CUDAStreamGuard on(stream);
  at::cuda::CUDAGraph g;
  std::string error;
  try {
    g.capture_begin();
    try {
      at::Tensor y = x;
      for (int k = 0; k < 100; ++k) {
        y = y * 1.0001 + 0.5;
        if (k % 10 == 0) during();
      }
    } catch (...) {
      try {
        g.capture_end();
      } catch (...) {
      }
      throw;
    }
    g.capture_end();
    g.replay();
    stream.synchronize();
  } catch (const std::exception& e) {
    error = compat::error_message(e);
    // A failed capture leaves the default generator marked as capturing.
    at::Generator def = at::cuda::detail::getDefaultCUDAGenerator();
    compat::renew_generator_state(def);
  }
  return error;
}

TEST(BatchLoaderGpu, PinnedBatchesDoNotBreakACaptureOnTheTrainingThread) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const auto dataset = make_synthetic(4096, {4, 8, 8}, 5, 1);
  BatchLoader loader(*dataset, 64, 3, {}, /*pin_memory=*/true, /*depth=*/2);
  const at::Device cuda(at::kCUDA, 0);
  const auto side = c10::cuda::getStreamFromPool(false, 0);
  const auto capture_stream = c10::cuda::getStreamFromPool(false, 0);
  const at::Tensor x = at::ones({64, 4, 8, 8}, at::TensorOptions().device(cuda));
  at::Tensor dst = at::empty_like(x);
  int captured = 0;
  std::vector<std::string> errors;
  for (int round = 0; round < 8; ++round) {
    {  // batches copied to the device asynchronously, then freed: pending events
      const c10::cuda::CUDAStreamGuard on_side(side);
      for (int i = 0; i < 3; ++i) dst.copy_(loader.next().x.to(cuda, /*non_blocking=*/true));
    }
    leave_pinned_events(dst, side, 4);
    std::vector<Batch> held;  // taken during the capture: the loader allocates their successors meanwhile
    const std::string error = capture_while(capture_stream, x, [&] {
      held.push_back(loader.next());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    if (error.empty()) ++captured;
    else errors.push_back("round " + std::to_string(round) + ": " + error);
  }
  std::string all;
  for (const auto& e : errors) all += e + "\n";
  EXPECT_EQ(captured, 8) << all;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(loader.next().x.size(0), 64);  // the loader is still well
}

// The cause, shown without the isolation (printed, not asserted: it documents
// the driver's rule): a plain thread allocating pinned memory while events are
// pending invalidates a capture on another thread.
TEST(BatchLoaderGpu, WithoutIsolationAPinnedAllocationOnAnotherThreadBreaksACapture) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const at::Device cuda(at::kCUDA, 0);
  const auto side = c10::cuda::getStreamFromPool(false, 0);
  const auto capture_stream = c10::cuda::getStreamFromPool(false, 0);
  const at::Tensor x = at::ones({64, 4, 8, 8}, at::TensorOptions().device(cuda));
  at::Tensor dst = at::empty_like(x);
  int failed = 0;
  std::string first_error, thread_error;
  for (int round = 0; round < 4; ++round) {
    leave_pinned_events(dst, side, 4);
    std::atomic<int> requests{0};
    std::atomic<bool> stop{false};
    std::thread allocator([&] {
      int done = 0;
      try {
        while (!stop.load()) {
          if (requests.load() > done) {
            ++done;
            at::Tensor h = at::empty({64 * 256}, at::TensorOptions().pinned_memory(true));
          } else {
            std::this_thread::yield();
          }
        }
      } catch (const std::exception& e) {
        if (thread_error.empty()) thread_error = compat::error_message(e);
      }
    });
    const std::string error = capture_while(capture_stream, x, [&] {
      ++requests;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    stop = true;
    allocator.join();
    if (!error.empty()) {
      ++failed;
      if (first_error.empty()) first_error = error;
    }
  }
  std::cout << "without isolation: " << failed << " of 4 captures failed"
            << (first_error.empty() ? "" : " (" + first_error + ")")
            << (thread_error.empty() ? "" : "; the allocating thread got: " + thread_error) << "\n";
  SUCCEED();
}

}  // namespace
}  // namespace perftrain::data
