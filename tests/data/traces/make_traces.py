#!/usr/bin/env python3
"""Writes the small torch.profiler traces `perftrain diagnose` is tested on.

Each is a Chrome trace in the exact form torch.profiler's export_chrome_trace
writes for a CUDA run on one GPU (Kineto's ChromeTraceLogger: the header with
schemaVersion and deviceProperties, then traceEvents): "X" events of the
categories cpu_op, user_annotation, cuda_runtime, cuda_driver, kernel,
gpu_memcpy, gpu_user_annotation with their args as Kineto writes them
(External id, correlation, cbid, stream, grid, bytes...), ac2g flow events
from each launch to its GPU activity, ProfilerStep#N ranges, and the process
and thread metadata. The programs are simulated: a host thread issues ops
whose launches queue work on one stream, so the GPU idles exactly where the
host is slower than the kernels, as it does in a real run.

  launch_bound.json.gz  eager fp32 MLP-ish step, batch small: ~300 short
                        kernels per step, a loss.item() each step
  matrix_bound.json     torch.compile'd bf16 DiT-like step: long cuBLAS
                        products and flash attention, Triton elementwise
  data_bound.json       a bf16 step waiting 40 ms per batch in a
                        single-process DataLoader, the batch copied from
                        pageable memory

Run from anywhere: python3 tests/data/traces/make_traces.py [OUT_DIR]
(default: this file's directory). Deterministic: the same files each time.
"""

import gzip
import json
import os
import random
import sys

PID = 41250          # the Python process
MAIN, AUTOGRAD = 41250, 41377  # host threads: the main one, the autograd engine's device thread
DEVICE, STREAM = 0, 7  # the GPU and its default stream

