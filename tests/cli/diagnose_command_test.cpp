// perftrain diagnose on the committed torch.profiler traces
// (tests/data/traces/, written by make_traces.py in Kineto's format): each
// gives its verdict first, with PyTorch-side advice, as text and as JSON; a
// file that is not a trace (not JSON, no events, cut short, a broken gzip,
// missing) exits non-zero with one line naming it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace {

using perftrain::testing::contains;
using perftrain::testing::run_shell;
using perftrain::testing::TempDir;

const std::string kTraces = std::string(PERFTRAIN_SOURCE_DIR) + "/tests/data/traces/";

perftrain::testing::CommandResult diagnose(const std::string& args) {
  return run_shell(std::string(PERFTRAIN_BINARY) + " diagnose " + args);
}

// The findings' ids in the report's order ("1. **launch-bound**: ...").
std::vector<std::string> finding_ids(const std::string& report) {
  std::vector<std::string> ids;
  for (size_t at = report.find(". **"); at != std::string::npos; at = report.find(". **", at + 1)) {
    const size_t end = report.find("**", at + 4);
    ids.push_back(report.substr(at + 4, end - at - 4));
  }
  return ids;
}

nlohmann::json json_report(const std::string& trace) {
  const auto r = diagnose("--json " + kTraces + trace);
  EXPECT_EQ(r.code, 0) << r.output;
  return nlohmann::json::parse(r.output);
}

TEST(CliDiagnose, AnEagerFp32StepIsLaunchBound) {
  const auto r = diagnose(kTraces + "launch_bound.json.gz");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto ids = finding_ids(r.output);
  ASSERT_FALSE(ids.empty()) << r.output;
  EXPECT_EQ(ids.front(), "launch-bound") << r.output;
  EXPECT_NE(std::find(ids.begin(), ids.end(), "host-syncs"), ids.end()) << r.output;  // loss.item() each step
  EXPECT_NE(std::find(ids.begin(), ids.end(), "fp32-matmul"), ids.end()) << r.output;  // ampere_sgemm kernels
  EXPECT_EQ(std::find(ids.begin(), ids.end(), "matrix-bound"), ids.end()) << r.output;
  // What ran, and the advice in PyTorch's terms, not perftrain's keys.
  EXPECT_TRUE(contains(r.output, "- program: a PyTorch program")) << r.output;
  EXPECT_TRUE(contains(r.output, "- device: NVIDIA H200 (132 SMs")) << r.output;
  EXPECT_TRUE(contains(r.output, "- steps: 2 (ProfilerStep ranges)")) << r.output;
  EXPECT_TRUE(contains(r.output, "mode=\"reduce-overhead\"")) << r.output;
  EXPECT_TRUE(contains(r.output, "capturable=True")) << r.output;
  EXPECT_TRUE(contains(r.output, "torch.autocast(\"cuda\", dtype=torch.bfloat16)")) << r.output;
  EXPECT_TRUE(contains(r.output, "cudaStreamSynchronize in aten::_local_scalar_dense")) << r.output;
  EXPECT_FALSE(contains(r.output, "speed.graph")) << r.output;
  // The phases torch marks: the autograd engine's nodes, the optimizer, the DataLoader.
  EXPECT_TRUE(contains(r.output, "| GPU busy: backward |")) << r.output;
  EXPECT_TRUE(contains(r.output, "| GPU busy: optimizer |")) << r.output;
  EXPECT_TRUE(contains(r.output, "| GPU busy: forward, loss and the rest (not marked) |")) << r.output;
}

TEST(CliDiagnose, ACompiledBf16StepIsMatrixBound) {
  const auto r = diagnose(kTraces + "matrix_bound.json --group-by op --top 5");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto ids = finding_ids(r.output);
  ASSERT_FALSE(ids.empty()) << r.output;
  EXPECT_EQ(ids.front(), "matrix-bound") << r.output;
  for (const char* quiet : {"launch-bound", "data-bound", "fp32-matmul", "host-syncs", "elementwise"})
    EXPECT_EQ(std::find(ids.begin(), ids.end(), quiet), ids.end()) << quiet << "\n" << r.output;
  EXPECT_TRUE(contains(r.output, "torch.compile's kernels in it")) << r.output;
  EXPECT_TRUE(contains(r.output, "- precision: bf16")) << r.output;
  EXPECT_TRUE(contains(r.output, "| `aten::mm` |")) << r.output;  // the op table by op
  EXPECT_TRUE(contains(r.output, "| GPU busy: forward |")) << r.output;  // CompiledFunction
}

