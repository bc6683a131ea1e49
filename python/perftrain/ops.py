"""The fused ops of perftrain as differentiable Python functions.

Each function calls one operator torch.ops.perftrain.<name> (python/csrc/
ops_*.cpp: the C++ op of src/ops/ on CUDA, its plain-ATen reference on the
CPU); its gradient is a second operator, <name>_backward, joined to it here
with torch.library.register_autograd (what the backward reads beyond the
inputs, such as a norm's per-row statistics, comes back from the forward
operator as extra outputs, which the functions here do not return; the
context keeps what the C++ op's autograd function keeps), and each operator has a fake
implementation (torch.library.register_fake) giving the outputs' shapes,
dtypes and strides, so that torch.compile(fullgraph=True) traces through with
no graph break. Nothing here syncs with the host or allocates by data, so the
ops capture in CUDA graphs. docs/guide/python.md lists them.
"""
import contextlib

import torch
from torch import Tensor

_ops = torch.ops.perftrain


def _name(op):
    return "perftrain::" + op


def _dense(t, dtype=None):
    """A new contiguous tensor like t (t's shape, device and dtype or `dtype`)."""
    return t.new_empty(t.shape, dtype=dtype if dtype is not None else t.dtype)


def _sized(like, shape, dtype=None):
    return like.new_empty(shape, dtype=dtype if dtype is not None else like.dtype)


def _no_grad_slot(like):
    """What a backward operator returns for an absent optional input."""
    return like.new_empty((0,), dtype=torch.float32)


def _out_dtype(x, out_dtype):
    return x.dtype if out_dtype is None else out_dtype


def _saved_not_results(ctx, *outputs):
    """Marks the outputs kept only for the backward (statistics, pre-activations) non-differentiable, and
    turns off autograd's zero tensors for gradients that do not come: without that, every backward would get
    a zero-filled tensor the size of each such output (a [rows, 4D] pre-activation per MLP), which nothing
    reads. The backward functions take None for the gradient of an unused result."""
    ctx.mark_non_differentiable(*outputs)
    ctx.set_materialize_grads(False)


# ----------------------------------------------------------------- row norms


def adaln_layernorm(x: Tensor, shift: Tensor, scale: Tensor, out_dtype: torch.dtype | None = None,
                    eps: float = 1e-6) -> Tensor:
    """LN(x) * (1 + scale[:, None]) + shift[:, None] (no affine, fp32 statistics), in out_dtype.

    x [B, T, D] float32/bfloat16/float16; shift, scale [B, D] (strided views
    whose last dimension is contiguous are read in place). out_dtype None:
    x's dtype. Gradients in each input's dtype.
    """
    h, _, _ = _ops.adaln_layernorm(x, shift, scale, _out_dtype(x, out_dtype), eps)
    return h


@torch.library.register_fake(_name("adaln_layernorm"))
def _(x, shift, scale, out_dtype, eps):
    rows = x.shape[0] * x.shape[1]
    return _dense(x, out_dtype), _sized(x, (rows,), torch.float32), _sized(x, (rows,), torch.float32)


def _adaln_layernorm_setup(ctx, inputs, output):
    x, shift, scale, out_dtype, eps = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, shift, scale, mean, rstd)
    _saved_not_results(ctx, mean, rstd)  # saved for the backward, not results
    ctx.rest = (out_dtype, eps)


def _adaln_layernorm_backward(ctx, grad, grad_mean, grad_rstd):
    dx, dshift, dscale = _ops.adaln_layernorm_backward(grad, *ctx.saved_tensors, *ctx.rest)
    return dx, dshift, dscale, None, None


torch.library.register_autograd(_name("adaln_layernorm"), _adaln_layernorm_backward,
                                setup_context=_adaln_layernorm_setup)


@torch.library.register_fake(_name("adaln_layernorm_backward"))
def _(grad, x, shift, scale, mean, rstd, out_dtype, eps):
    return _dense(x), _dense(shift), _dense(scale)


