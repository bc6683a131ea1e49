// The looped DiT (models/looped.h): names and the closed-form counts (shared
// weights once, FLOPs per application), the config's checks, state-dict
// names; depth-wise LoRA (a fresh adapter changes nothing; merged weights
// equal the unmerged formula); routing at capacity 1 equals no routing;
// concat re-injection starts as none; recompute changes nothing; and
// outputs, the auxiliary loss and every gradient (shared weights, adapters,
// routers) against the PyTorch reference (bench/reference_looped.py), with
// DiT and single-stream blocks.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "base/error.h"
#include "io/safetensors.h"
#include "models/dit.h"
#include "models/looped.h"
#include "support/tensor_checks.h"
#include "support/test_support.h"

namespace perftrain::models {
namespace {

using perftrain::testing::all_close;
using perftrain::testing::rel_err;
using perftrain::testing::run_command;
using perftrain::testing::TempDir;

// A small looped config: T = 16 image tokens.
DiTConfig small(const std::string& block) {
  DiTConfig c = model_config("Looped-T/2");
  c.hidden = 32, c.heads = 2, c.image_size = 8, c.in_channels = 2, c.num_classes = 5;
  c.loop_block = block;
  c.prelude = 1, c.coda = 1, c.shared_group = 2, c.loops = 3;
  c.depth = c.looped_depth();
  return c;
}

// Every tensor of the model moved off its initial value (the zero-initialised
// adaLN, final layer, lora_B and loop_embed would hide most of the math).
void perturb(LoopedDiT& m, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  m.transform([&](const std::string&, const at::Tensor& t) { return t + 0.1 * at::randn(t.sizes(), gen, at::kFloat); });
}

// b's tensors set to a's where a has the same name (the rest kept).
void copy_common(const LoopedDiT& a, LoopedDiT& b) {
  std::map<std::string, at::Tensor> from;
  for (const auto& [n, t] : a.state()) from[n] = t;
  b.transform([&](const std::string& n, const at::Tensor& t) { return from.count(n) ? from[n].clone() : t; });
}

struct Inputs {
  at::Tensor x, t;
  Condition cond;
};

Inputs inputs_for(const DiTConfig& c, uint64_t seed, int64_t B = 3) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Inputs in;
  in.x = at::randn({B, c.in_channels, c.image_size, c.image_size}, gen, at::kFloat);
  in.t = at::rand({B}, gen, at::kFloat) * 999;
  if (c.single_stream() && c.cond_dim > 0) {
    in.cond.features = at::randn({B, c.cond_tokens, c.cond_dim}, gen, at::kFloat);
    in.cond.lengths = at::randint(0, c.cond_tokens + 1, {B}, gen, at::kLong);
  } else {
    in.cond.labels = at::randint(0, c.num_classes + 1, {B}, gen, at::kLong);
  }
  return in;
}

TEST(LoopedConfig, NamesFollowTheSingleStreamOnesWithDiTSizes) {
  const auto names = model_names();
  const auto ss = std::find(names.begin(), names.end(), "SS-T/1");
  const auto looped = std::find(names.begin(), names.end(), "Looped-XL/2");
  ASSERT_NE(looped, names.end());
  EXPECT_LT(ss, looped);
  const DiTConfig b = model_config("Looped-B/2");
  EXPECT_EQ(b.family, "looped");
  EXPECT_EQ(b.hidden, 768);
  EXPECT_EQ(b.loops, 8);
  EXPECT_EQ(b.depth, 12);
  EXPECT_EQ(b.depth, b.looped_depth());
  EXPECT_NO_THROW(b.validate());
  // 12 block applications at DiT-B/2's width: DiT-B/2's FLOPs, a third of its blocks' weights.
  const DiTConfig dit = model_config("DiT-B/2");
  EXPECT_DOUBLE_EQ(b.forward_flops_per_sample(), dit.forward_flops_per_sample());
  EXPECT_EQ(dit.parameter_count() - b.parameter_count(), 7 * dit.block_parameter_count() - 8 * 768);
}

TEST(LoopedConfig, ClosedFormCountsEqualTheModulesSharedWeightsOnce) {
  for (const char* block : {"dit", "single_stream"}) {
    DiTConfig c = small(block);
    c.lora_rank = 3, c.lora_targets = "adaln, attn,mlp", c.reinject = "concat";
    c.lora_bias = std::string(block) == "dit";
    c.route_capacity = 1.0, c.route_capacity_end = 0.5;  // loops 1 and 2 routed
    LoopedDiT m(c, 0);
    EXPECT_EQ(m.parameter_count(), c.parameter_count()) << block;
    EXPECT_EQ(m.parameter_count(true), c.parameter_count(true)) << block;
    EXPECT_EQ(m.routers.size(), 2u);
    EXPECT_EQ(m.router(0), nullptr);
    // Two more loops: two more loop_embed rows, adapters and routers; no block weights.
    DiTConfig more = c;
    more.loops = 5, more.depth = more.looped_depth();
    const int64_t per_loop_adapters = (c.parameter_count() - [&] {
      DiTConfig r0 = c;
      r0.lora_rank = 0, r0.lora_bias = false;
      return r0.parameter_count();
    }()) / c.loops;
    EXPECT_EQ(LoopedDiT(more, 0).parameter_count(),
              c.parameter_count() + 2 * (c.hidden + per_loop_adapters + c.hidden + 1))
        << block;
  }
}

TEST(LoopedConfig, RoutedLoopsCountTheirTokens) {
  DiTConfig c = small("dit");
  const double plain = c.forward_flops_per_sample();
  c.route_capacity = 0.5;
  EXPECT_EQ(c.loop_tokens(0), 8);
  EXPECT_TRUE(c.routing());
  const double D = c.hidden, M = c.mlp_hidden();
  // 3 loops x 2 blocks at 8 of 16 tokens, plus each loop's router over 16 tokens.
  const double saved = 6 * (c.block_flops(16) - c.block_flops(8)) - 3 * 2 * 16 * D;
  EXPECT_DOUBLE_EQ(c.forward_flops_per_sample(), plain - saved);
  EXPECT_GT(M, 0);
  c.route_capacity = 1e-6;
  EXPECT_EQ(c.loop_tokens(2), 1);  // at least one token
}

TEST(LoopedConfig, BadValuesNameTheirKey) {
  auto error = [](auto&& edit) {
    DiTConfig c = small("dit");
    edit(c);
    try {
      c.validate();
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  using C = DiTConfig&;
  EXPECT_NE(error([](C c) { c.loops = 0, c.depth = c.looped_depth(); }).find("model.loops 0"), std::string::npos);
  EXPECT_NE(error([](C c) { c.shared_group = 0, c.depth = c.looped_depth(); }).find("model.shared_group"),
            std::string::npos);
  EXPECT_NE(error([](C c) { c.depth = 7; }).find("model.depth 7"), std::string::npos);
  EXPECT_NE(error([](C c) { c.lora_targets = "attn,ffn"; }).find("model.lora_targets"), std::string::npos);
  EXPECT_NE(error([](C c) { c.lora_targets = "attn,attn"; }).find("named twice"), std::string::npos);
  EXPECT_NE(error([](C c) { c.route_capacity = 0; }).find("model.route_capacity 0"), std::string::npos);
  EXPECT_NE(error([](C c) { c.route_capacity_end = 1.5; }).find("model.route_capacity_end"), std::string::npos);
  EXPECT_NE(error([](C c) { c.reinject = "mul"; }).find("model.reinject 'mul'"), std::string::npos);
  EXPECT_NE(error([](C c) { c.loop_block = "mmdit"; }).find("model.loop_block"), std::string::npos);
  EXPECT_NE(error([](C c) { c.lora_alpha = 0; }).find("model.lora_alpha"), std::string::npos);
  EXPECT_NE(error([](C c) { c.router_aux_weight = -1; }).find("model.router_aux_weight"), std::string::npos);
  EXPECT_NE(error([](C c) { c.loop_block = "single_stream", c.lora_bias = true; }).find("model.lora_bias"),
            std::string::npos);
  // The single-stream rules apply to single-stream loop blocks.
  EXPECT_NE(error([](C c) { c.loop_block = "single_stream", c.cond_tokens = 0; }).find("cond_tokens"),
            std::string::npos);
  EXPECT_EQ(error([](C) {}), "no error");
}

TEST(LoopedModel, StateDictNamesAndShapes) {
  DiTConfig c = small("dit");
  c.lora_rank = 4, c.lora_targets = "attn,mlp,adaln", c.lora_bias = true, c.reinject = "concat";
  c.route_capacity = 0.5;
  LoopedDiT m(c, 0);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [n, t] : m.state()) shapes[n] = t.sizes().vec();
  const int64_t D = 32, M = 128;
  const std::map<std::string, std::vector<int64_t>> want = {
      {"pos_embed", {1, 16, D}},
      {"prelude.0.attn.qkv.weight", {3 * D, D}},
      {"shared.1.mlp.fc2.weight", {D, M}},
      {"coda.0.adaLN_modulation.1.bias", {6 * D}},
      {"loop_embed", {3, D}},
      {"reinject.weight", {D, 2 * D}},
      {"adapters.2.1.attn.qkv.lora_A", {4, D}},
      {"adapters.2.1.attn.qkv.lora_B", {3 * D, 4}},
      {"adapters.0.0.mlp.fc1.bias", {M}},
      {"adapters.1.0.adaLN_modulation.1.lora_B", {6 * D, 4}},
      {"routers.2.weight", {1, D}},
      {"final_layer.linear.weight", {4 * 4, D}},
  };
  for (const auto& [n, s] : want) {
    ASSERT_TRUE(shapes.count(n)) << n;
    EXPECT_EQ(shapes[n], s) << n;
  }
  EXPECT_FALSE(shapes.count("shared.2.attn.qkv.weight"));  // K = 2 blocks, whatever L
  auto in = inputs_for(c, 1);
  auto out = m.forward_train(in.x, in.t, in.cond);
  EXPECT_EQ(out.out.sizes(), (std::vector<int64_t>{3, 4, 8, 8}));
  ASSERT_TRUE(out.aux_loss.defined());
  EXPECT_EQ(out.aux_loss.dim(), 0);
  // Fresh adapters and concat re-injection change nothing.
  LoopedDiT plain(small("dit"), 0);
  perturb(plain, 2);  // the blocks do something
  c.route_capacity = 1.0;
  LoopedDiT fresh(c, 0);
  copy_common(plain, fresh);
  EXPECT_TRUE(all_close(fresh.forward(in.x, in.t, in.cond), plain.forward(in.x, in.t, in.cond), 1e-6, 1e-5));
}

// A rank-r adapter with B = 0 is exactly the shared weight: rank 0 and a
// fresh adapter give the same model.
TEST(LoopedLoRA, RankZeroEqualsAFreshAdapterExactly) {
  for (const char* block : {"dit", "single_stream"}) {
    DiTConfig c = small(block);
    LoopedDiT plain(c, 3);
    perturb(plain, 4);
    c.lora_rank = 5, c.lora_targets = "attn,mlp,adaln";
    LoopedDiT adapted(c, 3);
    copy_common(plain, adapted);
    auto in = inputs_for(c, 5);
    EXPECT_TRUE(plain.forward(in.x, in.t, in.cond).equal(adapted.forward(in.x, in.t, in.cond))) << block;
  }
}

// loop_weights(l, k): every adapted linear of a loop is x W^T + b + s (x A^T) B^T + delta.
TEST(LoopedLoRA, MergedWeightsEqualTheUnmergedFormula) {
  DiTConfig c = small("dit");
  c.lora_rank = 3, c.lora_alpha = 6, c.lora_targets = "attn,mlp,adaln", c.lora_bias = true;
  LoopedDiT m(c, 7);
  perturb(m, 8);
  const int64_t l = 2, k = 1;
  const DiTBlockWeights w = m.loop_weights(l, k);
  const DiTBlock& block = m.dit->shared[static_cast<size_t>(k)];
  const BlockAdapters* a = m.adapters_of(l, k);
  ASSERT_NE(a, nullptr);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  struct Case {
    const char* path;
    const nn::Linear& shared;
    at::Tensor W, b;
  };
  const Case cases[] = {{"attn.qkv", block.attn.qkv, w.qkv_w, w.qkv_b},
                        {"attn.proj", block.attn.proj, w.proj_w, w.proj_b},
                        {"mlp.fc1", block.mlp.fc1, w.fc1_w, w.fc1_b},
                        {"mlp.fc2", block.mlp.fc2, w.fc2_w, w.fc2_b},
                        {"adaLN_modulation.1", block.adaLN_modulation.linear(), w.ada_w, w.ada_b}};
  for (const Case& cs : cases) {
    const LoRAAdapter* ad = a->find(cs.path);
    ASSERT_NE(ad, nullptr) << cs.path;
    EXPECT_DOUBLE_EQ(ad->scale(), 2.0);
    const at::Tensor x = at::randn({5, cs.shared.weight.size(1)}, gen, at::kFloat);
    const at::Tensor unmerged = at::linear(x, cs.shared.weight, cs.shared.bias) +
                                2.0 * at::linear(at::linear(x, ad->lora_A), ad->lora_B) + ad->bias;
    EXPECT_TRUE(all_close(at::linear(x, cs.W, cs.b), unmerged, 1e-5, 1e-5)) << cs.path;
  }
  // A loop without the target keeps the shared tensor itself.
  DiTConfig attn_only = c;
  attn_only.lora_targets = "attn";
  LoopedDiT m2(attn_only, 7);
  EXPECT_TRUE(m2.loop_weights(0, 0).fc1_w.is_same(m2.dit->shared[0].mlp.fc1.weight));
}

// Capacity 0.999 keeps all 16 tokens: the routed path with a gate of value 1
// is the unrouted model. Its gradients too when the routers' weights are
// zero (otherwise the gate's gradient also reaches the residual stream
// through the router's input, as Mixture-of-Depths' does); the routers'
// weights still get theirs through the gate.
TEST(LoopedRouting, CapacityOneEqualsNoRouting) {
  for (const char* block : {"dit", "single_stream"}) {
    DiTConfig c = small(block);
    LoopedDiT plain(c, 11);
    perturb(plain, 12);
    c.route_capacity = 0.999;
    ASSERT_EQ(c.loop_tokens(0), c.tokens());
    LoopedDiT routed(c, 11);
    copy_common(plain, routed);
    routed.transform([](const std::string& n, const at::Tensor& t) {
      return n.rfind("routers.", 0) == 0 && n.find(".weight") != std::string::npos ? at::zeros_like(t) : t;
    });
    auto in = inputs_for(c, 13);
    const at::Tensor x1 = in.x.clone().set_requires_grad(true), x2 = in.x.clone().set_requires_grad(true);
    const at::Tensor a = plain.forward(x1, in.t, in.cond);
    const ForwardOutput b = routed.forward_train(x2, in.t, in.cond);
    EXPECT_TRUE(all_close(b.out, a, 1e-5, 1e-5)) << block;
    a.square().sum().backward();
    (b.out.square().sum() + b.aux_loss).backward();
    EXPECT_LT(rel_err(x2.grad(), x1.grad()), 1e-5) << block;
    const auto pg = plain.named_parameters();
    std::map<std::string, at::Tensor> rg;
    for (const auto& [n, p] : routed.named_parameters()) rg[n] = p.grad();
    for (const auto& [n, p] : pg) EXPECT_LT(rel_err(rg.at(n), p.grad()), 1e-4) << block << " " << n;
    EXPECT_GT(rg.at("routers.0.weight").abs().max().item<double>(), 0) << block;
  }
}

TEST(LoopedRouting, RouterKeepsItsTopScoresInImageOrder) {
  DiTConfig c = small("dit");
  c.route_capacity = 0.25, c.loops = 1, c.prelude = 0, c.coda = 0, c.shared_group = 1;
  c.depth = c.looped_depth();
  LoopedDiT m(c, 21);
  perturb(m, 22);
  const at::Tensor u = at::randn({2, 16, 32});
  const LoopRoute r = m.route(0, u);
  EXPECT_EQ(r.index.sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_TRUE((r.index.slice(1, 1) > r.index.slice(1, 0, 3)).all().item<bool>());  // ascending
  EXPECT_TRUE(all_close(r.gate, at::ones_like(r.gate), 1e-6, 0));
  // The kept tokens are the top scores.
  const at::Tensor kept_min = at::gather(r.scores, 1, r.index).amin(1);
  const at::Tensor mask = at::zeros_like(r.scores).scatter(1, r.index, 1.0);
  const at::Tensor others_max = (r.scores - 1e9 * mask).amax(1);
  EXPECT_TRUE((kept_min >= others_max).all().item<bool>());
}

TEST(LoopedReinject, ConcatStartsAsNoneAndAddDiffers) {
  DiTConfig c = small("dit");
  LoopedDiT none(c, 31);
  perturb(none, 32);
  auto in = inputs_for(c, 33);
  const at::Tensor a = none.forward(in.x, in.t, in.cond);
  c.reinject = "concat";
  LoopedDiT concat(c, 31);
  copy_common(none, concat);
  EXPECT_TRUE(all_close(concat.forward(in.x, in.t, in.cond), a, 1e-6, 1e-5));
  c.reinject = "add";
  LoopedDiT add(c, 31);
  copy_common(none, add);
  EXPECT_GT((add.forward(in.x, in.t, in.cond) - a).abs().max().item<double>(), 1e-3);
}

TEST(LoopedModel, RecomputeChangesNothing) {
  DiTConfig c = small("single_stream");
  c.lora_rank = 2, c.route_capacity = 0.5;
  LoopedDiT m(c, 41);
  perturb(m, 42);
  auto in = inputs_for(c, 43);
  auto grads = [&](bool recompute) {
    for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
    DiTExecution exec;
    exec.recompute = recompute;
    const ForwardOutput o = m.forward_train(in.x, in.t, in.cond, exec);
    (o.out.square().sum() + o.aux_loss).backward();
    std::vector<at::Tensor> g{o.out.detach()};
    for (const auto& p : m.parameters()) g.push_back(p.grad().clone());
    return g;
  };
  const auto plain = grads(false), again = grads(true);
  ASSERT_EQ(plain.size(), again.size());
  // The same products, their gradients summed in another order.
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_LT(rel_err(again[i], plain[i]), 1e-5) << i;
}

std::string reference_cmd(const DiTConfig& c, const std::string& sub) {
  char flags[1024];
  std::snprintf(flags, sizeof flags,
                " --hidden %lld --heads %lld --patch %lld --image-size %lld --in-channels %lld --num-classes %lld"
                " --class-dropout %g --cond-tokens %lld --cond-dim %lld --loop-block %s --prelude %lld --coda %lld"
                " --shared-group %lld --loops %lld --reinject %s --lora-rank %lld --lora-alpha %.17g"
                " --lora-targets %s %s --route-capacity %.17g --route-capacity-end %.17g --router-aux-weight %.17g %s",
                (long long)c.hidden, (long long)c.heads, (long long)c.patch, (long long)c.image_size,
                (long long)c.in_channels, (long long)c.num_classes, c.class_dropout, (long long)c.cond_tokens,
                (long long)c.cond_dim, c.loop_block.c_str(), (long long)c.prelude, (long long)c.coda,
                (long long)c.shared_group, (long long)c.loops, c.reinject.c_str(), (long long)c.lora_rank,
                c.lora_alpha, c.lora_targets.c_str(), c.lora_bias ? "--lora-bias" : "--no-lora-bias",
                c.route_capacity, c.route_capacity_end, c.router_aux_weight,
                c.learn_sigma ? "--learn-sigma" : "--no-learn-sigma");
  return std::string(PERFTRAIN_PYTHON) + " " + PERFTRAIN_SOURCE_DIR + "/bench/reference_looped.py " + sub +
         " --model Looped-T/2" + flags;
}

void compare_with_reference(const DiTConfig& c, uint64_t seed) {
  TempDir tmp;
  LoopedDiT m(c, seed);
  perturb(m, seed + 1);
  io::save_safetensors(tmp.file("w.safetensors"), m.state());
  auto in = inputs_for(c, seed + 2);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 3);
  const at::Tensor gout = at::randn({3, c.out_channels(), c.image_size, c.image_size}, gen, at::kFloat);
  io::NamedTensors inputs{{"x", in.x}, {"t", in.t}, {"gout", gout}};
  if (in.cond.labels.defined()) inputs.emplace_back("y", in.cond.labels);
  if (in.cond.features.defined()) {
    inputs.emplace_back("cond", in.cond.features);
    inputs.emplace_back("cond_len", in.cond.lengths);
  }
  io::save_safetensors(tmp.file("in.safetensors"), inputs);

  const at::Tensor x = in.x.clone().set_requires_grad(true);
  const ForwardOutput o = m.forward_train(x, in.t, in.cond);
  ASSERT_EQ(o.out.sizes(), gout.sizes());
  ((o.out * gout).sum() + (o.aux_loss.defined() ? o.aux_loss : at::zeros({}))).backward();

  const std::string cmd = reference_cmd(c, "check") + " --weights " + tmp.file("w.safetensors") + " --inputs " +
                          tmp.file("in.safetensors") + " --out " + tmp.file("out.safetensors");
  ASSERT_EQ(run_command(cmd), 0) << cmd;
  auto ref = io::SafetensorsFile::open(tmp.file("out.safetensors"));
  const double tol = 5e-5;
  EXPECT_LT(rel_err(o.out, ref.get("out")), tol);
  ASSERT_EQ(ref.contains("aux"), o.aux_loss.defined());
  if (o.aux_loss.defined()) EXPECT_LT(rel_err(o.aux_loss.reshape({1}), ref.get("aux")), tol);
  EXPECT_LT(rel_err(x.grad(), ref.get("grad.x")), tol);
  int compared = 0;
  for (const auto& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(ref.contains("grad." + name)) << name;
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_GT(p.grad().abs().max().item<double>(), 0) << name;
    EXPECT_LT(rel_err(p.grad(), ref.get("grad." + name)), tol) << name;
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(m.named_parameters().size()));
}

// Adapters on every target with bias deltas, concat, routing that shrinks
// with depth (loop 0 unrouted, 1 and 2 routed): all gradients, the shared
// weights summed over loops, the routers through gate and aux.
TEST(LoopedReference, DiTBlocksWithLoRAConcatAndRoutingMatchPyTorch) {
  DiTConfig c = small("dit");
  c.lora_rank = 3, c.lora_alpha = 5, c.lora_targets = "attn,mlp,adaln", c.lora_bias = true, c.reinject = "concat";
  c.route_capacity = 1.0, c.route_capacity_end = 0.4, c.router_aux_weight = 0.5;
  compare_with_reference(c, 51);
}

TEST(LoopedReference, SingleStreamBlocksWithMaskedFeaturesAndRoutingMatchPyTorch) {
  DiTConfig c = small("single_stream");
  c.cond_tokens = 3, c.cond_dim = 6, c.learn_sigma = false;
  c.lora_rank = 2, c.lora_targets = "attn,mlp", c.reinject = "add", c.route_capacity = 0.5;
  compare_with_reference(c, 61);
}

TEST(LoopedReference, PlainLoopsMatchPyTorch) {
  compare_with_reference(small("dit"), 71);
}

}  // namespace
}  // namespace perftrain::models
