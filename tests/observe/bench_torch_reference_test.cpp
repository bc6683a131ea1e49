// Driving bench/reference_dit.py: the command line it gets, reading its JSON,
// a failing run becoming a row with its error and a log, and (with the
// project's Python) the real script on the CPU accepting what we send.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <map>

#include "base/error.h"
#include "base/fs.h"
#include "observe/bench/subprocess.h"
#include "observe/bench/torch_reference.h"
#include "support/test_support.h"

namespace {

using namespace perftrain::observe::bench;
using perftrain::testing::TempDir;

TorchBenchRequest request(const std::string& model, int64_t depth, int64_t hidden, int64_t heads, int64_t patch) {
  TorchBenchRequest r;
  r.model = model;
  r.depth = depth;
  r.hidden = hidden;
  r.heads = heads;
  r.patch = patch;
  r.batch = 32;
  r.steps = 30;
  r.warmup = 6;
  r.mode = "reduce-overhead";
  return r;
}

using perftrain::testing::contains;

TEST(BenchTorchReference, CommandLine) {
  auto cmd = torch_bench_command("/venv/bin/python", "/src/bench/reference_dit.py", request("DiT-S/2", 12, 384, 6, 2));
  EXPECT_EQ(cmd.rfind("'/venv/bin/python' '/src/bench/reference_dit.py' bench --model 'DiT-S/2' ", 0), 0u) << cmd;
  for (const char* part : {" --no-learn-sigma", " --batch 32", " --mode 'reduce-overhead'", " --steps 30",
                           " --warmup 6", " --json", " --image-size 32", " --in-channels 4", " --num-classes 1000",
                           " --class-dropout 0.1", " --device 'cuda'"})
    EXPECT_TRUE(contains(cmd, part)) << part << " missing in " << cmd;
  EXPECT_FALSE(contains(cmd, "--depth")) << cmd;
  EXPECT_FALSE(contains(cmd, "--ema")) << "no EMA unless asked: " << cmd;
  auto with_ema = request("DiT-S/2", 12, 384, 6, 2);
  with_ema.ema_decay = 0.9999;
  cmd = torch_bench_command("python3", "r.py", with_ema);
  EXPECT_TRUE(contains(cmd, " --ema 0.9999")) << cmd;
  // DiT-T is ours only: sent as an explicit architecture.
  cmd = torch_bench_command("python3", "r.py", request("DiT-T/4", 6, 192, 3, 4));
  EXPECT_TRUE(contains(cmd, "--depth 6 --hidden 192 --heads 3 --patch 4")) << cmd;
}

// DistributedDataParallel: torch.distributed.run starts the ranks, without
// the launch variables of a perftrain rank that runs it; its JSON's world
// size and total img/s are read.
TEST(BenchTorchReference, DdpCommandLineAndResult) {
  auto r = request("DiT-XL/2", 28, 1152, 16, 2);
  r.nproc = 2;
  const auto cmd = torch_bench_command("/venv/bin/python", "/src/bench/reference_dit.py", r);
  EXPECT_EQ(cmd.rfind("env -u RANK -u LOCAL_RANK -u WORLD_SIZE ", 0), 0u) << cmd;
  for (const char* part : {" -u MASTER_ADDR", " -u MASTER_PORT",
                           " '/venv/bin/python' -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node 2 "
                           "'/src/bench/reference_dit.py' bench --model 'DiT-XL/2' ",
                           " --batch 32"})
    EXPECT_TRUE(contains(cmd, part)) << part << " missing in " << cmd;
  EXPECT_EQ(cmd.substr(cmd.size() - 6), " --ddp") << cmd;
  EXPECT_FALSE(contains(torch_bench_command("python3", "r.py", request("DiT-S/2", 12, 384, 6, 2)), "ddp"));

  const auto row = parse_torch_bench_output(
      "{\"ms_median\": 400.5, \"images_per_s\": 639.2, \"world_size\": 2, \"rank_ms_median\": [400.5, 401.0], "
      "\"images_per_s_total\": 1276.9}",
      r);
  ASSERT_TRUE(row.ok()) << row.error;
  EXPECT_EQ(row.world_size, 2);
  EXPECT_DOUBLE_EQ(*row.images_per_s_total, 1276.9);
  const auto one = parse_torch_bench_output("{\"ms_median\": 4.0}", r);  // an older script: one process
  EXPECT_EQ(one.world_size, 1);
  EXPECT_FALSE(one.images_per_s_total.has_value());
}

// A single-stream model: its own script, the explicit architecture (a
// --set model.depth=... must reach the reference) and the condition shape.
TEST(BenchTorchReference, SingleStreamCommandLine) {
  auto r = request("SS-B/2", 12, 768, 12, 2);
  r.family = "single-stream";
  r.cond_tokens = 128;
  r.cond_dim = 1024;
  r.image_size = 64;
  const auto cmd = torch_bench_command("python3", "/src/bench/reference_single_stream.py", r);
  EXPECT_EQ(cmd.rfind("'python3' '/src/bench/reference_single_stream.py' bench --model 'SS-B/2' ", 0), 0u) << cmd;
  for (const char* part : {"--depth 12 --hidden 768 --heads 12 --patch 2", " --cond-tokens 128", " --cond-dim 1024",
                           " --image-size 64", " --no-learn-sigma", " --batch 32", " --mode 'reduce-overhead'"})
    EXPECT_TRUE(contains(cmd, part)) << part << " missing in " << cmd;
  EXPECT_EQ(reference_script("/src", "single-stream"), "/src/bench/reference_single_stream.py");
  EXPECT_EQ(reference_script("/src", "dit"), "/src/bench/reference_dit.py");
  // A DiT request says nothing of condition tokens.
  EXPECT_FALSE(contains(torch_bench_command("python3", "r.py", request("DiT-S/2", 12, 384, 6, 2)), "--cond"));
}

TEST(BenchTorchReference, ModesAreChecked) {
  EXPECT_EQ(parse_torch_modes("compile, eager-bf16,compile"), (std::vector<std::string>{"compile", "eager-bf16"}));
  EXPECT_EQ(parse_torch_modes("max-autotune,max-autotune-no-cudagraphs,reduce-overhead"),
            (std::vector<std::string>{"max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead"}));
  EXPECT_EQ(parse_torch_modes("float8-rowwise,float8-tensorwise"),
            (std::vector<std::string>{"float8-rowwise", "float8-tensorwise"}));
  EXPECT_EQ(parse_torch_modes("float8-tensorwise-regional,max-autotune-regional"),
            (std::vector<std::string>{"float8-tensorwise-regional", "max-autotune-regional"}));
  EXPECT_THROW(parse_torch_modes("eager-bf16-regional"), perftrain::UsageError);  // nothing compiled: no regions
  auto msg = perftrain::testing::error_of<perftrain::UsageError>([] { parse_torch_modes("eager-bf16,max-autotune-x"); });
  EXPECT_EQ(msg.rfind("--torch-modes: ", 0), 0u) << msg;
  EXPECT_TRUE(contains(msg, "'max-autotune-x'") && contains(msg, "reduce-overhead, max-autotune, "
                                                                  "max-autotune-no-cudagraphs")) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  msg = perftrain::testing::error_of<perftrain::UsageError>([] { parse_torch_modes(" , "); });
  EXPECT_TRUE(contains(msg, "--torch-modes")) << msg;
}

// The torch cache folder reaches the reference as Inductor's and Triton's
// cache variables, before the interpreter, with or without the DDP launcher.
TEST(BenchTorchReference, CacheDirInTheChildsEnvironment) {
  auto r = request("DiT-S/2", 12, 384, 6, 2);
  r.cache_dir = "/home/u/.cache/perftrain/inductor";
  auto cmd = torch_bench_command("/venv/bin/python", "/src/bench/reference_dit.py", r);
  EXPECT_EQ(cmd.rfind("env 'TORCHINDUCTOR_CACHE_DIR=/home/u/.cache/perftrain/inductor' "
                      "'TRITON_CACHE_DIR=/home/u/.cache/perftrain/inductor/triton' '/venv/bin/python' "
                      "'/src/bench/reference_dit.py' bench ",
                      0),
            0u)
      << cmd;
  r.nproc = 2;
  cmd = torch_bench_command("/venv/bin/python", "/src/bench/reference_dit.py", r);
  EXPECT_EQ(cmd.rfind("env -u RANK ", 0), 0u) << cmd;
  EXPECT_TRUE(contains(cmd, "-u TORCHELASTIC_RUN_ID 'TORCHINDUCTOR_CACHE_DIR=/home/u/.cache/perftrain/inductor' "
                            "'TRITON_CACHE_DIR=/home/u/.cache/perftrain/inductor/triton' '/venv/bin/python' -m "
                            "torch.distributed.run "))
      << cmd;
  // No folder: the child's environment as it is.
  EXPECT_FALSE(contains(torch_bench_command("python3", "r.py", request("DiT-S/2", 12, 384, 6, 2)), "CACHE_DIR"));

  // A stand-in Python that writes down its environment and arguments.
  TempDir tmp;
  const std::string python = tmp.file("python");
  perftrain::testing::write_raw(python, "#!/bin/sh\nenv > '" + tmp.file("env.txt") + "'\necho \"$@\" > '" +
                                            tmp.file("args.txt") + "'\necho '{\"ms_median\": 2.5}'\n");
  ASSERT_EQ(::chmod(python.c_str(), 0755), 0);
  r = request("DiT-S/2", 12, 384, 6, 2);
  r.cache_dir = tmp.file("a dir/inductor");
  const auto row = run_torch_bench(python, "script.py", r, tmp.file("torch.log"));
  ASSERT_TRUE(row.ok()) << row.error;
  const auto env = perftrain::testing::read_raw(tmp.file("env.txt"));
  EXPECT_TRUE(contains(env, "TORCHINDUCTOR_CACHE_DIR=" + tmp.file("a dir/inductor") + "\n")) << env;
  EXPECT_TRUE(contains(env, "TRITON_CACHE_DIR=" + tmp.file("a dir/inductor/triton") + "\n")) << env;
  EXPECT_EQ(perftrain::testing::read_raw(tmp.file("args.txt")).rfind("script.py bench --model DiT-S/2 ", 0), 0u);
}

// How warm a compiled mode's cache was, as the reference says it; an eager
// mode (or an older reference) says nothing.
TEST(BenchTorchReference, ReadsTheCacheState) {
  const auto r = request("DiT-B/2", 12, 768, 12, 2);
  auto row = parse_torch_bench_output(
      "{\"ms_median\": 80.1, \"first_step_s\": 412.5, \"torch_cache\": \"cold\", \"torch_cache_hits\": 0, "
      "\"torch_cache_misses\": 6}",
      r);
  ASSERT_TRUE(row.ok()) << row.error;
  EXPECT_EQ(row.torch_cache, "cold");
  EXPECT_EQ(*row.torch_cache_hits, 0);
  EXPECT_EQ(*row.torch_cache_misses, 6);
  EXPECT_DOUBLE_EQ(*row.first_step_s, 412.5);
  row = parse_torch_bench_output("{\"ms_median\": 80.1, \"torch_cache\": null, \"torch_cache_hits\": null}", r);
  EXPECT_EQ(row.torch_cache, "");
  EXPECT_FALSE(row.torch_cache_hits.has_value());
}

// --torch-cache's default under the user's cache folder, and its checks.
TEST(BenchTorchReference, TorchCacheDefaultAndChecks) {
  using Env = std::map<std::string, std::string>;
  const auto from = [](const Env& e) {
    return default_torch_cache_dir([&e](const char* n) -> const char* {
      auto it = e.find(n);
      return it == e.end() ? nullptr : it->second.c_str();
    });
  };
  EXPECT_EQ(from({{"XDG_CACHE_HOME", "/x/cache"}, {"HOME", "/home/u"}}), "/x/cache/perftrain/inductor");
  EXPECT_EQ(from({{"XDG_CACHE_HOME", "relative"}, {"HOME", "/home/u"}}), "/home/u/.cache/perftrain/inductor");
  EXPECT_EQ(from({{"HOME", "/home/u"}}), "/home/u/.cache/perftrain/inductor");
  EXPECT_EQ(from({}), "");

  TempDir tmp;
  check_torch_cache_dir(tmp.path());
  check_torch_cache_dir(tmp.file("not/yet/made"));  // made by torch when it compiles
  EXPECT_FALSE(perftrain::fs::exists(tmp.file("not"))) << "checking makes nothing";
  perftrain::testing::write_raw(tmp.file("file"), "x");
  auto msg = perftrain::testing::error_of<perftrain::UsageError>([&] { check_torch_cache_dir(tmp.file("file")); });
  EXPECT_EQ(msg, "--torch-cache " + tmp.file("file") + ": not a directory");
  msg = perftrain::testing::error_of<perftrain::UsageError>([&] { check_torch_cache_dir(tmp.file("file/sub")); });
  EXPECT_TRUE(contains(msg, "--torch-cache " + tmp.file("file/sub") + ": ")) << msg;
  msg = perftrain::testing::error_of<perftrain::UsageError>([] { check_torch_cache_dir(""); });
  EXPECT_TRUE(contains(msg, "--torch-cache")) << msg;

  EXPECT_EQ(count_files(tmp.file("missing")), 0);
  tmp.mkdir("c");
  tmp.mkdir("c/triton");
  perftrain::testing::write_raw(tmp.file("c/a.py"), "");
  perftrain::testing::write_raw(tmp.file("c/triton/k.cubin"), "");
  EXPECT_EQ(count_files(tmp.file("c")), 2);
}

TEST(BenchTorchReference, ParsesTheLastJsonLine) {
  const auto r = request("DiT-S/2", 12, 384, 6, 2);
  const std::string out =
      "W1130 some torch.compile warning {not json\n"
      "{\"model\": \"DiT-S/2\", \"batch\": 32, \"mode\": \"reduce-overhead\", \"ms_median\": 6.7612, "
      "\"ms_p10\": 6.7, \"ms_p90\": 6.9, \"images_per_s\": 4732.9, \"tflops\": 171.2, \"peak_gib\": 2.5, "
      "\"first_step_s\": 29.1, \"torch\": \"2.11.0+cu130\", \"device\": \"NVIDIA H200\"}\n\n";
  const auto row = parse_torch_bench_output(out, r);
  ASSERT_TRUE(row.ok()) << row.error;
  EXPECT_EQ(row.mode, "reduce-overhead");
  EXPECT_EQ(row.batch, 32);
  EXPECT_DOUBLE_EQ(*row.ms, 6.7612);
  EXPECT_DOUBLE_EQ(*row.ms_p90, 6.9);
  EXPECT_DOUBLE_EQ(*row.tflops, 171.2);
  EXPECT_DOUBLE_EQ(*row.peak_gib, 2.5);
  EXPECT_DOUBLE_EQ(*row.first_step_s, 29.1);
  EXPECT_EQ(row.torch_version, "2.11.0+cu130");
  EXPECT_EQ(row.device, "NVIDIA H200");

  // The CPU prints peak_gib null: no number, not an error.
  auto cpu = parse_torch_bench_output("{\"ms_median\": 120.5, \"peak_gib\": null}", r);
  ASSERT_TRUE(cpu.ok()) << cpu.error;
  EXPECT_FALSE(cpu.peak_gib.has_value());

  EXPECT_TRUE(contains(parse_torch_bench_output("Traceback ...\n", r).error, "no JSON"));
  EXPECT_TRUE(contains(parse_torch_bench_output("{\"ms_median\": 1.0,\n", r).error, "unreadable JSON"));
  EXPECT_TRUE(contains(parse_torch_bench_output("{\"tflops\": 1.0}", r).error, "no ms_median"));
}

TEST(BenchTorchReference, AFailingRunBecomesARowWithItsLog) {
  TempDir tmp;
  // A stand-in "python" (sh) running a stand-in script: one that fails like
  // an out-of-memory torch, one that succeeds.
  perftrain::testing::write_raw(tmp.file("fail.sh"),
                                "echo 'Traceback (most recent call last):' >&2\n"
                                "echo 'torch.OutOfMemoryError: CUDA out of memory' >&2\nexit 1\n");
  auto r = request("DiT-S/2", 12, 384, 6, 2);
  auto row = run_torch_bench("/bin/sh", tmp.file("fail.sh"), r, tmp.file("torch.log"));
  EXPECT_FALSE(row.ok());
  EXPECT_EQ(row.error, "exit status 1: torch.OutOfMemoryError: CUDA out of memory");
  EXPECT_EQ(row.mode, "reduce-overhead");
  EXPECT_EQ(row.log_path, tmp.file("torch.log"));
  const auto log = perftrain::testing::read_raw(tmp.file("torch.log"));
  EXPECT_EQ(log.rfind("$ '/bin/sh' ", 0), 0u) << log;
  EXPECT_TRUE(contains(log, "Traceback")) << log;

  perftrain::testing::write_raw(tmp.file("ok.sh"), "echo 'starting'\necho 'note' >&2\n"
                                                   "echo '{\"ms_median\": 35.3, \"mode\": \"compile\"}'\n");
  row = run_torch_bench("/bin/sh", tmp.file("ok.sh"), r, tmp.file("ok.log"));
  ASSERT_TRUE(row.ok()) << row.error;
  EXPECT_DOUBLE_EQ(*row.ms, 35.3);
  EXPECT_TRUE(contains(perftrain::testing::read_raw(tmp.file("ok.log")), "note"));

  row = run_torch_bench(tmp.file("no-such-python"), tmp.file("ok.sh"), r, tmp.file("missing.log"));
  EXPECT_FALSE(row.ok());
  EXPECT_TRUE(contains(row.error, "exit status 127")) << row.error;
}

// The build's Python when it is there, else the checkout's .venv, else
// python3; never one named by the environment.
TEST(BenchTorchReference, PythonAndScriptLocations) {
  TempDir tmp;
  ::setenv("PERFTRAIN_PYTHON", "/opt/py/bin/python3", 1);  // read by nothing
  EXPECT_EQ(reference_python("", tmp.path()), "python3");
  EXPECT_EQ(reference_python(tmp.file("gone/python"), tmp.path()), "python3");
  tmp.mkdir(".venv");
  tmp.mkdir(".venv/bin");
  perftrain::testing::write_raw(tmp.file(".venv/bin/python"), "");
  EXPECT_EQ(reference_python("", tmp.path()), tmp.file(".venv/bin/python"));
  EXPECT_EQ(reference_python("/bin/sh", tmp.path()), "/bin/sh");
  ::unsetenv("PERFTRAIN_PYTHON");
  EXPECT_EQ(reference_script("/src"), "/src/bench/reference_dit.py");

  check_python("/bin/sh");
  check_python("sh");  // on PATH
  perftrain::testing::write_raw(tmp.file("plain"), "");  // not executable
  for (const std::string bad : {tmp.file("plain"), tmp.file("missing"), std::string("no-such-program-here"),
                                std::string("")}) {
    const auto msg = perftrain::testing::error_of<perftrain::UsageError>([&] { check_python(bad); });
    EXPECT_EQ(msg.rfind("--python " + bad + ": ", 0), 0u) << msg;
  }
}

TEST(BenchTorchReference, TheRealScriptAcceptsOurCommandOnTheCpu) {
  if (perftrain::testing::run_command(std::string(PERFTRAIN_PYTHON) + " -c 'import torch' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no Python with torch at " << PERFTRAIN_PYTHON;
  TempDir tmp;
  auto r = request("DiT-T/4", 1, 32, 2, 8);  // a model the reference does not name
  r.batch = 2;
  r.steps = 2;
  r.warmup = 1;
  r.mode = "eager-fp32";
  r.device = "cpu";
  r.ema_decay = 0.99;  // the EMA path too
  const auto row =
      run_torch_bench(PERFTRAIN_PYTHON, std::string(PERFTRAIN_SOURCE_DIR) + "/bench/reference_dit.py", r,
                      tmp.file("torch.log"));
  ASSERT_TRUE(row.ok()) << row.error << "\n" << perftrain::testing::read_raw(tmp.file("torch.log"));
  EXPECT_EQ(row.model, "DiT-d1-h32-H2/8");
  EXPECT_EQ(row.device, "cpu");
  EXPECT_GT(*row.ms, 0.0);
  EXPECT_GE(*row.tflops, 0.0);  // rounded to 3 decimals by the script: 0 for so small a model
  EXPECT_FALSE(row.peak_gib.has_value());
  EXPECT_GT(*row.first_step_s, 0.0);
}

TEST(BenchTorchReference, TheRealSingleStreamScriptAcceptsOurCommandOnTheCpu) {
  if (perftrain::testing::run_command(std::string(PERFTRAIN_PYTHON) + " -c 'import torch' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no Python with torch at " << PERFTRAIN_PYTHON;
  TempDir tmp;
  auto r = request("SS-T/2", 1, 32, 2, 2);
  r.family = "single-stream";
  r.image_size = 8;
  r.cond_tokens = 3;
  r.cond_dim = 5;
  r.batch = 2;
  r.steps = 2;
  r.warmup = 1;
  r.mode = "eager-fp32";
  r.device = "cpu";
  r.ema_decay = 0.99;
  const auto row = run_torch_bench(PERFTRAIN_PYTHON,
                                   std::string(PERFTRAIN_SOURCE_DIR) + "/bench/reference_single_stream.py", r,
                                   tmp.file("torch.log"));
  ASSERT_TRUE(row.ok()) << row.error << "\n" << perftrain::testing::read_raw(tmp.file("torch.log"));
  EXPECT_EQ(row.model, "SS-T/2");
  EXPECT_EQ(row.device, "cpu");
  EXPECT_GT(*row.ms, 0.0);
  EXPECT_GT(*row.first_step_s, 0.0);
}

TEST(BenchSubprocess, QuotingExitStatusAndStderr) {
  TempDir tmp;
  const std::string odd = "it's a \"test\" $HOME `x` \\ ;";
  auto r = run_command_capture("printf '%s' " + shell_quote(odd));
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.out, odd);
  r = run_command_capture("echo out; echo err >&2; exit 3", tmp.file("err.txt"));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(perftrain::testing::read_raw(tmp.file("err.txt")), "err\n");
}

}  // namespace