def rms_adaln(x: Tensor, weight: Tensor | None = None, scale: Tensor | None = None,
              out_dtype: torch.dtype | None = None, eps: float = 1e-6) -> Tensor:
    """x * rsqrt(mean_D(x^2) + eps) * weight * (1 + scale[:, None]), in out_dtype.

    x [B, T, D]; weight [D] or None (ones); scale [B, D] or None (zero).
    """
    h, _, _ = _ops.rms_adaln(x, weight, scale, _out_dtype(x, out_dtype), eps)
    return h


def _keeps_xhat(x, act):
    """Whether the CUDA op keeps the normalised rows (in act, the kernels' type
    of h) for its backward instead of x or x1 (ops::detail::row_norm_tensors: a
    16-bit operand of a wider input)."""
    return x.is_cuda and act.itemsize == 2 and x.dtype.itemsize > 2


@torch.library.register_fake(_name("rms_adaln"))
def _(x, weight, scale, out_dtype, eps):
    xhat = _dense(x, out_dtype) if _keeps_xhat(x, out_dtype) else _no_grad_slot(x)
    return _dense(x, out_dtype), xhat, _sized(x, (x.shape[0] * x.shape[1],), torch.float32)


def _rms_adaln_setup(ctx, inputs, output):
    x, weight, scale, out_dtype, eps = inputs
    _, xhat, rstd = output
    # As the C++ op keeps: x only without xhat (or for the CPU's reference backward).
    ctx.save_for_backward(x if (xhat.numel() == 0 or not x.is_cuda) else None, weight, scale, xhat, rstd)
    _saved_not_results(ctx, xhat, rstd)  # saved for the backward, not results
    ctx.rest = (x.dtype, out_dtype, eps)


def _rms_adaln_backward(ctx, grad, *unused):
    x, weight, scale, xhat, rstd = ctx.saved_tensors
    dx, dweight, dscale = _ops.rms_adaln_backward(grad, x, weight, scale, xhat, rstd, *ctx.rest)
    return dx, dweight if weight is not None else None, dscale if scale is not None else None, None, None


torch.library.register_autograd(_name("rms_adaln"), _rms_adaln_backward, setup_context=_rms_adaln_setup)


@torch.library.register_fake(_name("rms_adaln_backward"))
def _(grad, x, weight, scale, xhat, rstd, x_dtype, out_dtype, eps):
    return (_dense(grad, x_dtype), _dense(weight) if weight is not None else _no_grad_slot(grad),
            _dense(scale) if scale is not None else _no_grad_slot(grad))


# ----------------------------------------------------------------- residuals


def gated_residual(x: Tensor, gate: Tensor, y: Tensor, bias: Tensor | None = None) -> Tensor:
    """x + gate[:, None, :] * (y + bias), fp32 math, in x's dtype.

    x, y [B, T, D] float32/bfloat16/float16 (any mix); gate [B, D] (a view
    whose last dimension is contiguous, such as a chunk of the adaLN
    projection, is read in place); bias [D] or None. Returns [B, T, D] in x's
    dtype. Gradients: x's is the incoming gradient; y's, gate's and bias's in
    their own dtypes.
    """
    return _ops.gated_residual(x, gate, y, bias)


@torch.library.register_fake(_name("gated_residual"))
def _(x, gate, y, bias=None):
    return _dense(x)


@torch.library.register_fake(_name("gated_residual_backward"))
def _(grad, gate, y, bias, x_dtype):
    return _dense(gate), _dense(y), _dense(bias) if bias is not None else _no_grad_slot(y)


def _gated_residual_setup(ctx, inputs, output):
    x, gate, y, bias = inputs
    ctx.save_for_backward(gate, y, bias)
    ctx.x_dtype = x.dtype


def _gated_residual_backward(ctx, grad):
    gate, y, bias = ctx.saved_tensors
    dgate, dy, dbias = _ops.gated_residual_backward(grad, gate, y, bias, ctx.x_dtype)
    return grad, dgate, dy, dbias if bias is not None else None


torch.library.register_autograd(_name("gated_residual"), _gated_residual_backward, setup_context=_gated_residual_setup)