# Kineto's deviceProperties for an H200 (cudaDeviceProp fields).
H200 = {"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150110011392, "computeMajor": 9, "computeMinor": 0,
        "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536,
        "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132, "regsPerMultiprocessor": 65536,
        "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472}

# CUPTI callback ids of the runtime and driver calls used here.
CBID = {"cudaLaunchKernel": 211, "cudaMemcpyAsync": 41, "cudaStreamSynchronize": 131, "cudaMemsetAsync": 51,
        "cuLaunchKernel": 307, "cudaLaunchKernelExC": 430}


class Program:
    """A host timeline (one cursor per thread) and a stream that runs what it is given in order."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.events = []
        self.flows = []
        self.now = {MAIN: 1000.0, AUTOGRAD: 1000.0}
        self.tid = MAIN
        self.gpu_free = 1000.0
        self.next_ext = 1      # External id: the record function's id, shared by an op and its launches
        self.next_corr = 1     # CUPTI correlation id
        self.ev_idx = 0
        self.stack = []        # open ops: (index into events, External id)
        self.step_gpu = []     # this step's GPU activity (start, end), for the gpu_user_annotation

    # --- host side ------------------------------------------------------
    def spend(self, us):
        self.now[self.tid] += us

    def open(self, cat, name, args=None):
        ext = self.next_ext
        self.next_ext += 1
        a = {"External id": ext, "Record function id": 0}
        a.update(args or {})
        a["Ev Idx"] = self.ev_idx
        self.ev_idx += 1
        e = {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": self.tid, "ts": self.now[self.tid], "dur": 0,
             "args": a}
        self.events.append(e)
        self.stack.append((e, ext))
        self.spend(self.rng.uniform(1.0, 3.0))  # the dispatcher's own time before any child

    def close(self):
        e, _ = self.stack.pop()
        self.spend(self.rng.uniform(0.5, 1.5))
        e["dur"] = self.now[self.tid] - e["ts"]

    def op(self, name, body=None, args=None, cat="cpu_op"):
        self.open(cat, name, args)
        if body:
            body()
        self.close()

    def ext(self):
        return self.stack[-1][1] if self.stack else 0

    def runtime(self, call, dur, correlation, cat="cuda_runtime"):
        args = {}
        if self.ext():
            args["External id"] = self.ext()
        args.update({"cbid": CBID[call], "correlation": correlation})
        e = {"ph": "X", "cat": cat, "name": call, "pid": PID, "tid": self.tid, "ts": self.now[self.tid],
             "dur": dur, "args": args}
        self.events.append(e)
        self.spend(dur)
        return e

    # --- launches -------------------------------------------------------
    def gpu(self, cat, name, launch_ts, us, correlation, args):
        start = max(launch_ts + self.rng.uniform(2.0, 4.0), self.gpu_free)
        a = {"External id": self.ext()} if self.ext() else {}
        a.update(args)
        e = {"ph": "X", "cat": cat, "name": name, "pid": DEVICE, "tid": STREAM, "ts": start, "dur": us, "args": a}
        self.events.append(e)
        self.gpu_free = start + us
        self.step_gpu.append((start, start + us))
        self.flows.append({"ph": "s", "id": correlation, "pid": PID, "tid": self.tid, "ts": launch_ts,
                           "cat": "ac2g", "name": "ac2g"})
        self.flows.append({"ph": "f", "id": correlation, "pid": DEVICE, "tid": STREAM, "ts": start,
                           "cat": "ac2g", "name": "ac2g", "bp": "e"})
        return e

    def kernel(self, name, us, call="cudaLaunchKernel", grid=(132, 1, 1), block=(256, 1, 1), regs=32, smem=0):
        c = self.next_corr
        self.next_corr += 1
        cat = "cuda_driver" if call.startswith("cu") and not call.startswith("cuda") else "cuda_runtime"
        r = self.runtime(call, self.rng.uniform(3.0, 6.0), c, cat)
        blocks = grid[0] * grid[1] * grid[2] / H200["numSms"]
        self.gpu("kernel", name, r["ts"], us, c,
                 {"queued": 0, "device": DEVICE, "context": 1, "stream": STREAM, "correlation": c,
                  "registers per thread": regs, "shared memory": smem, "blocks per SM": round(blocks, 6),
                  "warps per SM": round(blocks * block[0] * block[1] * block[2] / 32, 6), "grid": list(grid),
                  "block": list(block), "est. achieved occupancy %": 50})

    def memcpy(self, kind, src, dst, nbytes, us, blocking):
        """cudaMemcpyAsync; from pageable memory the host waits for the copy (the driver stages it)."""
        c = self.next_corr
        self.next_corr += 1
        launch = self.now[self.tid]
        rt = self.runtime("cudaMemcpyAsync", self.rng.uniform(4.0, 8.0), c)
        g = self.gpu("gpu_memcpy", "Memcpy %s (%s -> %s)" % (kind, src, dst), launch, us, c,
                     {"device": DEVICE, "context": 1, "stream": STREAM, "correlation": c, "bytes": nbytes,
                      "memory bandwidth (GB/s)": round(nbytes / (us * 1e3), 6)})
        if blocking:
            end = g["ts"] + g["dur"] + self.rng.uniform(3.0, 6.0)
            rt["dur"] = end - rt["ts"]
            self.now[self.tid] = end

    def synchronize(self):
        c = self.next_corr
        self.next_corr += 1
        wait = max(self.gpu_free - self.now[self.tid], 0.0) + self.rng.uniform(2.0, 4.0)
        self.runtime("cudaStreamSynchronize", wait, c)

    # --- steps ----------------------------------------------------------
    def step(self, n, body):
        self.tid = MAIN
        self.step_gpu = []
        self.open("user_annotation", "ProfilerStep#%d" % n)
        body()
        e, ext = self.stack[-1]
        self.close()
        if self.step_gpu:
            start = min(s for s, _ in self.step_gpu)
            end = max(t for _, t in self.step_gpu)
            self.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": e["name"], "pid": DEVICE,
                                "tid": STREAM, "ts": start - 0.001, "dur": end - start + 0.002,
                                "args": {"External id": ext}})

    def on_autograd_thread(self, body):
        """loss.backward(): the engine's device thread runs the nodes while the main thread waits."""
        self.now[AUTOGRAD] = self.now[MAIN] + self.rng.uniform(8.0, 12.0)
        self.tid = AUTOGRAD
        body()
        self.tid = MAIN
        self.now[MAIN] = self.now[AUTOGRAD] + self.rng.uniform(3.0, 6.0)

    def backward_node(self, node, body):
        self.op("autograd::engine::evaluate_function: " + node, lambda: self.op(node, body))

    def trace(self, extra_header=None):
        def rounded(e):
            e = dict(e)
            for k in ("ts", "dur"):
                if k in e:
                    e[k] = round(e[k], 3)
            return e

        meta = [
            {"name": "process_name", "ph": "M", "ts": 1000.0, "pid": PID, "tid": 0, "args": {"name": "python"}},
            {"name": "process_labels", "ph": "M", "ts": 1000.0, "pid": PID, "tid": 0, "args": {"labels": "CPU"}},
            {"name": "process_name", "ph": "M", "ts": 1000.0, "pid": DEVICE, "tid": 0, "args": {"name": "python"}},
            {"name": "process_labels", "ph": "M", "ts": 1000.0, "pid": DEVICE, "tid": 0, "args": {"labels": "GPU 0"}},
            {"name": "thread_name", "ph": "M", "ts": 1000.0, "pid": PID, "tid": MAIN,
             "args": {"name": "thread %d (python)" % MAIN}},
            {"name": "thread_name", "ph": "M", "ts": 1000.0, "pid": PID, "tid": AUTOGRAD,
             "args": {"name": "thread %d (pt_autograd_0)" % AUTOGRAD}},
            {"name": "thread_name", "ph": "M", "ts": 1000.0, "pid": DEVICE, "tid": STREAM,
             "args": {"name": "stream %d " % STREAM}},
        ]
        end = max(max(self.now.values()), self.gpu_free) + 50
        header = {"schemaVersion": 1, "deviceProperties": [H200], "cupti_version": 26,
                  "cuda_runtime_version": 12080, "cuda_driver_version": 12080,
                  "trace_id": "5F3A9C0E1B2D4E6F8A7B6C5D4E3F2A1B"}
        header.update(extra_header or {})
        header["displayTimeUnit"] = "ms"
        header["baseTimeNanoseconds"] = 1790000000000000000
        header["traceEvents"] = ([rounded(e) for e in self.events] + meta + [rounded(f) for f in self.flows] +
                                 [{"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",
                                   "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": 1000.0},
                                  {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "",
                                   "ts": round(end, 3)}])
        header["traceName"] = "trace.json"
        return header


ELEMENTWISE = {
    "add": "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
           "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
    "gelu": "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
            "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::"
            "{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl("
            "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::"
            "operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>)",
    "mul": "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<"
           "float, float, float, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, "
           "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > const&)"
           "::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, "
           "at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<"
           "float, float, float, at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1})",
    "layer_norm": "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, "
                  "float const*, float const*, float const*, float*, float*, float*)",
    "sum": "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
           "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
           "unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
           "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
           "unsigned int, float, 4, 4>)",
    "adamw": "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
             "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
             "(at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, bool, float*, float*>("
             "at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
             "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, "
             "double, double, bool, float*, float*)",
    "fill": "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
            "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
}
SGEMM = ["ampere_sgemm_64x32_sliced1x4_nn", "ampere_sgemm_64x32_sliced1x4_tn", "ampere_sgemm_128x32_nt"]
BF16_GEMM = ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_"
             "kernel__5x_cublas",
             "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
             "kernel__5x_cublas",
             "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize256x128x64_warpgroupsize2x1x1_execute_segment_k_off_"
             "kernel__5x_cublas"]
