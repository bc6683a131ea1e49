// The bench's results: rates from a step time, the per-batch summary against
// the best PyTorch mode, and the JSON / Markdown / stdout renderings of them
// (n/a where a number is missing, errors kept, the summary complete).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "observe/bench/report.h"
#include "support/test_support.h"

namespace {

using namespace perftrain::observe::bench;

using perftrain::testing::contains;

BenchRow row(int64_t batch, const std::string& variant, std::optional<double> ms, const std::string& error = "") {
  BenchRow r;
  r.model = "DiT-S/2";
  r.batch = batch;
  r.variant = variant;
  r.precision = variant == "eager-fp32" ? "fp32" : "bf16";
  r.graph = variant == "all" || variant == "graph";
  r.warmup = 6;
  r.steps = 30;
  r.repeats = 1;
  r.error = error;
  if (error.empty()) {
    r.ms = ms;
    r.ms_p10 = *ms * 0.98;
    r.ms_p90 = *ms * 1.03;
    r.ms_min = *ms * 0.97;
    r.ms_ci_low = *ms * 0.99;
    r.ms_ci_high = *ms * 1.01;
    r.peak_gib = 3.25;
    r.peak_gib_warmup = 3.25;
    r.peak_gib_steady = 1.5;
    r.held_gib_before = 0.25;
    r.first_step_s = 1.5;
    r.graph_status = r.graph ? "captured at step 4" : "eager: graph off";
    fill_rates(r, 3 * 1e9 * static_cast<double>(batch), 800.0);
  }
  return r;
}

TorchRow torch_row(int64_t batch, const std::string& mode, std::optional<double> ms, const std::string& error = "") {
  TorchRow t;
  t.model = "DiT-S/2";
  t.batch = batch;
  t.mode = mode;
  t.ms = ms;
  t.error = error;
  t.log_path = "/runs/x/torch-b" + std::to_string(batch) + "-" + mode + ".log";
  if (ms) {
    t.tflops = 3 * 1e9 * static_cast<double>(batch) / (*ms / 1e3) / 1e12;
    fill_rates(t, 800.0);
  }
  return t;
}

BenchReport sample_report() {
  BenchReport r;
  r.environment.device = "NVIDIA H200 (sm_90, 132 SMs, 139 GiB)";
  r.environment.gpu_name = "NVIDIA H200";
  r.environment.commit = "abc1234";
  r.matmul_peak.tflops = 800.0;
  r.matmul_peak.note = "bf16 mm 8192^3";
  r.settings.model = "DiT-S/2";
  r.settings.batches = {32, 256};
  r.settings.variants = {"eager-bf16", "fused", "all"};
  r.settings.device = "cuda";
  r.settings.against_torch = true;
  r.settings.torch_modes = {"compile", "reduce-overhead"};
  r.settings.optimizer = "AdamW lr 0.0001";
  // Batch 32: 'all' is slower than 'fused' here but is still ours (the full
  // stack). Batch 256: 'all' failed, so the fastest that ran stands in.
  r.rows = {row(32, "eager-bf16", 27.0), row(32, "fused", 5.0), row(32, "all", 5.5),
            row(256, "eager-bf16", 70.0), row(256, "fused", 30.0),
            row(256, "all", std::nullopt, "CUDA out of memory | tried to allocate 2 GiB")};
  r.torch = {torch_row(32, "compile", 16.9), torch_row(32, "reduce-overhead", 6.6),
             torch_row(256, "compile", 35.8), torch_row(256, "reduce-overhead", std::nullopt, "exit status 1: boom")};
  r.summary = summarize_batches(r.rows, r.torch);
  return r;
}

TEST(BenchReport, RatesFromTheStepTime) {
  BenchRow r;
  r.batch = 256;
  r.ms = 100.0;
  fill_rates(r, 3 * 1e9 * 256, 768.0);  // 768 GFLOP per step in 0.1 s
  EXPECT_NEAR(*r.images_per_s, 2560.0, 1e-9);
  EXPECT_NEAR(*r.tflops, 7.68, 1e-12);
  EXPECT_NEAR(*r.mfu, 0.01, 1e-12);
  BenchRow no_peak;
  no_peak.batch = 2;
  no_peak.ms = 4.0;
  fill_rates(no_peak, 1e9, std::nullopt);
  EXPECT_NEAR(*no_peak.tflops, 0.25, 1e-12);  // 1 GFLOP in 4 ms
  EXPECT_FALSE(no_peak.mfu.has_value());
  BenchRow failed;
  fill_rates(failed, 1e9, 800.0);
  EXPECT_FALSE(failed.tflops.has_value());
}

TEST(BenchReport, SummaryTakesOurFullStackAgainstTheBestTorchMode) {
  auto r = sample_report();
  ASSERT_EQ(r.summary.size(), 2u);
  const auto& s32 = r.summary[0];
  EXPECT_EQ(s32.batch, 32);
  EXPECT_EQ(s32.model, "DiT-S/2");
  EXPECT_EQ(s32.variant, "all");
  EXPECT_DOUBLE_EQ(*s32.ms, 5.5);
  EXPECT_EQ(s32.best_torch_mode, "reduce-overhead");
  EXPECT_DOUBLE_EQ(*s32.best_torch_ms, 6.6);
  EXPECT_NEAR(*s32.speedup_vs_best_torch, 6.6 / 5.5, 1e-12);
  EXPECT_NEAR(*s32.mfu, 3e9 * 32 / 5.5e-3 / 1e12 / 800, 1e-12);
  EXPECT_EQ(s32.graph_status, "captured at step 4");
  const auto& s256 = r.summary[1];
  EXPECT_EQ(s256.variant, "fused");  // 'all' ran out of memory
  EXPECT_EQ(s256.best_torch_mode, "compile");  // reduce-overhead failed
  EXPECT_NEAR(*s256.speedup_vs_best_torch, 35.8 / 30.0, 1e-12);
  // Every row of ours that ran carries its own ratio.
  EXPECT_NEAR(*r.rows[0].speedup_vs_best_torch, 6.6 / 27.0, 1e-12);
  EXPECT_FALSE(r.rows[5].speedup_vs_best_torch.has_value());

  // No torch rows: no ratio; no row that ran: says so.
  std::vector<BenchRow> rows = {row(8, "all", std::nullopt, "boom")};
  auto s = summarize_batches(rows, {});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].error, "no variant ran");
  EXPECT_TRUE(s[0].best_torch_mode.empty());
  EXPECT_FALSE(s[0].speedup_vs_best_torch.has_value());
}

