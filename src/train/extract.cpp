#include "train/extract.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <map>
#include <ostream>
#include <vector>

#include "base/error.h"
#include "base/fs.h"
#include "base/text.h"
#include "compat/compat.h"
#include "data/adm_crop.h"
#include "data/image_set.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "train/progress.h"
#include "train/vae.h"

namespace perftrain::train {
namespace {

using Metadata = std::map<std::string, std::string>;

constexpr const char* kShardPrefix = "latents-";
constexpr const char* kShardSuffix = ".safetensors";

std::string shard_name(int64_t i) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%06lld%s", kShardPrefix, static_cast<long long>(i), kShardSuffix);
  return buf;
}

// The shard index of a name shard_name made, or -1.
int64_t shard_index(const std::string& name) {
  const std::string prefix = kShardPrefix, suffix = kShardSuffix;
  if (name.size() != shard_name(0).size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = name.substr(prefix.size(), 6);
  for (char c : digits)
    if (c < '0' || c > '9') return -1;
  return std::stoll(digits);
}

std::string absolute(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) != nullptr ? std::string(buf) : path;
}

std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// What every shard records; a rerun continues only where all of it agrees.
Metadata settings_of(const ExtractOptions& o, const Vae& vae, const data::ImageSet& set, int64_t samples) {
  return {{kShardVae, absolute(o.vae)},
          {kShardScalingFactor, number_text(vae.scale.scale)},
          {kShardShiftFactor, number_text(vae.scale.shift)},
          {"vae_dtype", o.bf16 ? "bf16" : "fp32"},
          {"image_size", std::to_string(o.image_size)},
          {"flip", o.flip ? "true" : "false"},
          {"data", fs::exists(o.data_path) ? absolute(o.data_path) : o.data_path},
          {"shard_size", std::to_string(o.shard_size)},
          {"seed", std::to_string(o.seed)},
          {"samples", std::to_string(samples)},
          {"num_classes", std::to_string(set.num_classes())}};
}

// The complete shards an earlier run left in `out` (0, 1, ... without a gap),
// after removing what interrupted writes left. UsageError for shards of other
// settings, or other safetensors files the trainer would read as shards.
int64_t kept_shards(const std::string& out, const Metadata& settings, int64_t total) {
  if (!fs::exists(out)) {
    fs::create_directories(out);
    return 0;
  }
  if (!fs::is_directory(out)) throw UsageError("--out " + base::printable(out) + " is not a directory");
  std::vector<bool> present(static_cast<size_t>(total), false);
  for (const std::string& name : fs::list_directory(out)) {
    const std::string path = fs::join(out, name);
    if (io::is_atomic_temp_name(name)) {
      ::unlink(path.c_str());
      continue;
    }
    if (name.size() < 12 || name.compare(name.size() - 12, 12, kShardSuffix) != 0 || name[0] == '.') continue;
    const int64_t i = shard_index(name);
    if (i < 0)
      throw UsageError("--out " + base::printable(out) + " holds " + base::printable(name) +
                       ", which the trainer would read as a shard too; choose another --out");
    const Metadata m = io::SafetensorsFile::open(path).metadata();
    for (const auto& [key, value] : settings) {
      const auto it = m.find(key);
      const std::string there = it == m.end() ? "none" : it->second;
      if (there != value)
        throw UsageError("--out " + base::printable(out) + " holds shards of other settings: " +
                         base::printable(name) + " has " + key + " " + base::printable(there) + ", this run " +
                         base::printable(value) + "; choose another --out");
    }
    if (i < total) present[static_cast<size_t>(i)] = true;
  }
  int64_t kept = 0;
  while (kept < total && present[static_cast<size_t>(kept)]) ++kept;
  return kept;
}

// Items [first, first + count) as images [count, 3, size, size] in [-1, 1]:
// item k is image k / copies, flipped when k % copies is 1. Each image is
// read and cropped once, the images of the batch on ATen's CPU threads.
at::Tensor load_images(const data::ImageSet& set, int64_t first, int64_t count, int64_t copies, int64_t size) {
  at::Tensor out = at::empty({count, 3, size, size}, at::TensorOptions().dtype(at::kFloat));
  const int64_t first_image = first / copies, last_image = (first + count - 1) / copies;
  at::parallel_for(first_image, last_image + 1, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // (x / 255 - 0.5) / 0.5: torchvision's ToTensor and Normalize, as fast-DiT and the image inputs.
      const at::Tensor rgb = data::adm_center_crop(set.read_rgb(i), size).permute({2, 0, 1});
      const at::Tensor x = (rgb.to(at::kFloat) / 255.0f - 0.5f) / 0.5f;
      for (int64_t c = 0; c < copies; ++c) {
        const int64_t k = i * copies + c;
        if (k >= first && k < first + count) out[k - first].copy_(c == 1 ? x.flip({2}) : x);
      }
    }
  });
  return out;
}

at::Tensor labels_of(const data::ImageSet& set, int64_t first, int64_t count, int64_t copies) {
  at::Tensor y = at::empty({count}, at::TensorOptions().dtype(at::kLong));
  for (int64_t k = 0; k < count; ++k) y.data_ptr<int64_t>()[k] = set.item((first + k) / copies).label;
  return y;
}

struct Plan {
  int64_t copies = 1, samples = 0, shards = 0;
  std::array<int64_t, 3> latent{};  // C, h, w
};

