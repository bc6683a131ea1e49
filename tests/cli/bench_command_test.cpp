// `perftrain bench` as a user runs it on a CPU-only machine: a tiny model, one
// variant, the GPU-only parts (matmul peak, CUDA events, nvidia-smi) saying
// n/a, bench.json and bench.md written; bad options exit 2 with a message;
// with --against-torch the PyTorch reference runs beside it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "models/dit_config.h"
#include "support/test_support.h"

namespace {

using perftrain::testing::TempDir;

using Result = perftrain::testing::CommandResult;
using perftrain::testing::run_shell;

Result run(const std::string& args) { return run_shell(std::string(PERFTRAIN_BINARY) + " " + args); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const std::string kCpu = "bench --device cpu --model DiT-T/4 --batch 2 --steps 2 --warmup 1 --variants eager-fp32";
// The same without a batch size.
const std::string kCpuAnyBatch = "bench --device cpu --model DiT-T/4 --steps 2 --warmup 1 --variants eager-fp32";

TEST(CliBench, RunsOnTheCpuAndWritesItsReport) {
  TempDir tmp;
  const std::string out = tmp.file("b");
  auto r = run(kCpu + " --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "bf16 matmul peak: n/a")) << r.output;
  EXPECT_TRUE(contains(r.output, "DiT-T/4 batch 2: eager-fp32")) << r.output;
  EXPECT_TRUE(contains(r.output, "eager: CPU device")) << r.output;

  const auto j = nlohmann::json::parse(perftrain::testing::read_raw(out + "/bench.json"));
  EXPECT_TRUE(j["matmul_peak_tflops"].is_null());
  EXPECT_EQ(j["environment"]["gpu"], "n/a");
  EXPECT_EQ(j["environment"]["sm_clock"], "n/a");
  EXPECT_EQ(j["config"]["model"], "DiT-T/4");
  EXPECT_EQ(j["config"]["learn_sigma"], false);
  EXPECT_EQ(j["config"]["objective"], "ddpm");
  ASSERT_EQ(j["rows"].size(), 1u);
  const auto& row = j["rows"][0];
  EXPECT_TRUE(row["error"].is_null()) << row.dump(2);
  EXPECT_EQ(row["variant"], "eager-fp32");
  EXPECT_EQ(row["batch"], 2);
  EXPECT_EQ(row["step_ms"].size(), 2u);
  EXPECT_GT(row["ms"].get<double>(), 0.0);
  EXPECT_LE(row["ms_min"].get<double>(), row["ms"].get<double>());
  EXPECT_GT(row["tflops"].get<double>(), 0.0);
  EXPECT_TRUE(row["mfu"].is_null());       // no measured peak on the CPU
  EXPECT_TRUE(row["peak_gib"].is_null());  // no allocator statistics on the CPU
  for (const char* k : {"peak_gib_warmup", "peak_gib_steady", "held_gib_before"})
    EXPECT_TRUE(row.contains(k) && row[k].is_null()) << k;
  EXPECT_GT(row["first_step_s"].get<double>(), 0.0);
  EXPECT_TRUE(std::isfinite(row["loss"].get<double>()));
  ASSERT_EQ(j["summary"].size(), 1u);
  EXPECT_EQ(j["summary"][0]["variant"], "eager-fp32");
  EXPECT_EQ(j["summary"][0]["ms"], row["ms"]);
  EXPECT_TRUE(j["summary"][0]["speedup_vs_best_torch"].is_null());
  const auto md = perftrain::testing::read_raw(out + "/bench.md");
  EXPECT_TRUE(contains(md, "## Method")) << md;
  EXPECT_TRUE(contains(md, "| 2 | eager-fp32 |")) << md;

  // A second run into the same directory would overwrite it: refused.
  r = run(kCpu + " --out " + out);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "already holds a bench.json")) << r.output;
}

// --cooldown: the GPU idle before each variant (two here, one that cannot
// run on a CPU), said in the
// report; without it the optimizer line says the step has no EMA (as
// torch's), with --ema it names the EMA.
TEST(CliBench, CooldownAndEmaAreRecorded) {
  TempDir tmp;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run(kCpu + ",eager-bf16 --cooldown 0.4 --out " + tmp.file("c"));  // bf16: a row saying it needs a GPU
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_GE(took, 0.8) << "two variants, 0.4 s of cool-down before each";
  auto j = nlohmann::json::parse(perftrain::testing::read_raw(tmp.file("c/bench.json")));
  EXPECT_DOUBLE_EQ(j["config"]["cooldown_s"].get<double>(), 0.4);
  EXPECT_TRUE(contains(j["config"]["optimizer"].get<std::string>(), "no EMA")) << j["config"].dump(2);
  const auto md = perftrain::testing::read_raw(tmp.file("c/bench.md"));
  EXPECT_TRUE(contains(md, "after 0.4 s with the GPU idle")) << md;

  r = run(kCpu + " --ema --out " + tmp.file("e"));
  ASSERT_EQ(r.code, 0) << r.output;
  j = nlohmann::json::parse(perftrain::testing::read_raw(tmp.file("e/bench.json")));
  EXPECT_TRUE(contains(j["config"]["optimizer"].get<std::string>(), "EMA 0.9999")) << j["config"].dump(2);
  EXPECT_DOUBLE_EQ(j["config"]["cooldown_s"].get<double>(), 0.0);
  EXPECT_TRUE(std::isfinite(j["rows"][0]["loss"].get<double>()));
}

TEST(CliBench, AVariantThatCannotRunIsARowNotACrash) {
  TempDir tmp;
  // bf16 needs a GPU: that row says so, the fp32 row still runs.
  auto r = run(kCpu + ",eager-bf16 --out " + tmp.file("b"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "needs a CUDA device")) << r.output;
  const auto j = nlohmann::json::parse(perftrain::testing::read_raw(tmp.file("b/bench.json")));
  ASSERT_EQ(j["rows"].size(), 2u);
  EXPECT_TRUE(j["rows"][0]["error"].is_null());
  EXPECT_TRUE(contains(j["rows"][1]["error"].get<std::string>(), "needs a CUDA device"));
  EXPECT_EQ(j["summary"][0]["variant"], "eager-fp32");
  // Only failing rows: the report is still written, and the exit status says so.
  r = run("bench --device cpu --model DiT-T/4 --batch 2 --steps 2 --variants all --out " + tmp.file("c"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "no variant ran")) << r.output;
  EXPECT_TRUE(perftrain::fs::exists(tmp.file("c/bench.json")));
}

// --set: a config key for every variant (here with --recompute, the flag for
// speed.recompute), every [speed] key with its value in the report's config.
TEST(CliBench, SetOverridesTheSpeedConfigAndTheReportSaysSo) {
  TempDir tmp;
  auto r = run(kCpu + " --recompute --set speed.attention=cudnn --set speed.gemm_tune=0 --out " + tmp.file("s"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(perftrain::testing::read_raw(tmp.file("s/bench.json")));
  const auto& speed = j["config"]["speed"];
  EXPECT_EQ(speed["attention"], "cudnn") << speed.dump(2);
  EXPECT_EQ(speed["gemm_tune"], 0) << speed.dump(2);
  EXPECT_EQ(speed["weight_grad_stream"], "auto") << speed.dump(2);
  EXPECT_EQ(speed["recompute"], true) << speed.dump(2);
  EXPECT_EQ(speed["gelu_recompute"], false) << speed.dump(2);
  EXPECT_EQ(speed.size(), 8u) << "every [speed] key: " << speed.dump(2);
  EXPECT_EQ(j["rows"][0]["recompute"], true);
  EXPECT_FALSE(j["environment"].contains("switches")) << j["environment"].dump(2);
  const auto md = perftrain::testing::read_raw(tmp.file("s/bench.md"));
  EXPECT_TRUE(contains(md, "attention = 'cudnn'")) << md;
}

// --set train.precision=fp8 (or --precision fp8): the variants with fused
// kernels run fp8 (on the CPU on the references), the others bf16; the
// report names it.
TEST(CliBench, Fp8RunsInTheFusedVariants) {
  TempDir tmp;
  auto r = run("bench --device cpu --model DiT-T/4 --batch 2 --steps 2 --warmup 1 --variants fused,eager-fp32"
               " --set train.precision=fp8 --out " + tmp.file("f"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(perftrain::testing::read_raw(tmp.file("f/bench.json")));
  ASSERT_EQ(j["rows"].size(), 2u) << j["rows"].dump(2);
  EXPECT_EQ(j["rows"][0]["precision"], "fp8") << j["rows"][0].dump(2);
  EXPECT_TRUE(j["rows"][0]["error"].is_null()) << j["rows"][0].dump(2);
  EXPECT_EQ(j["rows"][1]["precision"], "fp32");
  EXPECT_TRUE(contains(perftrain::testing::read_raw(tmp.file("f/bench.md")), "mixed precision: fp8"));
}

// A single-stream model through the model family: class tokens, and
// synthetic condition features with lengths (keys masked); the report
// records the family and the condition shape, and the PyTorch side runs
// bench/reference_single_stream.py with that shape.
TEST(CliBench, SingleStreamWithConditionTokensOnTheCpu) {
  TempDir tmp;
  const std::string tiny = "bench --device cpu --model SS-T/2 --batch 2 --steps 2 --warmup 1 --variants eager-fp32"
                           " --image-size 8 --set model.depth=1 --set model.hidden=32 --set model.heads=2";
  auto r = run(tiny + " --set model.cond_tokens=3 --out " + tmp.file("tokens"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "3 learned tokens per class")) << r.output;
  auto j = nlohmann::json::parse(perftrain::testing::read_raw(tmp.file("tokens/bench.json")));
  EXPECT_EQ(j["config"]["family"], "single-stream");
  EXPECT_EQ(j["config"]["cond_tokens"], 3);
  EXPECT_EQ(j["config"]["cond_dim"], 0);
  EXPECT_EQ(j["config"]["image_tokens"], 16);
  EXPECT_EQ(j["config"]["sequence_tokens"], 19);
  EXPECT_TRUE(j["rows"][0]["error"].is_null()) << j["rows"][0].dump(2);
  EXPECT_TRUE(std::isfinite(j["rows"][0]["loss"].get<double>()));

  const bool python = perftrain::testing::run_command(std::string(PERFTRAIN_PYTHON) +
                                                      " -c 'import torch' >/dev/null 2>&1") == 0;
  r = run(tiny + " --set model.cond_tokens=4 --set model.cond_dim=6 --ema" +
          (python ? " --against-torch --torch-modes eager-fp32 --python " + std::string(PERFTRAIN_PYTHON) : "") +
          " --out " + tmp.file("features"));
  ASSERT_EQ(r.code, 0) << r.output;
  j = nlohmann::json::parse(perftrain::testing::read_raw(tmp.file("features/bench.json")));
  const auto& c = j["config"];
  EXPECT_EQ(c["model"], "SS-T/2");
  EXPECT_EQ(c["family"], "single-stream");
  EXPECT_EQ(c["depth"], 1);
  EXPECT_EQ(c["cond_tokens"], 4);
  EXPECT_EQ(c["cond_dim"], 6);
  EXPECT_EQ(c["sequence_tokens"], 20);
  EXPECT_TRUE(contains(c["condition"].get<std::string>(), "features 4x6")) << c.dump(2);
  EXPECT_TRUE(std::isfinite(j["rows"][0]["loss"].get<double>())) << j["rows"][0].dump(2);
  const auto md = perftrain::testing::read_raw(tmp.file("features/bench.md"));
  EXPECT_TRUE(contains(md, "| tokens | 16 image, 20 in the sequence; condition: features 4x6")) << md;
  if (!python) GTEST_SKIP() << "no Python with torch at " << PERFTRAIN_PYTHON << ": the torch side not run";
  ASSERT_EQ(j["torch"].size(), 1u);
  const auto& t = j["torch"][0];
  EXPECT_TRUE(t["error"].is_null()) << t.dump(2) << "\n" << perftrain::testing::read_raw(t["log"].get<std::string>());
  EXPECT_GT(t["ms"].get<double>(), 0.0);
  const auto log = perftrain::testing::read_raw(t["log"].get<std::string>());
  EXPECT_TRUE(contains(log, "reference_single_stream.py' bench --model 'SS-T/2' --depth 1 --hidden 32 --heads 2"))
      << log;
  EXPECT_TRUE(contains(log, "--cond-tokens 4 --cond-dim 6")) << log;
  EXPECT_TRUE(contains(j["method"].get<std::string>(), "reference_single_stream.py bench")) << j["method"];
}

TEST(CliBench, BadOptionsExitTwo) {
  TempDir tmp;
  const std::string out = " --out " + tmp.file("x");
  for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
           {"bench --device cpu --variants turbo", "known variants: eager-fp32"},
           {"bench --device cpu --batch 32,abc", "--batch-size"},
           {"bench --device cpu --batch 0", "--batch-size"},
           {"bench --device cpu --model DiT-Q/2", "known models"},
           {"bench --device cpu --precision fp4", "--precision"},
           {"bench --device cpu --against-torch --torch-modes max-autotune-fast", "--torch-modes: unknown torch mode"},
           {"bench --device tpu", "--device"},
           {"bench --device cpu --steps 0", "--steps"},
           {"bench --device cpu --cooldown -1", "--cooldown"},
           {"bench --device cpu --set speed.attention=flash", "speed.attention 'flash' (expected whole_head, tiled, cudnn or auto)"},
           {"bench --device cpu --set speed.gemm_tune=99", "speed.gemm_tune 99"},
           {"bench --device cpu --set sped.attention=whole_head", "[speed]"},
       }) {
    auto r = run(args + out);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, expect)) << args << "\n" << r.output;
    EXPECT_FALSE(contains(r.output, "Exception raised from")) << r.output;
  }
}

// bench spells the batch option as every command does (--batch-size), and
// still takes --batch: one option with two names.
TEST(CliBench, TakesBatchSizeAndBatch) {
  TempDir tmp;
  const std::string& cmd = kCpuAnyBatch;
  auto r = run(cmd + " --batch-size 3 --out " + tmp.file("a"));
  ASSERT_EQ(r.code, 0) << r.output;
  auto j = nlohmann::json::parse(perftrain::testing::read_raw(tmp.file("a/bench.json")));
  EXPECT_EQ(j["rows"][0]["batch"], 3);
  r = run(cmd + " --batch 2 --out " + tmp.file("b"));
  ASSERT_EQ(r.code, 0) << r.output;
  j = nlohmann::json::parse(perftrain::testing::read_raw(tmp.file("b/bench.json")));
  EXPECT_EQ(j["rows"][0]["batch"], 2);
}

// Inputs that would reach an allocator or a loop unchecked: a batch far
// beyond the machine's memory (by the memory estimate, before anything is
// allocated), NaN or infinite seconds of cool-down, step counts past the
// documented maxima; each a one-line usage error naming the option, and
// nothing written. (timeout: a program that takes them must not hang the test.)
TEST(CliBench, InputsBeyondTheirBoundsAreUsageErrors) {
  TempDir tmp;
  const std::string out = tmp.file("x");
  for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
           {"--batch-size 1000000000", "--batch-size 1000000000 needs about"},
           {"--batch 2,1000000000", "the largest batch that fits is"},
           {"--cooldown nan", "--cooldown: nan is not a finite number"},
           {"--cooldown inf", "--cooldown: inf is not a finite number"},
           {"--cooldown 1e9", "--cooldown: 1e9 is not a finite number from 0 to 3600"},
           {"--steps 1000000000", "--steps: 1000000000 is not an integer from 1 to 100000"},
           {"--repeats 100000", "--repeats"},
       }) {
    const std::string batch = args.find("--batch") == std::string::npos ? " --batch-size 2 " : " ";
    auto r = run_shell("timeout 60 " + std::string(PERFTRAIN_BINARY) + " " + kCpuAnyBatch + batch + args + " --out " + out);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, expect)) << args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << ": one line\n" << r.output;
    EXPECT_FALSE(perftrain::fs::exists(out)) << args;
  }
}