def residual_adaln(x: Tensor, gate: Tensor, y: Tensor, shift: Tensor, scale: Tensor,
                   out_dtype: torch.dtype | None = None, eps: float = 1e-6,
                   bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(x1, h): x1 = gated_residual(x, gate, y, bias) in x's dtype, h =
    adaln_layernorm(x1, shift, scale, out_dtype, eps), in one pass.

    x, y [B, T, D]; gate, shift, scale [B, D]; bias [D] or None.
    """
    x1, h, _, _, _ = _ops.residual_adaln(x, gate, y, shift, scale, bias, _out_dtype(x, out_dtype), eps)
    return x1, h


def _residual_act(y, out_dtype):
    """The residual ops' kernel type of y and h: out_dtype, or float32 where y is not in it."""
    return out_dtype if y.dtype == out_dtype else torch.float32


def _residual_outputs(x, y, out_dtype):
    """A residual norm op's fake outputs: x1, h, xhat (or [0]) and two per-row float32 statistics."""
    rows = x.shape[0] * x.shape[1]
    xhat = _dense(x, out_dtype) if _keeps_xhat(x, _residual_act(y, out_dtype)) else _no_grad_slot(x)
    return (_dense(x), _dense(x, out_dtype), xhat, _sized(x, (rows,), torch.float32),
            _sized(x, (rows,), torch.float32))


def _residual_context(ctx, x, tensors, output, out_dtype, eps):
    """A residual norm op's context, keeping what the C++ op keeps: x only for
    the CPU's reference backward, the other inputs (`tensors`), x1 only
    without xhat, xhat and the two statistics."""
    x1, _, xhat, stat, rstd = output
    kept = xhat.numel() > 0
    ctx.save_for_backward(None if x.is_cuda else x, *tensors, None if kept else x1, xhat, stat, rstd)
    _saved_not_results(ctx, xhat, stat, rstd)  # saved for the backward, not results
    ctx.rest = (x.dtype, out_dtype, eps)


@torch.library.register_fake(_name("residual_adaln"))
def _(x, gate, y, shift, scale, bias, out_dtype, eps):
    return _residual_outputs(x, y, out_dtype)


def _residual_adaln_setup(ctx, inputs, output):
    x, gate, y, shift, scale, bias, out_dtype, eps = inputs
    _residual_context(ctx, x, (gate, y, shift, scale, bias), output, out_dtype, eps)


def _residual_grads(ctx, saved, grad_x1, grad_h):
    """The two results' gradients, zeros for one not used (y, saved[2], has their shape)."""
    x_dtype, out_dtype, _ = ctx.rest
    y = saved[2]
    return (grad_x1 if grad_x1 is not None else y.new_zeros(y.shape, dtype=x_dtype),
            grad_h if grad_h is not None else y.new_zeros(y.shape, dtype=out_dtype))


def _residual_adaln_backward(ctx, grad_x1, grad_h, *unused):
    saved = ctx.saved_tensors
    grads = _ops.residual_adaln_backward(*_residual_grads(ctx, saved, grad_x1, grad_h), *saved, *ctx.rest)
    dx, dgate, dy, dshift, dscale, dbias = grads
    return dx, dgate, dy, dshift, dscale, dbias if saved[5] is not None else None, None, None


torch.library.register_autograd(_name("residual_adaln"), _residual_adaln_backward,
                                setup_context=_residual_adaln_setup)


@torch.library.register_fake(_name("residual_adaln_backward"))
def _(grad_x1, grad_h, x, gate, y, shift, scale, bias, x1, xhat, mean, rstd, x_dtype, out_dtype, eps):
    dbias = _dense(bias) if bias is not None else _no_grad_slot(y)
    return (_dense(grad_x1, x_dtype), _dense(gate), _dense(y), _dense(shift), _dense(scale), dbias)


def residual_rms_adaln(x: Tensor, gate: Tensor, y: Tensor, post_weight: Tensor | None = None,
                       pre_weight: Tensor | None = None, scale: Tensor | None = None,
                       out_dtype: torch.dtype | None = None, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """(x1, h): yn = rms(y) * post_weight; x1 = x + tanh(gate)[:, None] * yn
    (x's dtype); h = rms(x1) * pre_weight * (1 + scale[:, None]) (out_dtype).

    x, y [B, T, D]; gate [B, D]; scale [B, D] or None (zero); weights [D] or None (ones).
    """
    x1, h, _, _, _ = _ops.residual_rms_adaln(x, gate, y, post_weight, pre_weight, scale, _out_dtype(x, out_dtype),
                                             eps)
    return x1, h


@torch.library.register_fake(_name("residual_rms_adaln"))
def _(x, gate, y, post_weight, pre_weight, scale, out_dtype, eps):
    return _residual_outputs(x, y, out_dtype)


def _residual_rms_adaln_setup(ctx, inputs, output):
    x, gate, y, post_weight, pre_weight, scale, out_dtype, eps = inputs
    _residual_context(ctx, x, (gate, y, post_weight, pre_weight, scale), output, out_dtype, eps)


def _residual_rms_adaln_backward(ctx, grad_x1, grad_h, *unused):
    saved = ctx.saved_tensors
    grads = _ops.residual_rms_adaln_backward(*_residual_grads(ctx, saved, grad_x1, grad_h), *saved, *ctx.rest)
    optional = saved[3:6]  # post_weight, pre_weight, scale
    return (*grads[:3], *(g if t is not None else None for g, t in zip(grads[3:], optional)), None, None)


torch.library.register_autograd(_name("residual_rms_adaln"), _residual_rms_adaln_backward,
                                setup_context=_residual_rms_adaln_setup)


@torch.library.register_fake(_name("residual_rms_adaln_backward"))
def _(grad_x1, grad_h, x, gate, y, post_weight, pre_weight, scale, x1, xhat, y_rstd, rstd, x_dtype, out_dtype, eps):
    opt = [_dense(t) if t is not None else _no_grad_slot(y) for t in (post_weight, pre_weight, scale)]
    return (_dense(grad_x1, x_dtype), _dense(gate), _dense(y), *opt)


# ----------------------------------------------------------------- attention


def qk_norm_rope(qkv: Tensor, heads: int, q_weight: Tensor | None, k_weight: Tensor | None, cos: Tensor,
                 sin: Tensor, eps: float = 1e-6) -> Tensor:
    """Per-head RMSNorm of q and k with their weights, then the rotary
    rotation; v copied. qkv [B, T, 3D] packed as (3, heads, hd), hd even;
    q_weight, k_weight [hd] or None (ones); cos, sin [T, hd/2] float32 (no
    gradient). Returns [B, T, 3D] in qkv's dtype.
    """
    out, _ = _ops.qk_norm_rope(qkv, q_weight, k_weight, cos, sin, heads, eps)
    return out


@torch.library.register_fake(_name("qk_norm_rope"))
def _(qkv, q_weight, k_weight, cos, sin, heads, eps):
    return _dense(qkv), _sized(qkv, (qkv.shape[0], qkv.shape[1], 2, heads), torch.float32)


def _qk_norm_rope_setup(ctx, inputs, output):
    qkv, q_weight, k_weight, cos, sin, heads, eps = inputs
    ctx.save_for_backward(qkv, q_weight, k_weight, cos, sin, output[1])
    _saved_not_results(ctx, output[1])  # rstd: saved for the backward, not a result
    ctx.rest = (heads, eps)


def _qk_norm_rope_backward(ctx, grad, grad_rstd):
    qkv, q_weight, k_weight, cos, sin, rstd = ctx.saved_tensors
    dqkv, dq, dk = _ops.qk_norm_rope_backward(grad, qkv, q_weight, k_weight, cos, sin, rstd, *ctx.rest)
    return (dqkv, dq if q_weight is not None else None, dk if k_weight is not None else None, None, None, None,
            None)


torch.library.register_autograd(_name("qk_norm_rope"), _qk_norm_rope_backward, setup_context=_qk_norm_rope_setup)


@torch.library.register_fake(_name("qk_norm_rope_backward"))
def _(grad, qkv, q_weight, k_weight, cos, sin, rstd, heads, eps):
    return (_dense(qkv), _dense(q_weight) if q_weight is not None else _no_grad_slot(qkv),
            _dense(k_weight) if k_weight is not None else _no_grad_slot(qkv))


def attention(qkv: Tensor, heads: int, key_mask: Tensor | None = None) -> Tensor:
    """Softmax attention (scale 1/sqrt(hd)) of a packed qkv [B, T, 3D] laid
    out as (3, heads, hd) in the last dimension -> [B, T, D] in qkv's dtype.

    key_mask: None, or a bool mask of the keys attended (True: attended),
    [B, T] or [B, 1, 1, T] on qkv's device, no gradient; every query needs at
    least one attended key. CUDA: the kernels the C++ trainer's packed
    attention would pick (ops/packed_attention_route.h) under the process's
    attention mode (set_attention_mode): by default ("auto") our whole-head
    kernels at 256 tokens without a mask (bf16, head dim 64 or 72), elsewhere
    the fastest by timing of our tiled kernels, cuDNN's fused attention (a
    mask as its additive key bias) and cuDNN's forward with our backward;
    the backward runs the forward's family from its output and log-sum-exp.
    CPU, fp32, or a shape cuDNN refuses: ATen's SDPA (its backward through
    autograd on a recomputed forward).
    """
    out, _ = _ops.attention(qkv, heads, key_mask)
    return out


@torch.library.register_fake(_name("attention"))
def _(qkv, heads, key_mask=None):
    b, t, three_d = qkv.shape
    return _sized(qkv, (b, t, three_d // 3)), _sized(qkv, (b, heads, t), torch.float32)


def _attention_setup(ctx, inputs, output):
    qkv, heads, key_mask = inputs
    out, lse = output
    ctx.save_for_backward(qkv, out, lse, key_mask)
    _saved_not_results(ctx, lse)  # saved for the backward, not a result
    ctx.heads = heads


def _attention_backward(ctx, grad_out, grad_lse):
    qkv, out, lse, key_mask = ctx.saved_tensors
    return _ops.attention_backward(grad_out, qkv, out, lse, ctx.heads, key_mask), None, None


torch.library.register_autograd(_name("attention"), _attention_backward, setup_context=_attention_setup)


@torch.library.register_fake(_name("attention_backward"))
def _(grad, qkv, out, lse, heads, key_mask=None):
    return _dense(qkv)


def set_attention_mode(mode: str) -> None:
    """Which kernels attention (and perftrain.nn's blocks) runs in this process, as the C++ trainer's [speed]
    key attention (ops/attention_mode.h, docs/guide/speed.md):
      "whole_head"  our whole-head kernels where they apply (bf16, sm_90, 256 tokens, no key mask, head dim 64
                    or 72), cuDNN's elsewhere
      "tiled"       our tiled kernels wherever they apply (any length from 64 tokens, key masks, head dim 64,
                    72, 96 or 128), 256 tokens too; cuDNN's elsewhere
      "cudnn"       cuDNN's fused kernels both ways everywhere
      "auto"        the default, as the trainer's: the whole-head kernels where they apply; elsewhere, on the first
                    forward of each new shape, ours, cuDNN's and cuDNN's forward with our backward are timed
                    (CUDA events, fresh random inputs) and the fastest is kept for the process; a shape first
                    met while a CUDA graph is being captured is not timed and runs ours
    Set it before the first step (a captured graph keeps the kernels it recorded). RuntimeError naming the modes
    for any other name."""
    _ops.set_attention_mode(mode)


def attention_mode() -> str:
    """The attention mode the process runs now (set_attention_mode)."""
    return _ops.attention_mode()


# ----------------------------------------------------------------- MLP


def swiglu(gate_up: Tensor) -> Tensor:
    """silu(gate_up[..., :F]) * gate_up[..., F:] -> [..., F] in gate_up's dtype (fp32 math).

    gate_up [..., 2F] float32/bfloat16/float16: the output of ONE product
    against the concatenated weights [gate.weight; up.weight].
    """
    return _ops.swiglu(gate_up)


@torch.library.register_fake(_name("swiglu"))
def _(gate_up):
    return _sized(gate_up, (*gate_up.shape[:-1], gate_up.shape[-1] // 2))


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _swiglu_backward(ctx, grad):
    (gate_up,) = ctx.saved_tensors
    return _ops.swiglu_backward(grad, gate_up)


torch.library.register_autograd(_name("swiglu"), _swiglu_backward, setup_context=_swiglu_setup)


@torch.library.register_fake(_name("swiglu_backward"))
def _(grad, gate_up):
    return _dense(gate_up)


def linear_gelu(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """gelu_tanh(x @ weight.T + bias) [..., H] in x's dtype: fc1 of the MLP with
    its bias and GELU in one product.

    x [..., C] bfloat16/float16/float32; weight [H, C], bias [H] in float32
    (master weights) or x's dtype, cast to x's dtype per call. CUDA: our
    Hopper product where it applies (bf16, sm_90, rows % 128, H % 256, C % 64),
    else cuBLASLt's GELU epilogue, else ATen. Gradients in each input's dtype.
    """
    act, _ = _ops.linear_gelu(x, weight, bias)
    return act


@torch.library.register_fake(_name("linear_gelu"))
def _(x, weight, bias):
    shape = (*x.shape[:-1], weight.shape[0])
    return _sized(x, shape), _sized(x, shape)


def _linear_gelu_setup(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight, bias, output[1])
    _saved_not_results(ctx, output[1])  # pre: saved for the backward, not a result


def _linear_gelu_backward(ctx, grad_act, grad_pre):
    x, weight, bias, pre = ctx.saved_tensors
    return _ops.linear_gelu_backward(grad_act, x, weight, bias, pre)


torch.library.register_autograd(_name("linear_gelu"), _linear_gelu_backward, setup_context=_linear_gelu_setup)


@torch.library.register_fake(_name("linear_gelu_backward"))
def _(grad, x, weight, bias, pre):
    return _dense(x), _dense(weight), _dense(bias)


def gelu_mlp(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor | None = None, *,
             w1_copy: Tensor | None = None, w2_copy: Tensor | None = None) -> Tensor:
    """fc2(gelu_tanh(fc1(x))) [..., D] in x's dtype: the transformer MLP as the C++ trainer runs it.

    x [..., C] bfloat16/float16/float32; w1 [H, C], b1 [H], w2 [D, H], b2 [D] or None (the gated
    residual after a DiT block's MLP adds fc2's bias) in float32 (master weights) or x's dtype.
    w1_copy, w2_copy: None, or the weight's copy in x's dtype that the products read instead of
    casting it (DeviceAdamW's bf16 copies; perftrain.nn passes them); the gradients still go to w1 and
    w2. CUDA: fc1's bias and GELU in fc1's product (our Hopper kernel or cuBLASLt's epilogue), fc2's
    input gradient with GELU's backward and fc1's bias gradient in cuBLASLt's DGELU epilogue on large
    products (else a plain product and one GELU-backward pass), the weight gradients written in the
    weights' dtypes straight from the products, the bias gradients as column sums. Gradients in each
    input's dtype.
    """
    y, _, _ = _ops.gelu_mlp(x, w1, b1, w2, b2, w1_copy, w2_copy)
    return y


@torch.library.register_fake(_name("gelu_mlp"))
def _(x, w1, b1, w2, b2, w1_copy, w2_copy):
    hidden = (*x.shape[:-1], w1.shape[0])
    return _sized(x, (*x.shape[:-1], w2.shape[0])), _sized(x, hidden), _sized(x, hidden)


def _gelu_mlp_setup(ctx, inputs, output):
    _, pre, act = output
    ctx.save_for_backward(*inputs, pre, act)
    _saved_not_results(ctx, pre, act)  # saved for the backward, not results


def _gelu_mlp_backward(ctx, grad, grad_pre, grad_act):
    x, w1, b1, w2, b2, w1_copy, w2_copy, pre, act = ctx.saved_tensors
    dx, dw1, db1, dw2, db2 = _ops.gelu_mlp_backward(grad, x, w1, b1, w2, b2, w1_copy, w2_copy, pre, act)
    return dx, dw1, db1, dw2, db2 if b2 is not None else None, None, None


torch.library.register_autograd(_name("gelu_mlp"), _gelu_mlp_backward, setup_context=_gelu_mlp_setup)


@torch.library.register_fake(_name("gelu_mlp_backward"))
def _(grad, x, w1, b1, w2, b2, w1_copy, w2_copy, pre, act):
    return _dense(x), _dense(w1), _dense(b1), _dense(w2), _dense(b2) if b2 is not None else _no_grad_slot(x)


# ----------------------------------------------------------------- linear


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, weight_copy: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias [..., N] in x's dtype: the C++ trainer's linear layer.

    x [..., K] bfloat16/float16/float32; weight [N, K], bias [N] or None in float32 (master weights)
    or x's dtype. weight_copy: None, or weight's copy in x's dtype that the product reads instead of
    casting weight (DeviceAdamW's bf16 copies; perftrain.nn passes them); the gradient still goes to
    weight. CUDA: cuBLASLt with the bias in the epilogue; backward: the weight gradient written in
    weight's dtype straight from the product (float32 for master weights, no bfloat16 round trip),
    the bias gradient as column sums. Gradients in each input's dtype.
    """
    return _ops.linear(x, weight, bias, weight_copy)


@torch.library.register_fake(_name("linear"))
def _(x, weight, bias, weight_copy):
    return _sized(x, (*x.shape[:-1], weight.shape[0]))


def _linear_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _linear_backward(ctx, grad):
    x, weight, bias, weight_copy = ctx.saved_tensors
    dx, dweight, dbias = _ops.linear_backward(grad, x, weight, bias, weight_copy)
    return dx, dweight, dbias if bias is not None else None, None


torch.library.register_autograd(_name("linear"), _linear_backward, setup_context=_linear_setup)


@torch.library.register_fake(_name("linear_backward"))
def _(grad, x, weight, bias, weight_copy):
    return _dense(x), _dense(weight), _dense(bias) if bias is not None else _no_grad_slot(x)


def stacked_linear(x: Tensor, weights: list[Tensor], biases: list[Tensor] | None = None, *,
                   weight_copies: list[Tensor] | None = None, bias_copies: list[Tensor] | None = None) -> Tensor:
    """x @ [W_0; W_1; ...].T + [b_0; b_1; ...] [..., sum N_i] in x's dtype: several linear layers that read
    the same input as one product (DiT's adaLN modulations: one product of B rows for all blocks instead of
    one per block, forward and in each of the two backward products).

    x [..., K]; weights: one or more [N_i, K] of one dtype (float32 masters or x's dtype); biases: None or
    one [N_i] per weight. weight_copies / bias_copies: None, or one copy in x's dtype per weight / bias
    (DeviceAdamW's, which it lays out back to back for layers of one shape, so that the product reads them
    in place). CUDA: ops::stacked_linear's product; backward: one weight-gradient product and one bias
    column sum for all layers, each layer's gradient a row block of them. Gradients in each input's dtype.
    """
    return _ops.stacked_linear(x, list(weights), list(biases or []), list(weight_copies or []),
                               list(bias_copies or []))


@torch.library.register_fake(_name("stacked_linear"))
def _(x, weights, biases, weight_copies, bias_copies):
    return _sized(x, (*x.shape[:-1], sum(w.shape[0] for w in weights)))


def _stacked_linear_setup(ctx, inputs, output):
    x, weights, biases, weight_copies, bias_copies = inputs
    ctx.save_for_backward(x, *weights, *biases, *weight_copies)
    ctx.counts = (len(weights), len(biases), len(bias_copies))


def _stacked_linear_backward(ctx, grad):
    n, nb, nbc = ctx.counts
    saved = ctx.saved_tensors
    x, weights, biases, copies = saved[0], saved[1:1 + n], saved[1 + n:1 + n + nb], saved[1 + n + nb:]
    dx, dw, db = _ops.stacked_linear_backward(grad, x, list(weights), list(biases), list(copies))
    rows = [w.shape[0] for w in weights]
    # One gradient per list element, the lists as the inputs' (the copies take none).
    return dx, list(dw.split(rows)), list(db.split(rows)) if nb else [], [None] * len(copies), [None] * nbc


torch.library.register_autograd(_name("stacked_linear"), _stacked_linear_backward, setup_context=_stacked_linear_setup)


@torch.library.register_fake(_name("stacked_linear_backward"))
def _(grad, x, weights, biases, weight_copies):
    rows = sum(w.shape[0] for w in weights)
    db = _sized(x, (rows,), biases[0].dtype) if biases else _no_grad_slot(x)
    return _dense(x), _sized(x, (rows, x.shape[-1]), weights[0].dtype), db


# ----------------------------------------------------------------- gradient helpers


def column_sums(mats: list[Tensor]) -> list[Tensor]:
    """One float32 [N] per matrix: the sum over the rows of each of 1 to 4
    [M, N] matrices of one dtype, shape and row stride (the bias gradients;
    one launch pair on CUDA, fp32 accumulation). No gradient."""
    return _ops.column_sums(list(mats))


@torch.library.register_fake(_name("column_sums"))
def _(mats):
    return [_sized(m, (m.shape[1],), torch.float32) for m in mats]


# ----------------------------------------------------------------- products' algorithm timing


@contextlib.contextmanager
def gemm_tuning_deferred():
    """While inside, the products (linear, gelu_mlp, stacked_linear...) run cuBLASLt's first pick and time no
    candidate algorithms; a shape met inside is timed on its first call after it. perftrain.capture_step holds
    it over the first warm-up step, so that the time to the first step has no timing in it. Process-wide (the
    backward's products run on autograd's threads); a nested one changes nothing."""
    if not _ops.gemm_tuning_open():
        yield
        return
    _ops.defer_gemm_tuning(True)
    try:
        yield
    finally:
        _ops.defer_gemm_tuning(False)


# ----------------------------------------------------------------- optimizer

# The slots of adamw_scalars' tensor (ops::AdamWSlot, src/ops/multi_tensor_adamw.h).
ADAMW_SLOTS = {
    "loss_scale": 0,  # the scale the gradients carry (the unscale divides by it); the next step's after a step
    "grad_norm": 1,  # unscaled, before clipping, of the last step
    "lr": 2,  # LR of the last step
    "skipped": 3,  # steps skipped for inf/NaN, in total
    "step": 4,  # updates taken (AdamW's step counter)
    "good_steps": 5,  # finite steps since the loss scale last changed
    "skip": 6,  # 1: the last step was skipped
    "ema_weight": 11,  # 1 - the EMA decay of the last update
    "schedule_step": 12,  # steps taken, skipped ones too: the LR schedule's position
}


def adamw_scalars(device, loss_scale: float = 1.0) -> Tensor:
    """The device state of multi_tensor_adamw_: a float32 vector, zeros but the loss scale."""
    return _ops.adamw_scalars(torch.device(device), float(loss_scale))


def multi_tensor_adamw_(params: list[Tensor], grads: list[Tensor | None], exp_avgs: list[Tensor],
                        exp_avg_sqs: list[Tensor], emas: list[Tensor], scalars: Tensor, *,
                        shadows: list[Tensor] | None = None, decay: list[bool] | None = None, lr: float,
                        betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                        grad_clip: float = 0.0, warmup_steps: int = 0, lr_schedule: str = "constant",
                        lr_min: float = 0.0, total_steps: int = 0, decay_fraction: float = 0.2,
                        ema_decay: float = 0.9999, ema_warmup: bool = True, ema_start: int = 0,
                        dynamic_loss_scale: bool = False, growth_interval: int = 2000) -> None:
    """One AdamW + clip + unscale + EMA step over every tensor, in place, with
    the LR schedule, the step and the loss scale on the device (`scalars`,
    from adamw_scalars): no host sync on CUDA, capture-safe after the first
    call for a given list of tensors (which makes the launch plan).

    params, exp_avgs, exp_avg_sqs: float32 contiguous, pairwise the same
    sizes; grads: one per param (None: skipped); emas: [] or one per param;
    shadows: None or one bfloat16 tensor per param, rewritten as
    param.to(bfloat16) each step; decay: None (all) or a bool per param.
    """
    _ops.multi_tensor_adamw_(list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), list(emas),
                             list(shadows or []), scalars, list(decay or [True] * len(params)), float(lr),
                             float(betas[0]), float(betas[1]), float(eps), float(weight_decay), float(grad_clip),
                             int(warmup_steps), lr_schedule, float(lr_min), int(total_steps), float(decay_fraction),
                             float(ema_decay), bool(ema_warmup), int(ema_start), bool(dynamic_loss_scale),
                             int(growth_interval))


@torch.library.register_fake(_name("multi_tensor_adamw_"))
def _(*args):
    return None
