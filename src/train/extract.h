// `perftrain extract`: images to the latent shards the trainer reads
// (data/latent_shards.cpp's format), as fast-DiT's extract_features.py does
// it: each image ADM-centre-cropped to --image-size (data/adm_crop.h),
// scaled to [-1, 1], encoded by the user's VAE (train/vae.h), a sample of
// the posterior taken and stored as (z - shift_factor) * scaling_factor;
// with flip, the horizontally flipped image too, right after it.
//
// Output: OUT/latents-000000.safetensors, ... of shard_size samples each
// ("latents" [n, C, h, w] F32, "labels" [n] I64), each written atomically,
// with metadata recording the settings (the VAE, its scale, the image size,
// the flip, the data, the shard size, the seed and the number of samples).
// Resumable: a rerun with the same settings keeps the complete shards and
// continues after the last one (every shard's noise comes from seed and its
// index, so the result is the same as an uninterrupted run's); an OUT that
// holds shards of other settings is refused, naming the first that differs.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

namespace perftrain::train {

struct ExtractOptions {
  std::string data_path;  // an image folder or tar shards (data/image_set.h)
  std::string vae;        // a diffusers AutoencoderKL folder
  std::string out;        // the shard directory
  int64_t image_size = 256;
  int64_t batch_size = 32;
  int64_t shard_size = 10000;  // samples per shard
  bool flip = false;           // also the horizontally flipped copy of each image
  std::string device = "auto";  // auto | cpu | cuda
  bool bf16 = false;            // the VAE in bfloat16 (CUDA)
  uint64_t seed = 0;            // the posterior samples' noise
};

struct ExtractResult {
  int64_t samples = 0;         // in all shards
  int64_t shards = 0;
  int64_t shards_kept = 0;     // complete shards found from an earlier run
  double seconds = 0;
};

// UsageError (one line, naming the option) for a bad option, folder or
// file, before anything is written; progress lines on `log`.
ExtractResult run_extract(const ExtractOptions& o, std::ostream& log, bool interactive);

}  // namespace perftrain::train
