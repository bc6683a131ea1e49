"""Which masked-attention backends keep dq finite when every logit is about -127 (PyTorch issue 196678):
cuDNN's with an additive bias turns dq NaN at T % 128 == 64. Run: tools/gpu_run.sh MODE=lab LAB=masked_sdpa_nan_probe.py"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.manual_seed(0)
for T, hd, H in [(320, 64, 1), (192, 64, 2), (448, 64, 1), (256, 64, 1), (288, 72, 16), (1152, 72, 16)]:
    B = 2
    q = 0.1 * torch.randn(B, H, T, hd, device="cuda")
    k = 0.1 * torch.randn(B, H, T, hd, device="cuda")
    q[..., 0] = 1.0
    k[..., 0] = -127.0 * hd**0.5
    v = torch.randn(B, H, T, hd, device="cuda")
    mask = torch.ones(B, 1, 1, T, dtype=torch.bool, device="cuda")
    mask[..., : T // 4] = False
    bias = torch.zeros(B, 1, 1, T, device="cuda").masked_fill(~mask, -65504.0)
    go = torch.randn(B, H, T, hd, device="cuda")
    row = []
    for name, fn in [
        ("sdpa-default", lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=mask)),
        ("sdpa-efficient", lambda a, b, c: _with(SDPBackend.EFFICIENT_ATTENTION, a, b, c)),
        ("sdpa-cudnn", lambda a, b, c: _with(SDPBackend.CUDNN_ATTENTION, a, b, c)),
        ("efficient-direct", lambda a, b, c: torch.ops.aten._scaled_dot_product_efficient_attention(
            a, b, c, bias.to(a.dtype).expand(B, H, T, T), True)[0]),
    ]:
        def _with(backend, a, b, c):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(a, b, c, attn_mask=mask)
        try:
            qq, kk, vv = (t.to(torch.bfloat16).requires_grad_(True) for t in (q, k, v))
            out = fn(qq, kk, vv)
            out.backward(go.to(torch.bfloat16))
            row.append(f"{name}: dq non-finite {int((~torch.isfinite(qq.grad)).sum())}")
        except Exception as e:  # noqa: BLE001
            row.append(f"{name}: error {str(e).splitlines()[0][:80]}")
    print(f"T={T} hd={hd} H={H} (T%128={T % 128}): " + "; ".join(row), flush=True)