// The best torch is the fastest of every mode measured at that batch (the
// max-autotune ones among them), whichever order they ran in; a failed mode
// or another batch's does not count. Its first step and how warm its cache
// was travel with it into the summary, bench.json and the table.
TEST(BenchReport, BestTorchIsTheFastestOfEveryMode) {
  auto r = sample_report();
  auto with_cache = [](TorchRow t, const std::string& cache, double first_step_s) {
    t.torch_cache = cache;
    t.torch_cache_hits = cache == "warm" ? 6 : 0;
    t.torch_cache_misses = cache == "warm" ? 0 : 6;
    t.first_step_s = first_step_s;
    return t;
  };
  r.torch = {torch_row(32, "eager-bf16", 20.0),
             with_cache(torch_row(32, "compile", 7.0), "warm", 40.0),
             with_cache(torch_row(32, "reduce-overhead", 6.6), "warm", 45.0),
             torch_row(32, "max-autotune", std::nullopt, "exit status 124"),
             with_cache(torch_row(32, "max-autotune-no-cudagraphs", 6.1), "cold", 530.5),
             with_cache(torch_row(256, "max-autotune", 1.0), "warm", 60.0)};
  r.torch[0].first_step_s = 12.0;
  r.summary = summarize_batches(r.rows, r.torch);
  const auto& s32 = r.summary[0];
  EXPECT_EQ(s32.best_torch_mode, "max-autotune-no-cudagraphs");
  EXPECT_DOUBLE_EQ(*s32.best_torch_ms, 6.1);
  EXPECT_DOUBLE_EQ(*s32.best_torch_first_step_s, 530.5);
  EXPECT_EQ(s32.best_torch_cache, "cold");
  EXPECT_NEAR(*s32.speedup_vs_best_torch, 6.1 / 5.5, 1e-12);
  EXPECT_EQ(r.summary[1].best_torch_mode, "max-autotune");
  std::reverse(r.torch.begin(), r.torch.end());  // the order they ran in does not matter
  EXPECT_EQ(summarize_batches(r.rows, r.torch)[0].best_torch_mode, "max-autotune-no-cudagraphs");

  const auto j = nlohmann::json::parse(to_json(r).dump());
  EXPECT_EQ(j["summary"][0]["best_torch_cache"], "cold");
  EXPECT_EQ(j["torch"][0]["torch_cache"], "warm");  // reversed: 256 max-autotune first
  EXPECT_EQ(j["torch"][0]["torch_cache_hits"], 6);
  EXPECT_EQ(j["torch"][0]["torch_cache_misses"], 0);
  EXPECT_TRUE(j["torch"][5]["torch_cache"].is_null()) << "eager: nothing compiled";
  EXPECT_TRUE(j["torch"][5]["torch_cache_hits"].is_null());
  const auto table = format_table(r);
  EXPECT_TRUE(contains(table, "best torch max-autotune-no-cudagraphs 6.10 ms (first step 530.5 s, cache cold) | "
                              "speedup 1.11x"))
      << table;
  EXPECT_TRUE(contains(table, "(first step from process start; cache cold (0 graphs found, 6 compiled))")) << table;
  EXPECT_TRUE(contains(table, "12.00  (first step from process start)\n")) << table;
  // The name column fits the longest mode: the numbers stay in their columns.
  EXPECT_TRUE(contains(table, "  torch max-autotune-no-cudagraphs        6.10")) << table;
  const auto md = to_markdown(r);
  EXPECT_TRUE(contains(md, "| 32 | torch max-autotune-no-cudagraphs | 6.10 |")) << md;
  EXPECT_TRUE(contains(md, "530.50 (from process start) |  | torch ; cache cold (0 graphs found, 6 compiled) |")) << md;
}

