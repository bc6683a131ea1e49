// column_sums as a PyTorch operator: the bias gradients of up to four
// matrices at once (ops::column_sums_into: one launch pair on CUDA, fp32
// accumulation). A gradient helper: it has no gradient of its own.
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "op_support.h"
#include "ops/column_sums.h"

namespace perftrain::python {
namespace {

std::vector<at::Tensor> column_sums(const std::vector<at::Tensor>& mats) {
  std::vector<at::Tensor> outs;
  for (const at::Tensor& m : mats)
    outs.push_back(at::empty({m.dim() == 2 ? m.size(1) : 0}, m.options().dtype(at::kFloat)));
  ops::column_sums_into(mats, outs);  // checks the shapes (UsageError)
  return outs;
}

}  // namespace
}  // namespace perftrain::python

TORCH_LIBRARY_FRAGMENT(perftrain, m) { m.def("column_sums(Tensor[] mats) -> Tensor[]"); }

// The same kernels for CPU and CUDA (each kernel picks its path by device).
static void register_grads_kernels(torch::Library& m) {
  m.impl("column_sums", perftrain::python::kernel<&perftrain::python::column_sums>);
}

TORCH_LIBRARY_IMPL(perftrain, CPU, m) { register_grads_kernels(m); }

TORCH_LIBRARY_IMPL(perftrain, CUDA, m) { register_grads_kernels(m); }
