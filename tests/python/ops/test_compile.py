"""torch.compile(fullgraph=True) traces a small function that uses every
differentiable perftrain.ops function, forward and backward, with no graph
break (fullgraph raises on one; the graph-break counter stays at zero), and
gives the eager values and gradients (CPU, aot_eager: the AOT autograd path
that inductor takes, without compiling kernels)."""
import sys
import unittest

import torch
import torch._dynamo

import cases
import perftrain.ops as P


def every_op(x, y, ada, bias, qkv, qw, kw, cos, sin, gate_up, w1, b1, w2, mask):
    gate, shift, scale = ada.chunk(3, dim=1)
    h = P.adaln_layernorm(x, shift, scale)
    r = P.gated_residual(x, gate, y, bias)
    x1, h2 = P.residual_adaln(r, gate, h, shift, scale, bias=bias)
    h3 = P.rms_adaln(x1, bias, scale)
    x2, h4 = P.residual_rms_adaln(x1, gate, h3, bias, bias, scale)
    q = P.qk_norm_rope(qkv, cases.HEADS, qw, kw, cos, sin)
    a = P.attention(q, cases.HEADS) + P.attention(q, cases.HEADS, mask)
    s = P.swiglu(gate_up)
    g = P.linear_gelu(h4 + a, w1, b1)
    m = P.gelu_mlp(h2, w1, b1, w2, bias, w1_copy=w1.detach())
    p = P.linear(m, w1, b1) + P.linear(m, w1, weight_copy=w1.detach())
    return (h2 + x2).sum() + g.square().mean() + s.mean() + p.square().mean()


class CompileEveryOp(unittest.TestCase):
    def test_fullgraph_no_break(self):
        torch.manual_seed(0)
        dev, dt = "cpu", torch.float32
        B, T, D, H = cases.B, cases.T, cases.D, cases.HEADS
        inputs = [
            cases.randn(B, T, D, device=dev, dtype=dt),
            cases.randn(B, T, D, device=dev, dtype=dt),
            cases.randn(B, 3 * D, device=dev, dtype=dt, scale=0.5),
            cases.randn(D, device=dev, dtype=dt),
            cases.randn(B, T, 3 * D, device=dev, dtype=dt),
            cases.randn(D // H, device=dev, dtype=dt),
            cases.randn(D // H, device=dev, dtype=dt),
            *cases.rope_tables(dev, D // H),
            cases.randn(B, T, 2 * 9, device=dev, dtype=dt),
            cases.randn(11, D, device=dev, dtype=dt, scale=D ** -0.5),
            cases.randn(11, device=dev, dtype=dt),
            cases.randn(D, 11, device=dev, dtype=dt, scale=11 ** -0.5),
            cases.key_mask(B, T, dev),
        ]
        leaves = [t for t in inputs if t.requires_grad]
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        compiled = torch.compile(every_op, fullgraph=True, backend="aot_eager")
        cases.assert_compiled_matches_eager(compiled, every_op, inputs, leaves)
        self.assertEqual(sum(torch._dynamo.utils.counters["graph_break"].values()), 0)


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
