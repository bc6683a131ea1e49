"""Every perftrain.ops function on the CPU: torch.library.opcheck of each
operator it calls (schema, autograd registration, fake tensor, AOT
dispatch), and its outputs and gradients in float32 against the float64
reference of cases.py on odd sizes; column_sums and multi_tensor_adamw_
against plain PyTorch."""
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
        checked.add(self._opcheck_column_sums())
        checked.add(self._opcheck_adamw())
        # Every operator with a gradient (a `<op>_backward` twin) has a case.
        names = self._registered()
        differentiable = {n for n in names if n + "_backward" in names}
        self.assertEqual(len(differentiable), 12)
        self.assertEqual(differentiable - {n.split(".")[0] for n in checked}, set())
        self.assertIn("perftrain::column_sums", checked)
        self.assertIn("perftrain::multi_tensor_adamw_", checked)

    def _registered(self):
        return {n for n in torch._C._dispatch_get_all_op_names() if n.startswith("perftrain::")}

    def _opcheck_column_sums(self):
        mats = [torch.randn(7, 13) for _ in range(3)]
        torch.library.opcheck(torch.ops.perftrain.column_sums.default, (mats,))
        return "perftrain::column_sums"

    def _opcheck_adamw(self):
        params, grads, m, v, emas = ([torch.randn(n) for n in (5, 3)] for _ in range(5))
        m = [torch.zeros_like(p) for p in params]
        v = [torch.zeros_like(p) for p in params]
        scalars = P.adamw_scalars("cpu")
        args = (params, grads, m, v, emas, [], scalars, [True, False], 1e-3, 0.9, 0.999, 1e-8, 0.1, 0.0, 0,
                "constant", 0.0, 0, 0.2, 0.99, False, 0, False, 2000)
        # The AOT test functionalizes mutable list arguments, which is not what this op is for.
        torch.library.opcheck(torch.ops.perftrain.multi_tensor_adamw_.default, args,
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
        return "perftrain::multi_tensor_adamw_"

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

    def test_stacked_linear_refuses_copies_that_do_not_match_the_layers(self):
        """One copy per layer in x's dtype, or none: a count or dtype off is one line naming the argument."""
        x, ws = torch.randn(3, 8), [torch.randn(5, 8), torch.randn(5, 8)]
        bad = {"weight_copies": [ws[0].bfloat16()],  # one copy for two layers
               "bias_copies": [torch.randn(5)]}  # copies without biases
        for key, value in bad.items():
            with self.subTest(key=key):
                with self.assertRaises(RuntimeError) as e:
                    P.stacked_linear(x, ws, **{key: value})
                self.assertIn(key, str(e.exception).splitlines()[0])
        with self.assertRaises(RuntimeError) as e:  # a copy in float64, not x's dtype
            P.stacked_linear(x, ws, weight_copies=[w.double() for w in ws])
        self.assertIn("weight_copies", str(e.exception).splitlines()[0])

    def test_bfloat16_output_dtype(self):
        x = torch.randn(2, 3, 8)
        shift, scale = torch.randn(2, 8), torch.randn(2, 8)
        h = P.adaln_layernorm(x, shift, scale, out_dtype=torch.bfloat16)
        self.assertEqual(h.dtype, torch.bfloat16)
        torch.testing.assert_close(h.float(), P.adaln_layernorm(x, shift, scale), atol=2e-2, rtol=1e-2)

    def test_bad_input_names_the_op(self):
        with self.assertRaisesRegex(RuntimeError, "gated_residual"):
            P.gated_residual(torch.randn(2, 3, 8), torch.randn(2, 7), torch.randn(2, 3, 8))
        with self.assertRaisesRegex(RuntimeError, "swiglu"):
            P.swiglu(torch.randn(4, 7))
        w = torch.randn(6, 8)
        with self.assertRaisesRegex(RuntimeError, "linear: weight_copy must be the weight's copy"):
            P.linear(torch.randn(2, 8), w, weight_copy=w.t().contiguous())
        with self.assertRaisesRegex(RuntimeError, "gelu_mlp: w2_copy .* in Float"):
            P.gelu_mlp(torch.randn(2, 8), w, torch.randn(6), w.t(), w2_copy=w.t().to(torch.bfloat16))
        qkv = torch.randn(2, 5, 24)
        for mask in (torch.ones(2, 4, dtype=torch.bool), torch.ones(2, 5)):  # a wrong length; not bool
            with self.assertRaisesRegex(RuntimeError, r"qkv_attention: key_mask must be bool \[2, 5\]"):
                P.attention(qkv, 2, mask)
        p = [torch.randn(3)]
        with self.assertRaisesRegex(RuntimeError, "lr_schedule must be constant, cosine, linear or wsd"):
            P.multi_tensor_adamw_(p, [torch.randn(3)], [torch.zeros(3)], [torch.zeros(3)], [], P.adamw_scalars("cpu"),
                                  lr=1e-3, lr_schedule="cosin")

    def test_attention_mode_takes_the_trainers_names(self):
        self.assertEqual(P.attention_mode(), "auto")  # the package's default, as the trainer's
        try:
            for mode in ("cudnn", "tiled", "auto", "whole_head"):
                P.set_attention_mode(mode)
                self.assertEqual(P.attention_mode(), mode)
            P.set_attention_mode("tiled")
            with self.assertRaisesRegex(RuntimeError,
                                        'attention mode "flash" is not one of whole_head, tiled, cudnn, auto'):
                P.set_attention_mode("flash")
            self.assertEqual(P.attention_mode(), "tiled", "a refused name changes nothing")
        finally:
            P.set_attention_mode("auto")

    def test_gemm_tuning_deferred_closes_the_timing_and_restores_it(self):
        self.assertTrue(torch.ops.perftrain.gemm_tuning_open())
        with P.gemm_tuning_deferred():
            self.assertFalse(torch.ops.perftrain.gemm_tuning_open())
            with P.gemm_tuning_deferred():  # nested: changes nothing
                self.assertFalse(torch.ops.perftrain.gemm_tuning_open())
            self.assertFalse(torch.ops.perftrain.gemm_tuning_open(), "the nested one left it deferred")
        self.assertTrue(torch.ops.perftrain.gemm_tuning_open())
        with self.assertRaises(KeyError):
            with P.gemm_tuning_deferred():
                raise KeyError("inside")
        self.assertTrue(torch.ops.perftrain.gemm_tuning_open(), "an exception inside restores it")

    def test_column_sums(self):
        mats = [torch.randn(9, 11) for _ in range(2)]
        for out, m in zip(P.column_sums(mats), mats):
            self.assertEqual(out.dtype, torch.float32)
            torch.testing.assert_close(out.double(), m.double().sum(0), atol=1e-5, rtol=1e-5)

    def test_adamw_matches_torch(self):
        torch.manual_seed(0)
        params = [torch.randn(7, 3), torch.randn(5)]
        ref = [p.clone().requires_grad_(True) for p in params]
        m = [torch.zeros_like(p) for p in params]
        v = [torch.zeros_like(p) for p in params]
        emas = [p.clone() for p in params]
        scalars = P.adamw_scalars("cpu")
        opt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.8, 0.9), eps=1e-8, weight_decay=0.1)
        for step in range(3):
            grads = [torch.randn_like(p) for p in params]
            for r, g in zip(ref, grads):
                r.grad = g.clone()
            opt.step()
            before = [p.clone() for p in params]
            ema_before = [e.clone() for e in emas]
            P.multi_tensor_adamw_(params, grads, m, v, emas, scalars, lr=1e-2, betas=(0.8, 0.9), eps=1e-8,
                                  weight_decay=0.1, ema_decay=0.5, ema_warmup=False)
            for p, r, b in zip(params, ref, before):
                self.assertFalse(torch.equal(p, b))
                torch.testing.assert_close(p, r.detach(), atol=1e-6, rtol=1e-5)
            for e, eb, p in zip(emas, ema_before, params):
                torch.testing.assert_close(e, eb + 0.5 * (p - eb), atol=1e-6, rtol=1e-5)
        self.assertEqual(scalars[P.ADAMW_SLOTS["step"]].item(), 3)
        self.assertAlmostEqual(scalars[P.ADAMW_SLOTS["lr"]].item(), 1e-2, places=7)


if __name__ == "__main__":
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