FLASH_FWD = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
             "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, false, false, "
             "false, true, true, false, false>(pytorch_flash::Flash_fwd_params)")
FLASH_BWD = ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, "
             "8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 8, "
             "cutlass::bfloat16_t> >, false, false, false, false, false, false, false, false>("
             "pytorch_flash::Flash_bwd_params)")


def shapes(dims, types):
    return {"Input Dims": dims, "Input type": types, "Input Strides": [[] for _ in dims],
            "Concrete Inputs": ["" for _ in dims]}


# ---------------------------------------------------------------------------
# launch-bound: an eager fp32 step of a small model at a small batch. Each op
# takes the host 15-30 us (Python, the dispatcher, the launch) and its kernel
# 3-8 us, so the GPU waits for the host most of the time.
def launch_bound():
    p = Program(1)
    r = p.rng
    x = [[16, 256], [256, 256]]

    def linear():
        p.op("aten::linear", lambda: p.op("aten::addmm", lambda: (p.spend(r.uniform(4, 8)),
                                                               p.kernel(r.choice(SGEMM), r.uniform(5, 9))),
                                          shapes([[256], x[0], x[1], [], []], ["float", "float", "float", "Scalar",
                                                                               "Scalar"])))

    def pointwise(name, kern):
        p.spend(r.uniform(8, 16))  # the Python line between ops
        p.op(name, lambda: (p.spend(r.uniform(3, 6)), p.kernel(ELEMENTWISE[kern], r.uniform(2.5, 4.5))))

    def forward():
        for _ in range(12):  # layers: norm, linear, gelu, linear, residual
            pointwise("aten::layer_norm", "layer_norm")
            linear()
            pointwise("aten::gelu", "gelu")
            linear()
            pointwise("aten::add", "add")
        pointwise("aten::mse_loss", "sum")

    def backward():
        for _ in range(12):
            for node, kerns in (("AddBackward0", ["add"]), ("AddmmBackward0", None), ("GeluBackward0", ["gelu"]),
                                ("AddmmBackward0", None), ("NativeLayerNormBackward0", ["layer_norm", "sum"])):
                def body(kerns=kerns):
                    if kerns is None:
                        for _ in range(2):
                            p.op("aten::mm", lambda: (p.spend(r.uniform(3, 6)),
                                                      p.kernel(r.choice(SGEMM), r.uniform(5, 9))),
                                 shapes([[256, 16], [16, 256]], ["float", "float"]))
                        p.op("aten::sum", lambda: p.kernel(ELEMENTWISE["sum"], r.uniform(3, 5)))
                    else:
                        for k in kerns:
                            p.spend(r.uniform(4, 8))
                            p.kernel(ELEMENTWISE[k], r.uniform(2.5, 4.5))
                p.backward_node(node, body)

    def optimizer():
        def body():
            p.op("aten::_foreach_lerp_", lambda: [p.kernel(ELEMENTWISE["adamw"], r.uniform(4, 7)) for _ in range(4)])
            p.op("aten::_foreach_mul_", lambda: [p.kernel(ELEMENTWISE["mul"], r.uniform(3, 5)) for _ in range(4)])
            p.op("aten::_foreach_addcdiv_", lambda: [p.kernel(ELEMENTWISE["adamw"], r.uniform(4, 7))
                                                     for _ in range(4)])
        p.op("Optimizer.step#AdamW.step", body, cat="user_annotation")
        p.op("Optimizer.zero_grad#AdamW.zero_grad", lambda: p.spend(r.uniform(20, 30)), cat="user_annotation")

    def item():  # loss.item() for the log line, every step
        def dense():
            p.memcpy("DtoH", "Device", "Pageable", 4, 1.5, blocking=False)
            p.synchronize()
        p.op("aten::item", lambda: p.op("aten::_local_scalar_dense", dense))

    def data():
        p.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", lambda: p.spend(r.uniform(30, 40)),
             cat="user_annotation")
        p.op("aten::to", lambda: p.op("aten::_to_copy", lambda: p.op(
            "aten::copy_", lambda: p.memcpy("HtoD", "Pinned", "Device", 16384, 2.0, blocking=False))))

    for n in (2, 3):
        p.step(n, lambda: (data(), forward(), p.on_autograd_thread(backward), optimizer(), item()))
    return p.trace({"record_shapes": 1})


