// perftrain: train DiT-class transformers fast on one GPU, and see why a step
// is fast or slow. Exit codes: 0 done, 1 runtime failure, 2 usage error.
#include <CLI/CLI.hpp>

#include <iostream>

#include "base/error.h"
#include "cli/command.h"
#include "compat/compat.h"

int main(int argc, char** argv) {
  CLI::App app{"perftrain: fast single-GPU training of diffusion transformers"};
  app.require_subcommand(1);
  perftrain::cli::add_train_command(app);
  perftrain::cli::add_sample_command(app);
  perftrain::cli::add_models_command(app);
  perftrain::cli::add_bench_command(app);
  // CLI11 says only "a subcommand is required" for a mistyped command: name it
  // and list the real ones.
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const CLI::App* c : app.get_subcommands([](CLI::App*) { return true; })) {
      known += (known.empty() ? "" : ", ") + c->get_name();
      found |= c->get_name() == argv[1];
    }
    if (!found) {
      std::cerr << "perftrain: unknown command '" << argv[1] << "'; commands: " << known << " (see perftrain --help)\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "perftrain: " << e.what() << " (see perftrain --help)\n";
    return 2;
  } catch (const perftrain::UsageError& e) {
    std::cerr << "perftrain: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "perftrain: error: " << perftrain::compat::error_message(e) << "\n";
    return 1;
  }
  return 0;
}
