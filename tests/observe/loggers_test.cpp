// The logger interface (observe/log/logger.h) and its sinks: the fan-out's
// handling of a failing sink, MLflow's file store as files (the Python test
// python.loggers reads them with MLflow's own client where it is installed),
// TensorBoard's text and hparams summaries decoded by the tests' reader, and
// the W&B sidecar as a real process on a real socket with a fake wandb
// module (tests/support/fake_wandb/wandb.py) that records its calls.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "base/fs.h"
#include "observe/log/logger.h"
#include "observe/log/mlflow_logger.h"
#include "observe/log/tensorboard_logger.h"
#include "observe/log/wandb_logger.h"
#include "support/event_reader.h"
#include "support/test_support.h"

namespace ol = perftrain::observe::log;
namespace fs = perftrain::fs;
using perftrain::testing::TempDir;
using namespace perftrain::testing::event_reader;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

ol::RunStart run_start(const std::string& run_dir, int64_t resume_step = -1) {
  ol::RunStart r;
  r.run_dir = run_dir;
  r.run_name = "r1";
  r.params = {{"train.lr", 0.0001, "0.0001"}, {"train.steps", int64_t{6}, "6"}, {"log.tensorboard", true, "true"},
              {"model.name", std::string("DiT-T/4"), "DiT-T/4"}};
  r.config_toml = "[train]\nlr = 0.0001\n";
  r.resume_step = resume_step;
  r.metric_tags = {"train/loss"};
  return r;
}

// A sink that records its calls, or throws from scalars().
struct Probe : ol::Logger {
  Probe(bool required, bool throws, std::vector<std::string>& calls) : required_(required), throws_(throws), calls_(calls) {}
  std::string name() const override { return required_ ? "needed" : "optional"; }
  bool required() const override { return required_; }
  void start(const ol::RunStart&) override { calls_.push_back(name() + ":start"); }
  void scalars(int64_t step, const ol::Scalars&) override {
    if (throws_) throw perftrain::RuntimeError("disk full");
    calls_.push_back(name() + ":scalars@" + std::to_string(step));
  }
  void close(ol::RunEnd end) override { calls_.push_back(name() + ":close" + std::to_string(int(end))); }
  bool required_, throws_;
  std::vector<std::string>& calls_;
};

}  // namespace

TEST(Loggers, AnOptionalSinkThatFailsIsDroppedWithOneWarning) {
  std::vector<std::string> calls;
  std::ostringstream warnings;
  {
    ol::Loggers loggers(warnings);
    loggers.add(std::make_unique<Probe>(true, false, calls));
    loggers.add(std::make_unique<Probe>(false, true, calls));
    loggers.start(run_start("/nowhere"));
    loggers.scalars(2, {{"train/loss", 1.0}});
    loggers.scalars(4, {{"train/loss", 0.5}});
  }  // never closed: closed as failed
  EXPECT_EQ(calls, (std::vector<std::string>{"needed:start", "optional:start", "needed:scalars@2", "needed:scalars@4",
                                             "needed:close2"}));
  EXPECT_EQ(warnings.str(), "warning: optional logging stopped (scalars): disk full; training goes on\n");
}

TEST(Loggers, ARequiredSinkThatFailsEndsTheRun) {
  std::vector<std::string> calls;
  std::ostringstream warnings;
  ol::Loggers loggers(warnings);
  loggers.add(std::make_unique<Probe>(true, true, calls));
  EXPECT_THROW(loggers.scalars(2, {{"train/loss", 1.0}}), perftrain::RuntimeError);
  EXPECT_TRUE(warnings.str().empty());
}

// A temporary directory with the run directory "run" in it.
class MlflowStore : public ::testing::Test {
 protected:
  MlflowStore() { fs::create_directories(dir.file("run")); }
  TempDir dir;
};

