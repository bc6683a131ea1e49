"""Every perftrain.ops function on CUDA (skipped, exit 77, without a GPU):
opcheck of each operator on CUDA tensors; outputs and gradients in float32
and bfloat16 against the float64 reference of cases.py, on the odd sizes and
on the DiT shapes where our kernels apply (whole-head attention: bf16, 256
tokens, head dim 64; tiled or cuDNN's attention with a key mask, at 288 and
1024 tokens, in each attention mode; the Hopper bias-GELU product: rows %
128, H % 256, C % 64); a forward and backward captured in a CUDA graph and replayed;
multi_tensor_adamw_ on CUDA against the CPU step."""
import sys
import unittest

import torch

import cases
import perftrain.ops as P

# atol + rtol * |ref| per dtype of the inputs (bf16: operands rounded to 8 bits).
TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (6e-2, 4e-2)}
# The fp32 products (linear_gelu's, gelu_mlp's, linear's) run on TF32 Tensor Cores, as the C++ trainer's
# do (10-bit mantissas).
TF32_TOL = (5e-3, 5e-3)
# The names of the cases whose ops are products ("linear_gelu" included).
PRODUCTS = ("linear", "gelu_mlp", "stacked_linear")
# gelu_mlp's gradients pass through two TF32 products in a row: twice the error (one element of 32768 at the
# Hopper shape was 0.024 off against 0.022 allowed with TF32_TOL on the H200).
TF32_TOL_CHAINED = (1e-2, 1e-2)


def tolerance(name, dtype):
    if dtype != torch.float32 or not name.startswith(PRODUCTS):
        return TOL[dtype]
    return TF32_TOL_CHAINED if name.startswith("gelu_mlp") else TF32_TOL


def check_against_float64(test, name, fn, make, ref, dtype):
    torch.manual_seed(0)
    args, kwargs = make("cuda", dtype)
    outs, grads = cases.outputs_and_grads(fn, args, kwargs)
    args64, kwargs64 = cases.float64_copy(args, kwargs)

    def on_cpu(v):  # a float64 leaf of its own on the CPU (lists element by element)
        if isinstance(v, (list, tuple)):
            return [on_cpu(t) for t in v]
        return v.cpu().detach().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v

    args64 = tuple(on_cpu(a) for a in args64)
    kwargs64 = {k: on_cpu(v) for k, v in kwargs64.items()}
    outs64, grads64 = cases.outputs_and_grads(ref, args64, kwargs64)
    atol, rtol = tolerance(name, dtype)
    for o, r in zip(outs, outs64):
        test.assertFalse(o.isnan().any().item(), name)
        torch.testing.assert_close(o.double().cpu(), r, atol=atol, rtol=rtol)
    for g, r in zip(grads, grads64):
        test.assertIsNotNone(g, name)
        torch.testing.assert_close(g.double().cpu(), r, atol=atol * 4, rtol=rtol * 4)


def whole_head_attention_case(device, dtype):
    return (cases.randn(2, 256, 3 * 2 * 64, device=device, dtype=dtype, scale=0.5), 2), {}


def whole_head_attention_masked_case(device, dtype):
    """256 tokens with a key mask: not the whole-head kernels' (they take none); ours tiled or cuDNN's."""
    (qkv, heads), _ = whole_head_attention_case(device, dtype)
    return (qkv, heads), {"key_mask": cases.key_mask(2, 256, device)}


def single_stream_attention_case(device, dtype):
    """256 image + 32 condition tokens, head dim 72, a key mask whose lengths are no multiple of 64."""
    qkv = cases.randn(2, 288, 3 * 2 * 72, device=device, dtype=dtype, scale=0.5)
    return (qkv, 2), {"key_mask": cases.key_mask(2, 288, device, seed=3)}


def long_attention_case(device, dtype):
    """1024 tokens (DiT at 512 px), head dim 64, no mask."""
    return (cases.randn(1, 1024, 3 * 2 * 64, device=device, dtype=dtype, scale=0.5), 2), {}


