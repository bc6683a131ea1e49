"""perftrain's operators as Inductor fallbacks (perftrain/_inductor.py): importing perftrain does not load
Inductor's lowerings; once they load (torch.compile's first graph, or an import before perftrain's), every
perftrain operator that reaches lowering is a registered fallback, so Inductor never formats its arguments for an
implicit fallback; a chain of the operators compiled by Inductor on the CPU, forward and backward, gives the
eager values and gradients. Each process case is a fresh interpreter."""
import os
import subprocess
import sys
import textwrap
import unittest

import torch

import cases
import perftrain.ops as P

CHECK_REGISTERED = """
import sys
import torch
{before}
import perftrain
import perftrain._inductor as I
assert I.LOWERING not in sys.modules or {lowering_before}, "importing perftrain loaded Inductor's lowerings"
import torch._inductor.lowering as L
ops = [op for op in I.operators() if op not in L.decompositions]
missing = [str(op) for op in ops if op not in L.lowerings or op not in L.fallbacks]
assert not missing, f"not registered: {{missing}}"
names = {{str(op) for op in ops}}
for want in ("perftrain.gated_residual.default", "perftrain.gated_residual_backward.default",
             "perftrain.attention.default", "perftrain.attention_backward.default", "perftrain.linear.default"):
    assert want in names, (want, sorted(names))
print("registered", len(ops))
"""


def run_python(code):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)


def chain(x, gate, y, shift, scale, bias):
    """Each op reads the one before it, forward and backward: the shape of a DiT's blocks."""
    h = x
    for _ in range(4):
        h = P.gated_residual(h, gate, y, bias)
        h = P.adaln_layernorm(h, shift, scale)
    return h.square().mean()


class InductorFallbacks(unittest.TestCase):
    def test_registered_when_inductor_loads_after_perftrain(self):
        done = run_python(CHECK_REGISTERED.format(before="", lowering_before="False"))
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("registered", done.stdout)

    def test_registered_at_once_when_inductor_was_loaded_before(self):
        done = run_python(CHECK_REGISTERED.format(before="import torch._inductor.lowering", lowering_before="True"))
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertNotIn("not registered as Inductor fallbacks", done.stderr)

    def test_inductor_compiles_a_chain_of_the_ops(self):
        torch.manual_seed(0)
        B, T, D = cases.B, cases.T, cases.D
        x = cases.randn(B, T, D, device="cpu", dtype=torch.float32)
        y = cases.randn(B, T, D, device="cpu", dtype=torch.float32)
        gate, shift, scale = cases.modulation(3, "cpu", torch.float32)
        bias = cases.randn(D, device="cpu", dtype=torch.float32)
        inputs = (x, gate, y, shift, scale, bias)
        torch._dynamo.reset()
        compiled = torch.compile(chain, fullgraph=True, backend="inductor")
        cases.assert_compiled_matches_eager(compiled, chain, inputs, inputs)


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
