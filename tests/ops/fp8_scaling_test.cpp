// Delayed fp8 scaling on the CPU (ops/fp8_scaling.h, the reference of the
// device kernel): the amax history rolls (newest first, oldest out), the
// scale is fp8_max / (max(history) * 2^margin) with its inverse beside it,
// a non-finite amax keeps the scale and counts an overflow, a zero amax (or
// a scale that would be Inf) keeps it and counts an underflow, non-finite
// history entries are skipped by the max, the amax is zeroed for the next
// step; several states in one call; bad states raise UsageError.
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "base/error.h"
#include "ops/fp8_scaling.h"

namespace perftrain::ops {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const at::Device kCpu(at::kCPU);

std::vector<float> values(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// Sets slot 0's amax and runs one update.
void step(Fp8Scaling& s, float amax, int margin = 0) {
  s.amax[0].fill_(amax);
  fp8_scaling_update({&s}, margin);
}

float scale(const Fp8Scaling& s, int slot = 0) { return s.scale[slot].item<float>(); }
float events(const Fp8Scaling& s, int kind, int slot = 0) { return s.events[slot][kind].item<float>(); }

TEST(Fp8Scaling, FreshStateHasUnitScalesAndNamedTensors) {
  const Fp8Scaling s = make_fp8_scaling({Fp8Format::kE4M3, Fp8Format::kE5M2}, 16, kCpu);
  EXPECT_EQ(s.slots(), 2);
  EXPECT_EQ(s.history_len(), 16);
  EXPECT_EQ(values(s.scale), (std::vector<float>{1.f, 1.f}));
  EXPECT_EQ(values(s.scale_inv), (std::vector<float>{1.f, 1.f}));
  std::vector<std::string> names;
  for (const auto& [name, t] : s.named_tensors()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"amax", "history", "scale", "scale_inv", "events"}));
}

TEST(Fp8Scaling, ScaleInvSlotsAreSixteenBytesApart) {
  Fp8Scaling s = make_fp8_scaling({Fp8Format::kE4M3, Fp8Format::kE4M3, Fp8Format::kE5M2}, 2, kCpu);
  for (int64_t i = 0; i < s.slots(); ++i)
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.scale_inv.select(0, i).data_ptr()) % 16, 0u) << "slot " << i;
  // A state whose scale_inv is contiguous (a copy, as .to() makes) updates alike.
  Fp8Scaling dense = make_fp8_scaling({Fp8Format::kE4M3, Fp8Format::kE4M3, Fp8Format::kE5M2}, 2, kCpu);
  dense.scale_inv = dense.scale_inv.contiguous();
  for (Fp8Scaling* t : {&s, &dense}) {
    t->amax.copy_(at::tensor({3.f, 0.5f, 7.f}));
    fp8_scaling_update({t}, 0);
  }
  EXPECT_EQ(values(s.scale_inv), values(dense.scale_inv));
  EXPECT_NE(values(s.scale_inv), (std::vector<float>{1.f, 1.f, 1.f}));
}

TEST(Fp8Scaling, HistoryRollsNewestFirstAndTheAmaxIsZeroed) {
  Fp8Scaling s = make_fp8_scaling({Fp8Format::kE4M3}, 4, kCpu);
  for (const float a : {1.f, 2.f, 3.f, 4.f, 5.f}) step(s, a);
  EXPECT_EQ(values(s.history), (std::vector<float>{5.f, 4.f, 3.f, 2.f}));
  EXPECT_EQ(s.amax[0].item<float>(), 0.f);
}

TEST(Fp8Scaling, ScaleIsFp8MaxOverTheHistoryMaxWithMargin) {
  Fp8Scaling s = make_fp8_scaling({Fp8Format::kE4M3, Fp8Format::kE5M2}, 3, kCpu);
  s.amax.copy_(at::tensor({2.f, 7.f}));
  fp8_scaling_update({&s}, 0);
  EXPECT_EQ(scale(s, 0), 448.f / 2.f);
  EXPECT_EQ(scale(s, 1), 57344.f / 7.f);
  EXPECT_EQ(values(s.scale_inv), (std::vector<float>{1.f / (448.f / 2.f), 1.f / (57344.f / 7.f)}));
  // A smaller amax: the history's max (2) still rules, until it rolls out.
  for (int i = 0; i < 2; ++i) step(s, 0.5f);
  EXPECT_EQ(scale(s), 224.f);
  step(s, 0.5f);
  EXPECT_EQ(scale(s), 896.f);
  // Margin 2: a quarter of it.
  step(s, 0.5f, 2);
  EXPECT_EQ(scale(s), 224.f);
  // Slot 0 counted nothing; slot 1 saw a zero amax on each of the last 4 steps.
  EXPECT_EQ(values(s.events), (std::vector<float>{0.f, 0.f, 0.f, 4.f}));
}

