// perftrain summary and graph: parameter totals (a shared tensor once),
// mult-adds against a direct count, the formats, and DOT that Graphviz reads.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <unordered_set>

#include "base/error.h"
#include "models/views/graph.h"
#include "models/views/module_summary.h"
#include "models/views/view_model.h"
#include "nn/linear.h"
#include "support/test_support.h"

namespace perftrain::models::views {
namespace {

// A Linear applied twice (a looped model) and a second module that registers
// the first one's weight as its own (tied weights), with a bias of its own.
class Tied : public nn::Module {
 public:
  Tied(at::Tensor* shared_weight, int64_t out, at::Generator& gen) : weight(shared_weight) {
    bias = at::randn({out}, gen);
    register_parameter("weight", shared_weight);
    register_parameter("bias", &bias);
  }
  at::Tensor forward(const at::Tensor& x) const {
    return hooked({x}, [this](at::TensorList in) { return at::linear(in[0], *weight, bias); });
  }
  at::Tensor* weight;
  at::Tensor bias;
};

class Looped : public nn::Module {
 public:
  explicit Looped(at::Generator& gen) : body(16, 16, gen), head(&body.weight, 16, gen) {
    register_module("body", &body);
    register_module("head", &head);
    register_parameter("scale", &scale, /*trainable=*/false);
  }
  at::Tensor forward(const at::Tensor& x) const {
    return hooked({x}, [this](at::TensorList in) { return head.forward(body.forward(body.forward(in[0]))) * scale; });
  }
  nn::Linear body;
  Tied head;
  at::Tensor scale = at::full({1}, 2.0);
};

int64_t unique_numel(const nn::Module& m) {
  std::unordered_set<const c10::TensorImpl*> seen;
  int64_t n = 0;
  for (const auto& [name, t] : m.state()) {
    if (seen.insert(t.unsafeGetTensorImpl()).second) n += t.numel();
  }
  return n;
}

const SummaryRow& row(const ModuleSummary& s, const std::string& name) {
  for (const SummaryRow& r : s.rows) {
    if (r.name == name) return r;
  }
  throw std::runtime_error("no row " + name);
}

TEST(ModelSummary, CountsASharedParameterOnceAndLoopedCallsTwice) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  Looped m(gen);
  const at::Tensor x = at::randn({3, 5, 16}, gen);
  const ModuleSummary s = summarize_module(m, [&] { m.forward(x); });
  // state() lists the shared weight twice; the total counts it once.
  EXPECT_EQ(m.parameter_count(), unique_numel(m) + 16 * 16);
  EXPECT_EQ(s.total_params, unique_numel(m));
  EXPECT_EQ(s.total_params, 16 * 16 + 16 + 16 + 1);
  EXPECT_EQ(s.trainable_params, s.total_params - 1);  // scale is not trainable
  EXPECT_EQ(row(s, "head").params, 16);               // its bias; the weight is body's
  EXPECT_EQ(row(s, "head").shared_params, 16 * 16);
  EXPECT_EQ(row(s, "body").calls, 2);
  EXPECT_EQ(row(s, "body").output_shape, (std::vector<int64_t>{3, 5, 16}));
  EXPECT_EQ(row(s, "").trainable(), "partial");
  // Mult-adds: in * out per token and call: body twice, head once.
  EXPECT_DOUBLE_EQ(row(s, "body").mult_adds, 2.0 * 15 * 16 * 16);
  EXPECT_DOUBLE_EQ(row(s, "head").mult_adds, 15.0 * 16 * 16);
  EXPECT_DOUBLE_EQ(s.total_mult_adds, 3.0 * 15 * 16 * 16);
}

TEST(ModelSummary, LinearMultAddsAreInTimesOutTimesTokens) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
  nn::Linear l(24, 40, gen);
  const ModuleSummary s = summarize_module(l, [&] { l.forward(at::randn({2, 7, 24}, gen)); });
  ASSERT_EQ(s.rows.size(), 1u);
  EXPECT_DOUBLE_EQ(s.total_mult_adds, 24.0 * 40 * 2 * 7);
  EXPECT_EQ(s.total_params, 24 * 40 + 40);
  EXPECT_EQ(s.rows[0].type, "Linear");
}

DiTConfig small_dit() {
  DiTConfig c = dit_config("DiT-S/2");
  c.depth = 4;
  c.image_size = 16;
  c.num_classes = 10;
  return c;
}

TEST(ModelSummary, DiTOnTheMetaDeviceMatchesTheConfigsCounts) {
  const DiTConfig cfg = small_dit();
  const ViewModel v = meta_model(cfg, 3);
  const ModuleSummary s = summarize_module(*v.model, [&] { v.forward(); });
  EXPECT_EQ(s.total_params, cfg.parameter_count());
  EXPECT_EQ(s.trainable_params, cfg.parameter_count(true));
  EXPECT_EQ(row(s, "").output_shape, (std::vector<int64_t>{3, cfg.out_channels(), 16, 16}));
  const int64_t T = cfg.tokens(), D = cfg.hidden;
  EXPECT_EQ(row(s, "blocks.3.attn.qkv").output_shape, (std::vector<int64_t>{3, T, 3 * D}));
  EXPECT_DOUBLE_EQ(row(s, "blocks.0.mlp.fc1").mult_adds, 3.0 * T * D * cfg.mlp_hidden());
  // The patch conv: C*p*p per output element.
  EXPECT_DOUBLE_EQ(row(s, "x_embedder").mult_adds, 3.0 * T * D * cfg.in_channels * cfg.patch * cfg.patch);
  // Attention: its two projections plus the two [T, T] products.
  EXPECT_DOUBLE_EQ(row(s, "blocks.0.attn").mult_adds, 3.0 * T * D * 3 * D + 3.0 * T * D * D + 2.0 * 3 * T * T * D);
  // The model's forward against the config's closed form (2 FLOPs per mult-add).
  EXPECT_NEAR(s.total_mult_adds * 2, 3 * cfg.forward_flops_per_sample(), 0.02 * s.total_mult_adds * 2);
}

