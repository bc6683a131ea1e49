// Latents extracted ahead of training (e.g. by a VAE), stored as safetensors
// shards. Each batch reads its samples with pread (data::SampleReader; the
// page cache holds what fits), not through the mapping, so that a shard
// truncated under a running trainer is a RuntimeError, not SIGBUS, and a NaN
// or inf in a sample is a data error naming the file and the sample. Only the
// labels are copied, to check them once at open.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "base/error.h"
#include "base/text.h"
#include "data/dataset.h"
#include "data/sample_reader.h"
#include "io/safetensors.h"

namespace perftrain::data {
namespace {

struct Shard {
  io::SafetensorsFile file;
  at::Tensor latents;  // view of the mapping, [n, C, H, W]
  std::vector<int64_t> labels;
  at::Tensor cond;                // view of the mapping, [n, Tc, Dc], or undefined
  std::vector<int64_t> cond_len;  // valid condition tokens per sample
  int64_t start = 0;  // index of its first sample in the dataset
  SampleReader latents_in{}, cond_in{};  // what the batches read (cond_in: when there are cond features)
};

std::string shape_text(at::IntArrayRef sizes) { return c10::str(sizes); }

}  // namespace

// POSIX rather than std::filesystem: libtorch 2.11 exports its own copies of
// some std::filesystem functions, and not all of them work.
std::vector<std::string> latent_shard_files(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw UsageError("latent shards: no such file or directory: " + base::printable(path));
  if (!S_ISDIR(st.st_mode)) return {path};
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr)
    throw UsageError("latent shards: cannot list " + base::printable(path) + ": " + std::strerror(errno));
  std::vector<std::string> out;
  const std::string suffix = ".safetensors";
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name[0] == '.') continue;  // hidden: editor and OS droppings
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string full = path + "/" + name;
    struct stat fst {};
    if (::stat(full.c_str(), &fst) == 0 && S_ISREG(fst.st_mode)) out.push_back(full);
  }
  ::closedir(dir);
  if (out.empty()) throw UsageError("latent shards: no *.safetensors files in " + base::printable(path));
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

std::optional<int64_t> metadata_num_classes(const io::SafetensorsFile& f) {
  const auto it = f.metadata().find("num_classes");
  if (it == f.metadata().end()) return std::nullopt;
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != it->second.size() || v < 1) {
    throw RuntimeError(base::printable(f.path()) + ": metadata num_classes '" + base::printable(it->second) +
                       "' is not a positive integer");
  }
  return v;
}

class LatentShards final : public Dataset {
 public:
  explicit LatentShards(const std::string& path) : path_(path) {
    std::optional<int64_t> declared;
    int64_t max_label = -1;
    for (const std::string& file_path : latent_shard_files(path)) {
      const std::string p = base::printable(file_path);  // for messages
      Shard s{io::SafetensorsFile::open(file_path), {}, {}, {}, {}, size_};
      for (const char* name : {"latents", "labels"}) {
        if (!s.file.contains(name)) throw RuntimeError(p + ": no tensor named '" + std::string(name) + "'");
      }
      s.latents = s.file.get("latents");
      const at::Tensor labels = s.file.get("labels");
      const auto dt = s.latents.scalar_type();
      if (s.latents.dim() != 4 || (dt != at::kFloat && dt != at::kHalf && dt != at::kBFloat16)) {
        throw RuntimeError(p + ": 'latents' must be [N, C, H, W] of F32, F16 or BF16, found " +
                           io::safetensors_dtype_name(dt) + " " + shape_text(s.latents.sizes()));
      }
      if (labels.dim() != 1 || !at::isIntegralType(labels.scalar_type(), /*includeBool=*/false)) {
        throw RuntimeError(p + ": 'labels' must be [N] of an integer type, found " +
                           io::safetensors_dtype_name(labels.scalar_type()) + " " + shape_text(labels.sizes()));
      }
      if (labels.size(0) != s.latents.size(0)) {
        throw RuntimeError(p + ": 'labels' has " + std::to_string(labels.size(0)) + " entries but 'latents' has " +
                           std::to_string(s.latents.size(0)) + " samples");
      }
      const std::array<int64_t, 3> shape{s.latents.size(1), s.latents.size(2), s.latents.size(3)};
      if (shards_.empty()) {
        shape_ = shape;
      } else if (shape != shape_) {
        throw RuntimeError(p + ": latents of " + shape_text(shape) + " per sample, but " + first_shard() +
                           " has " + shape_text(shape_));
      }
      const at::Tensor l64 = labels.to(at::kLong).contiguous();
      s.labels.assign(l64.data_ptr<int64_t>(), l64.data_ptr<int64_t>() + l64.numel());
      for (size_t i = 0; i < s.labels.size(); ++i) {
        if (s.labels[i] < 0) {
          throw RuntimeError(p + ": label " + std::to_string(s.labels[i]) + " of sample " + std::to_string(i) +
                             " is negative");
        }
        max_label = std::max(max_label, s.labels[i]);
      }
      if (const auto n = metadata_num_classes(s.file)) {
        if (declared && *declared != *n) {
          throw RuntimeError(p + ": metadata num_classes " + std::to_string(*n) + " differs from " +
                             std::to_string(*declared) + " in an earlier shard");
        }
        declared = n;
        const auto big = std::find_if(s.labels.begin(), s.labels.end(), [&](int64_t l) { return l >= *n; });
        if (big != s.labels.end()) {
          throw RuntimeError(p + ": label " + std::to_string(*big) + " of sample " +
                             std::to_string(big - s.labels.begin()) + " is not below metadata num_classes " +
                             std::to_string(*n));
        }
      }
      read_cond(s, p);
      s.latents_in = SampleReader::open(s.file, "latents");
      size_ += s.latents.size(0);
      shards_.push_back(std::move(s));
    }
    if (size_ == 0) throw RuntimeError("latent shards: " + base::printable(path) + " holds no samples");
    num_classes_ = declared ? *declared : max_label + 1;
  }

