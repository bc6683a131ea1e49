// train.precision = fp8 on the CPU, where the fused schedules run the fp8
// linears on the ops' references: the key's validation, tiny DiT and
// single-stream models training with their scaling states moving (a looped
// model's shared block with a state per loop), the single-stream gate_up's
// row blocks training as the concatenated weight bit for bit, a resumed
// fp8 run bit-identical to an uninterrupted one, the clear error of a
// checkpoint resumed across precisions, the monitor's fp8 health in
// metrics.jsonl and TensorBoard's scalars, the line the log and report
// give (with the layers that ran bf16), the table's amax in one buffer, and
// data parallel over real processes (this binary run as 2 ranks over Gloo:
// the Fp8DistWorker tests, which do nothing unless DIST_TEST_FP8_WORKER is
// set): the amax reduced by their maximum, and ranks on different rows ending
// with one scaling state, bit for bit, with and without ZeRO-1.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "distributed/group.h"
#include "distributed/launch_env.h"
#include "io/safetensors.h"
#include "models/diffusion_model.h"
#include "models/fp8_states.h"
#include "models/fused/single_stream_block.h"
#include "observe/tensorboard/health_events.h"
#include "support/dist_ranks.h"
#include "support/run_checks.h"
#include "support/test_support.h"
#include "ops/fp8_linear.h"
#include "ops/swiglu.h"
#include "train/checkpoint.h"
#include "train/fp8_training.h"
#include "train/step_runner.h"
#include "train/trainer.h"

