// A single-stream block's fused schedule, in pieces: the same function as
// SingleStreamBlock::forward through the ops of src/ops (RMSNorm + adaLN
// scale, the post-norm + tanh-gated residual + next pre-norm in one pass,
// QK-norm + RoPE on the packed qkv, cuDNN's attention with the key mask as
// its bias, SwiGLU against [gate; up] in one product; docs/design.md, "A
// single-stream block, line by line"). Each piece takes the block (its
// heads and norms' weights) and the linears' weights it runs with
// (models/block_weights.h: weights_of(block), or a looped model's per-loop
// merged weights), so a schedule may run one block many times with other
// weights each time (a looped family lists the same block again in a
// SingleStreamBlockSeq). No module's hooks fire here. The residual stream is fp32; matrix operands are in the
// compute dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <utility>
#include <vector>

#include "models/block_weights.h"
#include "models/fp8_states.h"
#include "models/fused/block_application.h"
#include "models/single_stream.h"

namespace perftrain::models::fused {

// A block's four adaLN vectors [B, D]: scale, gate (attention); scale, gate (FFN).
struct SingleStreamModulation {
  at::Tensor attn_scale, attn_gate, ffn_scale, ffn_gate;
};

// What every block of one forward reads besides its weights and x.
struct SingleStreamContext {
  at::Tensor cos, sin;   // the rotary tables [S, head_dim/2]
  at::Tensor mask;       // the key mask [B, 1, 1, S], or undefined
  at::Tensor key_bias;   // ops::attention_key_bias(mask, act), made once for all blocks, or undefined
  at::ScalarType act;    // the compute dtype
  bool keep_activation;  // SwiGLU's output kept for backward (false: ops::swiglu_product_linear)
  // The fp8 states of the chained blocks' linears (DiTExecution::fp8), by
  // each application's key; null: none.
  Fp8States* fp8 = nullptr;
};

// A residual not yet added: x + tanh(gate) * rms_norm(y) * post_weight. A
// half-block ends in one; it is added alone or together with the pre-norm
// that opens the next half-block (add_with_rms_norm).
struct PostNormResidual {
  at::Tensor x, gate, y, post_weight;
};

// The applications in the order a schedule runs them (block_application.h;
// own_weights(blocks) for blocks with their own weights).
using SingleStreamApplication = BlockApplication<SingleStreamBlock, SingleStreamBlockWeights>;
using SingleStreamBlockSeq = std::vector<SingleStreamApplication>;

// One block's modulation from silu(c) in the compute dtype (ops::linear of
// w's modulation weight, no bias).
SingleStreamModulation single_stream_modulation(const SingleStreamBlockWeights& w, const at::Tensor& silu_c);

// Every application's modulation from silu(c) in one product
// (ops::stacked_linear, no biases), split once. Blocks' own [4D, D] bf16
// weight copies lie back to back (the device optimizer groups copies by
// shape), so the stacked weight is a view; other weights are concatenated.
// None for an empty seq.
std::vector<SingleStreamModulation> single_stream_modulations(const SingleStreamBlockSeq& seq,
                                                              const at::Tensor& silu_c);

// The count modulations side by side in product [..., 4 * count * D], in order.
std::vector<SingleStreamModulation> split_single_stream_modulations(const at::Tensor& product, size_t count);

// r's residual and the pre-norm after it (pre_weight and (1 + scale); both
// undefined: none, its h left unused) in one pass (ops::residual_rms_adaln)
// -> (the residual stream, the next half-block's input h in act).
std::pair<at::Tensor, at::Tensor> add_with_rms_norm(const PostNormResidual& r, const at::Tensor& pre_weight,
                                                    const at::Tensor& scale, at::ScalarType act);

// A linear's opening norms with h handed to it: where block_linear runs
// `layer` (of out_features weight rows) of application f in fp8 with fused
// casts (block_linear_target), the norm writes h's E4M3 codes in place of h
// (ops::rms_adaln_fp8, ops::residual_rms_adaln_fp8); else h itself.
ops::Fp8Operand open_linear_rms_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                                     at::ScalarType act, const Fp8Block& f, const char* layer, int64_t out_features);
std::pair<at::Tensor, ops::Fp8Operand> add_with_linear_rms_norm(const PostNormResidual& r,
                                                                const at::Tensor& pre_weight, const at::Tensor& scale,
                                                                at::ScalarType act, const Fp8Block& f,
                                                                const char* layer, int64_t out_features);

