// perftrain summary and graph of a looped model: the shared block's weights
// once with its applications (×L), the per-loop adapters rolled up into one
// row per target, parameter totals as the config counts them; the graph
// with one box for the shared block, its next-loop edge and the adapters.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "models/views/graph.h"
#include "models/views/module_summary.h"
#include "models/views/view_model.h"

namespace perftrain::models::views {
namespace {

// Looped-T/2 at 8x8 latents: prelude 1, one shared block x 4 loops, coda 1,
// LoRA rank 4 with bias deltas on every block linear.
DiTConfig small_looped(int64_t rank = 4) {
  DiTConfig c = model_config("Looped-T/2");
  c.image_size = 8;
  c.num_classes = 10;
  c.prelude = 1;
  c.coda = 1;
  c.loops = 4;
  c.lora_rank = rank;
  c.lora_targets = "attn,mlp,adaln";
  c.lora_bias = true;
  c.depth = c.looped_depth();
  return c;
}

const SummaryRow* find_row(const ModuleSummary& s, const std::string& name) {
  for (const SummaryRow& r : s.rows)
    if (r.name == name) return &r;
  return nullptr;
}

TEST(LoopedViews, SummaryCountsTheSharedBlockOnceAndShowsItsLoops) {
  const DiTConfig cfg = small_looped();
  const ViewModel v = meta_model(cfg, 2);
  const ModuleSummary s = summarize_module(*v.model, [&] { v.forward(); });
  EXPECT_EQ(s.total_params, cfg.parameter_count());
  const SummaryRow* shared = find_row(s, "shared.0");
  ASSERT_NE(shared, nullptr);
  EXPECT_EQ(shared->calls, 4) << "applied once per loop";
  const SummaryRow* prelude = find_row(s, "prelude.0");
  ASSERT_NE(prelude, nullptr);
  EXPECT_EQ(shared->params, prelude->params) << "the shared block's weights counted once";
  EXPECT_DOUBLE_EQ(shared->mult_adds, 4 * prelude->mult_adds) << "each application costs a block";
  // The adapters: one row per target standing for the 4 loops.
  EXPECT_EQ(find_row(s, "adapters.1"), nullptr) << "loops 1..3 are rolled into loop 0's rows";
  const SummaryRow* list = find_row(s, "adapters.0..3");
  ASSERT_NE(list, nullptr);
  EXPECT_EQ(list->repeat, 4);
  const SummaryRow* qkv = find_row(s, "adapters.0..3.0.attn.qkv");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->repeat, 4);
  EXPECT_EQ(qkv->params, 4 * (4 * (cfg.hidden + 3 * cfg.hidden) + 3 * cfg.hidden)) << "A, B and the bias delta, x4";
  const std::string table = format_summary(s, "table", 9);
  EXPECT_NE(table.find("×4"), std::string::npos) << table;
  EXPECT_NE(table.find("0..3 (ModuleList<BlockAdapters>) ×4"), std::string::npos) << table;
  EXPECT_NE(table.find("qkv (LoRAAdapter) ×4"), std::string::npos) << table;
}

TEST(LoopedViews, SummaryMultAddsMatchTheConfigAtRankZero) {
  const DiTConfig cfg = small_looped(0);
  const ViewModel v = meta_model(cfg, 3);
  const ModuleSummary s = summarize_module(*v.model, [&] { v.forward(); });
  EXPECT_NEAR(s.total_mult_adds * 2, 3 * cfg.forward_flops_per_sample(), 0.02 * s.total_mult_adds * 2);
}

TEST(LoopedViews, ModuleGraphDrawsTheLoopOnceWithItsAdapters) {
  const ViewModel v = meta_model(small_looped(), 2);
  GraphOptions o;
  const std::string dot = module_graph_dot(*v.model, [&] { return v.forward(); }, o);
  EXPECT_NE(dot.find("shared.0 (DiTBlock)"), std::string::npos) << dot;
  EXPECT_NE(dot.find("applied ×4"), std::string::npos) << dot;
  EXPECT_NE(dot.find("next loop ×3"), std::string::npos) << dot;
  EXPECT_NE(dot.find("not called: read as weights"), std::string::npos) << dot;
  EXPECT_NE(dot.find("each loop's LoRA"), std::string::npos) << dot;
  EXPECT_EQ(dot.find("shared (ModuleList<DiTBlock>)\\nnot called"), std::string::npos)
      << "a list whose blocks ran is no weight list: " << dot;
}

TEST(LoopedViews, AutogradGraphDrawsTheFirstLoopAndRollsUpTheOthers) {
  const ViewModel v = meta_model(small_looped(), 2);
  GraphOptions o;
  const std::string dot = autograd_graph_dot(*v.model, [&] { return v.loss(); }, o);
  EXPECT_NE(dot.find("adapters.0.0.attn.qkv.lora_A"), std::string::npos) << "loop 0's adapters drawn";
  EXPECT_EQ(dot.find("adapters.2.0.attn.qkv.lora_A"), std::string::npos) << "later loops' adapters rolled up";
  EXPECT_NE(dot.find("applied ×3 more"), std::string::npos) << dot.substr(0, 4000);
  o.roll_up = false;
  const std::string all = autograd_graph_dot(*v.model, [&] { return v.loss(); }, o);
  EXPECT_NE(all.find("adapters.2.0.attn.qkv.lora_A"), std::string::npos);
}

}  // namespace
}  // namespace perftrain::models::views