namespace perftrain::train {
namespace {

using perftrain::testing::contains;
using perftrain::testing::error_of;
using perftrain::testing::expect_resume_bit_identical;
using perftrain::testing::metrics_lines;
using perftrain::testing::TempDir;

TrainConfig with(TrainConfig c, const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) apply_override(c, o);
  return c;
}

// A tiny model of `family` on 8x8 inputs (16 tokens, hidden 32).
TrainConfig tiny(const std::string& family) {
  TrainConfig c = with(default_config(false),
                       {"model.family=" + family, "model.depth=2", "model.hidden=32", "model.heads=2",
                        "model.patch=2", "model.image_size=8", "model.in_channels=2", "model.num_classes=3",
                        "model.learn_sigma=false", "diffusion.objective=flow", "train.lr=3e-3",
                        "train.warmup_steps=0", "train.batch_size=8", "train.device=cpu"});
  if (family == "single-stream") apply_override(c, "model.cond_tokens=2");
  return c;
}

struct Trained {
  std::vector<double> losses;
  std::map<std::string, ops::Fp8Scaling> states;  // copies after the last step
};

// `steps` steps of `precision` on one fixed batch (the loss can fall);
// fused_casts false: the fp8 linears cast their inputs themselves.
Trained train_steps(const TrainConfig& c, const std::string& precision, int steps, bool fused_casts = true) {
  const at::Device cpu(at::kCPU);
  auto built = models::build_diffusion_model_and_ema(c.model, 1, cpu);
  StepOptions o;
  o.precision = precision;
  StepRunner r(*built.model, built.ema.get(), c, o, cpu, at::make_generator<at::CPUGeneratorImpl>(5));
  if (r.fp8_states() != nullptr) r.fp8_states()->set_fused_casts(fused_casts);
  auto data_gen = at::make_generator<at::CPUGeneratorImpl>(11);
  // Each class a fixed pattern: the model can learn it in a few steps.
  const at::Tensor y = at::randint(3, {8}, data_gen, at::kLong);
  const at::Tensor patterns = at::randn({3, 2, 8, 8}, data_gen);
  const data::Batch b{patterns.index_select(0, y), y};
  Trained t;
  for (int i = 0; i < steps; ++i) {
    r.step(b);
    t.losses.push_back(r.take_window().loss);
  }
  if (r.fp8_states() != nullptr) t.states = r.fp8_states()->states();
  return t;
}

TEST(Fp8Config, PrecisionFp8IsValidatedWithTheFusedSchedule) {
  TrainConfig c = tiny("dit");
  EXPECT_NO_THROW(apply_override(c, "train.precision=fp8"));
  EXPECT_NO_THROW(c.validate());
  std::string msg = error_of<UsageError>([&] {
    TrainConfig bad = c;
    apply_override(bad, "train.precision=fp4");
    bad.validate();
  });
  EXPECT_TRUE(contains(msg, "train.precision")) << msg;
  EXPECT_TRUE(contains(msg, "fp8")) << msg;  // the allowed values name it
  TrainConfig r = with(tiny("dit"), {"train.precision=fp8", "speed.recompute=true"});
  msg = error_of<UsageError>([&] { r.validate(); });
  EXPECT_TRUE(contains(msg, "train.precision = fp8")) << msg;
  EXPECT_TRUE(contains(msg, "speed.recompute")) << msg;
  TrainConfig f = with(tiny("dit"), {"train.precision=fp8", "speed.fused_kernels=false"});
  msg = error_of<UsageError>([&] { f.validate(); });
  EXPECT_TRUE(contains(msg, "speed.fused_kernels")) << msg;
}

class Fp8FamilyTest : public ::testing::TestWithParam<std::string> {};

// Every block's four big linears get a state; the loss stays finite and
// falls; the scales leave 1 (the first update sets them from the amax), the
// history holds the amax of every step; and the products are fp8's: the
// losses differ from fp32's, but not by much.
TEST_P(Fp8FamilyTest, TrainsOnTheCpuWithItsScalingStatesMoving) {
  const TrainConfig c = tiny(GetParam());
  const int steps = 16;
  const Trained fp8 = train_steps(c, "fp8", steps);
  const Trained fp32 = train_steps(c, "fp32", steps);
  const bool ss = GetParam() == "single-stream";
  std::vector<std::string> want;
  for (const char* b : {"blocks.0.", "blocks.1."})
    for (const char* l : {"attn.qkv", "attn.proj", ss ? "ffn.gate_up" : "mlp.fc1", ss ? "ffn.down" : "mlp.fc2"})
      want.push_back(std::string(b) + l);
  ASSERT_EQ(fp8.states.size(), want.size());
  for (const std::string& name : want) {
    ASSERT_TRUE(fp8.states.count(name)) << name;
    const ops::Fp8Scaling& s = fp8.states.at(name);
    // x and W have a non-zero amax from the first step: their scales moved.
    EXPECT_NE(s.scale[ops::kFp8X].item<float>(), 1.f) << name;
    EXPECT_NE(s.scale[ops::kFp8W].item<float>(), 1.f) << name;
    EXPECT_GT(s.history[ops::kFp8X][0].item<float>(), 0.f) << name;
    EXPECT_GT(s.history[ops::kFp8X][steps - 1].item<float>(), 0.f) << name;  // the first step's, rolled down
    EXPECT_EQ(s.amax.abs().sum().item<float>(), 0.f) << name;                  // zeroed by the update
    EXPECT_EQ(s.events[ops::kFp8X][0].item<float>(), 0.f) << name;            // no overflow
  }
  for (double l : fp8.losses) EXPECT_TRUE(std::isfinite(l));
  auto mean = [&](size_t from, size_t n) {
    double m = 0;
    for (size_t i = from; i < from + n; ++i) m += fp8.losses[i];
    return m / double(n);
  };
  EXPECT_LT(mean(steps - 4, 4), mean(0, 4));
  double diff = 0;
  for (int i = 1; i < steps; ++i) diff = std::max(diff, std::abs(fp8.losses[i] - fp32.losses[i]));
  EXPECT_GT(diff, 0) << "fp8 ran the fp32 products";
  EXPECT_LT(diff, 0.1 * fp32.losses.front());
}

// The norms' fused casts (the codes written by adaln_layernorm and
// residual_adaln for DiT's attn.qkv and mlp.fc1, by rms_adaln and
// residual_rms_adaln for the single-stream attn.qkv and ffn.gate_up) train
// exactly as the casts inside fp8_linear do: the same losses and the same
// scaling states, bit for bit.
TEST_P(Fp8FamilyTest, FusedCastsTrainAsTheLinearsOwnCasts) {
  const TrainConfig c = tiny(GetParam());
  const Trained fused = train_steps(c, "fp8", 4, true);
  const Trained plain = train_steps(c, "fp8", 4, false);
  EXPECT_EQ(fused.losses, plain.losses);
  ASSERT_EQ(fused.states.size(), plain.states.size());
  for (const auto& [name, s] : fused.states) {
    const auto mine = s.named_tensors(), theirs = plain.states.at(name).named_tensors();
    ASSERT_EQ(mine.size(), theirs.size());
    for (size_t i = 0; i < mine.size(); ++i)
      EXPECT_TRUE(mine[i].second.equal(theirs[i].second)) << name << "." << mine[i].first;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Fp8FamilyTest, ::testing::Values("dit", "single-stream"),
                         [](const auto& info) { return info.param == "dit" ? "DiT" : "SingleStream"; });

// The single-stream FFN's fp8 gate_up reads gate and up as the row blocks of
// one weight (no concatenation): steps of the branch (forward from the norm's
// codes, backward, the scaling update, an SGD step on the weights) equal, bit
// for bit, the same steps on the concatenated weight (the path before, kept
// here as the reference): outputs, every gradient, the scaling states.
at::Tensor gate_up_on_the_concatenation(const models::SingleStreamBlockWeights& w, const ops::Fp8Operand& h2,
                                        const models::Fp8Block& fp8) {
  const at::Tensor gate_up = models::block_linear(fp8, "ffn.gate_up", h2, at::cat({w.gate_w, w.up_w}, 0));
  return models::block_linear(fp8, "ffn.down", ops::swiglu(gate_up), w.down_w);
}

TEST(Fp8SingleStream, GateUpRowBlocksTrainAsTheConcatenatedWeightBitForBit) {
  const int64_t batch = 2, tokens = 5, d = 32, f = 48;
  auto g = at::make_generator<at::CPUGeneratorImpl>(23);
  const models::SingleStreamBlockWeights init{at::Tensor(), at::Tensor(), at::randn({f, d}, g) / 6,
                                              at::randn({f, d}, g) / 6, at::randn({d, f}, g) / 7, at::Tensor()};
  struct Run {
    models::Fp8States states{4};
    models::SingleStreamBlockWeights w;
    std::vector<at::Tensor> seen;  // each step's output and gradients
  };
  Run blocks, cat;
  for (Run* r : {&blocks, &cat}) {
    r->w = init;
    for (at::Tensor* t : {&r->w.gate_w, &r->w.up_w, &r->w.down_w}) *t = t->clone().requires_grad_(true);
  }
  for (int step = 0; step < 3; ++step) {
    const at::Tensor x = at::randn({batch, tokens, d}, g).to(at::kBFloat16);
    const at::Tensor probe = at::randn({batch, tokens, d}, g);
    for (Run* r : {&blocks, &cat}) {
      const models::Fp8Block fp8{&r->states, "blocks.0"};
      const at::Tensor h = x.clone().requires_grad_(true);
      const auto target = models::block_linear_target(fp8, "ffn.gate_up", h, 2 * f);
      ASSERT_TRUE(target.has_value());
      const ops::Fp8Operand h2 = ops::fp8_operand_of(h, *target, "h2");
      const at::Tensor y = r == &blocks ? models::fused::single_stream_ffn_branch(r->w, h2, false, fp8)
                                        : gate_up_on_the_concatenation(r->w, h2, fp8);
      const auto grads =
          torch::autograd::grad({(y.to(at::kFloat) * probe).sum()}, {h, r->w.gate_w, r->w.up_w, r->w.down_w});
      r->seen.push_back(y.detach());
      r->seen.insert(r->seen.end(), grads.begin(), grads.end());
      r->states.update();
      const at::NoGradGuard no_grad;
      for (size_t i = 1; i < grads.size(); ++i) {
        at::Tensor& w = i == 1 ? r->w.gate_w : i == 2 ? r->w.up_w : r->w.down_w;
        w.sub_(grads[i] * 0.5);
      }
    }
  }
  ASSERT_EQ(blocks.seen.size(), cat.seen.size());
  for (size_t i = 0; i < blocks.seen.size(); ++i) {
    EXPECT_GT(blocks.seen[i].abs().sum().item<double>(), 0) << "step " << i / 5 << " tensor " << i % 5;
    EXPECT_TRUE(blocks.seen[i].equal(cat.seen[i])) << "step " << i / 5 << " tensor " << i % 5
                                                   << " (y, dh, dgate, dup, ddown)";
  }
  const auto mine = blocks.states.named_tensors(), theirs = cat.states.named_tensors();
  ASSERT_EQ(mine.size(), theirs.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].first, theirs[i].first);
    EXPECT_TRUE(mine[i].second.equal(theirs[i].second)) << mine[i].first;
  }
  EXPECT_TRUE(blocks.states.states().count("blocks.0.ffn.gate_up"));
}

