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
                          "train.grad_clip", "train.ema_decay", "train.lr_min", "train.decay_fraction",
                          "diffusion.cfg_scale", "model.mlp_ratio", "model.class_dropout"}) {
    for (const char* value : {"inf", "-inf", "nan"}) {
      const std::string msg = rejected(std::string(key) + "=" + value);
      const std::string field = std::string(key).substr(std::string(key).find('.') + 1);
      EXPECT_NE(msg.find(field), std::string::npos) << key << "=" << value << ": " << msg;
    }
  }
}

// The schedule, weight decay, EMA and accumulation keys (train/lr_schedule.h).
TEST(ConfigValidation, ScheduleAndAccumulationKeys) {
  EXPECT_NE(rejected("train.lr_schedule=step").find("train.lr_schedule 'step' (expected constant, cosine, linear or wsd)"),
            std::string::npos);
  EXPECT_NE(rejected("train.lr_min=1").find("train.lr_min must be in [0, train.lr]"), std::string::npos);
  EXPECT_NE(rejected("train.lr_min=-1e-6").find("train.lr_min"), std::string::npos);
  EXPECT_NE(rejected("train.decay_fraction=1.5").find("train.decay_fraction"), std::string::npos);
  EXPECT_NE(rejected("train.ema_start=-1").find("train.ema_start"), std::string::npos);
  EXPECT_NE(rejected("train.accumulate=0").find("train.accumulate 0"), std::string::npos);
  EXPECT_NE(rejected("train.accumulate=4097").find("train.accumulate"), std::string::npos);
  for (const char* ok : {"train.lr_schedule=wsd", "train.lr_min=1e-6", "train.decay_fraction=1", "train.ema_start=7",
                         "train.accumulate=4096", "train.decay_all=true"})
    accepted(ok);
  EXPECT_FALSE(default_config(true).optim.decay_all) << "parameter groups by default";
  EXPECT_EQ(default_config(true).optim.lr_schedule, "constant") << "DiT's recipe";
}

