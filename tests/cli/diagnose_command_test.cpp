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

// A report and its findings' ids in order ("1. **launch-bound**: ...").
struct Report {
  std::string text;
  std::vector<std::string> ids;
  bool has(const std::string& id) const { return std::find(ids.begin(), ids.end(), id) != ids.end(); }
};

Report report_of(const std::string& args) {
  const auto r = diagnose(args);
  EXPECT_EQ(r.code, 0) << r.output;
  Report out{r.output, {}};
  for (size_t at = r.output.find(". **"); at != std::string::npos; at = r.output.find(". **", at + 1)) {
    const size_t end = r.output.find("**", at + 4);
    out.ids.push_back(r.output.substr(at + 4, end - at - 4));
  }
  EXPECT_FALSE(out.ids.empty()) << r.output;
  if (out.ids.empty()) out.ids.push_back("none");
  return out;
}

nlohmann::json json_report(const std::string& trace) {
  const auto r = diagnose("--json " + kTraces + trace);
  EXPECT_EQ(r.code, 0) << r.output;
  return nlohmann::json::parse(r.output);
}

TEST(CliDiagnose, AnEagerFp32StepIsLaunchBound) {
  const Report r = report_of(kTraces + "launch_bound.json.gz");
  const std::string& out = r.text;
  EXPECT_EQ(r.ids.front(), "launch-bound") << out;
  EXPECT_TRUE(r.has("host-syncs")) << out;   // loss.item() each step
  EXPECT_TRUE(r.has("fp32-matmul")) << out;  // ampere_sgemm kernels
  EXPECT_FALSE(r.has("matrix-bound")) << out;
  // What ran, and the advice in PyTorch's terms, not perftrain's keys.
  EXPECT_TRUE(contains(out, "- program: a PyTorch program")) << out;
  EXPECT_TRUE(contains(out, "- device: NVIDIA H200 (132 SMs")) << out;
  EXPECT_TRUE(contains(out, "- steps: 2 (ProfilerStep ranges)")) << out;
  EXPECT_TRUE(contains(out, "mode=\"reduce-overhead\"")) << out;
  EXPECT_TRUE(contains(out, "capturable=True")) << out;
  EXPECT_TRUE(contains(out, "torch.autocast(\"cuda\", dtype=torch.bfloat16)")) << out;
  EXPECT_TRUE(contains(out, "cudaStreamSynchronize in aten::_local_scalar_dense")) << out;
  EXPECT_FALSE(contains(out, "speed.graph")) << out;
  // The phases torch marks: the autograd engine's nodes, the optimizer, the DataLoader.
  EXPECT_TRUE(contains(out, "| GPU busy: backward |")) << out;
  EXPECT_TRUE(contains(out, "| GPU busy: optimizer |")) << out;
  EXPECT_TRUE(contains(out, "| GPU busy: forward, loss and the rest (not marked) |")) << out;
}

TEST(CliDiagnose, ACompiledBf16StepIsMatrixBound) {
  const Report r = report_of(kTraces + "matrix_bound.json --group-by op --top 5");
  EXPECT_EQ(r.ids.front(), "matrix-bound") << r.text;
  for (const char* quiet : {"launch-bound", "data-bound", "fp32-matmul", "host-syncs", "elementwise"})
    EXPECT_FALSE(r.has(quiet)) << quiet << "\n" << r.text;
  EXPECT_TRUE(contains(r.text, "torch.compile's kernels in it")) << r.text;
  EXPECT_TRUE(contains(r.text, "- precision: bf16")) << r.text;
  EXPECT_TRUE(contains(r.text, "| `aten::mm` |")) << r.text;          // the op table by op
  EXPECT_TRUE(contains(r.text, "| GPU busy: forward |")) << r.text;  // CompiledFunction
}

TEST(CliDiagnose, AStepWaitingForItsDataLoaderIsDataBound) {
  const Report r = report_of(kTraces + "data_bound.json");
  EXPECT_EQ(r.ids.front(), "data-bound") << r.text;
  for (const char* said : {"pin_memory=True", "num_workers", "copies from pageable memory",
                           "| GPU idle: waiting for data |"})
    EXPECT_TRUE(contains(r.text, said)) << said << "\n" << r.text;
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