Plan plan_of(const ExtractOptions& o, const Vae& vae, const data::ImageSet& set) {
  const auto& c = vae.net->config();
  const int64_t f = c.downsample_factor();
  if (c.in_channels != 3)
    throw UsageError("--vae " + base::printable(o.vae) + ": in_channels " + std::to_string(c.in_channels) +
                     ", images have 3");
  if (o.image_size % f != 0)
    throw UsageError("--image-size " + std::to_string(o.image_size) + " is not a multiple of the VAE's downsampling, " +
                     std::to_string(f));
  Plan p;
  p.copies = o.flip ? 2 : 1;
  p.samples = set.size() * p.copies;
  p.shards = (p.samples + o.shard_size - 1) / o.shard_size;
  p.latent = {c.latent_channels, o.image_size / f, o.image_size / f};
  return p;
}

// One shard's latents, batch by batch, the next batch's images read while
// the VAE encodes the current one.
at::Tensor encode_shard(const ExtractOptions& o, const Vae& vae, const data::ImageSet& set, const Plan& p,
                        int64_t first, int64_t count, const at::Device& device,
                        const std::function<void(int64_t)>& progress) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed * 1000003 + static_cast<uint64_t>(first / o.shard_size));
  at::Tensor out = at::empty({count, p.latent[0], p.latent[1], p.latent[2]}, at::TensorOptions().dtype(at::kFloat));
  const auto load = [&](int64_t offset) {
    return std::async(std::launch::async, load_images, std::cref(set), first + offset,
                      std::min(o.batch_size, count - offset), p.copies, o.image_size);
  };
  auto next = load(0);
  for (int64_t done = 0; done < count;) {
    const at::Tensor images = next.get();
    const int64_t n = images.size(0);
    if (done + n < count) next = load(done + n);
    const auto post = vae.net->encode(images.to(device));
    const at::Tensor noise = at::randn(post.mean.sizes(), gen, at::kFloat).to(device);
    const at::Tensor z = (post.sample(noise) - vae.scale.shift) * vae.scale.scale;
    out.narrow(0, done, n).copy_(z.cpu());
    done += n;
    progress(first + done);
  }
  return out;
}

std::string shards_text(int64_t n) { return std::to_string(n) + (n == 1 ? " shard" : " shards"); }

at::Device device_of(const std::string& name) {
  if (name == "cuda" && !compat::cuda_available()) throw UsageError("--device cuda but no CUDA GPU is visible");
  const bool cuda = name == "cuda" || (name == "auto" && compat::cuda_available());
  return cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
}

}  // namespace

ExtractResult run_extract(const ExtractOptions& o, std::ostream& log, bool interactive) {
  const auto start = std::chrono::steady_clock::now();
  const at::Device device = device_of(o.device);
  if (o.bf16 && !device.is_cuda()) throw UsageError("--precision bf16 needs a CUDA device");
  const Vae vae = load_vae(o.vae, device, o.bf16);
  const data::ImageSet set = data::ImageSet::open(o.data_path);
  const Plan p = plan_of(o, vae, set);
  const Metadata settings = settings_of(o, vae, set, p.samples);
  ExtractResult r;
  r.shards = p.shards;
  r.samples = p.samples;
  r.shards_kept = kept_shards(o.out, settings, p.shards);
  log << "extract: " << set.size() << " images, " << set.num_classes() << " classes, from " << set.describe()
      << (o.flip ? ", each also flipped" : "") << " -> " << p.samples << " latents " << p.latent[0] << "x"
      << p.latent[1] << "x" << p.latent[2] << " in " << shards_text(p.shards) << " of " << o.shard_size << " in "
      << base::printable(o.out) << " (VAE " << base::printable(o.vae) << ", x " << vae.scale.scale << ")\n";
  if (r.shards_kept > 0) log << "resuming after the " << shards_text(r.shards_kept) << " already complete\n";
  const int64_t from = r.shards_kept * o.shard_size;
  const auto encoding = std::chrono::steady_clock::now();
  const auto progress = [&](int64_t done) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - encoding).count();
    const double rate = static_cast<double>(done - from) / std::max(s, 1e-9);
    char line[160];
    std::snprintf(line, sizeof line, " %lld/%lld latents | %.1f img/s | ETA %s", static_cast<long long>(done),
                  static_cast<long long>(p.samples), rate,
                  format_duration(static_cast<double>(p.samples - done) / std::max(rate, 1e-9)).c_str());
    const std::string text = "extract " + progress_bar(done, p.samples) + line;
    if (interactive) log << "\r" << text << "\x1b[K" << std::flush;
    else if (done % o.shard_size == 0 || done == p.samples) log << text << "\n" << std::flush;
  };
  for (int64_t s = r.shards_kept; s < p.shards; ++s) {
    const int64_t first = s * o.shard_size, count = std::min(o.shard_size, p.samples - first);
    const at::Tensor latents = encode_shard(o, vae, set, p, first, count, device, progress);
    io::save_safetensors(fs::join(o.out, shard_name(s)),
                         {{"latents", latents}, {"labels", labels_of(set, first, count, p.copies)}}, settings);
  }
  if (interactive) log << "\n";
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log << "wrote " << shards_text(p.shards - r.shards_kept) << " (" << p.shards << " in all, " << p.samples
      << " latents) to " << base::printable(o.out) << " in " << format_duration(r.seconds) << "\n";
  return r;
}

}  // namespace perftrain::train
