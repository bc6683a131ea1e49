// A trace from any PyTorch program through the one rule set: torch's own
// marks (DataLoader, optimizer, autograd engine nodes, torch.compile's
// CompiledFunction) become phases, copies from pageable memory count as a
// wait for data, the facts the rules read come from the trace (its device,
// the kernels' precision, our "perftrain" object's measured steps and GPU
// samples), and the same finding is worded for perftrain or for PyTorch.
#include <gtest/gtest.h>

#include <string>

#include "observe/profile/diagnosis.h"
#include "observe/profile/timeline.h"
#include "observe/profile/trace_diagnosis.h"
#include "support/findings.h"
#include "support/test_support.h"
#include "support/timeline_builder.h"

namespace {

using namespace perftrain::observe::profile;

using perftrain::testing::contains;
using perftrain::testing::find_finding;

using Builder = perftrain::testing::TimelineBuilder;

double phase(const StepAnalysis& a, const std::string& p) {
  for (const auto& x : a.busy_by_phase)
    if (x.phase == p) return x.ms;
  return -1;
}

TEST(ProfileTraceDiagnosis, TorchMarksAreThePhases) {
  EXPECT_EQ(phase_of_scope("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"), "data wait");
  EXPECT_EQ(phase_of_scope("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"), "data wait");
  EXPECT_EQ(phase_of_scope("Optimizer.step#AdamW.step"), "optimizer");
  EXPECT_EQ(phase_of_scope("Optimizer.zero_grad#AdamW.zero_grad"), "optimizer");
  EXPECT_EQ(phase_of_scope("ProfilerStep#3"), "");
  EXPECT_EQ(phase_of_op("autograd::engine::evaluate_function: AddmmBackward0"), "backward");
  EXPECT_EQ(phase_of_op("CompiledFunctionBackward"), "backward");
  EXPECT_EQ(phase_of_op("CompiledFunction"), "forward");
  EXPECT_EQ(phase_of_op("aten::mm"), "");

  // One step: the forward unmarked, the backward on the engine's thread, the optimizer.
  Builder b;
  b.add(EventKind::kScope, "ProfilerStep#1", 0, 1000, 1);
  b.launch("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x1_nn", 10, 20, 100);  // forward
  b.add(EventKind::kCpuOp, "autograd::engine::evaluate_function: MmBackward0", 200, 300, 2);
  b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", 210, 220, 200,
           perftrain::testing::kAutograd);
  b.add(EventKind::kScope, "Optimizer.step#AdamW.step", 600, 100, 1);
  b.launch("multi_tensor_apply_kernel", 610, 620, 50);
  const StepAnalysis a = analyze(b.t);
  EXPECT_NEAR(phase(a, "forward, loss and the rest (not marked)"), 0.1, 1e-12);
  EXPECT_NEAR(phase(a, "backward"), 0.2, 1e-12);
  EXPECT_NEAR(phase(a, "optimizer"), 0.05, 1e-12);
  // A bf16 product with fp32 accumulation ("s16816" in a bf16 kernel's name) is no fp32 product.
  EXPECT_EQ(a.fp32_matrix_ms, 0);
}

// Under autocast a Linear is recorded with its caller's float inputs, the
// product inside it with bf16 ones: no fp32 product.
TEST(ProfileTraceDiagnosis, AutocastLinearsAreNoFp32Products) {
  Builder b;
  b.add(EventKind::kScope, "ProfilerStep#1", 0, 200, perftrain::testing::kMain);
  b.add(EventKind::kCpuOp, "aten::linear", 10, 100, perftrain::testing::kMain).input_types = "float, float, float";
  b.add(EventKind::kCpuOp, "aten::matmul", 12, 90, perftrain::testing::kMain).input_types = "float, float";
  b.add(EventKind::kCpuOp, "aten::addmm", 20, 60, perftrain::testing::kMain).input_types =
      "c10::BFloat16, c10::BFloat16, c10::BFloat16, Scalar, Scalar";
  b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", 30, 40, 100);
  EXPECT_EQ(analyze(b.t).fp32_matrix_ops, 0);
  b.add(EventKind::kCpuOp, "aten::mm", 150, 20, perftrain::testing::kMain).input_types = "float, float";
  EXPECT_EQ(analyze(b.t).fp32_matrix_ops, 1);  // a product on float inputs is one
}

// The batch copied from pageable memory: the host waits in the copy call, as
// it waits in the DataLoader; both are the step's wait for data.
TEST(ProfileTraceDiagnosis, PageableCopiesAreAWaitForData) {
  Builder b;
  b.add(EventKind::kScope, "ProfilerStep#1", 0, 1000, 1);
  b.add(EventKind::kScope, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 400, 1);
  b.add(EventKind::kRuntime, "cudaMemcpyAsync", 405, 300, 1).correlation = 99;
  b.add(EventKind::kMemcpy, "Memcpy HtoD (Pageable -> Device)", 425, 270, 7).correlation = 99;
  b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", 710, 720, 250);
  const StepAnalysis a = analyze(b.t);
  EXPECT_NEAR(a.data_wait_ms, 0.7, 1e-12);
  EXPECT_NEAR(a.blocking_h2d_ms, 0.3, 1e-12);
  EXPECT_NEAR(phase(a, "host-to-device copy"), 0.27, 1e-12);
  RunFacts f = trace_facts(b.t, a);
  EXPECT_EQ(f.program, Program::kPyTorch);
  const auto x = find_finding(diagnose(a, f), "data-bound");
  ASSERT_TRUE(x);
  EXPECT_TRUE(contains(x->evidence, "0.300 ms/step of the wait in host-to-device copies from pageable memory"))
      << x->evidence;
  EXPECT_TRUE(contains(x->advice, "pin_memory=True")) << x->advice;
}

