// [speed] attention = "auto" without a GPU (ops/attention_choice): the
// decision logic with an injected timer (the fastest of the three plans,
// ties to ours, then to the mixed plan, timed once per key, the capture rule), the records and the note the bench
// report's attention lines carry, and that CPU inputs never reach a timing.
#include "ops/attention_choice.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ops/attention_paths.h"
#include "ops/attention_tiled.h"
#include "ops/qkv_attention.h"

namespace perftrain::ops {
namespace {

AttentionChoiceKey key_at(int64_t tokens, bool masked = false) {
  AttentionChoiceKey k;
  k.batch = 2;
  k.tokens = tokens;
  k.heads = 16;
  k.head_dim = 64;
  k.masked = masked;
  k.dtype = at::kBFloat16;
  return k;
}

// A timer that counts its calls and answers the given times (tiled, cuDNN, cuDNN then tiled).
struct FakeTimer {
  double tiled_ms, cudnn_ms, mixed_ms;
  int calls = 0;
  detail::AttentionTimer fn() {
    return [this](const AttentionChoiceKey&) {
      ++calls;
      return detail::AttentionTimes{tiled_ms, cudnn_ms, mixed_ms};
    };
  }
};

TEST(AttentionChoice, TimesANewKeyOnceAndKeepsTheFastestPlan) {
  reset_attention_choices();
  FakeTimer cudnn_fastest{0.93, 0.81, 0.85};
  EXPECT_EQ(detail::choose_attention_plan(key_at(1024), false, cudnn_fastest.fn()), kCudnnPlan);
  EXPECT_EQ(detail::choose_attention_plan(key_at(1024), false, cudnn_fastest.fn()), kCudnnPlan);
  EXPECT_EQ(cudnn_fastest.calls, 1);
  // Another mask, another key: timed again (here ours fastest).
  FakeTimer tiled_fastest{0.5, 0.7, 0.6};
  EXPECT_EQ(detail::choose_attention_plan(key_at(1024, true), false, tiled_fastest.fn()), kTiledPlan);
  EXPECT_EQ(tiled_fastest.calls, 1);
  // cuDNN's forward with our backward fastest.
  FakeTimer mixed_fastest{0.8, 0.7, 0.65};
  EXPECT_EQ(detail::choose_attention_plan(key_at(288, true), false, mixed_fastest.fn()), kMixedPlan);
  // Ties: ours before the mixed plan, the mixed plan before cuDNN's.
  FakeTimer tie{0.6, 0.6, 0.6};
  EXPECT_EQ(detail::choose_attention_plan(key_at(512), false, tie.fn()), kTiledPlan);
  FakeTimer tie_mixed{0.7, 0.6, 0.6};
  EXPECT_EQ(detail::choose_attention_plan(key_at(2048), false, tie_mixed.fn()), kMixedPlan);

  const std::vector<AttentionChoiceRecord> r = attention_choice_records();
  ASSERT_EQ(r.size(), 5u);  // key order: tokens first, then the mask
  EXPECT_EQ(r[0].key.tokens, 288);
  EXPECT_EQ(r[0].choice, kMixedPlan);
  EXPECT_DOUBLE_EQ(r[0].mixed_ms, 0.65);
  EXPECT_EQ(r[1].key.tokens, 512);
  EXPECT_EQ(r[2].key.tokens, 1024);
  EXPECT_FALSE(r[2].key.masked);
  EXPECT_TRUE(r[2].timed);
  EXPECT_DOUBLE_EQ(r[2].tiled_ms, 0.93);
  EXPECT_DOUBLE_EQ(r[2].cudnn_ms, 0.81);
  EXPECT_DOUBLE_EQ(r[2].mixed_ms, 0.85);
  EXPECT_EQ(r[2].choice, kCudnnPlan);
  EXPECT_TRUE(r[3].key.masked);
  EXPECT_EQ(r[3].choice, kTiledPlan);
  EXPECT_EQ(r[4].choice, kMixedPlan);
  reset_attention_choices();
  EXPECT_TRUE(attention_choice_records().empty());
}

TEST(AttentionChoice, DuringACaptureNothingIsTimed) {
  reset_attention_choices();
  FakeTimer timer{0.9, 0.1, 0.5};
  // No decision yet: ours both ways, recorded as not timed, and kept after the capture.
  EXPECT_EQ(detail::choose_attention_plan(key_at(288), true, timer.fn()), kTiledPlan);
  EXPECT_EQ(detail::choose_attention_plan(key_at(288), false, timer.fn()), kTiledPlan);
  EXPECT_EQ(timer.calls, 0);
  // A decision made before the capture is used during it.
  EXPECT_EQ(detail::choose_attention_plan(key_at(1024), false, timer.fn()), kCudnnPlan);
  EXPECT_EQ(detail::choose_attention_plan(key_at(1024), true, timer.fn()), kCudnnPlan);
  EXPECT_EQ(timer.calls, 1);
  const auto r = attention_choice_records();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_FALSE(r[0].timed);
  EXPECT_EQ(r[0].tiled_ms, 0.0);
  EXPECT_TRUE(r[1].timed);
  reset_attention_choices();
}

TEST(AttentionChoice, TheAttentionLinesCarryTheTimingThatChose) {
  reset_attention_choices();
  reset_attention_paths();
  FakeTimer timer{0.81, 0.93, 0.78};
  (void)detail::choose_attention_plan(key_at(1024, true), false, timer.fn());
  (void)detail::choose_attention_plan(key_at(288), true, timer.fn());
  note_attention_path(AttentionPath::Cudnn, 1024, 64, true, at::kBFloat16);
  note_attention_path(AttentionPath::TiledBackward, 1024, 64, true, at::kBFloat16);
  note_attention_path(AttentionPath::Tiled, 288, 64, false, at::kBFloat16);
  note_attention_path(AttentionPath::Sdpa, 1024, 64, true, at::kBFloat16);  // not a choice of "auto": no note
  note_attention_path(AttentionPath::Cudnn, 2048, 64, false, at::kBFloat16);  // no record: no note
  {  // a timing run's paths are not the model's
    const detail::ForcedAttentionPlan forced(kTiledPlan);
    note_attention_path(AttentionPath::Tiled, 4096, 64, false, at::kBFloat16);
  }
  const std::vector<std::string> lines = attention_paths_used();
  ASSERT_EQ(lines.size(), 5u);
  const std::string timing = " (auto, fwd+bwd: tiled 0.81 ms, cuDNN 0.93 ms, cuDNN then tiled 0.78 ms)";
  EXPECT_EQ(lines[0], "ours, tiled: 288 tokens, head dim 64, BFloat16 (auto: not timed, chosen during a capture)");
  EXPECT_EQ(lines[1], "cuDNN fused: 1024 tokens, head dim 64, key mask, BFloat16" + timing);
  EXPECT_EQ(lines[2], "cuDNN fused: 2048 tokens, head dim 64, BFloat16");
  EXPECT_EQ(lines[3], "ours, tiled backward after cuDNN's forward: 1024 tokens, head dim 64, key mask, BFloat16" +
                          timing);
  EXPECT_EQ(lines[4], "ATen scaled_dot_product_attention: 1024 tokens, head dim 64, key mask, BFloat16");
  reset_attention_paths();
  reset_attention_choices();
}

TEST(AttentionChoice, AutoOnCpuInputsTimesNothing) {
  reset_attention_choices();
  set_attention_auto(true);
  at::manual_seed(5);
  const at::Tensor qkv = at::randn({2, 128, 3 * 128}).requires_grad_(true);
  EXPECT_FALSE(detail::tiled_attention_applies(qkv, 2));
  qkv_attention(qkv, 2).sum().backward();
  EXPECT_TRUE(qkv.grad().defined());
  EXPECT_TRUE(attention_choice_records().empty());
  set_attention_auto(false);
  EXPECT_FALSE(attention_auto());
}

}  // namespace
}  // namespace perftrain::ops