def hopper_linear_gelu_case(device, dtype):
    x = cases.randn(2, 64, 128, device=device, dtype=dtype)
    w = cases.randn(256, 128, device=device, dtype=torch.float32, scale=128 ** -0.5)
    b = cases.randn(256, device=device, dtype=torch.float32)
    return (x, w, b), {}


def hopper_gelu_mlp_case(device, dtype):
    (x, w1, b1), _ = hopper_linear_gelu_case(device, dtype)
    w2 = cases.randn(128, 256, device=device, dtype=torch.float32, scale=256 ** -0.5)
    return (x, w1, b1, w2, None), {"w1_copy": cases.copy_in(w1, dtype), "w2_copy": cases.copy_in(w2, dtype)}


DIT_SHAPES = [
    ("attention (whole-head shape)", P.attention, whole_head_attention_case, cases.attention_ref),
    ("attention (256 tokens, key mask)", P.attention, whole_head_attention_masked_case, cases.attention_ref),
    ("attention (288 tokens, head dim 72, key mask)", P.attention, single_stream_attention_case,
     cases.attention_ref),
    ("attention (1024 tokens)", P.attention, long_attention_case, cases.attention_ref),
    ("linear_gelu (Hopper product shape)", P.linear_gelu, hopper_linear_gelu_case, cases.linear_gelu_ref),
    ("gelu_mlp (Hopper product shape)", P.gelu_mlp, hopper_gelu_mlp_case, cases.gelu_mlp_ref),
]


