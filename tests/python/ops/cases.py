"""The ops' test cases, shared by the CPU, GPU and compile tests: for each
differentiable function of perftrain.ops, seeded inputs on odd sizes and an
independent float64 reference written here in plain PyTorch (not the C++
reference the CPU op runs).

A case is (name, fn, make, reference): make(device, dtype) gives (args,
kwargs) with the floating inputs that take a gradient marked requires_grad;
reference(*args, **kwargs) computes the same outputs from float64 copies.
"""
import math

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import perftrain.ops as P

# Odd sizes: an odd batch, a token count and a width that are no multiples of the vector width.
B, T, D, HEADS = 3, 5, 40, 2


def randn(*shape, device, dtype, grad=True, scale=1.0):
    t = (torch.randn(*shape, dtype=torch.float32) * scale).to(device=device, dtype=dtype)
    return t.requires_grad_(grad)


def modulation(count, device, dtype):
    """count [B, D] vectors as chunks of one [B, count*D] tensor (strided views, as a DiT's adaLN output)."""
    ada = randn(B, count * D, device=device, dtype=dtype, grad=False, scale=0.5)
    return [c.detach().requires_grad_(True) for c in ada.chunk(count, dim=1)]


def layer_norm(x, eps):
    return F.layer_norm(x, (x.shape[-1],), eps=eps)