// The attention from its modulated norm h (compute dtype) without the
// projection: the qkv product, normalised and rotated in one pass over the
// packed [B, S, 3D] (ops::qk_norm_rope), and qkv_attention reading q, k, v
// from it in place -> [B, S, D] (proj's input). With fp8 states: the qkv
// product through block_linear ("attn.qkv"; h may be its codes, from
// open_linear_rms_norm).
at::Tensor single_stream_attention(const SingleStreamAttention& attn, const at::Tensor& qkv_w,
                                   const ops::Fp8Operand& h, const SingleStreamContext& ctx,
                                   const Fp8Block& fp8 = {});

// The attention half from the residual stream x and its modulated norm h:
// the attention and its projection, its residual added with the FFN's
// pre-norm -> (x1, h2). fp8: qkv's and proj's states ("attn.proj"), and h2
// for "ffn.gate_up" from add_with_linear_rms_norm.
std::pair<at::Tensor, ops::Fp8Operand> single_stream_attention_half(const SingleStreamBlock& block,
                                                                    const SingleStreamBlockWeights& w,
                                                                    const at::Tensor& x, const ops::Fp8Operand& h,
                                                                    const SingleStreamModulation& mod,
                                                                    const SingleStreamContext& ctx,
                                                                    const Fp8Block& fp8 = {});

// The FFN branch from h2 to down's output: gate and up as one product
// against their stacked weights with swiglu (ops::swiglu_product), down
// (keep_activation false: swiglu's output not kept for backward,
// ops::swiglu_product_linear). With fp8 states: gate and up as the row
// blocks of one fp8 product ("ffn.gate_up": each cast in place, no
// concatenation), swiglu, down ("ffn.down"); keep_activation does not apply.
at::Tensor single_stream_ffn_branch(const SingleStreamBlockWeights& w, const ops::Fp8Operand& h2,
                                    bool keep_activation, const Fp8Block& fp8 = {});

// The whole block on its own with the weights w (the recompute path): x [B,
// S, D] residual stream, silu_c [B, D] in ctx.act -> [B, S, D]; its modulation, rms_adaln
// to open it, its last residual added without a next pre-norm.
at::Tensor single_stream_block(const SingleStreamBlock& block, const SingleStreamBlockWeights& w, const at::Tensor& x,
                               const at::Tensor& silu_c, const SingleStreamContext& ctx);

// What closes a chain: receives the last block's FFN residual, not added.
using CloseSingleStreamChain = std::function<at::Tensor(const PostNormResidual&)>;

// Applications chained (non-empty; mods[i] is seq[i]'s): the first opened with
// rms_adaln, each half-block's post-norm, gated residual and the pre-norm
// that opens the next half as one residual_rms_adaln (an application's
// enter_add joins the residual there, or is added to x0 for the first), so the residual stream
// is written once per half-block and its two gradients meet inside one
// kernel. The last block's FFN residual goes to `close` (e.g. added with the
// final layer's norm), called while the last block's tensors are still held,
// as one loop would hold them; returns what close returns.
at::Tensor single_stream_blocks_chained(const SingleStreamBlockSeq& seq,
                                        const std::vector<SingleStreamModulation>& mods, const at::Tensor& x0,
                                        const SingleStreamContext& ctx, const CloseSingleStreamChain& close);

}  // namespace perftrain::models::fused
