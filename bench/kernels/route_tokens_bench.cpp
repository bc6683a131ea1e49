// One routed loop's routing, forward + backward, at Looped-B/2's shapes
// (B 256, T 256, D 768, capacity 0.5: k 128), the group a cheap stand-in
// (y = 1.5 kept): ops::route_select + route_combine against their ATen
// references (the composition routed_loop ran before: linear, gather,
// scatter_add, autograd's zeros + scatter and accumulations). Prints the
// median ms of each. Usage: route_tokens_bench [B T k D]
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "compat/compat.h"
#include "ops/route_tokens.h"

namespace {

double median_ms_of(const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int w = 0; w < 9; ++w) {
    cudaEventRecord(start, stream);
    fn();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace perftrain;
  if (!compat::cuda_available()) {
    std::printf("no GPU\n");
    return 77;
  }
  const int64_t B = argc > 4 ? std::atoll(argv[1]) : 256, T = argc > 4 ? std::atoll(argv[2]) : 256;
  const int64_t k = argc > 4 ? std::atoll(argv[3]) : 128, D = argc > 4 ? std::atoll(argv[4]) : 768;
  const auto f32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const at::Tensor u = at::randn({B, T, D}, f32).requires_grad_(true);
  const at::Tensor w = (at::randn({1, D}, f32) * 0.02).requires_grad_(true), b = at::zeros({1}, f32).requires_grad_(true);
  const at::Tensor dout = at::randn({B, T, D}, f32);
  for (const bool ours : {false, true}) {
    const double ms = median_ms_of([&] {
      const ops::RouteSelection s = ours ? ops::route_select(u, w, b, k) : ops::route_select_reference(u, w, b, k);
      const at::Tensor sig = at::sigmoid(at::gather(s.scores, 1, s.index));
      const at::Tensor gate = 1 + sig - sig.detach();
      const at::Tensor y = s.kept * 1.5;
      const at::Tensor out = ours ? ops::route_combine(s.through, s.kept, y, gate, s.index)
                                  : ops::route_combine_reference(s.through, s.kept, y, gate, s.index);
      torch::autograd::grad({out}, {u, w, b}, {dout});
    });
    std::printf("%-26s B %lld T %lld k %lld D %lld: %.3f ms forward + backward\n",
                ours ? "route_select+combine" : "ATen reference", (long long)B, (long long)T, (long long)k,
                (long long)D, ms);
  }
  return 0;
}