TEST_F(MlflowStore, WritesExperimentRunParamsTagsAndMetricLines) {
  std::string run_path;
  {
    ol::MlflowLogger m(dir.file("mlruns"), "exp 'one'");
    m.start(run_start(dir.file("run")));
    m.scalars(2, {{"train/loss", 0.5}, {"grad_norm/blocks.0", 1.25}});
    m.scalars(4, {{"train/loss", 0.25}, {"weird/../name\n", 3}});
    m.close(ol::RunEnd::finished);
    run_path = m.run_path();
  }
  const std::string experiment = fs::parent_path(run_path);
  EXPECT_NE(slurp(experiment + "/meta.yaml").find("name: 'exp ''one'''\n"), std::string::npos);
  EXPECT_NE(slurp(dir.file("mlruns/0/meta.yaml")).find("name: 'Default'\n"), std::string::npos);
  const std::string meta = slurp(run_path + "/meta.yaml");
  EXPECT_NE(meta.find("status: 3\n"), std::string::npos) << meta;
  EXPECT_NE(meta.find("run_name: 'r1'\n"), std::string::npos) << meta;
  EXPECT_EQ(meta.find("end_time: null"), std::string::npos) << meta;
  EXPECT_EQ(slurp(run_path + "/params/train.lr"), "0.0001");
  EXPECT_EQ(slurp(run_path + "/params/model.name"), "DiT-T/4");
  EXPECT_EQ(slurp(run_path + "/tags/mlflow.runName"), "r1");
  const auto loss = lines_of(run_path + "/metrics/train/loss");
  ASSERT_EQ(loss.size(), 2u);
  long long ts = 0, step = 0;
  double value = 0;
  ASSERT_EQ(std::sscanf(loss[1].c_str(), "%lld %lf %lld", &ts, &value, &step), 3);
  EXPECT_GT(ts, 1600000000000LL);
  EXPECT_EQ(value, 0.25);
  EXPECT_EQ(step, 4);
  EXPECT_EQ(lines_of(run_path + "/metrics/grad_norm/blocks.0").size(), 1u);
  EXPECT_EQ(lines_of(run_path + "/metrics/weird/_/name_").size(), 1u);  // no way out of metrics/
}

TEST_F(MlflowStore, AResumeAppendsToTheSameRunCutAtTheCheckpoint) {
  std::string first;
  {
    ol::MlflowLogger m(dir.file("mlruns"), "Default");
    m.start(run_start(dir.file("run")));
    for (int step : {2, 4, 6}) m.scalars(step, {{"train/loss", 1.0 / step}});
    first = m.run_path();
  }  // killed after step 6: the run stays RUNNING
  EXPECT_NE(slurp(first + "/meta.yaml").find("status: 1\n"), std::string::npos);
  ol::MlflowLogger m(dir.file("mlruns"), "Default");
  m.start(run_start(dir.file("run"), /*resume_step=*/4));
  EXPECT_EQ(m.run_path(), first);
  m.scalars(6, {{"train/loss", 0.125}});
  m.close(ol::RunEnd::stopped);
  const auto loss = lines_of(first + "/metrics/train/loss");
  ASSERT_EQ(loss.size(), 3u);
  EXPECT_NE(loss[0].find(" 0.5 2"), std::string::npos);
  EXPECT_NE(loss[1].find(" 0.25 4"), std::string::npos);
  EXPECT_NE(loss[2].find(" 0.125 6"), std::string::npos);
  EXPECT_NE(slurp(first + "/meta.yaml").find("status: 5\n"), std::string::npos);  // KILLED
  EXPECT_EQ(fs::list_directory(fs::parent_path(first)).size(), 2u);  // meta.yaml and the one run
}

TEST_F(MlflowStore, AFileWhereTheTrackingDirectoryGoesIsAUsageError) {
  std::ofstream(dir.file("mlruns")) << "x";
  try {
    ol::check_mlflow_tracking_dir(dir.file("mlruns"));
    FAIL() << "no error";
  } catch (const perftrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("log.mlflow"), std::string::npos) << e.what();
  }
}