// A looped model's states: its prelude and coda blocks', and its shared
// block's once per loop (the loops' inputs and merged weights differ).
TEST(Fp8Looped, TheSharedBlockHasAStatePerLoop) {
  const TrainConfig c = with(default_config(false),
                             {"model.name=Looped-T/2", "model.hidden=32", "model.heads=2", "model.image_size=8",
                              "model.in_channels=2", "model.num_classes=3", "model.prelude=1", "model.coda=1",
                              "model.loops=2", "model.lora_rank=4", "model.learn_sigma=false",
                              "diffusion.objective=flow", "train.batch_size=8", "train.device=cpu",
                              "train.lr=1e-2", "train.warmup_steps=0"});
  const Trained t = train_steps(c, "fp8", 4);
  std::vector<std::string> names;
  for (const auto& [name, s] : t.states) names.push_back(name);
  std::vector<std::string> want;
  for (const char* b : {"coda.0.", "prelude.0.", "shared.0.loop.0.", "shared.0.loop.1."})
    for (const char* l : {"attn.proj", "attn.qkv", "mlp.fc1", "mlp.fc2"}) want.push_back(std::string(b) + l);
  EXPECT_EQ(names, want);
  // Once the gates have moved, the loops' inputs differ: so do their amax.
  const at::Tensor loop0 = t.states.at("shared.0.loop.0.mlp.fc1").history[ops::kFp8X][0];
  const at::Tensor loop1 = t.states.at("shared.0.loop.1.mlp.fc1").history[ops::kFp8X][0];
  EXPECT_GT(loop0.item<float>(), 0.f);
  EXPECT_NE(loop0.item<float>(), loop1.item<float>());
  EXPECT_FALSE(loop0.is_same(loop1));
  for (double l : t.losses) EXPECT_TRUE(std::isfinite(l));
}

