// Which kernels run the attention of a packed projection qkv [B, T, 3D]: one
// place for the two autograd functions that take it (qkv_attention's packed
// form and projected_attention), so that both choose alike.
//   forward:  our tiled forward where it is on and applies (ops/attention_tiled);
//             else, unmasked, our whole-head forward where it applies
//             (ops/attention_head_fwd) and no timing run of "auto" forces
//             cuDNN's family (ops/attention_choice); else cuDNN's.
//   backward: unmasked, our whole-head backward where it applies, and always
//             after our whole-head forward; after our tiled forward, or after
//             cuDNN's where "auto" chose that plan (ops/attention_choice), our
//             tiled backward elsewhere; cuDNN's where neither takes the gradient.
// What the forward saves: first_saved (the caller's own tensors), then out
// at index first_saved.size() and lse after it: save_cudnn_state's layout
// after the tiled or cuDNN forward, only out and lse after the whole-head one.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace perftrain::ops::detail {

// The rule above as a value: which family runs a packed qkv [B, T, 3D] that
// cuDNN may run (qkv_attention's gate passed; bias as the forward gets it),
// asked before the forward and, by an operator whose backward is another
// operator (qkv_attention_forward / _backward), again in the backward, where
// the shape's "auto" plan is settled. Notes nothing.
enum class PackedAttentionPlan {
  Tiled,                   // our tiled forward and backward (ops/attention_tiled)
  WholeHead,               // our whole-head forward and backward (256 tokens, no mask)
  Cudnn,                   // cuDNN's forward and backward
  CudnnThenTiledBackward,  // cuDNN's forward, our tiled backward on its out and lse ("auto"'s mixed plan)
};
PackedAttentionPlan packed_attention_plan(const at::Tensor& qkv, int64_t heads, const at::Tensor& bias);

// The attention output [B, T, D]; saved_data "heads", "masked", "own_fwd"
// (the whole-head forward ran) and "tiled" (ops/attention_tiled) set. bias:
// undefined, or key_bias()'s [B, 1, 1, T].
at::Tensor packed_attention_forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv, int64_t heads,
                                    std::vector<at::Tensor> first_saved, const at::Tensor& bias = at::Tensor());

// The packed gradient [B, T, 3D] from our kernels, from what
// packed_attention_forward saved (out at index `at`); undefined where
// cuDNN's backward has to run (detail::cudnn_backward(ctx, saved, at, ...)).
at::Tensor own_packed_attention_backward(torch::autograd::AutogradContext* ctx,
                                         const torch::autograd::variable_list& saved, size_t at,
                                         const at::Tensor& qkv, const at::Tensor& grad_out);

}  // namespace perftrain::ops::detail
