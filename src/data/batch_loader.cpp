#include "data/batch_loader.h"

#include <ATen/Context.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <chrono>

#include "base/error.h"
#include "compat/compat.h"

namespace perftrain::data {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct SplitMix64 {
  uint64_t state;
  uint64_t next() { return mix(state += kGolden); }
  // Rejection keeps every value of [0, bound) equally likely; the modulo alone
  // would favour small values when 2^64 is not a multiple of bound.
  uint64_t below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }
};

}  // namespace

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  SplitMix64 rng{mix(seed ^ mix(static_cast<uint64_t>(epoch) + kGolden))};
  for (int64_t i = n - 1; i >= 1; --i) {
    std::swap(p[i], p[static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1))]);
  }
  return p;
}

bool sample_flipped(uint64_t seed, int64_t epoch, int64_t index) {
  return (mix(mix(mix(seed ^ 0xF11F11F11F11F11Full) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(index)) >>
          63) != 0;
}

BatchLoader::BatchLoader(const Dataset& dataset, int64_t batch_size, uint64_t seed,
                         LoaderPosition start, bool pin_memory, int depth, LoaderShard shard, LoaderOptions options)
    : dataset_(dataset), batch_size_(batch_size), shard_(shard), options_(options), seed_(seed), depth_(depth) {
  const int64_t n = dataset.size();
  if (n < 1) throw UsageError("cannot load batches: dataset " + dataset.describe() + " is empty");
  if (batch_size < 1) throw UsageError("batch size must be >= 1, got " + std::to_string(batch_size));
  if (depth < 1) throw UsageError("loader depth must be >= 1, got " + std::to_string(depth));
  if (options.workers < 1) throw UsageError("loader workers must be >= 1, got " + std::to_string(options.workers));
  if (shard.count < 1 || shard.index < 0 || shard.index >= shard.count || batch_size % shard.count != 0)
    throw UsageError("batch size " + std::to_string(batch_size) + " cannot be split into " +
                     std::to_string(shard.count) + " equal shards (shard " + std::to_string(shard.index) + ")");
  if (start.epoch < 0 || start.index < 0 || start.index > n) {
    throw UsageError("loader position (epoch " + std::to_string(start.epoch) + ", index " +
                     std::to_string(start.index) + ") is outside a dataset of " + std::to_string(n) +
                     " samples");
  }
  if (start.index == n) start = {start.epoch + 1, 0};
  // Page-locked memory needs the CUDA runtime; without it plain memory is the
  // only kind there is.
  pin_memory_ = pin_memory && at::globalContext().hasCUDA();
  produced_pos_ = consumed_pos_ = start;
  thread_ = std::thread([this] { produce(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BatchLoader::produce() {
  try {
    // Pinned allocations query CUDA events, which would invalidate a graph
    // the training thread is capturing meanwhile (compat.h).
    if (pin_memory_) compat::isolate_thread_from_graph_captures();
    const int64_t n = dataset_.size();
    const auto shape = dataset_.sample_shape();
    LoaderPosition pos = produced_pos_;
    std::vector<int64_t> perm = epoch_permutation(n, seed_, pos.epoch);
    std::vector<int64_t> indices(static_cast<size_t>(batch_size_));
    std::vector<LoaderPosition> places(static_cast<size_t>(batch_size_));  // each sample's place in the stream
    const auto options = at::TensorOptions().pinned_memory(pin_memory_);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stop_) return;
      }
      for (int64_t j = 0; j < batch_size_; ++j) {
        if (pos.index == n) {
          pos = {pos.epoch + 1, 0};
          perm = epoch_permutation(n, seed_, pos.epoch);
        }
        places[j] = pos;
        indices[j] = perm[pos.index++];
      }
      if (pos.index == n) {  // a batch that ends an epoch leaves us at the next one's start
        pos = {pos.epoch + 1, 0};
        perm = epoch_permutation(n, seed_, pos.epoch);
      }
      // This process's slice of the global batch.
      const int64_t b = batch_size_ / shard_.count;
      const int64_t* mine = indices.data() + shard_.index * b;
      Batch batch;
      batch.x = at::empty({b, shape[0], shape[1], shape[2]}, options.dtype(at::kFloat));
      batch.y = at::empty({b}, options.dtype(at::kLong));
      if (const auto cs = dataset_.cond_shape(); cs[0] > 0) {
        batch.cond = at::empty({b, cs[0], cs[1]}, options.dtype(at::kFloat));
        batch.cond_len = at::empty({b}, options.dtype(at::kLong));
      }
      fill(batch, mine, places.data() + shard_.index * b);

      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || static_cast<int>(queue_.size()) < depth_; });
      if (stop_) return;
      queue_.emplace_back(std::move(batch), pos);
      produced_pos_ = pos;
      lock.unlock();
      cv_.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
    }
    cv_.notify_all();
  }
}

void BatchLoader::fill_rows(Batch& batch, const int64_t* indices, const LoaderPosition* places, int64_t lo,
                            int64_t hi) const {
  if (hi <= lo) return;
  const auto s = dataset_.sample_shape();
  const int64_t numel = s[0] * s[1] * s[2];
  float* x = batch.x.data_ptr<float>();
  dataset_.gather(indices + lo, hi - lo, x + lo * numel, batch.y.data_ptr<int64_t>() + lo);
  if (batch.cond.defined()) {
    const int64_t cond_numel = batch.cond.size(1) * batch.cond.size(2);
    dataset_.gather_cond(indices + lo, hi - lo, batch.cond.data_ptr<float>() + lo * cond_numel,
                         batch.cond_len.data_ptr<int64_t>() + lo);
  }
  if (!options_.flip) return;
  for (int64_t r = lo; r < hi; ++r) {
    if (!sample_flipped(seed_, places[r].epoch, places[r].index)) continue;
    float* row = x + r * numel;
    for (int64_t line = 0; line < s[0] * s[1]; ++line) std::reverse(row + line * s[2], row + (line + 1) * s[2]);
  }
}

void BatchLoader::fill(Batch& batch, const int64_t* indices, const LoaderPosition* places) const {
  const int64_t b = batch.y.size(0);
  const int64_t threads = std::min<int64_t>(options_.workers, b);
  if (threads <= 1) return fill_rows(batch, indices, places, 0, b);
  // Thread k takes rows [k * b / threads, (k + 1) * b / threads); this
  // thread the first part. The first error (in row order) is rethrown.
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  auto part = [&](int64_t k) {
    try {
      fill_rows(batch, indices, places, k * b / threads, (k + 1) * b / threads);
    } catch (...) {
      errors[static_cast<size_t>(k)] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int64_t k = 1; k < threads; ++k) pool.emplace_back(part, k);
  part(0);
  for (auto& t : pool) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

Batch BatchLoader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (queue_.empty() && !error_) {
    const auto t0 = std::chrono::steady_clock::now();
    cv_.wait(lock, [&] { return !queue_.empty() || error_; });
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Batches made before a failure are still good; the error comes after them.
  if (queue_.empty()) std::rethrow_exception(error_);
  auto [batch, pos] = std::move(queue_.front());
  queue_.pop_front();
  consumed_pos_ = pos;
  lock.unlock();
  cv_.notify_all();
  return batch;
}

LoaderPosition BatchLoader::position() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return consumed_pos_;
}

double BatchLoader::wait_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return wait_seconds_;
}

}  // namespace perftrain::data