  std::array<int64_t, 2> cond_shape() const override { return cond_shape_; }

  void gather_cond(const int64_t* indices, int64_t n, float* cond_out, int64_t* len_out) const override {
    if (cond_shape_[0] == 0) throw RuntimeError(describe() + ": the shards hold no 'cond' features");
    const int64_t numel = cond_shape_[0] * cond_shape_[1];
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = indices[k];
      if (i < 0 || i >= size_) throw RuntimeError(describe() + ": sample index " + std::to_string(i) + " out of range");
      const auto it = shard_of(i);
      const int64_t j = i - it->start;
      len_out[k] = it->cond_len[j];
      it->cond_in.read(j, cond_out + k * numel);
    }
  }

  int64_t size() const override { return size_; }
  std::array<int64_t, 3> sample_shape() const override { return shape_; }
  int64_t num_classes() const override { return num_classes_; }

  std::string describe() const override {
    return "latent shards (" + summary() + ", " + std::to_string(shards_.size()) + " files) from " +
           base::printable(path_);
  }

 protected:
  int64_t read(int64_t i, float* out) const override {
    const auto it = shard_of(i);
    const int64_t j = i - it->start;
    it->latents_in.read(j, out);
    return it->labels[j];
  }

 private:
  std::string first_shard() const { return base::printable(shards_[0].file.path()); }

  // The last shard that starts at or before i.
  std::vector<Shard>::const_iterator shard_of(int64_t i) const {
    return std::upper_bound(shards_.begin(), shards_.end(), i, [](int64_t v, const Shard& s) { return v < s.start; }) -
           1;
  }

  // The optional "cond" / "cond_len" pair: in every shard or in none, of
  // one [Tc, Dc], lengths in [0, Tc].
  void read_cond(Shard& s, const std::string& p) {
    const bool has = s.file.contains("cond"), has_len = s.file.contains("cond_len");
    if (has != has_len) throw RuntimeError(p + ": 'cond' and 'cond_len' come together; found only one");
    const bool first = shards_.empty();
    if (!first && has != (cond_shape_[0] > 0))
      throw RuntimeError(p + (has ? ": has" : ": has no") + " condition features ('cond') but " +
                         first_shard() + (has ? " has none" : " has them"));
    if (!has) return;
    s.cond = s.file.get("cond");
    const at::Tensor len = s.file.get("cond_len");
    const auto dt = s.cond.scalar_type();
    if (s.cond.dim() != 3 || (dt != at::kFloat && dt != at::kHalf && dt != at::kBFloat16) ||
        s.cond.size(0) != s.latents.size(0) || s.cond.size(1) < 1 || s.cond.size(2) < 1)
      throw RuntimeError(p + ": 'cond' must be [N, Tc, Dc] of F32, F16 or BF16 with N = " +
                         std::to_string(s.latents.size(0)) + ", found " + io::safetensors_dtype_name(dt) + " " +
                         shape_text(s.cond.sizes()));
    if (len.dim() != 1 || len.size(0) != s.latents.size(0) ||
        !at::isIntegralType(len.scalar_type(), /*includeBool=*/false))
      throw RuntimeError(p + ": 'cond_len' must be [" + std::to_string(s.latents.size(0)) +
                         "] of an integer type, found " + io::safetensors_dtype_name(len.scalar_type()) + " " +
                         shape_text(len.sizes()));
    const std::array<int64_t, 2> shape{s.cond.size(1), s.cond.size(2)};
    if (!first && shape != cond_shape_)
      throw RuntimeError(p + ": 'cond' of " + shape_text(shape) + " per sample, but " + first_shard() +
                         " has " + shape_text(cond_shape_));
    cond_shape_ = shape;
    const at::Tensor l64 = len.to(at::kLong).contiguous();
    s.cond_len.assign(l64.data_ptr<int64_t>(), l64.data_ptr<int64_t>() + l64.numel());
    for (size_t i = 0; i < s.cond_len.size(); ++i)
      if (s.cond_len[i] < 0 || s.cond_len[i] > shape[0])
        throw RuntimeError(p + ": cond_len " + std::to_string(s.cond_len[i]) + " of sample " + std::to_string(i) +
                           " is outside [0, " + std::to_string(shape[0]) + "]");
    s.cond_in = SampleReader::open(s.file, "cond");
  }

  std::string path_;
  std::vector<Shard> shards_;
  std::array<int64_t, 3> shape_{};
  std::array<int64_t, 2> cond_shape_{0, 0};
  int64_t size_ = 0;
  int64_t num_classes_ = 0;
};

}  // namespace

std::unique_ptr<Dataset> open_latent_shards(const std::string& path) {
  return std::make_unique<LatentShards>(path);
}

}  // namespace perftrain::data
