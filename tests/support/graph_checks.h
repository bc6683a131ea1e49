// The CUDA-graph check the op tests share: run a step eagerly (the warm-up a
// capture needs: plans, workspaces, handles), capture the same step on a side
// stream, replay it, and expect every output of each replay to equal the
// eager one bit for bit (same kernels, same inputs).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/equal.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "compat/compat.h"

namespace perftrain::testing {

inline void expect_graph_replays_match_eager(const std::function<std::vector<at::Tensor>()>& step,
                                             const std::string& what, int replays = 2) {
  compat::synchronize(at::Device(at::kCUDA, 0));  // the inputs were made on the default stream
  c10::cuda::CUDAStreamGuard stream_guard(c10::cuda::getStreamFromPool());
  const auto eager = step();  // warm-up outside the capture
  at::cuda::CUDAGraph graph;
  graph.capture_begin();
  const auto captured = step();
  graph.capture_end();
  for (int i = 0; i < replays; ++i) {
    graph.replay();
    at::cuda::getCurrentCUDAStream().synchronize();
    for (size_t k = 0; k < eager.size(); ++k)
      EXPECT_TRUE(at::equal(captured[k], eager[k])) << what << "replay " << i << " output " << k;
  }
}

}  // namespace perftrain::testing