// An unknown model lists every family's names, from the registry.
TEST(CliBench, UnknownModelListsEveryFamily) {
  const auto r = run("bench --device cpu --model DiT-Q/2");
  EXPECT_EQ(r.code, 2) << r.output;
  for (const auto& name : perftrain::models::dit_model_names())
    EXPECT_TRUE(contains(r.output, " " + name)) << name << "\n" << r.output;
  for (const auto& name : perftrain::models::single_stream_model_names())
    EXPECT_TRUE(contains(r.output, " " + name)) << name << "\n" << r.output;
}

TEST(CliBench, AFailingTorchReferenceIsARow) {
  TempDir tmp;
  auto r = run(kCpu + " --against-torch --torch-modes eager-fp32 --python /bin/false --out " + tmp.file("b"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(perftrain::testing::read_raw(tmp.file("b/bench.json")));
  ASSERT_EQ(j["torch"].size(), 1u);
  EXPECT_TRUE(contains(j["torch"][0]["error"].get<std::string>(), "exit status 1")) << j["torch"].dump(2);
  EXPECT_TRUE(perftrain::fs::exists(tmp.file("b/torch-b2-eager-fp32.log")));
  EXPECT_TRUE(j["summary"][0]["best_torch_mode"].is_null());
  EXPECT_TRUE(j["summary"][0]["speedup_vs_best_torch"].is_null());
  EXPECT_EQ(j["config"]["torch_python"], "/bin/false");
}

TEST(CliBench, AgainstTorchOnTheCpu) {
  if (perftrain::testing::run_command(std::string(PERFTRAIN_PYTHON) + " -c 'import torch' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no Python with torch at " << PERFTRAIN_PYTHON;
  TempDir tmp;
  auto r = run(kCpu + " --against-torch --torch-modes eager-fp32 --python " + std::string(PERFTRAIN_PYTHON) +
               " --torch-cache " + tmp.file("cache") + " --out " + tmp.file("c"));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(perftrain::testing::read_raw(tmp.file("c/bench.json")));
  ASSERT_EQ(j["torch"].size(), 1u);
  const auto& t = j["torch"][0];
  EXPECT_TRUE(t["error"].is_null()) << t.dump(2) << "\n" << perftrain::testing::read_raw(t["log"].get<std::string>());
  EXPECT_EQ(t["mode"], "eager-fp32");
  EXPECT_GT(t["ms"].get<double>(), 0.0);
  const auto& s = j["summary"][0];
  EXPECT_EQ(s["best_torch_mode"], "eager-fp32");
  EXPECT_NEAR(s["speedup_vs_best_torch"].get<double>(), t["ms"].get<double>() / s["ms"].get<double>(), 1e-9);
  EXPECT_TRUE(contains(r.output, "best torch eager-fp32")) << r.output;
  EXPECT_EQ(j["config"]["torch_python"], PERFTRAIN_PYTHON);
  EXPECT_EQ(j["config"]["torch_cache_dir"], tmp.file("cache"));
  EXPECT_TRUE(t["torch_cache"].is_null()) << "eager: nothing compiled";
}

// A stand-in for the reference (--python: a shell script) that writes down
// the torch cache variables it was started with and answers per mode: every
// mode reaches it with the cache folder in its environment, the best torch is
// the fastest of all modes (max-autotune here, neither first nor last), and
// each row's first step and cache state are in bench.json, bench.md and the
// table; the folder's files before the runs are counted.
TEST(CliBench, TorchModesWithTheirCacheAgainstAStandIn) {
  TempDir tmp;
  const std::string python = tmp.file("python");
  perftrain::testing::write_raw(
      python,
      "#!/bin/sh\nmode=; prev=\nfor a in \"$@\"; do [ \"$prev\" = --mode ] && mode=$a; prev=$a; done\n"
      "echo \"$mode $TORCHINDUCTOR_CACHE_DIR $TRITON_CACHE_DIR\" >> '" + tmp.file("calls.txt") + "'\n"
      "case $mode in compile) ms=9.0 ;; max-autotune) ms=7.5 ;; *) ms=8.0 ;; esac\n"
      "echo \"{\\\"ms_median\\\": $ms, \\\"first_step_s\\\": 31.5, \\\"torch_cache\\\": \\\"cold\\\", "
      "\\\"torch_cache_hits\\\": 0, \\\"torch_cache_misses\\\": 4}\"\n");
  ASSERT_EQ(perftrain::testing::run_command("chmod +x '" + python + "'"), 0);
  const std::string cache = tmp.file("cache");
  tmp.mkdir("cache");
  tmp.mkdir("cache/fx");
  perftrain::testing::write_raw(cache + "/fx/a", "");
  perftrain::testing::write_raw(cache + "/b", "");
  // A PERFTRAIN_PYTHON in the environment is nobody's business.
  auto r = run_shell("PERFTRAIN_PYTHON=/bin/false " + std::string(PERFTRAIN_BINARY) + " " + kCpu +
                     " --against-torch --torch-modes compile,max-autotune,max-autotune-no-cudagraphs --python " +
                     python + " --torch-cache " + cache + " --out " + tmp.file("b"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(perftrain::testing::read_raw(tmp.file("calls.txt")),
            "compile " + cache + " " + cache + "/triton\nmax-autotune " + cache + " " + cache +
                "/triton\nmax-autotune-no-cudagraphs " + cache + " " + cache + "/triton\n");
  const auto j = nlohmann::json::parse(perftrain::testing::read_raw(tmp.file("b/bench.json")));
  EXPECT_EQ(j["config"]["torch_modes"], nlohmann::json({"compile", "max-autotune", "max-autotune-no-cudagraphs"}));
  EXPECT_EQ(j["config"]["torch_python"], python);
  EXPECT_EQ(j["config"]["torch_cache_dir"], cache);
  EXPECT_EQ(j["config"]["torch_cache_files"], 2);
  ASSERT_EQ(j["torch"].size(), 3u);
  for (const auto& t : j["torch"]) {
    EXPECT_TRUE(t["error"].is_null()) << t.dump(2);
    EXPECT_EQ(t["torch_cache"], "cold") << t.dump(2);
    EXPECT_EQ(t["torch_cache_misses"], 4) << t.dump(2);
    EXPECT_DOUBLE_EQ(t["first_step_s"].get<double>(), 31.5);
  }
  const auto& s = j["summary"][0];
  EXPECT_EQ(s["best_torch_mode"], "max-autotune");
  EXPECT_DOUBLE_EQ(s["best_torch_ms"].get<double>(), 7.5);
  EXPECT_EQ(s["best_torch_cache"], "cold");
  EXPECT_TRUE(contains(r.output, "best torch max-autotune 7.50 ms (first step 31.5 s, cache cold)")) << r.output;
  EXPECT_TRUE(contains(r.output, "torch batch 2 max-autotune ... 7.50 ms, first step 31.5 s, cache cold"))
      << r.output;
  const auto md = perftrain::testing::read_raw(tmp.file("b/bench.md"));
  EXPECT_TRUE(contains(md, "; cache " + cache + ", 2 files before) |")) << md;
  EXPECT_TRUE(contains(md, "cache cold (0 graphs found, 4 compiled)")) << md;
}

// The torch options, each checked before anything runs: a one-line usage
// error naming the option, exit 2, nothing written.
TEST(CliBench, TorchOptionsAreOneLineErrors) {
  TempDir tmp;
  perftrain::testing::write_raw(tmp.file("file"), "x");
  const std::string torch = " --against-torch --torch-modes compile";
  for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
           {" --against-torch --torch-modes compile,turbo", "--torch-modes: unknown torch mode 'turbo'"},
           {torch + " --python " + tmp.file("no-python"), "--python " + tmp.file("no-python") + ": not an executable"},
           {torch + " --python " + tmp.file("file"), "--python " + tmp.file("file") + ": not an executable"},
           {torch + " --torch-cache " + tmp.file("file"), "--torch-cache " + tmp.file("file") + ": not a directory"},
           {torch + " --torch-cache " + tmp.file("file") + "/sub", "--torch-cache " + tmp.file("file") + "/sub: "},
           {" --torch-cache " + tmp.path(), "--torch-cache requires --against-torch"},
           {" --python /bin/sh", "--python requires --against-torch"},
       }) {
    auto r = run(kCpu + args + " --out " + tmp.file("x"));
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, expect)) << args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << ": one line\n" << r.output;
    EXPECT_FALSE(perftrain::fs::exists(tmp.file("x"))) << args;
  }
}

}  // namespace