// A single-stream model with condition features of per-sample lengths: the
// padding's zeroing (at::where) and the key mask run on the meta device too.
TEST(ModelSummary, SingleStreamWithConditionFeaturesOnTheMetaDevice) {
  DiTConfig cfg = model_config("SS-S/2");
  cfg.depth = 2, cfg.image_size = 16, cfg.cond_tokens = 5, cfg.cond_dim = 12;
  const ViewModel v = meta_model(cfg, 3);
  const ModuleSummary s = summarize_module(*v.model, [&] { v.forward(); });
  EXPECT_EQ(s.total_params, cfg.parameter_count());
  EXPECT_EQ(row(s, "").output_shape, (std::vector<int64_t>{3, cfg.out_channels(), 16, 16}));
}

TEST(ModelSummary, FormatsCarryTheRowsAndTotals) {
  const ViewModel v = meta_model(small_dit(), 2);
  ModuleSummary s = summarize_module(*v.model, [&] { v.forward(); });
  s.title = "small";
  s.memory = {{"parameters", 1.5e6}, {"activations", 3e9}};
  const std::string table = format_summary(s, "table", 2);
  EXPECT_NE(table.find("├─blocks (ModuleList<DiTBlock>)"), std::string::npos) << table;
  EXPECT_NE(table.find("Total params: "), std::string::npos);
  EXPECT_NE(table.find("activations"), std::string::npos);
  EXPECT_EQ(table.find("qkv"), std::string::npos) << "depth 2 hides depth 3";
  const std::string csv = format_summary(s, "csv", 3);
  size_t rows_to_3 = 0;
  for (const SummaryRow& r : s.rows) rows_to_3 += r.depth <= 3;
  EXPECT_EQ(static_cast<size_t>(std::count(csv.begin(), csv.end(), '\n')), rows_to_3 + 1);
  EXPECT_NE(csv.find("blocks.1.attn,SelfAttention,3,"), std::string::npos) << csv;
  const std::string json = format_summary(s, "json", 9);
  EXPECT_NE(json.find("\"total_params\": " + std::to_string(s.total_params)), std::string::npos);
  EXPECT_NE(json.find("\"name\": \"blocks.3.mlp.fc2\""), std::string::npos);
  const std::string md = format_summary(s, "md", 1);
  EXPECT_NE(md.find("| `final_layer` | FinalLayer |"), std::string::npos) << md;
  EXPECT_THROW(format_summary(s, "xml", 1), UsageError);
}

// Graphviz accepts the text (when dot is installed).
void expect_renders(const std::string& dot_text) {
  if (!have_graphviz()) return;
  perftrain::testing::TempDir tmp;
  const std::string path = tmp.path() + "/g.svg";
  ASSERT_NO_THROW(write_graph(dot_text, path, "svg"));
  std::ifstream f(path);
  std::string head((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(head.find("<svg"), std::string::npos);
}

TEST(ModelGraph, ModuleGraphRollsUpTheBlocksAndRenders) {
  const ViewModel v = meta_model(small_dit(), 2);
  const std::string dot = module_graph_dot(*v.model, [&] { return v.forward(); }, {});
  // Blocks after the first are not drawn.
  perftrain::testing::expect_text(
      dot, {"blocks.0..3 (DiTBlock) x4", "blocks.0..3.attn.qkv (Linear)", "next block", "t_embedder"}, {"blocks.2"});
  expect_renders(dot);
  GraphOptions shallow;
  shallow.depth = 1;
  const std::string dot1 = module_graph_dot(*v.model, [&] { return v.forward(); }, shallow);
  perftrain::testing::expect_text(dot1, {"blocks.0..3 (DiTBlock) x4"}, {"attn"});
  expect_renders(dot1);
}

TEST(ModelGraph, AutogradGraphNamesParametersAndRollsUpTheBlocks) {
  const ViewModel v = meta_model(small_dit(), 2);
  GraphOptions o;
  o.saved = true;
  const std::string dot = autograd_graph_dot(*v.model, [&] { return v.loss(); }, o);
  // Some node lists its saved tensors ("saved [").
  perftrain::testing::expect_text(dot, {"blocks.0.attn.qkv.weight", "3 more like blocks.0", "saved ["},
                                  {"blocks.1.attn.qkv.weight"});
  expect_renders(dot);
  GraphOptions all;
  all.roll_up = false;
  all.depth = 1;
  const std::string dot_all = autograd_graph_dot(*v.model, [&] { return v.loss(); }, all);
  perftrain::testing::expect_text(dot_all, {"blocks.3 (DiTBlock)", "backward nodes"});
  expect_renders(dot_all);
  GraphOptions rolled_shallow;
  rolled_shallow.depth = 1;
  const std::string dot1 = autograd_graph_dot(*v.model, [&] { return v.loss(); }, rolled_shallow);
  // Depth 1 folds the blocks' insides.
  perftrain::testing::expect_text(dot1, {"blocks.0..3 (DiTBlock) x4\\n", "3 more like blocks.0"}, {"qkv"});
  expect_renders(dot1);
}

}  // namespace
}  // namespace perftrain::models::views
