#include "ops/column_sums.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <c10/cuda/CUDAGuard.h>

#include <string>

#include "base/error.h"
#include "kernels/column_sums.h"
#include "ops/dtype_dispatch.h"

namespace perftrain::ops {

void column_sums_into(const std::vector<at::Tensor>& mats, const std::vector<at::Tensor>& outs) {
  if (mats.empty() || mats.size() != outs.size() || mats.size() > size_t(kernels::kColumnSumsMaxMatrices))
    throw UsageError("column_sums_into: 1 to " + std::to_string(kernels::kColumnSumsMaxMatrices) +
                     " matrices, one output each");
  const at::Tensor& m0 = mats[0];
  bool fused = m0.is_cuda() && is_kernel_dtype(m0.scalar_type()) && m0.dim() == 2 && m0.numel() > 0;
  // Rows ld elements apart: contiguous matrices (ld = N, whatever the strides
  // of a size-1 dimension say), or column blocks of a wider one (narrow(1, ...)).
  const auto row_stride = [](const at::Tensor& t) -> int64_t {
    if (t.dim() != 2) return -1;
    if (t.is_contiguous()) return t.size(1);
    return t.stride(1) == 1 && t.stride(0) >= t.size(1) ? t.stride(0) : -1;
  };
  const int64_t ld = row_stride(m0);
  for (size_t j = 0; j < mats.size(); ++j) {
    if (mats[j].dim() != 2 || mats[j].sizes() != m0.sizes() || mats[j].scalar_type() != m0.scalar_type() ||
        mats[j].device() != m0.device() || ld < 0 || row_stride(mats[j]) != ld)
      throw UsageError("column_sums_into: the matrices must be 2-D tensors of one shape, row stride, dtype and "
                       "device, with contiguous rows");
    if (outs[j].dim() != 1 || outs[j].size(0) != m0.size(1) || !outs[j].is_contiguous() ||
        outs[j].device() != m0.device())
      throw UsageError("column_sums_into: each output must be a contiguous [N] tensor on the matrices' device");
    fused = fused && outs[j].scalar_type() == at::kFloat;
  }
  if (!fused) {
    for (size_t j = 0; j < mats.size(); ++j) {
      at::Tensor out = outs[j];
      at::sum_out(out, mats[j], {0}, /*keepdim=*/false, out.scalar_type());
    }
    return;
  }
  const c10::cuda::CUDAGuard guard(m0.device());
  const int count = int(mats.size()), cols = int(m0.size(1));
  const int64_t rows = m0.size(0);
  const int chunks = kernels::column_sums_chunks(rows, cols, count,
                                                 at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  // Shape-determined scratch from the caching allocator: fine under graph capture.
  at::Tensor partials = at::empty({count, chunks, cols}, m0.options().dtype(at::kFloat));
  float* out_ptrs[kernels::kColumnSumsMaxMatrices] = {};
  for (int j = 0; j < count; ++j) out_ptrs[j] = outs[j].data_ptr<float>();
  with_kernel_type("column_sums_into", m0.scalar_type(), [&](auto tp) {
    using T = kernel_type<decltype(tp)>;
    const T* in_ptrs[kernels::kColumnSumsMaxMatrices] = {};
    for (int j = 0; j < count; ++j) in_ptrs[j] = static_cast<const T*>(mats[j].data_ptr());
    kernels::column_sums<T>(in_ptrs, out_ptrs, count, rows, cols, ld, partials.data_ptr<float>(), chunks,
                            at::cuda::getCurrentCUDAStream());
  });
}

void batch_sums_into(const at::Tensor& partials, const at::Tensor& out) {
  if (partials.scalar_type() != at::kFloat || partials.dim() != 2 || out.dim() != 1 ||
      out.size(0) != partials.size(1) || out.device() != partials.device())
    throw UsageError("batch_sums_into: fp32 partials [B, N] and an [N] output on one device");
  at::Tensor o = out;  // a handle on the same storage
  if (!partials.is_cuda() || partials.numel() == 0 || !partials.is_contiguous() || partials.size(0) > 65535) {
    if (out.scalar_type() == at::kFloat) at::sum_out(o, partials, {0});
    else o.copy_(at::sum(partials, {0}));
    return;
  }
  // One short launch (kernels::column_sums_reduce), several times faster
  // than ATen's sum over dim 0 of such short matrices.
  const c10::cuda::CUDAGuard guard(partials.device());
  const bool direct = out.scalar_type() == at::kFloat && out.is_contiguous();
  at::Tensor sums = direct ? out : at::empty({partials.size(1)}, partials.options());
  float* out_ptr = sums.data_ptr<float>();
  kernels::column_sums_reduce(partials.data_ptr<float>(), &out_ptr, 1, int(partials.size(0)), int(partials.size(1)),
                              at::cuda::getCurrentCUDAStream());
  if (!direct) o.copy_(sums);
}

}  // namespace perftrain::ops