TEST(BenchReport, JsonHasEveryFieldWithNullsForTheMissing) {
  auto r = sample_report();
  r.matmul_peak.tflops.reset();  // as on a machine where it could not be measured
  r.matmul_peak.note = "n/a: no CUDA device";
  const auto j = nlohmann::json::parse(to_json(r).dump());  // survives a round trip through text
  for (const char* k :
       {"environment", "matmul_peak_tflops", "config", "method", "rows", "torch", "summary", "gemm_tuning"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_TRUE(j["matmul_peak_tflops"].is_null());
  EXPECT_EQ(j["environment"]["commit"], "abc1234");
  EXPECT_EQ(j["config"]["batches"], nlohmann::json({32, 256}));
  ASSERT_EQ(j["rows"].size(), 6u);
  const auto& ok = j["rows"][2];
  for (const char* k : {"model", "batch", "variant", "ms", "ms_p10", "ms_p90", "ms_min", "images_per_s", "tflops",
                        "mfu", "peak_gib", "first_step_s", "graph_status", "weight_grad_stream",
                        "speedup_vs_best_torch", "error"})
    EXPECT_TRUE(ok.contains(k)) << k;
  EXPECT_EQ(ok["variant"], "all");
  EXPECT_DOUBLE_EQ(ok["ms"].get<double>(), 5.5);
  EXPECT_DOUBLE_EQ(ok["peak_gib_warmup"].get<double>(), 3.25);
  EXPECT_DOUBLE_EQ(ok["peak_gib_steady"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(ok["held_gib_before"].get<double>(), 0.25);
  EXPECT_TRUE(ok["error"].is_null());
  const auto& failed = j["rows"][5];
  EXPECT_TRUE(failed["ms"].is_null());
  EXPECT_EQ(failed["error"], "CUDA out of memory | tried to allocate 2 GiB");
  EXPECT_EQ(j["torch"][3]["error"], "exit status 1: boom");
  EXPECT_TRUE(contains(j["torch"][3]["log"].get<std::string>(), "reduce-overhead.log"));
  ASSERT_EQ(j["summary"].size(), 2u);
  for (const auto& s : j["summary"])
    for (const char* k : {"model", "batch", "ms", "mfu", "peak_gib", "first_step_s", "best_torch_mode",
                          "best_torch_ms", "speedup_vs_best_torch"}) {
      EXPECT_TRUE(s.contains(k)) << k;
      EXPECT_FALSE(s[k].is_null()) << k;
    }
}

// The [speed] config the variants ran with: typed in bench.json, one line in
// bench.md; a report without it says n/a.
TEST(BenchReport, SpeedSettingsInJsonAndMarkdown) {
  BenchReport r;
  r.settings.model = "DiT-S/2";
  // As config.toml writes them: TOML literal strings.
  r.settings.speed = {{"graph", "true"}, {"recompute", "false"}, {"attention", "'cudnn'"}, {"gemm_tune", "0"}};
  const auto j = nlohmann::json::parse(to_json(r).dump());
  const auto& speed = j["config"]["speed"];
  EXPECT_EQ(speed["graph"], true) << speed.dump();
  EXPECT_EQ(speed["recompute"], false) << speed.dump();
  EXPECT_EQ(speed["attention"], "cudnn") << speed.dump();
  EXPECT_EQ(speed["gemm_tune"], 0) << speed.dump();
  EXPECT_FALSE(j["config"].contains("gelu_recompute")) << "in speed, not beside it: " << j["config"].dump();
  const auto md = to_markdown(r);
  EXPECT_TRUE(contains(md, "| speed | graph = true, recompute = false, attention = 'cudnn', gemm_tune = 0 (")) << md;
  r.settings.speed.clear();
  EXPECT_TRUE(contains(to_markdown(r), "| speed | n/a (")) << to_markdown(r);
  EXPECT_TRUE(nlohmann::json::parse(to_json(r).dump())["config"]["speed"].empty());
}

TEST(BenchReport, MarkdownAndTable) {
  auto r = sample_report();
  r.rows[2].weight_grad_stream = true;  // batch 32 'all'
  const auto md = to_markdown(r);
  EXPECT_TRUE(contains(md, "| captured at step 4; weight gradients on a second stream |")) << md;
  EXPECT_TRUE(contains(format_table(r), "captured at step 4; weight gradients on a second stream")) << format_table(r);
  EXPECT_EQ(nlohmann::json::parse(to_json(r).dump())["rows"][2]["weight_grad_stream"], true);
  EXPECT_EQ(execution_note(r.rows[1]), "eager: graph off");
  for (const char* part : {"# perftrain bench: DiT-S/2", "## Environment", "| commit | abc1234 |", "## Method",
                           "CUDA events", "median", "## Results", "| 32 | all | 5.50 |",
                           "| 256 | torch compile | 35.80", "## Summary", "| DiT-S/2 | 256 | fused | 30.00 |",
                           "1.19x", "800.0 TFLOP/s"})
    EXPECT_TRUE(contains(md, part)) << part << "\n" << md;
  // A '|' inside an error message must not break the table.
  EXPECT_TRUE(contains(md, "CUDA out of memory \\| tried")) << md;

  const auto table = format_table(r);
  EXPECT_TRUE(contains(table, "error: CUDA out of memory")) << table;
  EXPECT_TRUE(contains(table, "torch reduce-overhead")) << table;
  EXPECT_TRUE(contains(table, "error: exit status 1: boom (log: /runs/x/torch-b256-reduce-overhead.log)")) << table;
  EXPECT_TRUE(contains(table, "DiT-S/2 batch 32: all 5.50 ms")) << table;
  EXPECT_TRUE(contains(table, "best torch reduce-overhead 6.60 ms | speedup 1.20x")) << table;

  // Without a measured peak or torch rows, the same writers say n/a.
  BenchReport cpu;
  cpu.settings.model = "DiT-T/4";
  cpu.settings.device = "cpu";
  cpu.matmul_peak.note = "n/a: no CUDA device";
  cpu.rows = {row(2, "eager-fp32", 120.0)};
  cpu.rows[0].mfu.reset();
  cpu.summary = summarize_batches(cpu.rows, {});
  const auto cpu_md = to_markdown(cpu);
  EXPECT_TRUE(contains(cpu_md, "| measured bf16 matmul peak | n/a (n/a: no CUDA device) |")) << cpu_md;
  EXPECT_TRUE(contains(cpu_md, "the host clock")) << cpu_md;
  EXPECT_TRUE(contains(format_table(cpu), "DiT-S/2 batch 2: eager-fp32 120.00 ms")) << format_table(cpu);
  EXPECT_EQ(format_number(std::nullopt, 2), "n/a");
  EXPECT_EQ(format_number(1.23456, 2), "1.23");
}

// The tuned product shapes: all in the JSON, in order; in the Markdown only
// those that changed algorithm (with how many were tuned); no section when
// nothing was tuned.
TEST(BenchReport, GemmTuningInJsonAndMarkdown) {
  auto r = sample_report();
  EXPECT_TRUE(to_json(r)["gemm_tuning"].empty());
  EXPECT_FALSE(contains(to_markdown(r), "## Matrix-product algorithms"));
  r.gemm_tuning = {{"DGELU m=65536 n=1536 k=384 A=bf16 B=bf16 D=bf16", 8, 1, 0.266, 0.230},
                   {"DEFAULT m=8192 n=384 k=384 A=bf16 B=bf16^T D=bf16", 8, 0, 0.0081, 0.0081}};
  const auto j = to_json(r);
  ASSERT_EQ(j["gemm_tuning"].size(), 2u);
  EXPECT_EQ(j["gemm_tuning"][0]["what"], "DGELU m=65536 n=1536 k=384 A=bf16 B=bf16 D=bf16");
  EXPECT_EQ(j["gemm_tuning"][0]["candidates"], 8);
  EXPECT_EQ(j["gemm_tuning"][0]["chosen"], 1);
  EXPECT_DOUBLE_EQ(j["gemm_tuning"][0]["heuristic_ms"].get<double>(), 0.266);
  EXPECT_DOUBLE_EQ(j["gemm_tuning"][0]["chosen_ms"].get<double>(), 0.230);
  EXPECT_EQ(j["gemm_tuning"][1]["chosen"], 0);
  const auto md = to_markdown(r);
  EXPECT_TRUE(contains(md, "## Matrix-product algorithms")) << md;
  EXPECT_TRUE(contains(md, "2 product shapes were tuned")) << md;
  EXPECT_TRUE(contains(md, "1 run a faster algorithm")) << md;
  EXPECT_TRUE(contains(md, "| DGELU m=65536 n=1536 k=384 A=bf16 B=bf16 D=bf16 | 0.2660 | 0.2300 | 1 of 8 |")) << md;
  EXPECT_FALSE(contains(md, "DEFAULT m=8192")) << "unchanged shapes are left out of the table\n" << md;
}

// What nvidia-smi saw during a row's timed steps: in its JSON (nulls without
// samples) and, only when there were samples, a Markdown section.
TEST(BenchReport, GpuDuringTheTimedSteps) {
  auto r = sample_report();
  EXPECT_EQ(to_json(r.rows[0])["gpu_during_timing"]["samples"], 0);
  EXPECT_TRUE(to_json(r.rows[0])["gpu_during_timing"]["sm_clock_mhz_median"].is_null());
  EXPECT_FALSE(contains(to_markdown(r), "## The GPU during the timed steps"));
  r.rows[0].gpu = parse_gpu_samples("1755, 1980, 690, 700, 61\n1745, 1980, 695, 700, 62\n");
  const auto j = to_json(r.rows[0])["gpu_during_timing"];
  EXPECT_EQ(j["samples"], 2);
  EXPECT_DOUBLE_EQ(j["sm_clock_mhz_median"].get<double>(), 1750);
  EXPECT_DOUBLE_EQ(j["at_power_limit"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["power_limit_w"].get<double>(), 700);
  const auto md = to_markdown(r);
  EXPECT_TRUE(contains(md, "## The GPU during the timed steps")) << md;
  EXPECT_TRUE(contains(md, "| 1750 (min 1745, max 1980) | 692 of 700 | 100.0% | 62 |")) << md;
}

TEST(BenchReport, WritesBothFiles) {
  perftrain::testing::TempDir tmp;
  write_report_files(tmp.path(), sample_report());
  const auto j = nlohmann::json::parse(perftrain::testing::read_raw(tmp.file("bench.json")));
  EXPECT_EQ(j["summary"][0]["variant"], "all");
  EXPECT_TRUE(contains(perftrain::testing::read_raw(tmp.file("bench.md")), "## Summary"));
  EXPECT_EQ(tmp.entries(), (std::vector<std::string>{"bench.json", "bench.md"}));
}

}  // namespace
