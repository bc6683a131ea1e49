// Each subcommand lives in its own file and adds itself to the program with
// one of these; its callback parses nothing itself (CLI11 fills a plain
// struct) and calls the library.
#pragma once

namespace CLI {
class App;
}

namespace perftrain::cli {

void add_train_command(CLI::App& app);
void add_config_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_models_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_verify_command(CLI::App& app);
void add_profile_command(CLI::App& app);
void add_diagnose_command(CLI::App& app);
void add_summary_command(CLI::App& app);
void add_graph_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_extract_command(CLI::App& app);

}  // namespace perftrain::cli
