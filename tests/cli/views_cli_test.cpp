// perftrain summary and perftrain graph as a user runs them: every format,
// numbers that agree with `perftrain models`, DOT that Graphviz renders,
// usage errors that name the flag.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "models/dit_config.h"
#include "support/test_support.h"

namespace {

using perftrain::testing::TempDir;
using Result = perftrain::testing::CommandResult;

Result run(const std::string& args) { return perftrain::testing::run_shell(std::string(PERFTRAIN_BINARY) + " " + args); }

bool have_dot() { return std::system("command -v dot >/dev/null 2>&1") == 0; }

TEST(CliViews, SummaryInEveryFormat) {
  const int64_t params = perftrain::models::dit_config("DiT-S/4").parameter_count();
  auto r = run("summary DiT-S/4 --batch 3 --depth 2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("Total params: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("├─blocks (ModuleList<DiTBlock>)"), std::string::npos);
  EXPECT_NE(r.output.find("[3, 8, 32, 32]"), std::string::npos) << "the model's output shape at batch 3";
  EXPECT_NE(r.output.find("Training memory estimate"), std::string::npos);

  r = run("summary DiT-S/4 --batch 3 --format json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["total_params"].get<int64_t>(), params);
  EXPECT_GT(j["training_memory_bytes"]["total"].get<double>(), j["training_memory_bytes"]["parameters"].get<double>());
  int64_t depth1 = 0;
  for (const auto& row : j["rows"]) depth1 += row["depth"].get<int>() == 1 ? row["params"].get<int64_t>() : 0;
  EXPECT_EQ(depth1 + 64 * 384, params) << "children's parameters plus the fixed pos_embed add up to the total";

  r = run("summary DiT-S/4 --format csv --depth 1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("name,type,depth,output_shape,", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("\nfinal_layer,FinalLayer,1,"), std::string::npos) << r.output;

  TempDir tmp;
  r = run("summary DiT-S/4 --format md --depth 1 -o " + tmp.file("s.md"));
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string md = perftrain::testing::read_raw(tmp.file("s.md"));
  EXPECT_NE(md.find("| `final_layer` | FinalLayer |"), std::string::npos) << md;
  EXPECT_NE(md.find("training memory estimate"), std::string::npos);
}

// A single-stream model's modules fire their hooks too: every block and its
// attention, norms and SwiGLU have an output shape, and the attention's
// mult-adds hold its two [T, T] products (T = 1 class token + 256 patches).
TEST(CliViews, SummaryOfASingleStreamModelShowsItsHierarchy) {
  auto r = run("summary SS-S/2 --batch 2 --depth 3 --format csv");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* row :
       {"\nblocks.0,SingleStreamBlock,2,2x257x384,1,", "\nblocks.11,SingleStreamBlock,2,2x257x384,1,",
        "\nblocks.0.attn_norm,RMSNorm,3,2x257x384,1,", "\nblocks.0.ffn,SwiGLU,3,2x257x384,1,",
        "\nblocks.0.ffn_post_norm,RMSNorm,3,2x257x384,1,", "\nfinal_layer,SingleStreamFinalLayer,1,2x256x32,1,"})
    EXPECT_NE(r.output.find(row), std::string::npos) << row << "\n" << r.output;
  const double B = 2, T = 257, D = 384;
  const double attn = B * T * D * 3 * D + B * T * D * D + 2 * B * T * T * D;  // qkv, proj, the two attention products
  char want[128];
  std::snprintf(want, sizeof want, "\nblocks.0.attn,SingleStreamAttention,3,2x257x384,1,589952,589952,0,yes,%.0f\n",
                attn);
  EXPECT_NE(r.output.find(want), std::string::npos) << want << r.output;
}

TEST(CliViews, SummaryOfAConfigFileWithOverrides) {
  TempDir tmp;
  perftrain::testing::write_raw(tmp.file("c.toml"), "[model]\nname = \"DiT-S/4\"\ndepth = 3\n[train]\nbatch_size = 5\n");
  auto r = run("summary --config " + tmp.file("c.toml") + " --set model.image_size=16 --format json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_NE(j["title"].get<std::string>().find("batch 5, input [5, 1, 16, 16]"), std::string::npos) << j["title"];
  int blocks = 0;
  for (const auto& row : j["rows"]) blocks += row["type"] == "DiTBlock";
  EXPECT_EQ(blocks, 3);
}

TEST(CliViews, GraphsAsDotSvgAndPng) {
  TempDir tmp;
  for (const std::string kind : {"modules", "autograd"}) {
    auto r = run("graph DiT-S/4 --kind " + kind + (kind == "autograd" ? " --saved" : ""));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(r.output.rfind("digraph G {", 0), 0u) << r.output.substr(0, 200);
    EXPECT_NE(r.output.find("blocks.0..11"), std::string::npos);
    r = run("graph DiT-S/4 --kind " + kind + " --depth 1 -o " + tmp.file(kind + ".dot"));
    ASSERT_EQ(r.code, 0) << r.output;
    if (have_dot()) {
      for (const std::string fmt : {"svg", "png"}) {
        const std::string out = tmp.file(kind + "." + fmt);
        r = run("graph DiT-S/4 --kind " + kind + " -o " + out);
        ASSERT_EQ(r.code, 0) << r.output;
        const std::string bytes = perftrain::testing::read_raw(out);
        EXPECT_NE(bytes.find(fmt == "svg" ? "<svg" : "PNG"), std::string::npos) << out;
      }
      // The DOT file written with -o renders too.
      r = perftrain::testing::run_shell("dot -Tsvg " + tmp.file(kind + ".dot") + " -o " + tmp.file(kind + "-dot.svg"));
      EXPECT_EQ(r.code, 0) << r.output;
    }
  }
}

// The model by --model as bench, profile and train take it, or positionally;
// --batch-size as every command spells it, or -b / --batch.
TEST(CliViews, ModelAndBatchSizeAsEveryCommandSpellsThem) {
  const auto positional = run("summary DiT-T/4 --batch 3 --format json");
  ASSERT_EQ(positional.code, 0) << positional.output;
  const auto named = run("summary --model DiT-T/4 --batch-size 3 --format json");
  ASSERT_EQ(named.code, 0) << named.output;
  EXPECT_EQ(named.output, positional.output);
  EXPECT_EQ(nlohmann::json::parse(named.output)["title"].get<std::string>().rfind("DiT-T/4, batch 3", 0), 0u);
  const auto graph = run("graph --model DiT-T/4 --batch-size 2");
  ASSERT_EQ(graph.code, 0) << graph.output;
  EXPECT_EQ(graph.output, run("graph DiT-T/4 -b 2").output);
  EXPECT_NE(graph.output.find("DiT-T/4 module graph"), std::string::npos) << graph.output.substr(0, 300);
}

TEST(CliViews, UsageErrorsNameTheFlag) {
  auto r = run("summary DiT-S/4 --format xml");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--format"), std::string::npos) << r.output;
  r = run("summary DiT-Q/2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("DiT-XL/2"), std::string::npos) << "lists the known models: " << r.output;
  for (const auto& name : perftrain::models::single_stream_model_names())  // every family's
    EXPECT_NE(r.output.find(" " + name), std::string::npos) << name << ": " << r.output;
  r = run("graph --model SS-Q/2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("DiT-T/8"), std::string::npos) << r.output;
  r = run("graph DiT-S/4 --kind weights");
  EXPECT_EQ(r.code, 2) << r.output;
  r = run("graph DiT-S/4 --format svg");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("-o"), std::string::npos) << r.output;
}

}  // namespace

// A looped model: the shared block once with its loops (×8), the per-loop
// adapters as one row per target, the totals as `perftrain models` counts them.
TEST(CliViewsLooped, SummaryShowsTheSharedBlockOnceWithItsLoops) {
  perftrain::models::DiTConfig cfg = perftrain::models::model_config("Looped-S/4");
  cfg.lora_rank = 8;
  const int64_t params = cfg.parameter_count();
  auto r = run("summary Looped-S/4 --set model.lora_rank=8 --batch 2 --depth 9");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("├─shared (ModuleList<DiTBlock>)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("] ×8"), std::string::npos) << "the shared block's applications: " << r.output;
  EXPECT_NE(r.output.find("0..7 (ModuleList<BlockAdapters>) ×8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("qkv (LoRAAdapter) ×8"), std::string::npos) << r.output;
  r = run("summary Looped-S/4 --set model.lora_rank=8 --batch 2 --format json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["total_params"].get<int64_t>(), params);
  int64_t rolled = 0, loop1 = 0;
  for (const auto& row : j["rows"]) {
    const std::string name = row["name"].get<std::string>();
    if (name == "adapters.0..7") rolled = row["repeat"].get<int64_t>();
    loop1 += name.rfind("adapters.1", 0) == 0;
  }
  EXPECT_EQ(rolled, 8);
  EXPECT_EQ(loop1, 0) << "loops 1..7 are in loop 0's rows";
}
