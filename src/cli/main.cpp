// perftrain: train DiT-class transformers fast on one GPU, and see why a step
// is fast or slow. Exit codes: 0 done, 1 runtime failure, 2 usage error.
#include <ATen/detail/CUDAHooksInterface.h>
#include <CLI/CLI.hpp>
#include <cuda_runtime_api.h>

#include <cctype>
#include <fstream>
#include <iostream>
#include <sstream>

#include "base/error.h"
#include "cli/command.h"
#include "compat/compat.h"

// Set by CMake: the project version and the commit at configure time.
#ifndef PERFTRAIN_VERSION
#define PERFTRAIN_VERSION "unknown"
#endif
#ifndef PERFTRAIN_GIT_COMMIT
#define PERFTRAIN_GIT_COMMIT "unknown"
#endif

namespace {

// 12080 -> "12.8"
std::string cuda_version_text(long v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

// The NVIDIA kernel module's release ("570.86.15"): the first word of
// /proc/driver/nvidia/version that looks like one; "" without a driver.
std::string driver_release() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line, word;
  std::getline(f, line);
  std::istringstream words(line);
  while (words >> word) {
    if (std::isdigit(static_cast<unsigned char>(word[0])) && word.find('.') != std::string::npos) return word;
  }
  return "";
}

// What a bug report needs: our version and commit, torch's version and the
// CUDA it was built for, the CUDA our kernels were built with, and the GPU
// with its driver and runtime when there is one.
std::string version_text() {
  std::ostringstream o;
  o << "perftrain " << PERFTRAIN_VERSION << " (commit " << PERFTRAIN_GIT_COMMIT << ")\n";
  o << "torch " << perftrain::compat::torch_version();
  try {
    o << ", built for CUDA " << cuda_version_text(at::detail::getCUDAHooks().versionCUDART());
  } catch (const std::exception&) {
    o << ", built without CUDA";
  }
  o << "\nperftrain's kernels built with CUDA " << cuda_version_text(CUDART_VERSION) << "\n";
  if (perftrain::compat::cuda_available()) {
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    const std::string release = driver_release();
    o << "GPU: " << perftrain::compat::device_description(at::Device(at::kCUDA, 0)) << "; driver "
      << (release.empty() ? "" : release + " ") << "(CUDA " << cuda_version_text(driver) << "), CUDA runtime "
      << cuda_version_text(runtime);
  } else {
    o << "GPU: none visible";
  }
  return o.str();  // CLI11 ends the line
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"perftrain: fast single-GPU training of diffusion transformers"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text, "print the version, commit, torch and CUDA versions and exit");
  // Help shows each option's default (subcommands inherit this).
  app.option_defaults()->always_capture_default();
  perftrain::cli::add_train_command(app);
  perftrain::cli::add_config_command(app);
  perftrain::cli::add_sample_command(app);
  perftrain::cli::add_models_command(app);
  perftrain::cli::add_bench_command(app);
  perftrain::cli::add_verify_command(app);
  perftrain::cli::add_profile_command(app);
  perftrain::cli::add_summary_command(app);
  perftrain::cli::add_graph_command(app);
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
  } catch (const CLI::Success& e) {  // --help, --version
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