// One rule, two wordings: the same launch-bound step from perftrain and from
// any PyTorch program.
TEST(ProfileTraceDiagnosis, OneRuleSetAdviceForEachProgram) {
  StepAnalysis a;
  a.steps = 2, a.step_ms = 10, a.window_ms = 20;
  a.gpu_busy_ms = 3, a.idle_other_ms = 7;
  a.busy_by_phase = {{"forward", 3}};
  a.matrix_ms = 1, a.elementwise_ms = 2;
  a.kernels_per_step = 900, a.median_kernel_us = 4, a.launch_cpu_ms = 5;
  a.syncs = {{"cudaStreamSynchronize", "aten::_local_scalar_dense", "forward", 2}};
  a.syncs_per_step = 1;
  RunFacts ours;
  ours.precision = "bf16";
  RunFacts theirs = ours;
  theirs.program = Program::kPyTorch;
  const auto x = diagnose(a, ours), y = diagnose(a, theirs);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].id, y[i].id);
    EXPECT_EQ(x[i].evidence, y[i].evidence);
  }
  EXPECT_TRUE(contains(find_finding(x, "launch-bound")->advice, "speed.graph=true"));
  EXPECT_TRUE(contains(find_finding(y, "launch-bound")->advice, "mode=\"reduce-overhead\""));
  EXPECT_TRUE(contains(find_finding(y, "launch-bound")->advice, "fused=True, capturable=True"));
  EXPECT_TRUE(contains(find_finding(y, "host-syncs")->advice, "loss.item()"));
  EXPECT_TRUE(contains(find_finding(y, "elementwise")->advice, "torch.compile(model)"));
  theirs.compiled = true;
  EXPECT_TRUE(contains(find_finding(diagnose(a, theirs), "elementwise")->advice, "already compiled"));
}

// What the trace holds besides its events: the device, our "perftrain"
// object's measured steps and nvidia-smi samples (the power-capped rule and
// the profiler's cost, where perftrain.profile wrote them).
TEST(ProfileTraceDiagnosis, FactsFromTheTrace) {
  const Timeline t = parse_trace(R"JSON({
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150110011392,
                          "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
    "perftrain": {"unprofiled_ms": "0.7", "unprofiled_steps": "10", "profiled_ms": "1.0", "profiled_steps": "1",
                  "gpu_samples": "1500, 1980, 699.5, 700.0, 60\n1500, 1980, 700.0, 700.0, 61\n"},
    "traceEvents": [
      {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
      {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10, "dur": 3,
       "args": {"correlation": 5}},
      {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_add_0", "pid": 0, "tid": 7, "ts": 20, "dur": 10,
       "args": {"correlation": 5}}
    ]})JSON");
  ASSERT_EQ(t.devices.size(), 1u);
  EXPECT_EQ(t.devices[0].name, "NVIDIA H200");
  EXPECT_EQ(t.devices[0].sms, 132);
  const StepAnalysis a = analyze(t);
  const RunFacts f = trace_facts(t, a);
  EXPECT_EQ(f.program, Program::kPyTorch);  // a "perftrain" object, but no perftrain:: scopes
  EXPECT_TRUE(f.compiled);
  EXPECT_EQ(f.precision, "");
  EXPECT_NEAR(*f.memory_total_gib, 139.8, 0.05);
  EXPECT_DOUBLE_EQ(f.measured.unprofiled_ms, 0.7);
  EXPECT_DOUBLE_EQ(f.measured.profiled_ms, 1.0);
  EXPECT_EQ(f.gpu.count, 2);
  const auto findings = diagnose(a, f);
  EXPECT_TRUE(find_finding(findings, "power-capped"));
  // 0.99 ms idle in the trace less the 0.3 ms the profiler cost, of the unprofiled 0.7 ms
  const auto x = find_finding(findings, "launch-bound");
  ASSERT_TRUE(x);
  EXPECT_TRUE(contains(x->evidence, "about 0.690 ms of the unprofiled 0.700 ms step")) << x->evidence;

  // perftrain's own step: its scopes, and the precision its "perftrain" object names.
  Builder b;
  b.scope("perftrain::forward", 0, 100);
  b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", 10, 20, 50);
  b.t.perftrain["precision"] = "fp16";
  const RunFacts ours = trace_facts(b.t, analyze(b.t));
  EXPECT_EQ(ours.program, Program::kPerftrain);
  EXPECT_EQ(ours.precision, "fp16");
}

}  // namespace
