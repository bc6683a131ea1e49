// TrainConfig::validate refuses, naming the key, every value that crashed
// later or was silently accepted: non-finite numbers (inf and nan pass
// comparisons such as lr > 0), an MLP width below 1 (a division by zero in
// the initialisation), sizes that overflow, oversized sample grids; and
// accepts the values around them.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "base/error.h"
#include "support/test_support.h"
#include "train/config.h"

namespace perftrain::train {
namespace {

using perftrain::testing::error_of;

std::string rejected(const std::string& override, bool cuda = false) {
  TrainConfig c = default_config(cuda);
  apply_override(c, override);
  return error_of<UsageError>([&] { c.validate(); });
}

void accepted(const std::string& override, bool cuda = false) {
  TrainConfig c = default_config(cuda);
  apply_override(c, override);
  EXPECT_NO_THROW(c.validate()) << override;
}

TEST(ConfigValidation, EveryNumberIsFinite) {
  for (const char* key : {"train.lr", "train.weight_decay", "train.beta1", "train.beta2", "train.eps",
                          "train.grad_clip", "train.ema_decay", "diffusion.cfg_scale", "model.mlp_ratio",
                          "model.class_dropout"}) {
    for (const char* value : {"inf", "-inf", "nan"}) {
      const std::string msg = rejected(std::string(key) + "=" + value);
      const std::string field = std::string(key).substr(std::string(key).find('.') + 1);
      EXPECT_NE(msg.find(field), std::string::npos) << key << "=" << value << ": " << msg;
    }
  }
}

TEST(ConfigValidation, MlpRatioGivesAWidthOfAtLeastOne) {
  // hidden 192 (DiT-T): 0.001 gives 0 (was SIGFPE), 1/192 gives 1.
  EXPECT_NE(rejected("model.mlp_ratio=0.001").find("model.mlp_ratio 0.001"), std::string::npos);
  EXPECT_NE(rejected("model.mlp_ratio=0.001").find("MLP width of 0"), std::string::npos);
  accepted("model.mlp_ratio=0.0053");
  EXPECT_NE(rejected("model.mlp_ratio=0").find("model.mlp_ratio"), std::string::npos);
  EXPECT_NE(rejected("model.mlp_ratio=-2").find("model.mlp_ratio"), std::string::npos);
  EXPECT_NE(rejected("model.mlp_ratio=65").find("(0, 64]"), std::string::npos);
  accepted("model.mlp_ratio=64");
}

TEST(ConfigValidation, ClassDropoutInZeroOne) {
  accepted("model.class_dropout=0.001");
  accepted("model.class_dropout=0.999");
  for (const char* v : {"1", "-0.1", "nan"})
    EXPECT_NE(rejected(std::string("model.class_dropout=") + v).find("model.class_dropout"), std::string::npos) << v;
}

TEST(ConfigValidation, SizesThatWouldOverflowAreRefused) {
  EXPECT_NE(rejected("model.depth=1025").find("model.depth 1025 is above 1024"), std::string::npos);
  EXPECT_NE(rejected("model.hidden=131072").find("model.hidden"), std::string::npos);
  EXPECT_NE(rejected("model.in_channels=5000").find("model.in_channels"), std::string::npos);
  EXPECT_NE(rejected("model.num_classes=20000000").find("model.num_classes"), std::string::npos);
  EXPECT_NE(rejected("data.prefetch=65").find("data.prefetch"), std::string::npos);
  EXPECT_NE(rejected("diffusion.sample_steps=100001").find("diffusion.sample_steps"), std::string::npos);
  EXPECT_NE(rejected("log.sample_per_class=2000").find("log.sample_per_class"), std::string::npos);
  accepted("model.depth=1024");
  accepted("data.prefetch=64");
}

TEST(ConfigValidation, DeviceIsOneOfTheKnown) {
  EXPECT_NE(rejected("train.device=tpu").find("train.device 'tpu' (expected auto, cpu or cuda)"), std::string::npos);
  for (const char* d : {"auto", "cpu", "cuda"}) accepted(std::string("train.device=") + d);
}

TEST(ConfigValidation, IntegersBeyondInt64AreUsageErrorsNotClamped) {
  TrainConfig c = default_config(false);
  const std::string msg =
      error_of<UsageError>([&] { apply_override(c, "train.batch_size=99999999999999999999"); });
  EXPECT_NE(msg.find("train.batch_size"), std::string::npos) << msg;
  EXPECT_EQ(c.optim.batch_size, default_config(false).optim.batch_size);  // unchanged
  const std::string toml_msg =
      error_of<UsageError>([&] { apply_toml(c, "[train]\nsteps = 99999999999999999999\n", "x.toml"); });
  EXPECT_NE(toml_msg.find("x.toml:2"), std::string::npos) << toml_msg;
}

}  // namespace
}  // namespace perftrain::train