TEST(TensorBoardLogger, ConfigAsTextAndHParams) {
  TempDir dir;
  std::string path;
  {
    ol::TensorBoardLogger tb(dir.file("tb"));
    path = tb.path();
    tb.start(run_start(dir.path()));
    tb.close(ol::RunEnd::finished);
  }
  std::map<std::string, Message> values;
  for (const Event& e : read_events(path))
    if (!e.tag.empty()) values[e.tag] = e.value;
  ASSERT_EQ(values.size(), 4u);
  // Summary.Value: metadata 9 { plugin_data 1 { plugin_name 1, content 2 } }, tensor 8.
  const Message text_meta = decode(one(decode(one(values.at("config"), 9).bytes), 1).bytes);
  EXPECT_EQ(one(text_meta, 1).bytes, "text");
  const Message tensor = decode(one(values.at("config"), 8).bytes);
  EXPECT_EQ(one(tensor, 1).varint, 7u);  // DT_STRING
  EXPECT_EQ(one(tensor, 8).bytes, "    [train]\n    lr = 0.0001\n");
  const Message plugin = decode(one(decode(one(values.at("_hparams_/session_start_info"), 9).bytes), 1).bytes);
  EXPECT_EQ(one(plugin, 1).bytes, "hparams");
  const Message start = decode(one(decode(one(plugin, 2).bytes), 3).bytes);
  std::map<std::string, Message> hp;
  for (auto [it, end] = start.equal_range(1); it != end; ++it) {
    const Message entry = decode(it->second.bytes);
    hp[one(entry, 1).bytes] = decode(one(entry, 2).bytes);
  }
  ASSERT_EQ(hp.size(), 4u);
  EXPECT_EQ(as_double(one(hp.at("train.lr"), 2)), 0.0001);
  EXPECT_EQ(one(hp.at("log.tensorboard"), 4).varint, 1u);
  EXPECT_EQ(one(hp.at("model.name"), 3).bytes, "DiT-T/4");
  const Message end_plugin = decode(one(decode(one(values.at("_hparams_/session_end_info"), 9).bytes), 1).bytes);
  EXPECT_EQ(one(decode(one(decode(one(end_plugin, 2).bytes), 4).bytes), 1).varint, 1u);  // STATUS_SUCCESS
}

// The W&B sidecar with the fake wandb module first on PYTHONPATH.
class WandbSidecar : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("PYTHONPATH", (std::string(PERFTRAIN_SOURCE_DIR) + "/tests/support/fake_wandb").c_str(), 1);
    ::setenv("FAKE_WANDB_CALLS", dir.file("calls.jsonl").c_str(), 1);
    ::unsetenv("FAKE_WANDB_MODE");
    fs::create_directories(dir.file("run"));
  }
  void TearDown() override {
    ::unsetenv("PYTHONPATH");
    ::unsetenv("FAKE_WANDB_CALLS");
    ::unsetenv("FAKE_WANDB_MODE");
  }
  ol::WandbOptions options(double finish_timeout_s = 60) const {
    ol::WandbOptions o;
    o.mode = "offline";
    o.project = "proj";
    o.python = PERFTRAIN_PYTHON;
    o.script = ol::wandb_sidecar_script(PERFTRAIN_SOURCE_DIR);
    o.finish_timeout_s = finish_timeout_s;
    return o;
  }
  std::vector<nlohmann::json> calls() const {
    std::vector<nlohmann::json> out;
    for (const auto& line : lines_of(dir.file("calls.jsonl"))) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  TempDir dir;
};

