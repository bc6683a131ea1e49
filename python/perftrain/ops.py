"""The fused ops of perftrain as differentiable Python functions.

Each function calls one operator torch.ops.perftrain.<name> (python/csrc/
ops_*.cpp: the C++ op of src/ops/ on CUDA, its plain-ATen reference on the
CPU); its gradient is a second operator, <name>_backward, joined to it here
with torch.library.register_autograd, and each operator has a fake
implementation (torch.library.register_fake) giving the outputs' shapes,
dtypes and strides, so that torch.compile(fullgraph=True) traces through with
no graph break. Nothing here syncs with the host or allocates by data, so the
ops capture in CUDA graphs. Signatures, shapes and dtypes: the docstrings, and
/work/wt/notes/python-ops.md while the Python guide is written.
"""
import torch
from torch import Tensor

_lib = "perftrain::"


def _dense(shape, like, dtype=None):
    """A contiguous tensor of `shape` with like's device and dtype (or `dtype`)."""
    return like.new_empty(shape, dtype=dtype if dtype is not None else like.dtype)


def _no_grad_slot(like):
    """What a backward operator returns for an absent optional input."""
    return like.new_empty((0,), dtype=torch.float32)


# ---------------------------------------------------------------- gated residual


def gated_residual(x: Tensor, gate: Tensor, y: Tensor, bias: Tensor | None = None) -> Tensor:
    """x + gate[:, None, :] * (y + bias), fp32 math, in x's dtype.

    x, y [B, T, D] float32/bfloat16/float16 (any mix); gate [B, D] (a view
    whose last dimension is contiguous, such as a chunk of the adaLN
    projection, is read in place); bias [D] or None. Returns [B, T, D] in x's
    dtype. Gradients: x's is the incoming gradient; y's, gate's and bias's in
    their own dtypes.
    """
    return torch.ops.perftrain.gated_residual(x, gate, y, bias)


@torch.library.register_fake(_lib + "gated_residual")
def _(x, gate, y, bias=None):
    return _dense(x.shape, x)


@torch.library.register_fake(_lib + "gated_residual_backward")
def _(grad, gate, y, bias, x_dtype):
    return _dense(gate.shape, gate), _dense(y.shape, y), _dense(bias.shape, bias) if bias is not None else _no_grad_slot(y)


def _gated_residual_setup(ctx, inputs, output):
    x, gate, y, bias = inputs
    ctx.save_for_backward(gate, y, bias)
    ctx.x_dtype = x.dtype


def _gated_residual_backward(ctx, grad):
    gate, y, bias = ctx.saved_tensors
    dgate, dy, dbias = torch.ops.perftrain.gated_residual_backward(grad, gate, y, bias, ctx.x_dtype)
    return grad, dgate, dy, dbias if bias is not None else None


torch.library.register_autograd(_lib + "gated_residual", _gated_residual_backward, setup_context=_gated_residual_setup)