# ---------------------------------------------------------------------------
# matrix-bound: a torch.compile'd bf16 DiT-like step (8 blocks) at a large batch. The
# host launches each compiled region's kernels far ahead of the GPU; the
# products and attention take most of the GPU time.
def matrix_bound():
    p = Program(2)
    r = p.rng

    def triton(name, us):
        p.kernel(name, us, call="cuLaunchKernel", grid=(4096, 1, 1), block=(512, 1, 1))

    def mm(us):
        p.op("aten::mm", lambda: p.kernel(r.choice(BF16_GEMM), us, call="cudaLaunchKernelExC", grid=(132, 1, 1),
                                          block=(384, 1, 1), regs=168, smem=213248),
             shapes([[65536, 768], [768, 3072]], ["c10::BFloat16", "c10::BFloat16"]))

    def attention(fwd=True):
        name = "aten::_scaled_dot_product_flash_attention" if fwd else \
            "aten::_scaled_dot_product_flash_attention_backward"
        p.op(name, lambda: p.kernel(FLASH_FWD if fwd else FLASH_BWD, r.uniform(1500, 1700) * (1 if fwd else 2.4),
                                    grid=(2, 3072, 1), block=(128, 1, 1), regs=255, smem=49152))

    def forward():
        def region():
            for i in range(8):
                triton("triton_red_fused_native_layer_norm_%d" % (2 * i), r.uniform(90, 110))
                mm(r.uniform(1150, 1250))  # qkv
                attention(True)
                mm(r.uniform(380, 420))    # proj
                triton("triton_poi_fused_add_mul_%d" % (2 * i + 1), r.uniform(60, 80))
                mm(r.uniform(1500, 1650))  # fc1
                triton("triton_poi_fused_gelu_%d" % (2 * i + 1), r.uniform(110, 130))
                mm(r.uniform(1500, 1650))  # fc2
            triton("triton_red_fused_mse_loss_16", r.uniform(40, 60))
        p.op("Torch-Compiled Region: 0/0", lambda: p.op("CompiledFunction", region), cat="user_annotation")

    def backward():
        def body():
            for i in range(8):
                for _ in range(4):
                    mm(r.uniform(1200, 1650))
                    mm(r.uniform(1200, 1650))
                attention(False)
                triton("triton_red_fused_native_layer_norm_backward_%d" % i, r.uniform(150, 190))
                triton("triton_poi_fused_gelu_backward_%d" % i, r.uniform(120, 140))
        p.backward_node("CompiledFunctionBackward", body)

    def optimizer():
        def body():
            p.op("aten::_fused_adamw_", lambda: [p.kernel(ELEMENTWISE["adamw"], r.uniform(180, 220))
                                                 for _ in range(3)])
        p.op("Optimizer.step#AdamW.step", body, cat="user_annotation")

    def data():
        p.op("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", lambda: p.spend(r.uniform(80, 120)),
             cat="user_annotation")
        p.op("aten::to", lambda: p.op("aten::_to_copy", lambda: p.op(
            "aten::copy_", lambda: p.memcpy("HtoD", "Pinned", "Device", 8388608, 180.0, blocking=False))))

    def wait_for_previous():  # the loop reads nothing back: the host runs ahead until the queue is full
        if p.gpu_free - p.now[MAIN] > 30000:
            p.now[MAIN] = p.gpu_free - 30000

    for n in (6, 7):
        p.step(n, lambda: (wait_for_previous(), data(), forward(), p.on_autograd_thread(backward), optimizer()))
    return p.trace({"record_shapes": 1})


