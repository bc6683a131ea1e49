// Sample quality of a model (docs/guide/evaluation.md): N samples, rounded
// to 8 bits as saved images are, through the FID Inception network (FID
// against reference statistics, the Inception score where the weights carry
// the 1008-way fc, precision/recall against reference features) and/or the
// feature network of the run's data set (a Fréchet distance in its feature
// space and the class consistency of class-conditional samples). One
// Evaluator loads its networks once; `perftrain eval` runs it once and
// training every eval.every steps.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/diffusion_model.h"
#include "train/config.h"
#include "train/sampling.h"

namespace perftrain::train::eval {

struct EvalOptions {
  int64_t samples = 10000;
  int64_t batch_size = 250;
  SampleOptions sample;      // steps, guidance, seed (batch b draws from seed + b), bf16, the VAE's decoder
  std::string inception;     // FID Inception weights (safetensors); empty: none
  std::string ref_stats;     // .npz with mu, sigma (pytorch-fid --save-stats, ADM reference batches)
  std::string ref_features;  // .npz / .npy with reference pool3 features [M, 2048] (precision/recall)
  std::string features;      // feature network file; empty: none
  std::string vae;           // the VAE folder behind sample.decoder, for the record; empty: none
};

// Metric name -> value, in the order computed: fid, inception_score,
// inception_score_std, precision, recall, fd_features, class_consistency.
using Metrics = std::vector<std::pair<std::string, double>>;

class Evaluator {
 public:
  // Loads the networks and reference statistics; UsageError naming the
  // option and file when one is missing or not what it should be.
  Evaluator(const EvalOptions& opts, const at::Device& device);
  ~Evaluator();
  // UsageError (one line) when the model's images cannot go through the
  // networks: latents without a decoder (opts.sample.decoder), or a size or
  // channel count other than the feature network's.
  void check_model(const TrainConfig& cfg) const;
  Metrics run(const models::DiffusionModel& model, const TrainConfig& cfg) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The metrics as a JSON object text with the settings that produced them.
std::string metrics_json(const Metrics& m, const EvalOptions& opts, const std::string& checkpoint);

}  // namespace perftrain::train::eval
