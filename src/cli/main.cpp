// perftrain: train DiT-class transformers fast on one GPU, and see why a step
// is fast or slow. Exit codes: 0 done, 1 runtime failure, 2 usage error.
#include <ATen/detail/CUDAHooksInterface.h>
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <new>
#include <regex>
#include <sstream>

#include "base/error.h"
#include "base/text.h"
#include "cli/command.h"
#include "compat/compat.h"
#include "train/memory_estimate.h"

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

// Run from a directory deleted under the shell, the program must say so
// before anything else: libtorch's initialisers (MKL's "cannot load
// libtorch_cpu.so" fatal error) fail without the current directory, and
// relative paths (run directories, --ckpt, data) need it too. So the check
// runs from the executable's .preinit_array, before any library's
// initialisers, with nothing but system calls: one line, exit 2.
void check_current_directory(int, char**, char**) {
  char cwd[4096];
  if (::getcwd(cwd, sizeof cwd) != nullptr || errno == ERANGE) return;  // ERANGE: it exists, deeper than 4096
  const char* why = errno == ENOENT ? "it was deleted; cd to a directory that exists and run again"
                    : errno == EACCES ? "permission denied"
                                      : "getcwd failed";
  for (const char* part : {"perftrain: cannot read the current directory: ", why, "\n"}) {
    const ssize_t written = ::write(STDERR_FILENO, part, std::strlen(part));
    (void)written;  // nothing more to do when stderr is gone
  }
  ::_exit(2);
}
__attribute__((section(".preinit_array"), used)) void (*const kCheckCurrentDirectory)(int, char**, char**) =
    check_current_directory;

// CLI11's NonNegativeNumber and PositiveNumber let nan and inf through (every
// comparison with nan is false) and print their bounds with std::to_string:
// the largest double as 309 digits, the smallest positive one as 0.000000.
// Every command's options with them take this check instead.
void tighten_number_checks(CLI::App& app) {
  for (CLI::App* cmd : app.get_subcommands([](CLI::App*) { return true; })) {
    for (CLI::Option* opt : cmd->get_options()) {
      for (int i = 0;; ++i) {
        CLI::Validator* v = nullptr;
        try {
          v = opt->get_validator(i);
        } catch (const CLI::OptionNotFound&) {
          break;
        }
        // CLI11 gives them no name, only these descriptions, which
        // cli/integer_option.h's checks share; CLI11's are the ones that let
        // nan through.
        const bool positive = v->get_description() == "POSITIVE";
        std::string probe = "nan";
        if ((!positive && v->get_description() != "NONNEGATIVE") || !(*v)(probe).empty()) continue;
        v->operation([positive](std::string& text) -> std::string {
          double x = 0;
          if (CLI::detail::lexical_cast(text, x) && std::isfinite(x) && (positive ? x > 0 : x >= 0)) return "";
          return text + " is not a finite number " + (positive ? "> 0" : ">= 0");
        });
      }
    }
  }
}

// One line for an allocation that failed, "" for other errors: std::bad_alloc,
// torch's CUDA OutOfMemoryError ("CUDA out of memory. Tried to allocate ...")
// and its CPU allocator's enforce ("[enforce fail at alloc_cpu.cpp:N] ...
// DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes").
// The checks before a run (the memory estimate, the bounds on config values)
// should have refused the request already; this is the last resort.
std::string out_of_memory_text(const std::exception& e) {
  const std::string advice = "; a smaller model, batch or sample grid needs less";
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return "out of memory (std::bad_alloc)" + advice;
  const std::string m = perftrain::compat::error_message(e);
  const bool cpu = m.find("DefaultCPUAllocator") != std::string::npos;
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) == nullptr && !cpu) return "";
  std::smatch bytes;
  if (cpu && std::regex_search(m, bytes, std::regex(R"(allocate (\d+) bytes)")))
    return "out of memory: " + perftrain::train::bytes_text(std::stod(bytes[1])) + " could not be allocated" + advice;
  return "out of memory: " + m + advice;
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
  perftrain::cli::add_eval_command(app);
  perftrain::cli::add_models_command(app);
  perftrain::cli::add_bench_command(app);
  perftrain::cli::add_verify_command(app);
  perftrain::cli::add_profile_command(app);
  perftrain::cli::add_diagnose_command(app);
  perftrain::cli::add_summary_command(app);
  perftrain::cli::add_graph_command(app);
  perftrain::cli::add_convert_command(app);
  perftrain::cli::add_extract_command(app);
  tighten_number_checks(app);
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
      std::cerr << "perftrain: unknown command '" << perftrain::base::printable(argv[1]) << "'; commands: " << known
                << " (see perftrain --help)\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {  // every message printable: it may echo a file's bytes or an option's
    std::cerr << "perftrain: " << perftrain::base::printable(e.what()) << " (see perftrain --help)\n";
    return 2;
  } catch (const perftrain::UsageError& e) {
    std::cerr << "perftrain: " << perftrain::base::printable(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    const std::string oom = out_of_memory_text(e);
    std::cerr << "perftrain: error: "
              << perftrain::base::printable(oom.empty() ? perftrain::compat::error_message(e) : oom) << "\n";
    return 1;
  }
  return 0;
}