def relative_error(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


@unittest.skipUnless(torch.cuda.is_available(), "no GPU")
class OpsOnCuda(unittest.TestCase):
    def test_opcheck_every_operator(self):
        for name, fn, make, _ in cases.CASES + DIT_SHAPES:
            for dtype in (torch.float32, torch.bfloat16):
                torch.manual_seed(0)
                args, kwargs = make("cuda", dtype)
                for op, op_args, op_kwargs in cases.operator_calls(fn, args, kwargs):
                    with self.subTest(op=name, dtype=dtype):
                        torch.library.opcheck(op, op_args, op_kwargs, atol=1e-2, rtol=1e-2)

    def test_matches_float64_reference(self):
        for name, fn, make, ref in cases.CASES + DIT_SHAPES:
            for dtype in (torch.float32, torch.bfloat16):
                if name.startswith("attention") and dtype == torch.float32:
                    continue  # fp32 attention runs ATen's SDPA (TF32 products): the CPU test covers it
                with self.subTest(op=name, dtype=dtype):
                    check_against_float64(self, name, fn, make, ref, dtype)

    def test_attention_in_every_mode_matches_float64(self):
        """set_attention_mode as the trainer's [speed] key: each attention shape above, bf16, in each mode
        against float64 ("auto" times the three plans at the masked and long shapes on their first forward;
        "tiled" runs our tiled kernels at 256 tokens too), and the mode read back."""
        default = P.attention_mode()
        try:
            for mode in ("cudnn", "tiled", "whole_head", "auto"):
                P.set_attention_mode(mode)
                self.assertEqual(P.attention_mode(), mode)
                for name, fn, make, ref in DIT_SHAPES:
                    if name.startswith("attention"):
                        with self.subTest(mode=mode, op=name):
                            check_against_float64(self, name, fn, make, ref, torch.bfloat16)
        finally:
            P.set_attention_mode(default)

    def test_a_weight_copy_gives_the_bits_of_the_cast(self):
        """The optimizer's bf16 copies (what perftrain.nn passes) read as the cast weight: same outputs and
        gradients, the weights' gradients in fp32 (the masters')."""
        for name, fn, make, _ in cases.CASES:
            if not name.startswith(("linear (", "gelu_mlp (", "stacked_linear (")):
                continue
            with self.subTest(op=name):
                torch.manual_seed(0)
                args, kwargs = make("cuda", torch.bfloat16)
                with_copy = cases.outputs_and_grads(fn, args, kwargs)
                without = cases.outputs_and_grads(fn, args, {})
                for a, b in zip(with_copy[0] + with_copy[1], without[0] + without[1]):
                    self.assertTrue(torch.equal(a, b), name)
                for g, leaf in zip(with_copy[1], cases.leaves(args, kwargs)):
                    self.assertEqual(g.dtype, leaf.dtype)

    def test_gelu_mlp_at_a_dit_b2_size_takes_the_dgelu_epilogue(self):
        """A DiT-B/2 b256 MLP's rows x hidden is past the split form's limit (ops::kSplitDGeluMaxElements):
        pre's gradient and fc1's bias gradient come from cuBLASLt's DGELU epilogue. bf16 against fp32."""
        torch.manual_seed(0)
        rows, c, h = 65536, 256, 2048  # rows * h > 65536 * 1536
        x = cases.randn(rows, c, device="cuda", dtype=torch.bfloat16)
        w1 = cases.randn(h, c, device="cuda", dtype=torch.float32, scale=c ** -0.5)
        b1 = cases.randn(h, device="cuda", dtype=torch.float32)
        w2 = cases.randn(c, h, device="cuda", dtype=torch.float32, scale=h ** -0.5)
        gout = torch.randn(rows, c, device="cuda", dtype=torch.bfloat16)
        y = P.gelu_mlp(x, w1, b1, w2, w1_copy=cases.copy_in(w1, torch.bfloat16),
                       w2_copy=cases.copy_in(w2, torch.bfloat16))
        grads = torch.autograd.grad(y, (x, w1, b1, w2), gout)
        leaves = [t.detach().float().requires_grad_(True) for t in (x, w1, b1, w2)]
        want = cases.gelu_mlp_ref(*leaves)
        want_grads = torch.autograd.grad(want, leaves, gout.float())
        self.assertLess(relative_error(y, want), 1e-2)
        for g, w, leaf in zip(grads, want_grads, (x, w1, b1, w2)):
            self.assertEqual(g.dtype, leaf.dtype)
            self.assertLess(relative_error(g, w), 2e-2)

    def test_cuda_graph_capture(self):
        torch.manual_seed(0)
        x = cases.randn(cases.B, cases.T, cases.D, device="cuda", dtype=torch.float32)
        gate, shift, scale = cases.modulation(3, "cuda", torch.float32)
        y = cases.randn(cases.B, cases.T, cases.D, device="cuda", dtype=torch.bfloat16)

        def step():
            x1, h = P.residual_adaln(x, gate, y, shift, scale, out_dtype=torch.bfloat16)
            loss = (x1.float().square().mean() + P.swiglu(h).float().mean())
            return torch.autograd.grad(loss, (x, gate, shift, scale))

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                eager = step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        graph.replay()
        torch.cuda.synchronize()
        for c, e in zip(captured, eager):
            torch.testing.assert_close(c, e)

    def test_adamw_cuda_matches_cpu(self):
        torch.manual_seed(0)
        cpu = [torch.randn(33, 7), torch.randn(129)]
        grads = [torch.randn_like(p) for p in cpu]
        state = {}
        for dev in ("cpu", "cuda"):
            params = [p.clone().to(dev) for p in cpu]
            m = [torch.zeros_like(p) for p in params]
            v = [torch.zeros_like(p) for p in params]
            emas = [p.clone() for p in params]
            scalars = P.adamw_scalars(dev)
            for _ in range(3):
                P.multi_tensor_adamw_(params, [g.to(dev) for g in grads], m, v, emas, scalars, lr=1e-2,
                                      weight_decay=0.1, grad_clip=1.0, warmup_steps=2, ema_decay=0.9)
            # The scalars' state slots (the others are the kernels' scratch: coef, step size, ...).
            state[dev] = [t.cpu() for t in params + emas] + [scalars.cpu()[list(P.ADAMW_SLOTS.values())]]
        for c, g in zip(state["cpu"], state["cuda"]):
            torch.testing.assert_close(g, c, atol=1e-6, rtol=1e-5)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("no GPU: skipped")
        sys.exit(77)
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