TEST_F(WandbSidecar, InitLogAndFinishFromJsonLines) {
  std::ostringstream warnings;
  {
    ol::WandbLogger w(options(), warnings);
    w.start(run_start(dir.file("run")));
    w.scalars(2, {{"train/loss", 0.5}, {"train/lr", 1e-4}});
    w.scalars(4, {{"train/loss", 0.25}});
    w.close(ol::RunEnd::finished);
  }
  const auto c = calls();
  ASSERT_EQ(c.size(), 4u) << warnings.str();
  EXPECT_EQ(c[0]["call"], "init");
  EXPECT_EQ(c[0]["mode"], "offline");
  EXPECT_EQ(c[0]["project"], "proj");
  EXPECT_EQ(c[0]["name"], "r1");
  EXPECT_EQ(c[0]["config"]["train.lr"], 0.0001);
  EXPECT_EQ(c[0]["config"]["model.name"], "DiT-T/4");
  EXPECT_EQ(c[0]["id"], slurp(dir.file("run/wandb_run_id")).substr(0, 8));
  EXPECT_EQ(c[1]["data"]["train/loss"], 0.5);
  EXPECT_EQ(c[1]["step"], 2);
  EXPECT_EQ(c[2]["step"], 4);
  EXPECT_EQ(c[3]["call"], "finish");
  EXPECT_EQ(c[3]["exit_code"], 0);
  EXPECT_TRUE(warnings.str().empty()) << warnings.str();
}

TEST_F(WandbSidecar, NoWandbPackageIsAUsageErrorNamingTheKey) {
  ::setenv("FAKE_WANDB_MODE", "missing", 1);
  std::ostringstream warnings;
  try {
    ol::WandbLogger w(options(), warnings);
    FAIL() << "no error";
  } catch (const perftrain::UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("log.wandb = offline needs the wandb Python package"), std::string::npos) << what;
    EXPECT_NE(what.find("No module named 'wandb'"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST_F(WandbSidecar, ASidecarThatDiesIsOneWarningAndTheRestGoesOn) {
  ::setenv("FAKE_WANDB_MODE", "die_on_log", 1);
  std::vector<std::string> calls_seen;
  std::ostringstream warnings;
  ol::Loggers loggers(warnings);
  loggers.add(std::make_unique<Probe>(true, false, calls_seen));
  loggers.add(std::make_unique<ol::WandbLogger>(options(), warnings));
  loggers.start(run_start(dir.file("run")));
  loggers.scalars(2, {{"train/loss", 0.5}});  // the sidecar exits on it
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (warnings.str().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    loggers.scalars(4, {{"train/loss", 0.25}});
  }
  EXPECT_NE(warnings.str().find("warning: wandb logging stopped (scalars): the W&B sidecar exited with status 7"),
            std::string::npos)
      << warnings.str();
  loggers.scalars(6, {{"train/loss", 0.125}});
  loggers.close(ol::RunEnd::finished);
  EXPECT_EQ(calls_seen.front(), "needed:start");
  EXPECT_EQ(calls_seen.back(), "needed:close0");
  const std::string said = warnings.str();
  EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 1) << said;
}

TEST_F(WandbSidecar, AStalledSidecarNeverHoldsUpTheCaller) {
  ::setenv("FAKE_WANDB_MODE", "stall", 1);
  std::ostringstream warnings;
  ol::WandbLogger w(options(/*finish_timeout_s=*/1), warnings);
  w.start(run_start(dir.file("run")));
  ol::Scalars many;
  for (int i = 0; i < 200; ++i) many.emplace_back("grad_norm/blocks." + std::to_string(i), 1.0 + i);
  const auto start = std::chrono::steady_clock::now();
  for (int step = 1; step <= 800; ++step) w.scalars(step, many);  // ~6 MB against a 1 MiB socket buffer
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0);
  EXPECT_GT(w.dropped(), 0);
  EXPECT_EQ(warnings.str(),
            "warning: the W&B sidecar is behind; dropping what it cannot take (training is not held up)\n");
  const pid_t pid = w.pid();
  w.close(ol::RunEnd::finished);  // waits finish_timeout_s, then ends it
  EXPECT_NE(warnings.str().find("did not finish within 1 s; ended it"), std::string::npos) << warnings.str();
  EXPECT_EQ(::kill(pid, 0), -1);  // gone and reaped
}