TEST(CliDiagnose, AStepWaitingForItsDataLoaderIsDataBound) {
  const auto r = diagnose(kTraces + "data_bound.json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto ids = finding_ids(r.output);
  ASSERT_FALSE(ids.empty()) << r.output;
  EXPECT_EQ(ids.front(), "data-bound") << r.output;
  EXPECT_TRUE(contains(r.output, "pin_memory=True")) << r.output;
  EXPECT_TRUE(contains(r.output, "num_workers")) << r.output;
  EXPECT_TRUE(contains(r.output, "copies from pageable memory")) << r.output;
  EXPECT_TRUE(contains(r.output, "| GPU idle: waiting for data |")) << r.output;
}

TEST(CliDiagnose, JsonHasTheBreakdownAndTheFindingsInOrder) {
  const struct {
    const char* trace;
    const char* first;
  } cases[] = {{"launch_bound.json.gz", "launch-bound"}, {"matrix_bound.json", "matrix-bound"},
               {"data_bound.json", "data-bound"}};
  for (const auto& c : cases) {
    const nlohmann::json j = json_report(c.trace);
    ASSERT_FALSE(j["findings"].empty()) << c.trace;
    EXPECT_EQ(j["findings"][0]["id"], c.first) << c.trace;
    EXPECT_FALSE(j["findings"][0]["advice"].get<std::string>().empty()) << c.trace;
    EXPECT_EQ(j["program"], "pytorch");
    EXPECT_EQ(j["steps"], 2);
    EXPECT_EQ(j["device"]["name"], "NVIDIA H200");
    const auto& b = j["breakdown_ms"];
    double parts = b["idle_waiting_for_data"].get<double>() + b["idle_between_kernels"].get<double>();
    for (const auto& [phase, ms] : b["busy_by_phase"].items()) parts += ms.get<double>();
    EXPECT_NEAR(parts, j["step_ms"].get<double>(), 1e-6 * j["step_ms"].get<double>()) << c.trace;
  }
}

// Every bad file: exit 1, one line, naming the file; nothing on stdout but that.
TEST(CliDiagnose, BadFilesAreOneLineErrorsNamingThem) {
  TempDir tmp;
  const std::string whole = perftrain::testing::read_raw(kTraces + "data_bound.json");
  const std::string gz = perftrain::testing::read_raw(kTraces + "launch_bound.json.gz");
  const struct {
    std::string name, bytes, says;
  } cases[] = {
      {"notes.json", "these are not the events you are looking for\n", "is not JSON"},
      {"empty-events.json", "{\"schemaVersion\": 1, \"traceEvents\": []}", "holds no profiler events"},
      {"no-events.json", "{\"schemaVersion\": 1}", "has no traceEvents"},
      {"cut.json", whole.substr(0, whole.size() / 2), "cut short"},
      {"cut.json.gz", gz.substr(0, gz.size() / 2), "cut short"},
      {"bad.json.gz", gz.substr(0, 10) + std::string(200, 'x'), "cannot read trace"},
  };
  for (const auto& c : cases) {
    const std::string path = tmp.file(c.name);
    perftrain::testing::write_raw(path, c.bytes);
    const auto r = diagnose(path);
    EXPECT_EQ(r.code, 1) << c.name << ": " << r.output;
    EXPECT_TRUE(contains(r.output, path)) << c.name << ": " << r.output;
    EXPECT_TRUE(contains(r.output, c.says)) << c.name << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << c.name << ": " << r.output;
  }
  const auto missing = diagnose(tmp.file("missing.json"));
  EXPECT_EQ(missing.code, 1) << missing.output;
  EXPECT_TRUE(contains(missing.output, tmp.file("missing.json"))) << missing.output;
  const auto usage = diagnose(kTraces + "data_bound.json --group-by kernels");
  EXPECT_EQ(usage.code, 2) << usage.output;
  EXPECT_TRUE(contains(usage.output, "--group-by")) << usage.output;
}

}  // namespace