TEST(Fp8Scaling, NonFiniteAmaxKeepsTheScaleAndCountsAnOverflow) {
  Fp8Scaling s = make_fp8_scaling({Fp8Format::kE4M3}, 4, kCpu);
  step(s, 4.f);
  ASSERT_EQ(scale(s), 112.f);
  step(s, kNaN);
  EXPECT_EQ(scale(s), 112.f);
  EXPECT_EQ(events(s, 0), 1.f);
  EXPECT_TRUE(std::isnan(s.history[0][0].item<float>())) << "the history records what came";
  step(s, kInf);
  EXPECT_EQ(scale(s), 112.f);
  EXPECT_EQ(events(s, 0), 2.f);
  EXPECT_EQ(s.scale_inv[0].item<float>(), 1.f / 112.f);
  // The next finite amax: the max over the finite entries (4, 8) only.
  step(s, 8.f);
  EXPECT_EQ(scale(s), 56.f);
  EXPECT_EQ(events(s, 1), 0.f);
}

TEST(Fp8Scaling, ZeroAmaxOrAnInfiniteScaleKeepsTheScaleAndCountsAnUnderflow) {
  Fp8Scaling s = make_fp8_scaling({Fp8Format::kE5M2}, 2, kCpu);
  step(s, 0.f);
  EXPECT_EQ(scale(s), 1.f);
  EXPECT_EQ(events(s, 1), 1.f);
  EXPECT_EQ(events(s, 0), 0.f);
  step(s, 1e-40f);  // 57344 / 1e-40 overflows fp32
  EXPECT_EQ(scale(s), 1.f);
  EXPECT_EQ(events(s, 1), 2.f);
  step(s, 2.f);
  EXPECT_EQ(scale(s), 28672.f);
}

TEST(Fp8Scaling, OneCallUpdatesEveryStateAndSlot) {
  Fp8Scaling a = make_fp8_scaling({Fp8Format::kE4M3, Fp8Format::kE4M3, Fp8Format::kE5M2}, 5, kCpu);
  Fp8Scaling b = make_fp8_scaling({Fp8Format::kE4M3}, 1, kCpu);
  a.amax.copy_(at::tensor({1.f, 2.f, 4.f}));
  b.amax.fill_(8.f);
  fp8_scaling_update({&a, &b}, 1);
  EXPECT_EQ(values(a.scale), (std::vector<float>{224.f, 112.f, 7168.f}));
  EXPECT_EQ(values(b.scale), (std::vector<float>{28.f}));
  EXPECT_EQ(values(b.history), (std::vector<float>{8.f}));
}

// What a checkpoint keeps (named_tensors) is all a resume needs: a fresh
// state given those tensors continues bit for bit like the original.
TEST(Fp8Scaling, ResumingFromTheNamedTensorsIsExact) {
  const std::vector<Fp8Format> formats = {Fp8Format::kE4M3, Fp8Format::kE4M3, Fp8Format::kE5M2};
  Fp8Scaling run = make_fp8_scaling(formats, 3, kCpu);
  const std::vector<std::vector<float>> amaxes = {{1.f, 2.f, 3.f}, {kNaN, 0.5f, 0.f}, {4.f, 0.25f, 9.f},
                                                   {2.f, kInf, 1.f}, {0.f, 3.f, 5.f}};
  Fp8Scaling resumed = make_fp8_scaling(formats, 3, kCpu);
  for (size_t i = 0; i < amaxes.size(); ++i) {
    if (i == 2) {  // the checkpoint: every named tensor copied into a fresh state
      const auto saved = run.named_tensors(), fresh = resumed.named_tensors();
      for (size_t j = 0; j < saved.size(); ++j) fresh[j].second.copy_(saved[j].second);
    }
    for (Fp8Scaling* s : {&run, &resumed}) {
      if (s == &resumed && i < 2) continue;  // it starts from the checkpoint
      s->amax.copy_(at::tensor(amaxes[i]));
      fp8_scaling_update({s}, 0);
    }
  }
  const auto a = run.named_tensors(), b = resumed.named_tensors();
  for (size_t j = 0; j < a.size(); ++j)
    EXPECT_TRUE(at::equal(a[j].second.view(at::kInt), b[j].second.view(at::kInt))) << a[j].first;
}

TEST(Fp8Scaling, BadStatesRaiseUsageError) {
  EXPECT_THROW(make_fp8_scaling({Fp8Format::kE4M3}, 0, kCpu), UsageError);
  EXPECT_THROW(make_fp8_scaling({Fp8Format::kE4M3}, kernels::kFp8MaxHistory + 1, kCpu), UsageError);
  Fp8Scaling s = make_fp8_scaling({Fp8Format::kE4M3, Fp8Format::kE5M2}, 4, kCpu);
  s.formats.pop_back();  // the tensors have two slots, the formats one
  EXPECT_THROW(fp8_scaling_update({&s}, 0), UsageError);
}

}  // namespace
}  // namespace perftrain::ops
