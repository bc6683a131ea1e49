"""Every perftrain.ops function on the CPU: torch.library.opcheck of each
operator it calls (schema, autograd registration, fake tensor, AOT
dispatch), and its outputs and gradients in float32 against the float64
reference of cases.py on odd sizes."""
import sys
import unittest

import torch

import cases
import perftrain.ops as P


class OpsOnCpu(unittest.TestCase):
    def test_opcheck_every_operator(self):
        checked = set()
        for name, fn, make, _ in cases.CASES:
            torch.manual_seed(0)
            args, kwargs = make("cpu", torch.float32)
            calls = cases.operator_calls(fn, args, kwargs)
            self.assertEqual(len(calls), 1, name)
            for op, op_args, op_kwargs in calls:
                with self.subTest(op=name):
                    torch.library.opcheck(op, op_args, op_kwargs)
                checked.add(op.name())
        # Every operator with a gradient (a `<op>_backward` twin) has a case.
        names = self._registered()
        differentiable = {n for n in names if n + "_backward" in names}
        self.assertTrue(differentiable)
        self.assertEqual(differentiable - {n.split(".")[0] for n in checked}, set())

    def _registered(self):
        return {n for n in torch._C._dispatch_get_all_op_names() if n.startswith("perftrain::")}

    def test_matches_float64_reference(self):
        for name, fn, make, ref in cases.CASES:
            with self.subTest(op=name):
                torch.manual_seed(0)
                args, kwargs = make("cpu", torch.float32)
                outs, grads = cases.outputs_and_grads(fn, args, kwargs)
                args64, kwargs64 = cases.float64_copy(args, kwargs)
                outs64, grads64 = cases.outputs_and_grads(ref, args64, kwargs64)
                self.assertEqual(len(outs), len(outs64))
                for o, r in zip(outs, outs64):
                    self.assertEqual(o.dtype, torch.float32)
                    self.assertEqual(o.shape, r.shape)
                    torch.testing.assert_close(o.double(), r, atol=2e-5, rtol=2e-5)
                for g, r, leaf in zip(grads, grads64, cases.leaves(args, kwargs)):
                    self.assertIsNotNone(g)
                    self.assertEqual(g.shape, leaf.shape)
                    self.assertEqual(g.dtype, leaf.dtype)
                    torch.testing.assert_close(g.double(), r, atol=1e-4, rtol=1e-4)

    def test_bad_input_names_the_op(self):
        with self.assertRaisesRegex(RuntimeError, "gated_residual"):
            P.gated_residual(torch.randn(2, 3, 8), torch.randn(2, 7), torch.randn(2, 3, 8))


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
