// The feature network of `perftrain eval --train-features`
// (models/feature_net.h): trained once on a run's training set (one epoch of
// Adam: seconds on a GPU, a few minutes of CPU time), its accuracy measured on
// the test set, and saved as one safetensors file with the reference
// statistics of the training set's features (reference.mu, reference.sigma),
// so that an evaluation needs no pass over the data.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <iosfwd>
#include <memory>
#include <string>

#include "data/dataset.h"
#include "models/feature_net.h"
#include "observe/eval/metrics.h"

namespace perftrain::train::eval {

struct FeatureNetTraining {
  int64_t epochs = 1;
  int64_t batch_size = 128;
  double lr = 1e-3;
  uint64_t seed = 0;
};

struct TrainedFeatureNet {
  double test_accuracy = 0;  // on `test`, or -1 without one
  double seconds = 0;
};

// Trains on `train`, measures on `test` (may be null), writes `path`
// atomically; a line per epoch to `log`.
TrainedFeatureNet train_feature_net(const data::Dataset& train, const data::Dataset* test, const std::string& path,
                                    const FeatureNetTraining& opts, const at::Device& device, std::ostream& log);

struct LoadedFeatureNet {
  std::unique_ptr<models::FeatureNet> net;
  observe::eval::FeatureStats reference;
  std::string dataset;  // what it was trained on (Dataset::describe())
  int64_t image_size = 0;
};

// UsageError naming the file when it is not a feature network file.
LoadedFeatureNet load_feature_net(const std::string& path, const at::Device& device);

// Features (and logits) of images in model space, a batch at a time.
at::Tensor dataset_features(const models::FeatureNet& net, const data::Dataset& data, const at::Device& device);

}  // namespace perftrain::train::eval
