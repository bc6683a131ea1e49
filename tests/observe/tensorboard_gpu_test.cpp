// The weight histograms computed on the GPU (histograms_of: min, max, sums
// and histc counts where the tensors live, one copy back) against the same
// histograms of the values on the host; skips without a GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "compat/compat.h"
#include "observe/tensorboard/event_writer.h"

namespace tb = perftrain::observe::tensorboard;

TEST(TensorBoardGpu, DeviceHistogramsMatchTheHostOnes) {
  if (!perftrain::compat::cuda_available()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(5);
  const at::Device cuda(at::kCUDA, 0);
  const std::vector<at::Tensor> host = {at::randn({1152, 4608}) * 0.02, at::rand({4608}) - 3, at::full({16}, -0.5),
                                        at::randn({300}).to(at::kBFloat16).to(at::kFloat)};
  std::vector<at::Tensor> dev;
  for (const auto& t : host) dev.push_back(t.to(cuda));
  dev[3] = dev[3].to(at::kBFloat16);  // a bf16 tensor is read as float
  const auto got = tb::histograms_of(dev, 30);
  ASSERT_EQ(got.size(), host.size());
  for (size_t k = 0; k < host.size(); ++k) {
    at::Tensor c = host[k].to(at::kDouble).contiguous();
    const std::vector<double> v(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
    const tb::Histogram want = tb::histogram_of(v, 30);
    EXPECT_EQ(got[k].num, want.num) << k;
    EXPECT_NEAR(got[k].min, want.min, 1e-6) << k;
    EXPECT_NEAR(got[k].max, want.max, 1e-6) << k;
    EXPECT_NEAR(got[k].sum_squares, want.sum_squares, 1e-4 * want.sum_squares) << k;
    ASSERT_EQ(got[k].bucket.size(), want.bucket.size()) << k;
    double total = 0;
    for (size_t b = 0; b < want.bucket.size(); ++b) {
      // Values on a bucket edge may land either side in float32: a few per bucket.
      EXPECT_NEAR(got[k].bucket[b], want.bucket[b], 1 + 1e-5 * want.num) << k << " bucket " << b;
      total += got[k].bucket[b];
    }
    EXPECT_EQ(total, want.num) << k;
  }
}