// The loggers' keys (docs/guide/training.md, Logging).
TEST(ConfigValidation, LoggerKeys) {
  EXPECT_NE(rejected("log.wandb=sometimes").find("log.wandb 'sometimes' (expected off, offline or online)"),
            std::string::npos);
  EXPECT_NE(rejected("log.wandb_project=team/dit").find("log.wandb_project 'team/dit' must be 1 to 128 characters"),
            std::string::npos);
  EXPECT_NE(rejected("log.wandb_project=\"\"").find("log.wandb_project"), std::string::npos);
  EXPECT_NE(rejected("log.wandb_project=" + std::string(129, 'p')).find("log.wandb_project"), std::string::npos);
  EXPECT_NE(rejected("log.mlflow_experiment=\"\"").find("log.mlflow_experiment must be a name of 1 to 500"),
            std::string::npos);
  EXPECT_NE(rejected("log.mlflow=\"runs\\u0007\"").find("log.mlflow '"), std::string::npos);
  TrainConfig c = default_config(false);
  EXPECT_EQ(error_of<UsageError>([&] { apply_override(c, "log.wandb=1"); }),
            "override 'log.wandb=1': log.wandb must be a string (off, offline or online)");
  for (const char* ok : {"log.wandb=offline", "log.wandb=online", "log.mlflow=mlruns", "log.mlflow_experiment=dit fm",
                         "log.wandb_project=" "dit-fm_2"})
    accepted(ok);
  EXPECT_EQ(default_config(true).log.wandb, "off") << "never a dependency unless asked for";
  EXPECT_TRUE(default_config(true).log.mlflow.empty());
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

// Values that reached an allocator unchecked: a synthetic set whose loader
// order would not fit in memory (std::bad_alloc on the loader thread), an image
// of 65536^2 tokens (torch's allocator enforce on building the model).
TEST(ConfigValidation, SizesThatWouldExhaustMemoryAreRefused) {
  EXPECT_NE(rejected("data.synthetic_size=100000000000")
                .find("data.synthetic_size 100000000000 (expected an integer from 1 to 100000000)"),
            std::string::npos);
  EXPECT_NE(rejected("data.synthetic_size=0").find("data.synthetic_size"), std::string::npos);
  accepted("data.synthetic_size=100000000");
  TrainConfig c = default_config(false);
  apply_override(c, "model.image_size=65536");
  apply_override(c, "model.patch=1");
  const std::string msg = error_of<UsageError>([&] { c.validate(); });
  EXPECT_NE(msg.find("model.image_size 65536 at model.patch 1 gives 4294967296 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at most 65536"), std::string::npos) << msg;
  apply_override(c, "model.image_size=256");
  EXPECT_NO_THROW(c.validate());  // 256 x 256 patches: the most
  apply_override(c, "model.image_size=258");
  EXPECT_NE(error_of<UsageError>([&] { c.validate(); }).find("66564 tokens"), std::string::npos);
}

TEST(ConfigValidation, ModelWeightsMustFitTheMemoryGiven) {
  TrainConfig c = default_config(false);
  apply_override(c, "model.depth=1024");
  apply_override(c, "model.hidden=65536");
  apply_override(c, "model.heads=64");
  EXPECT_NO_THROW(c.validate());  // each value within its bound ...
  const std::string msg = error_of<UsageError>([&] { check_model_fits(c.model, 64.0 * (1 << 30)); });
  for (const char* want : {"model.depth 1024", "model.hidden 65536", "TiB of weights", "64.00 GiB of memory available"})
    EXPECT_NE(msg.find(want), std::string::npos) << want << " in: " << msg;
  const TrainConfig small = default_config(false);
  EXPECT_DOUBLE_EQ(model_weight_bytes(small.model), 4.0 * small.model.parameter_count());
  EXPECT_NO_THROW(check_model_fits(small.model, model_weight_bytes(small.model)));
  EXPECT_THROW(check_model_fits(small.model, model_weight_bytes(small.model) - 1), UsageError);
}

// A --set value is one TOML value: a newline would smuggle in more keys.
TEST(ConfigValidation, OverrideIsOneValueOnOneLine) {
  for (const char* bad : {"train.lr=1e-3\n[run]\nname = \"x\"", "train.lr=1e-3\nsteps = 7", "run.name=a\rb",
                          "run.name=\"a\"\n"}) {
    TrainConfig c = default_config(false);
    const std::string msg = error_of<UsageError>([&] { apply_override(c, bad); });
    EXPECT_NE(msg.find("a value is one line"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(c.to_toml(), default_config(false).to_toml()) << bad;  // nothing set
  }
  TrainConfig c = default_config(false);
  apply_override(c, "run.name=plain words # and a comment");
  EXPECT_EQ(c.run.name, "plain words # and a comment");  // a bare string, taken whole
  apply_override(c, "train.lr=3e-4 # a comment");
  EXPECT_EQ(c.optim.lr, 3e-4);
}

TEST(ConfigValidation, RunNameIsPrintableText) {
  for (const char* bad : {"run.name=\"a\\u001b[2Jb\"", "run.name=\"tab\\there\"", "run.name=\"\\u009b\""}) {
    const std::string msg = rejected(bad);
    EXPECT_NE(msg.find("run.name"), std::string::npos) << msg;
    EXPECT_NE(msg.find("control characters"), std::string::npos) << msg;
    for (char ch : msg) EXPECT_FALSE(static_cast<unsigned char>(ch) < 0x20) << msg;
  }
  accepted("run.name=\"caf\u00e9 run 2\"");
}

// Strings from a file or the command line are echoed printable in errors.
TEST(ConfigValidation, EchoedStringsArePrintable) {
  EXPECT_NE(rejected("train.device=\"t\\u001bpu\"").find("train.device 't\\x1bpu'"), std::string::npos);
  TrainConfig c = default_config(false);
  const std::string msg = error_of<UsageError>([&] { apply_toml(c, "[\"tr\\u001bain\"]\nx = 1\n", "f.toml"); });
  EXPECT_NE(msg.find("unknown section [tr\\x1bain]"), std::string::npos) << msg;
}

}  // namespace
}  // namespace perftrain::train
