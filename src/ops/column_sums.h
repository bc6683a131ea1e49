// Bias gradients as column sums: out_j = sum over rows of mats_j, for a few
// matrices at once (one launch pair for all of them on CUDA, see
// kernels/column_sums.h for why not cuBLASLt's BGRADB).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace perftrain::ops {

// mats: 1 to 4 [M, N] tensors of one float dtype, shape and row stride, on one
// device, each row contiguous (whole matrices, or column blocks of a wider
// one such as dqkv.narrow(1, 0, D)); outs: as many contiguous [N] tensors
// (written). CUDA with fp32 outputs: the fused kernel, fp32 accumulation;
// otherwise at::sum_out.
void column_sums_into(const std::vector<at::Tensor>& mats, const std::vector<at::Tensor>& outs);

// out[N] = the sum over rows of fp32 per-sample partials [B, N], in fp32,
// then one rounding to out's dtype: the bias gradients of the fused residual
// kernels, which write one partial row per sample.
void batch_sums_into(const at::Tensor& partials, const at::Tensor& out);

}  // namespace perftrain::ops