TrainConfig tiny_run(const std::string& runs, const std::string& name, int64_t steps, const std::string& precision) {
  TrainConfig c = with(tiny("dit"), {"model.patch=4", "data.source=synthetic", "data.synthetic_size=40",
                                     "train.grad_clip=1.0", "log.every=2", "log.checkpoint_every=3",
                                     "log.sample_every=0", "diffusion.sample_steps=2", "log.sample_per_class=2",
                                     "train.precision=" + precision});
  c.optim.steps = steps;
  c.run.dir = runs;
  c.run.name = name;
  return c;
}

// The scaling states are in trainer_state.safetensors and resume exactly:
// N steps equal N/2, a resume and N/2 more, bit for bit.
TEST(Fp8Resume, ResumedFp8RunIsBitIdenticalToAnUninterruptedOne) {
  TempDir tmp;
  std::ostringstream log;
  expect_resume_bit_identical(
      [&](const std::string& name, int64_t steps) { return tiny_run(tmp.path(), name, steps, "fp8"); }, tmp.path(), 5,
      log);
  // The resumed run's last checkpoint.
  const std::string last = latest_checkpoint_dir(tmp.path() + "/half/ckpt");
  const auto file = io::SafetensorsFile::open(last + "/trainer_state.safetensors");
  const auto names = file.names();
  for (const char* n : {"fp8.history_len", "fp8.blocks.1.mlp.fc2.scale", "fp8.blocks.0.attn.qkv.history",
                        "fp8.blocks.0.attn.proj.events"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  // Not in the weights that load into facebookresearch/DiT.
  for (const auto& n : io::SafetensorsFile::open(last + "/model.safetensors").names())
    EXPECT_FALSE(contains(n, "fp8")) << n;
}

// A checkpoint resumed with the other precision: one line naming
// train.precision, nothing trained.
TEST(Fp8Resume, ACheckpointResumedAcrossPrecisionsIsAUsageError) {
  TempDir tmp;
  std::ostringstream log;
  for (const auto& [saved, resumed] : std::vector<std::pair<std::string, std::string>>{{"fp8", "fp32"}, {"fp32", "fp8"}}) {
    const std::string name = "from_" + saved;
    run_training(tiny_run(tmp.path(), name, 3, saved), {}, log);
    TrainOptions opts;
    opts.resume = tmp.path() + "/" + name;
    const std::string msg =
        error_of<UsageError>([&] { run_training(tiny_run(tmp.path(), name, 6, resumed), opts, log); });
    EXPECT_TRUE(contains(msg, "train.precision")) << msg;
    EXPECT_TRUE(contains(msg, "resume")) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(metrics_lines(tmp.path() + "/" + name).back()["step"].get<int64_t>(), 3) << saved;
  }
}

// train.fp8_amax_history and train.fp8_margin: validated, carried into the
// table (its length in the checkpoint, the margin in the scales: one more
// power of two of headroom halves every scale the update sets), and a resume
// with another history length is one line, nothing trained.
TEST(Fp8Scaling, HistoryLengthAndMarginAreKeysOfTheRun) {
  for (const char* bad : {"train.fp8_amax_history=0", "train.fp8_amax_history=1025", "train.fp8_margin=-1",
                          "train.fp8_margin=17"}) {
    const std::string msg = error_of<UsageError>([&] {
      TrainConfig c = tiny("dit");
      apply_override(c, bad);
      c.validate();
    });
    EXPECT_TRUE(contains(msg, std::string(bad).substr(0, std::string(bad).find('=')))) << msg;
  }
  std::map<int, std::map<std::string, ops::Fp8Scaling>> by_margin;
  for (int margin : {0, 1}) {
    TrainConfig c = with(tiny("dit"), {"train.precision=fp8", "train.fp8_amax_history=4",
                                       "train.fp8_margin=" + std::to_string(margin)});
    by_margin[margin] = train_steps(c, "fp8", 1).states;
    for (const auto& [name, st] : by_margin[margin]) EXPECT_EQ(st.history_len(), 4) << name;
  }
  // The first step is the same in both runs (every scale 1 until the first
  // update), so the update's scales differ by exactly 2x where it set them.
  ASSERT_EQ(by_margin[0].size(), by_margin[1].size());
  int set = 0;
  for (const auto& [name, s0] : by_margin[0]) {
    const at::Tensor a = s0.scale, b = by_margin[1].at(name).scale;
    for (int64_t i = 0; i < a.size(0); ++i) {
      if (a[i].item<float>() == 1.f) continue;  // kept (a zero amax: an underflow event)
      EXPECT_EQ(b[i].item<float>(), a[i].item<float>() / 2) << name << " slot " << i;
      ++set;
    }
  }
  EXPECT_GT(set, 8);

  TempDir tmp;
  std::ostringstream log;
  TrainConfig first = with(tiny_run(tmp.path(), "h4", 3, "fp8"), {"train.fp8_amax_history=4"});
  run_training(first, {}, log);
  TrainOptions opts;
  opts.resume = tmp.path() + "/h4";
  TrainConfig longer = with(tiny_run(tmp.path(), "h4", 6, "fp8"), {"train.fp8_amax_history=8"});
  const std::string msg = error_of<UsageError>([&] { run_training(longer, opts, log); });
  EXPECT_TRUE(contains(msg, "amax history has 4 entries, this run 8")) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_EQ(metrics_lines(tmp.path() + "/h4").back()["step"].get<int64_t>(), 3);
}

// The monitor's step carries every fp8 linear's scales and event counts:
// metrics.jsonl's "fp8" and TensorBoard's fp8_* scalars. The zero-initialised
// gates make the first steps' output gradients of attn.proj and mlp.fc2
// exactly zero: underflow events, the scale kept.
TEST(Fp8Monitor, MetricsCarryTheScalingHealthPerLayer) {
  TempDir tmp;
  std::ostringstream log;
  TrainConfig c = with(tiny_run(tmp.path(), "mon", 4, "fp8"), {"health.monitor_every=2", "log.tensorboard=false"});
  run_training(c, {}, log);
  bool seen = false;
  for (const auto& line : metrics_lines(tmp.path() + "/mon")) {
    if (!line.contains("fp8")) continue;
    seen = true;
    const auto& f = line["fp8"];
    EXPECT_EQ(f["overflows"].get<double>(), 0);
    EXPECT_GT(f["underflows"].get<double>(), 0);
    ASSERT_TRUE(f["layers"].contains("blocks.1.mlp.fc1")) << f.dump();
    const auto& l = f["layers"]["blocks.1.mlp.fc1"];
    EXPECT_NE(l["scale_x"].get<double>(), 1.0);
    EXPECT_GT(f["layers"]["blocks.0.mlp.fc2"]["underflows"].get<double>(), 0);
  }
  EXPECT_TRUE(seen);
  EXPECT_TRUE(contains(log.str(), "fp8 products in 8 linears")) << log.str();

  observe::GradHealthSample s;
  s.fp8.push_back({"blocks.0.mlp.fc1", 2.0, 3.0, 4.0, 1, 5});
  const auto scalars = observe::tensorboard::grad_health_scalars(s);
  auto value = [&](const std::string& tag) {
    for (const auto& [k, v] : scalars)
      if (k == tag) return v;
    return -1.0;
  };
  EXPECT_EQ(value("fp8_scale_x/blocks.0.mlp.fc1"), 2.0);
  EXPECT_EQ(value("fp8_scale_dy/blocks.0.mlp.fc1"), 4.0);
  EXPECT_EQ(value("fp8_overflows/blocks.0.mlp.fc1"), 1.0);
  EXPECT_EQ(value("fp8_underflows/blocks.0.mlp.fc1"), 5.0);
}

// Layers that ran ops::linear (on CUDA, shapes not multiples of 16) are
// named in the line the log and the report's precision row give.
TEST(Fp8Report, NamesTheLayersThatRanBf16) {
  models::Fp8States states(16);
  states.state("blocks.0.attn.qkv", at::kCPU);
  states.note_fallback("blocks.1.mlp.fc2");
  states.note_fallback("blocks.0.mlp.fc2");
  EXPECT_EQ(describe_fp8(states),
            "fp8 products in 1 linears (delayed scaling, amax history 16, margin 0); 2 ran bf16 (shapes not multiples of 16): "
            "blocks.0.mlp.fc2, blocks.1.mlp.fc2");

  TempDir tmp;
  std::ostringstream log;
  run_training(tiny_run(tmp.path(), "rep", 2, "fp8"), {}, log);
  std::ifstream in(tmp.path() + "/rep/report.md");
  const std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(report, "| precision | fp8 in the blocks' linears")) << report;
  EXPECT_TRUE(contains(report, "fp8 products in 8 linears")) << report;
}

// freeze() moves every state's amax into one buffer (what a data-parallel
// step reduces in one collective): the values kept, the states' amax views of
// it in states()' order, and the update reading and zeroing them there.
TEST(Fp8States, FreezeKeepsEveryAmaxInOneBuffer) {
  models::Fp8States states(4);
  auto g = at::make_generator<at::CPUGeneratorImpl>(5);
  std::vector<at::Tensor> before;
  for (const char* name : {"blocks.1.mlp.fc1", "blocks.0.attn.qkv", "blocks.0.mlp.fc2"}) {
    const ops::Fp8Scaling& s = states.state(name, at::kCPU);
    at::Tensor amax = s.amax;
    amax.copy_(at::rand({s.slots()}, g) * 10 + 0.5);
  }
  for (const auto& [name, s] : states.states()) before.push_back(s.amax.clone());
  EXPECT_EQ(states.amax_tensors().size(), 3u);  // before freeze: each state's own

  states.freeze();
  const std::vector<at::Tensor> flat = states.amax_tensors();
  ASSERT_EQ(flat.size(), 1u);
  ASSERT_EQ(flat[0].numel(), 9);
  EXPECT_TRUE(at::cat(before).equal(flat[0]));
  int64_t offset = 0;
  for (const auto& [name, s] : states.states()) {
    EXPECT_EQ(s.amax.data_ptr<float>(), flat[0].data_ptr<float>() + offset) << name;
    offset += s.slots();
  }
  // A write to the buffer is what the states see, and the update uses it.
  flat[0].mul_(2);
  states.update();
  EXPECT_EQ(flat[0].abs().sum().item<double>(), 0.0);  // zeroed by the update, in place
  size_t i = 0;
  for (const auto& [name, s] : states.states()) {
    const at::Tensor want_scale = at::full_like(before[i], 448.0f);  // x and W: E4M3
    want_scale[ops::kFp8Dy].fill_(57344.0f);                        // dY: E5M2
    EXPECT_TRUE(s.scale.equal(want_scale / (before[i] * 2))) << name << ": " << s.scale;
    ++i;
  }
  EXPECT_THROW(states.state("blocks.2.attn.qkv", at::kCPU), RuntimeError);
}

// Data parallel, each rank a process of this binary (the Fp8DataParallel
// tests start them).
constexpr const char* kFp8RankEnv = "DIST_TEST_FP8_WORKER";

// This process's group when it runs as one of those ranks; else null.
std::unique_ptr<distributed::Group> rank_group() {
  if (std::getenv(kFp8RankEnv) == nullptr) return nullptr;
  distributed::GroupOptions o;
  o.timeout_s = 30;
  return std::make_unique<distributed::Group>(distributed::launch_env(), at::kCPU, o);
}

// Every tensor equal to rank 0's, bit for bit (NaN and Inf too).
void expect_as_on_rank_0(distributed::Group& group, const std::vector<std::pair<std::string, at::Tensor>>& named) {
  for (const auto& [name, t] : named) {
    std::vector<at::Tensor> root{t.clone()};
    group.broadcast(root, 0);
    EXPECT_TRUE(root[0].view(at::kInt).equal(t.view(at::kInt)))
        << "rank " << group.rank() << ", " << name << ": " << t << " but rank 0 has " << root[0];
  }
}

// reduce_fp8_amax before freeze() (each state's amax on its own: the first
// step) and after it (the one buffer): the elementwise maximum, a NaN on one
// rank +inf on both, so that both count the overflow; the scales from the
// ranks' maximum, not from this rank's amax.
TEST(Fp8DistWorker, AmaxReducedByTheMaximum) {
  const auto group = rank_group();
  if (!group) GTEST_SKIP() << "a rank of Fp8DataParallel's tests only";
  ASSERT_EQ(group->world_size(), 2);
  const float r = float(group->rank()), inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  models::Fp8States states(4);
  for (const bool frozen : {false, true}) {
    if (frozen) states.freeze();
    at::Tensor a = states.state("blocks.0.attn.qkv", at::kCPU).amax;
    at::Tensor b = states.state("blocks.0.mlp.fc1", at::kCPU).amax;
    a.copy_(at::tensor({1 + r, 5 - r, r == 1 ? nan : 2.f}));
    b.copy_(at::tensor({r == 0 ? inf : 0.f, 0.f, 3 * r}));
    reduce_fp8_amax(states, *group);
    EXPECT_TRUE(a.equal(at::tensor({2.f, 5.f, inf}))) << "frozen " << frozen << ": " << a;
    EXPECT_TRUE(b.equal(at::tensor({inf, 0.f, 3.f}))) << "frozen " << frozen << ": " << b;
    states.update();
  }
  ASSERT_EQ(states.amax_tensors().size(), 1u);
  const ops::Fp8Scaling& qkv = states.states().at("blocks.0.attn.qkv");
  const ops::Fp8Scaling& fc1 = states.states().at("blocks.0.mlp.fc1");
  EXPECT_EQ(qkv.scale[ops::kFp8X].item<float>(), 448.f / 2) << "rank " << r;  // rank 0's own amax was 1
  EXPECT_EQ(qkv.scale[ops::kFp8W].item<float>(), 448.f / 5) << "rank " << r;
  EXPECT_EQ(qkv.events[ops::kFp8Dy][0].item<float>(), 2.f) << "rank " << r;  // overflows: rank 1's NaN
  EXPECT_EQ(fc1.events[ops::kFp8X][0].item<float>(), 2.f) << "rank " << r;   // overflows: rank 0's Inf
  EXPECT_EQ(fc1.events[ops::kFp8W][1].item<float>(), 2.f) << "rank " << r;   // underflows
  expect_as_on_rank_0(*group, states.named_tensors());
}

// Two ranks train a tiny DiT in fp8, each on its own half of the global
// batch (so their own amax differ) for 4 steps: the first reduces each
// state's amax, the others the frozen table's one buffer. Every rank ends
// with the same scaling state, bit for bit, its scales moved.
void expect_ranks_scale_alike(distributed::Group& group, bool shard_optimizer) {
  SCOPED_TRACE(shard_optimizer ? "ZeRO-1" : "replicated optimizer");
  TrainConfig c = tiny("dit");
  if (shard_optimizer) apply_override(c, "distributed.shard_optimizer=true");
  const at::Device cpu(at::kCPU);
  auto built = models::build_diffusion_model_and_ema(c.model, 1, cpu);
  StepOptions o;
  o.precision = "fp8";
  o.group = &group;
  StepRunner runner(*built.model, built.ema.get(), c, o, cpu, at::make_generator<at::CPUGeneratorImpl>(5));
  auto data_gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor y = at::randint(3, {8}, data_gen, at::kLong);
  const at::Tensor x = at::randn({8, 2, 8, 8}, data_gen);
  const int64_t rows = 8 / group.world_size();
  const data::Batch mine{x.narrow(0, rows * group.rank(), rows), y.narrow(0, rows * group.rank(), rows)};
  for (int i = 0; i < 4; ++i) runner.step(mine);
  EXPECT_TRUE(std::isfinite(runner.take_window().loss));
  const models::Fp8States& states = *runner.fp8_states();
  ASSERT_EQ(states.states().size(), 8u);
  EXPECT_EQ(states.amax_tensors().size(), 1u);
  for (const auto& [name, s] : states.states()) EXPECT_NE(s.scale[ops::kFp8X].item<float>(), 1.f) << name;
  expect_as_on_rank_0(group, states.named_tensors());
}

TEST(Fp8DistWorker, RanksScaleAlike) {
  const auto group = rank_group();
  if (!group) GTEST_SKIP() << "a rank of Fp8DataParallel's tests only";
  expect_ranks_scale_alike(*group, false);
  expect_ranks_scale_alike(*group, true);
}

TEST(Fp8DataParallel, AmaxReducedByTheMaximumOverTwoRanks) {
  perftrain::testing::expect_ranks_pass(2, kFp8RankEnv, "Fp8DistWorker.AmaxReducedByTheMaximum", /*quiet=*/false);
}

TEST(Fp8DataParallel, TwoRanksOnDifferentRowsEndWithOneScalingState) {
  perftrain::testing::expect_ranks_pass(2, kFp8RankEnv, "Fp8DistWorker.RanksScaleAlike", /*quiet=*/false);
}

}  // namespace
}  // namespace perftrain::train