def rms(x, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


# ------------------------------------------------------------------ the cases


def adaln_layernorm_case(device, dtype):
    x = randn(B, T, D, device=device, dtype=dtype)
    shift, scale = modulation(2, device, dtype)
    return (x, shift, scale), {"eps": 1e-5}


def adaln_layernorm_ref(x, shift, scale, out_dtype=None, eps=1e-6):
    return layer_norm(x, eps) * (1 + scale[:, None]) + shift[:, None]


def rms_adaln_case(device, dtype):
    x = randn(B, T, D, device=device, dtype=dtype)
    weight = randn(D, device=device, dtype=dtype)
    (scale,) = modulation(1, device, dtype)
    return (x, weight, scale), {}


def rms_adaln_ref(x, weight=None, scale=None, out_dtype=None, eps=1e-6):
    h = rms(x, eps)
    if weight is not None:
        h = h * weight
    return h if scale is None else h * (1 + scale[:, None])


def rms_adaln_noweight_case(device, dtype):
    (x, _, _), kw = rms_adaln_case(device, dtype)
    return (x, None, None), kw


def gated_residual_case(device, dtype):
    x = randn(B, T, D, device=device, dtype=dtype)
    (gate,) = modulation(1, device, dtype)
    y = randn(B, T, D, device=device, dtype=dtype)
    bias = randn(D, device=device, dtype=dtype)
    return (x, gate, y, bias), {}


def gated_residual_ref(x, gate, y, bias=None):
    return x + gate[:, None, :] * (y if bias is None else y + bias)


def gated_residual_nobias_case(device, dtype):
    (x, gate, y, _), kw = gated_residual_case(device, dtype)
    return (x, gate, y, None), kw


def residual_adaln_case(device, dtype):
    x = randn(B, T, D, device=device, dtype=dtype)
    y = randn(B, T, D, device=device, dtype=dtype)
    gate, shift, scale = modulation(3, device, dtype)
    bias = randn(D, device=device, dtype=dtype)
    return (x, gate, y, shift, scale), {"bias": bias}


def residual_adaln_ref(x, gate, y, shift, scale, out_dtype=None, eps=1e-6, bias=None):
    x1 = gated_residual_ref(x, gate, y, bias)
    return x1, adaln_layernorm_ref(x1, shift, scale, eps=eps)


def residual_rms_adaln_case(device, dtype):
    x = randn(B, T, D, device=device, dtype=dtype)
    y = randn(B, T, D, device=device, dtype=dtype)
    gate, scale = modulation(2, device, dtype)
    post = randn(D, device=device, dtype=dtype)
    pre = randn(D, device=device, dtype=dtype)
    return (x, gate, y, post, pre, scale), {}


def residual_rms_adaln_ref(x, gate, y, post_weight=None, pre_weight=None, scale=None, out_dtype=None, eps=1e-6):
    x1 = x + torch.tanh(gate)[:, None] * rms_adaln_ref(y, post_weight, None, eps=eps)
    return x1, rms_adaln_ref(x1, pre_weight, scale, eps=eps)


def rope_tables(device, hd):
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    freq = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angle = pos * freq[None]
    return angle.cos().float().to(device), angle.sin().float().to(device)


def qk_norm_rope_case(device, dtype):
    hd = D // HEADS
    qkv = randn(B, T, 3 * D, device=device, dtype=dtype)
    qw = randn(hd, device=device, dtype=dtype)
    kw = randn(hd, device=device, dtype=dtype)
    cos, sin = rope_tables(device, hd)
    return (qkv, HEADS, qw, kw, cos, sin), {}


def qk_norm_rope_ref(qkv, heads, q_weight, k_weight, cos, sin, eps=1e-6):
    b, t, three_d = qkv.shape
    hd = three_d // 3 // heads
    q, k, v = qkv.view(b, t, 3, heads, hd).unbind(2)
    c, s = cos.double()[None, :, None, :], sin.double()[None, :, None, :]

    def rope(u):
        u0, u1 = u[..., 0::2], u[..., 1::2]
        return torch.stack((u0 * c - u1 * s, u0 * s + u1 * c), dim=-1).flatten(-2)

    q = rope(rms(q, eps) * (1 if q_weight is None else q_weight))
    k = rope(rms(k, eps) * (1 if k_weight is None else k_weight))
    return torch.stack((q, k, v), dim=2).reshape(b, t, three_d)


def attention_case(device, dtype):
    return (randn(B, T, 3 * D, device=device, dtype=dtype), HEADS), {}


def key_mask(b, t, device, seed=7):
    """A bool key mask [b, t] with a different number of attended keys per sample (at least one)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0] = t  # one sample attends every key
    return (torch.arange(t)[None, :] < lengths[:, None]).to(device)


def attention_masked_case(device, dtype):
    (qkv, heads), _ = attention_case(device, dtype)
    return (qkv, heads), {"key_mask": key_mask(B, T, device)}


def attention_ref(qkv, heads, key_mask=None):
    b, t, three_d = qkv.shape
    hd = three_d // 3 // heads
    q, k, v = qkv.view(b, t, 3, heads, hd).permute(2, 0, 3, 1, 4)
    logits = q @ k.transpose(-1, -2) / math.sqrt(hd)
    if key_mask is not None:
        logits = logits.masked_fill(~key_mask.reshape(b, 1, 1, t), float("-inf"))
    w = torch.softmax(logits, dim=-1)
    return (w @ v).transpose(1, 2).reshape(b, t, three_d // 3)


def swiglu_case(device, dtype):
    return (randn(B, T, 2 * 37, device=device, dtype=dtype),), {}


def swiglu_ref(gate_up):
    f = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :f]) * gate_up[..., f:]


def master_weights(rows, cols, device, scale):
    """fp32 master weight [rows, cols] and bias [rows], as DeviceAdamW's parameters."""
    return (randn(rows, cols, device=device, dtype=torch.float32, scale=scale),
            randn(rows, device=device, dtype=torch.float32))


def copy_in(weight, dtype):
    """weight's copy in the compute dtype, as DeviceAdamW keeps one (no gradient)."""
    return weight.detach().to(dtype)


def linear_gelu_case(device, dtype):
    x = randn(B, T, D, device=device, dtype=dtype)
    weight, bias = master_weights(3 * D + 1, D, device, D ** -0.5)
    return (x, weight, bias), {}


def linear_gelu_ref(x, weight, bias):
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def linear_case(device, dtype):
    x = randn(B, T, D, device=device, dtype=dtype)
    weight, bias = master_weights(2 * D + 3, D, device, D ** -0.5)
    return (x, weight, bias), {}


def linear_ref(x, weight, bias=None, weight_copy=None):
    return F.linear(x, weight, bias)


def linear_nobias_copy_case(device, dtype):
    (x, weight, _), _ = linear_case(device, dtype)
    return (x, weight, None), {"weight_copy": copy_in(weight, dtype)}


def gelu_mlp_case(device, dtype):
    x = randn(B, T, D, device=device, dtype=dtype)
    w1, b1 = master_weights(3 * D + 1, D, device, D ** -0.5)
    w2, b2 = master_weights(D + 5, 3 * D + 1, device, (3 * D + 1) ** -0.5)
    return (x, w1, b1, w2, b2), {}


def gelu_mlp_ref(x, w1, b1, w2, b2=None, w1_copy=None, w2_copy=None):
    return F.linear(linear_gelu_ref(x, w1, b1), w2, b2)


def gelu_mlp_nobias_copies_case(device, dtype):
    """As a DiT block calls it: no fc2 bias, the optimizer's copies beside the master weights."""
    (x, w1, b1, w2, _), _ = gelu_mlp_case(device, dtype)
    return (x, w1, b1, w2, None), {"w1_copy": copy_in(w1, dtype), "w2_copy": copy_in(w2, dtype)}


def stacked_linear_case(device, dtype):
    """Three layers of two shapes (odd sizes), as DiT's blocks' adaLN modulations and more."""
    x = randn(5, D, device=device, dtype=dtype)
    layers = [master_weights(rows, D, device, D ** -0.5) for rows in (2 * D + 3, 2 * D + 3, 7)]
    return (x, [w for w, _ in layers], [b for _, b in layers]), {}


def stacked_linear_ref(x, weights, biases=None, weight_copies=None, bias_copies=None):
    return F.linear(x, torch.cat(list(weights)), torch.cat(list(biases)) if biases else None)


def stacked_linear_copies_case(device, dtype):
    """No biases; the optimizer's copies of the weights, back to back in one buffer (read in place)."""
    (x, weights, _), _ = stacked_linear_case(device, dtype)
    weights = weights[:2]
    flat = torch.cat([w.detach().to(dtype).reshape(-1) for w in weights])
    copies = list(flat.view(2 * weights[0].shape[0], -1).split(weights[0].shape[0]))
    return (x, weights, None), {"weight_copies": copies}


CASES = [
    ("adaln_layernorm", P.adaln_layernorm, adaln_layernorm_case, adaln_layernorm_ref),
    ("rms_adaln", P.rms_adaln, rms_adaln_case, rms_adaln_ref),
    ("rms_adaln (no weight, no scale)", P.rms_adaln, rms_adaln_noweight_case, rms_adaln_ref),
    ("gated_residual", P.gated_residual, gated_residual_case, gated_residual_ref),
    ("gated_residual (no bias)", P.gated_residual, gated_residual_nobias_case, gated_residual_ref),
    ("residual_adaln", P.residual_adaln, residual_adaln_case, residual_adaln_ref),
    ("residual_rms_adaln", P.residual_rms_adaln, residual_rms_adaln_case, residual_rms_adaln_ref),
    ("qk_norm_rope", P.qk_norm_rope, qk_norm_rope_case, qk_norm_rope_ref),
    ("attention", P.attention, attention_case, attention_ref),
    ("attention (key mask)", P.attention, attention_masked_case, attention_ref),
    ("swiglu", P.swiglu, swiglu_case, swiglu_ref),
    ("linear_gelu", P.linear_gelu, linear_gelu_case, linear_gelu_ref),
    ("gelu_mlp", P.gelu_mlp, gelu_mlp_case, gelu_mlp_ref),
    ("gelu_mlp (no b2, weight copies)", P.gelu_mlp, gelu_mlp_nobias_copies_case, gelu_mlp_ref),
    ("linear", P.linear, linear_case, linear_ref),
    ("linear (no bias, weight copy)", P.linear, linear_nobias_copy_case, linear_ref),
    ("stacked_linear", P.stacked_linear, stacked_linear_case, stacked_linear_ref),
    ("stacked_linear (no biases, back-to-back copies)", P.stacked_linear, stacked_linear_copies_case,
     stacked_linear_ref),
]


# ------------------------------------------------------------------ helpers


class OperatorCalls(TorchDispatchMode):
    """Records every torch.ops.perftrain.* call (operator, args, kwargs) made inside it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "perftrain":
            self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


def operator_calls(fn, args, kwargs):
    """The perftrain operators fn's forward calls, with their arguments."""
    with OperatorCalls() as rec:
        fn(*args, **kwargs)
    return rec.calls


def as_tuple(out):
    return out if isinstance(out, (tuple, list)) else (out,)


def float64_copy(args, kwargs):
    def conv(v):
        if isinstance(v, (list, tuple)):
            return [conv(t) for t in v]
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v.detach().to(torch.float64).requires_grad_(v.requires_grad)
        return v

    return tuple(conv(a) for a in args), {k: conv(v) for k, v in kwargs.items()}


def leaves(args, kwargs):
    """The inputs that take a gradient, in order."""
    vals = []
    for v in list(args) + list(kwargs.values()):
        vals.extend(v if isinstance(v, (list, tuple)) else [v])
    return [v for v in vals if isinstance(v, torch.Tensor) and v.requires_grad]


def outputs_and_grads(fn, args, kwargs, seed=1):
    """fn's outputs and the gradients of sum(out * w) (w seeded, one per output) for each leaf."""
    outs = as_tuple(fn(*args, **kwargs))
    gen = torch.Generator().manual_seed(seed)
    loss = 0
    for o in outs:
        w = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(device=o.device, dtype=o.dtype)
        loss = loss + (o * w).sum()
    grads = torch.autograd.grad(loss, leaves(args, kwargs), allow_unused=True)
    return outs, grads


def assert_compiled_matches_eager(compiled, fn, inputs, leaves):
    """compiled(*inputs) (a scalar loss) and its gradients for `leaves` equal fn's, eager."""
    got = compiled(*inputs)
    got_grads = torch.autograd.grad(got, leaves)
    want = fn(*inputs)
    want_grads = torch.autograd.grad(want, leaves)
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w)