# ---------------------------------------------------------------------------
# data-bound: each batch takes the single-process DataLoader 40 ms (decoding
# and augmenting images on the main thread), then goes to the GPU from
# pageable memory; the bf16 step itself is about 12 ms of GPU work.
def data_bound():
    p = Program(3)
    r = p.rng

    def mm(us):
        p.op("aten::addmm", lambda: p.kernel(r.choice(BF16_GEMM), us, call="cudaLaunchKernelExC", regs=168,
                                             smem=213248))

    def forward():
        for i in range(8):
            p.op("aten::layer_norm", lambda: p.kernel(ELEMENTWISE["layer_norm"].replace("float, float", "c10::BFloat16, float"),
                                                      r.uniform(40, 50)))
            mm(r.uniform(280, 320))
            p.op("aten::_scaled_dot_product_flash_attention", lambda: p.kernel(FLASH_FWD, r.uniform(250, 300)))
            mm(r.uniform(90, 110))
            p.op("aten::gelu", lambda: p.kernel(ELEMENTWISE["gelu"].replace("(float)", "(c10::BFloat16)"),
                                                r.uniform(50, 60)))
            mm(r.uniform(350, 400))
            mm(r.uniform(350, 400))
        p.op("aten::mse_loss", lambda: p.kernel(ELEMENTWISE["sum"], r.uniform(20, 30)))

    def backward():
        for i in range(8):
            p.backward_node("AddmmBackward0", lambda: [mm(r.uniform(350, 420)) for _ in range(6)])
            p.backward_node("ScaledDotProductFlashAttentionBackward0",
                            lambda: p.kernel(FLASH_BWD, r.uniform(600, 700)))

    def optimizer():
        p.op("Optimizer.step#AdamW.step", lambda: p.op(
            "aten::_fused_adamw_", lambda: [p.kernel(ELEMENTWISE["adamw"], r.uniform(60, 80)) for _ in range(3)]),
             cat="user_annotation")

    def data():
        def load():
            for _ in range(64):  # decode and augment each image, then collate
                p.spend(r.uniform(580, 640))
            p.op("aten::stack", lambda: p.spend(r.uniform(900, 1100)))
        p.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", load, cat="user_annotation")
        p.op("aten::to", lambda: p.op("aten::_to_copy", lambda: p.op(
            "aten::copy_", lambda: p.memcpy("HtoD", "Pageable", "Device", 12582912, 2400.0, blocking=True))))

    for n in (4, 5):
        p.step(n, lambda: (data(), forward(), p.on_autograd_thread(backward), optimizer()))
    return p.trace()


def dumps(trace):
    """The header's keys, then one event a line (Kineto indents each event over several lines)."""
    lines = ["{"]
    for k, v in trace.items():
        if k == "traceEvents":
            lines.append('  "traceEvents": [')
            lines.append(",\n".join("  " + json.dumps(e) for e in v))
            lines.append("  ],")
        else:
            lines.append("  %s: %s," % (json.dumps(k), json.dumps(v)))
    lines[-1] = lines[-1].rstrip(",")
    return "\n".join(lines) + "\n}\n"


def write(path, trace):
    text = dumps(trace)
    if path.endswith(".gz"):
        with open(path, "wb") as f:  # mtime 0: the same bytes each time
            f.write(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    else:
        with open(path, "w") as f:
            f.write(text)
    print(path, os.path.getsize(path), "bytes")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    write(os.path.join(out, "launch_bound.json.gz"), launch_bound())
    write(os.path.join(out, "matrix_bound.json"), matrix_bound())
    write(os.path.join(out, "data_bound.json"), data_bound())


if __name__ == "__main__":
    main()
