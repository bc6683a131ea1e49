// apply_speed_settings sets the process-wide choices of ops from [speed]
// (read back through ops' getters), refuses what validate() refuses, and
// dit_execution gives the model's plan for a device.
#include <gtest/gtest.h>

#include "base/error.h"
#include "ops/attention_choice.h"
#include "ops/attention_head_bwd.h"
#include "ops/attention_head_fwd.h"
#include "ops/attention_tiled.h"
#include "ops/cublaslt_workspace.h"
#include "ops/weight_grad_stream.h"
#include "support/test_support.h"
#include "train/speed.h"

namespace perftrain::train {
namespace {

// Puts the process back on the defaults whatever a test set.
struct RestoreDefaults {
  ~RestoreDefaults() { apply_speed_settings(SpeedConfig{}); }
};

TEST(SpeedSettings, ApplySetsTheOpsState) {
  RestoreDefaults restore;
  SpeedConfig s;
  s.attention = "cudnn";
  s.weight_grad_stream = "off";
  s.gemm_tune = 0;
  apply_speed_settings(s);
  EXPECT_FALSE(ops::whole_head_attention_forward());
  EXPECT_FALSE(ops::whole_head_attention_backward());
  EXPECT_EQ(ops::weight_grad_stream_mode(), ops::WeightGradStreamMode::kOff);
  EXPECT_EQ(ops::gemm_tune_candidates(), 0);

  s.attention = "whole_head";
  s.weight_grad_stream = "on";
  s.gemm_tune = 64;
  apply_speed_settings(s);
  EXPECT_TRUE(ops::whole_head_attention_forward());
  EXPECT_TRUE(ops::whole_head_attention_backward());
  EXPECT_EQ(ops::weight_grad_stream_mode(), ops::WeightGradStreamMode::kOn);
  EXPECT_EQ(ops::gemm_tune_candidates(), 64);

  s.attention = "tiled";  // the tiled kernels; the whole-head backward after the tiled forward at 256 tokens
  apply_speed_settings(s);
  EXPECT_TRUE(ops::tiled_attention());
  EXPECT_FALSE(ops::whole_head_attention_forward());
  EXPECT_TRUE(ops::whole_head_attention_backward());

  s.attention = "whole_head";  // the whole-head kernels, cuDNN's elsewhere, nothing timed
  apply_speed_settings(s);
  EXPECT_FALSE(ops::attention_auto());
  EXPECT_FALSE(ops::tiled_attention());
  EXPECT_TRUE(ops::whole_head_attention_forward());

  apply_speed_settings(SpeedConfig{});  // the default, "auto": the whole-head kernels where they apply, else by timing
  EXPECT_TRUE(ops::attention_auto());
  EXPECT_TRUE(ops::whole_head_attention_forward());
  EXPECT_TRUE(ops::whole_head_attention_backward());
  EXPECT_FALSE(ops::tiled_attention());
  EXPECT_EQ(ops::weight_grad_stream_mode(), ops::WeightGradStreamMode::kAuto);
  EXPECT_EQ(ops::gemm_tune_candidates(), ops::kDefaultGemmTuneCandidates);
}

TEST(SpeedSettings, AWrongValueChangesNothing) {
  RestoreDefaults restore;
  SpeedConfig good;
  good.attention = "cudnn";
  good.gemm_tune = 3;
  apply_speed_settings(good);
  SpeedConfig bad = good;
  bad.attention = "whole_head";
  bad.weight_grad_stream = "sometimes";
  auto msg = perftrain::testing::error_of<UsageError>([&] { apply_speed_settings(bad); });
  EXPECT_NE(msg.find("speed.weight_grad_stream"), std::string::npos) << msg;
  EXPECT_NE(msg.find("auto, on or off"), std::string::npos) << msg;
  EXPECT_FALSE(ops::whole_head_attention_forward()) << "refused before anything was set";
  EXPECT_EQ(ops::gemm_tune_candidates(), 3);
}

TEST(SpeedSettings, DitExecutionFusesOnlyOnCuda) {
  SpeedConfig s;
  s.recompute = true;
  s.gelu_recompute = true;
  const auto gpu = dit_execution(s, /*cuda=*/true);
  EXPECT_TRUE(gpu.fused_kernels);
  EXPECT_TRUE(gpu.recompute);
  EXPECT_TRUE(gpu.gelu_recompute);
  const auto cpu = dit_execution(s, /*cuda=*/false);
  EXPECT_FALSE(cpu.fused_kernels) << "the CPU runs the plain blocks (the fused ops' references)";
  EXPECT_TRUE(cpu.recompute);
  s.fused_kernels = false;
  EXPECT_FALSE(dit_execution(s, true).fused_kernels);
}

}  // namespace
}  // namespace perftrain::train
