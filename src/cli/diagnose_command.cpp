// perftrain diagnose TRACE: parses the options and prints the breakdown and
// diagnosis of a torch.profiler trace from any program
// (observe/profile/trace_diagnosis.h).
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>
#include <string>

#include "cli/command.h"
#include "cli/option_checks.h"
#include "observe/profile/trace_diagnosis.h"

namespace perftrain::cli {
namespace {

struct DiagnoseArgs {
  std::string trace;
  std::string group_by = "kernel";
  int64_t top = 15;
  bool json = false;
};

void run(const DiagnoseArgs& a) {
  namespace op = observe::profile;
  op::DiagnoseOptions o;
  o.group_by = op::parse_group_by(a.group_by);
  o.top = static_cast<size_t>(a.top);
  o.json = a.json;
  std::cout << op::diagnose_trace(a.trace, o);
}

}  // namespace

void add_diagnose_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("diagnose", "breakdown and diagnosis of a torch.profiler trace (Chrome JSON, or "
                                             ".json.gz) from any PyTorch program (docs/guide/profiling.md)");
  auto a = std::make_shared<DiagnoseArgs>();
  cmd->add_option("trace", a->trace, "the trace: torch.profiler's export_chrome_trace or tensorboard_trace_handler "
                                     "output, or a perftrain profile window")
      ->required();
  cmd->add_flag("--json", a->json, "print the report as one JSON object");
  cmd->add_option("--group-by", a->group_by, "kernel | op | scope: the op table's rows");
  cmd->add_option("--top", a->top, "rows of the op table")->check(integer_in(1, 100000));
  cmd->callback([a] { run(*a); });
}

}  // namespace perftrain::cli
