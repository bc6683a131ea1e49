// perftrain eval: sample quality of a checkpoint (FID, Inception score,
// precision/recall through the FID Inception network; a Fréchet distance and
// class consistency through the run's feature network), and training that
// feature network once (--train-features). docs/guide/evaluation.md.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <string>

#include "base/error.h"
#include "base/fs.h"
#include "cli/checkpoint_model.h"
#include "cli/command.h"
#include "cli/option_checks.h"
#include "compat/compat.h"
#include "data/dataset.h"
#include "io/atomic_file.h"
#include "train/eval/evaluation.h"
#include "train/eval/feature_net_training.h"

namespace perftrain::cli {
namespace {

struct EvalArgs {
  CheckpointArgs source;
  SamplerArgs sampler;
  train::eval::EvalOptions eval;
  std::string out;              // eval.json; default: in the run directory
  std::string data = "/usr/share/datasets/fashion-mnist";
  bool train_features = false;
  int64_t feature_epochs = 1;
};

// --train-features: the feature network on Fashion-MNIST's training set, its
// accuracy on the test set, written to --features.
void train_features(const EvalArgs& a) {
  if (a.eval.features.empty()) throw UsageError("--train-features needs --features PATH (the file to write)");
  const bool cuda = a.source.device == "cuda" || (a.source.device == "auto" && compat::cuda_available());
  const at::Device device = cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  const auto train_set = data::open_fashion_mnist(a.data, true);
  const auto test_set = data::open_fashion_mnist(a.data, false);
  train::eval::FeatureNetTraining o;
  o.epochs = a.feature_epochs;
  const auto r = train::eval::train_feature_net(*train_set, test_set.get(), a.eval.features, o, device, std::cout);
  std::printf("wrote %s: feature network, test accuracy %.4f, trained in %.1f s\n", a.eval.features.c_str(),
              r.test_accuracy, r.seconds);
}

void print_table(const train::eval::Metrics& m) {
  std::printf("%-22s %s\n", "metric", "value");
  for (const auto& [k, v] : m) std::printf("%-22s %.6g\n", k.c_str(), v);
}

void run(const EvalArgs& a) {
  if (a.train_features) train_features(a);
  if (a.source.ckpt.empty()) {
    if (a.train_features) return;
    throw UsageError("--ckpt is required (or --train-features alone)");
  }
  if (!a.eval.features.empty() && !fs::exists(a.eval.features))
    throw UsageError("--features " + a.eval.features + " does not exist (make it with --train-features)");
  // Everything the user named is checked before the (long) sampling starts.
  const CheckpointModel m = load_checkpoint_model(a.source, [&](const train::TrainConfig& cfg) {
    if (a.sampler.vae.empty()) train::require_images(cfg, {}, "eval");
  });
  train::eval::EvalOptions o = a.eval;
  o.sample = sampler_options(a.sampler, m);
  o.vae = a.sampler.vae;
  const train::eval::Evaluator evaluator(o, m.device);
  evaluator.check_model(m.cfg);
  const std::string out = !a.out.empty() ? a.out : m.run_dir.empty() ? "eval.json" : m.run_dir + "/eval.json";
  const train::eval::Metrics metrics = evaluator.run(*m.model, m.cfg);
  print_table(metrics);
  io::write_text_atomic(out, train::eval::metrics_json(metrics, o, m.path));
  std::cout << "wrote " << out << ": " << o.samples << " samples, " << o.sample.steps << " steps, guidance "
            << o.sample.cfg_scale << ", from " << m.path << "\n";
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "sample quality of a checkpoint: FID, Inception score, precision/recall "
                                         "(--inception), or the feature network's distance and class consistency "
                                         "(--features)");
  auto a = std::make_shared<EvalArgs>();
  add_checkpoint_options(cmd, a->source);
  cmd->get_option("--ckpt")->required(false);
  add_sampler_options(cmd, a->sampler);
  auto& e = a->eval;
  cmd->add_option("--samples", e.samples, "images sampled")->check(integer_in(10, 10000000));
  cmd->add_option("--batch-size", e.batch_size, "images sampled and measured at once")->check(integer_in(1, 65536));
  cmd->add_option("--inception", e.inception,
                  "pytorch-fid's Inception weights as safetensors (docs/guide/evaluation.md has the conversion)")
      ->check(CLI::ExistingFile)
      ->default_str("none");
  cmd->add_option("--ref-stats", e.ref_stats, ".npz with mu and sigma (pytorch-fid --save-stats, ADM's batches)")
      ->check(CLI::ExistingFile)
      ->default_str("none");
  cmd->add_option("--ref-features", e.ref_features,
                  ".npz/.npy whose arr_0 is reference pool3 features [M, 2048] or uint8 images [M, H, W, C] "
                  "(precision/recall; the statistics too without --ref-stats)")
      ->check(CLI::ExistingFile)
      ->default_str("none");
  cmd->add_option("--features", e.features, "the feature network file (written by --train-features)")
      ->check(printable_text())
      ->default_str("none");
  cmd->add_flag("--train-features", a->train_features,
                "train the feature network on Fashion-MNIST (--data-path) once and write it to --features");
  cmd->add_option("--data-path", a->data, "Fashion-MNIST directory for --train-features");
  cmd->add_option("--feature-epochs", a->feature_epochs, "epochs of --train-features")->check(integer_in(1, 100));
  cmd->add_option("--out", a->out, "eval.json to write")
      ->check(printable_text())
      ->default_str("eval.json in the run directory (--ckpt a directory), else here");
  cmd->callback([a] { run(*a); });
}

}  // namespace perftrain::cli
