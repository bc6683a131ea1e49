// Per-tensor CRC32Cs in the safetensors metadata, and one of the header:
// recorded on write, checked on demand, the first corrupt tensor or the
// corrupt header named; files without them (or from before the header's)
// still load, and Python's safetensors reads and rewrites files with them.
#include <ATen/ops/arange.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <utility>
#include <vector>

#include "base/crc32c.h"
#include "base/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "support/header_edit.h"
#include "support/test_support.h"

namespace perftrain::io {
namespace {

using perftrain::testing::edit_header;
using perftrain::testing::error_of;
using perftrain::testing::read_raw;
using perftrain::testing::run_command;
using perftrain::testing::TempDir;
using perftrain::testing::write_raw;

NamedTensors random_tensors() {
  return {{"a.weight", at::randn({17, 5})},
          {"b.bias", at::randn({33}).to(at::kBFloat16)},
          {"steps", at::randint(0, 1 << 30, {9}, at::TensorOptions().dtype(at::kLong))},
          {"c.weight", at::randn({4, 8, 3})}};
}

// Byte offset in the file of tensor `name`'s data, from the header.
int64_t data_offset(const std::string& path, const std::string& name) {
  const std::string bytes = read_raw(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  return 8 + static_cast<int64_t>(n) + header.at(name).at("data_offsets")[0].get<int64_t>();
}

void flip_bit(const std::string& path, int64_t byte, int bit) {
  std::string bytes = read_raw(path);
  bytes[byte] = static_cast<char>(bytes[byte] ^ (1 << bit));
  write_raw(path, bytes);
}

TEST(SafetensorsChecksum, RecordsTheCrcOfEachTensorsBytes) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  const NamedTensors tensors = random_tensors();
  save_safetensors(path, tensors, {{"step", "7"}}, SaveOptions{true});
  const auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.has_checksums());
  EXPECT_EQ(file.metadata().at("step"), "7");
  const auto record = nlohmann::json::parse(file.metadata().at(kChecksumKey));
  ASSERT_EQ(record.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const at::Tensor c = t.contiguous();
    char want[16];
    std::snprintf(want, sizeof want, "%08x", base::crc32c(c.data_ptr(), c.nbytes()));
    EXPECT_EQ(record.at(name).get<std::string>(), want) << name;
  }
  EXPECT_EQ(file.verify_checksums(), tensors.size());
}

TEST(SafetensorsChecksum, AFlippedBitNamesTheFirstCorruptTensor) {
  std::mt19937 rng(std::random_device{}());
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  const NamedTensors tensors = random_tensors();
  for (const auto& [name, t] : tensors) {
    save_safetensors(path, tensors, {}, SaveOptions{true});
    const int64_t nbytes = static_cast<int64_t>(t.nbytes());
    flip_bit(path, data_offset(path, name) + static_cast<int64_t>(rng() % nbytes), static_cast<int>(rng() % 8));
    const std::string msg = error_of<RuntimeError>([&] { SafetensorsFile::open(path).verify_checksums(); });
    EXPECT_NE(msg.find("tensor '" + name + "' is corrupt"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  }
  // Two corrupt tensors: the first in data order is named.
  save_safetensors(path, tensors, {}, SaveOptions{true});
  flip_bit(path, data_offset(path, "c.weight"), 3);
  flip_bit(path, data_offset(path, "b.bias") + 1, 0);
  const std::string msg = error_of<RuntimeError>([&] { SafetensorsFile::open(path).verify_checksums(); });
  EXPECT_NE(msg.find("tensor 'b.bias'"), std::string::npos) << msg;
}

TEST(SafetensorsChecksum, AFileWithoutChecksumsStillLoads) {
  TempDir dir;
  const std::string path = dir.file("plain.safetensors");
  const NamedTensors tensors = random_tensors();
  save_safetensors(path, tensors, {{"format", "pt"}});
  const auto file = SafetensorsFile::open(path);
  EXPECT_FALSE(file.has_checksums());
  EXPECT_EQ(file.verify_checksums(), 0u);
  EXPECT_TRUE(file.get("a.weight").equal(tensors[0].second));
}

TEST(SafetensorsChecksum, TheChecksumKeysAreReserved) {
  TempDir dir;
  for (const char* key : {kChecksumKey, kHeaderChecksumKey}) {
    const std::string msg = error_of<UsageError>([&] {
      save_safetensors(dir.file("t.safetensors"), random_tensors(), {{key, "x"}}, SaveOptions{true});
    });
    EXPECT_NE(msg.find(kChecksumKey), std::string::npos) << msg;
  }
}

// What the tensor CRC32Cs cannot see: a metadata value, a dtype of the same
// size, a shape with the same count. The header's CRC32C does.
TEST(SafetensorsChecksum, AnEditedHeaderIsFoundWithoutReadingTheData) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"\"step\":\"7\"", "\"step\":\"1\""},
                                 {"\"dtype\":\"F32\",\"shape\":[17,5]", "\"dtype\":\"I32\",\"shape\":[17,5]"},
                                 {"\"shape\":[17,5]", "\"shape\":[5,17]"}}) {
    save_safetensors(path, random_tensors(), {{"step", "7"}}, SaveOptions{true});
    ASSERT_TRUE(SafetensorsFile::open(path).has_header_checksum());
    SafetensorsFile::open(path).verify_header_checksum();
    edit_header(path, from, to);
    const auto file = SafetensorsFile::open(path);
    for (const auto& check : std::vector<std::function<void()>>{[&] { file.verify_header_checksum(); },
                                                                [&] { file.verify_checksums(); }}) {
      const std::string msg = error_of<RuntimeError>(check);
      EXPECT_NE(msg.find(path + ": the header is corrupt"), std::string::npos) << to << ": " << msg;
    }
  }
}

// A file from before the header checksum: tensors checked, the header not.
TEST(SafetensorsChecksum, AFileWithoutAHeaderChecksumStillVerifies) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  save_safetensors(path, random_tensors(), {{"step", "7"}}, SaveOptions{true});
  const auto file = SafetensorsFile::open(path);
  NamedTensors tensors;
  for (const auto& name : file.names()) tensors.emplace_back(name, file.get(name).clone());
  auto meta = file.metadata();
  meta.erase(kHeaderChecksumKey);
  save_safetensors(path, tensors, meta);
  const auto old = SafetensorsFile::open(path);
  EXPECT_TRUE(old.has_checksums());
  EXPECT_FALSE(old.has_header_checksum());
  EXPECT_EQ(old.verify_checksums(), tensors.size());
}

// PyTorch's safetensors (and so facebookresearch/DiT's load_state_dict) reads
// a file with checksums: metadata values are strings, tensors unchanged.
TEST(SafetensorsChecksum, PythonReadsAFileWithChecksums) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  const at::Tensor ramp = at::arange(12, at::TensorOptions().dtype(at::kFloat)).reshape({3, 4});
  save_safetensors(path, {{"ramp", ramp}, {"noise", at::randn({5})}}, {{"format", "pt"}}, SaveOptions{true});
  const std::string script = dir.file("check.py");
  write_raw(script, R"(
import sys, json, torch
from safetensors import safe_open
from safetensors.torch import load_file
t = load_file(sys.argv[1])
assert torch.equal(t["ramp"], torch.arange(12, dtype=torch.float32).reshape(3, 4)), t["ramp"]
with safe_open(sys.argv[1], "pt") as f:
    meta = f.metadata()
assert all(isinstance(v, str) for v in meta.values()), meta
assert meta["format"] == "pt", meta
assert set(json.loads(meta["perftrain.crc32c"])) == {"ramp", "noise"}, meta
)");
  EXPECT_EQ(run_command(std::string("'") + PERFTRAIN_PYTHON + "' '" + script + "' '" + path + "'"), 0);
}

// Python's safetensors rewriting a file with its metadata kept (it orders
// the header its own way and may place the tensors anew): both checksums
// still hold, since they cover what the header says, not its layout.
TEST(SafetensorsChecksum, AFileRewrittenByPythonWithItsMetadataStillVerifies) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors"), copy = dir.file("copy.safetensors");
  save_safetensors(path, random_tensors(), {{"format", "pt"}, {"step", "7"}}, SaveOptions{true});
  const std::string script = dir.file("rewrite.py");
  write_raw(script, R"(
import sys
from safetensors import safe_open
from safetensors.torch import load_file, save_file
with safe_open(sys.argv[1], "pt") as f:
    meta = f.metadata()
save_file(load_file(sys.argv[1]), sys.argv[2], metadata=meta)
)");
  ASSERT_EQ(run_command(std::string("'") + PERFTRAIN_PYTHON + "' '" + script + "' '" + path + "' '" + copy + "'"), 0);
  ASSERT_NE(read_raw(copy), read_raw(path));  // laid out anew
  const auto file = SafetensorsFile::open(copy);
  ASSERT_TRUE(file.has_header_checksum());
  EXPECT_EQ(file.verify_checksums(), 4u);
}

TEST(AtomicTempName, RecognisesOnlyWriteFileAtomicsTemporaries) {
  TempDir dir;
  // The name of the temporary file while a write is under way (what a kill
  // at that moment leaves).
  std::vector<std::string> during;
  write_file_atomic(dir.file("latest"), [&](std::FILE*) { during = dir.entries(); });
  ASSERT_EQ(during.size(), 1u);
  EXPECT_TRUE(is_atomic_temp_name(during[0])) << during[0];
  EXPECT_TRUE(is_atomic_temp_name(".latest.tmp.123.0.0"));
  EXPECT_TRUE(is_atomic_temp_name(".model.safetensors.tmp.99999.12.3"));
  for (const char* keep : {"latest", "model.safetensors", ".hidden", ".a.tmp.1.2", ".a.tmp.1.2.x", "a.tmp.1.2.3",
                           ".a.tmp.1..3", "step_00000010"})
    EXPECT_FALSE(is_atomic_temp_name(keep)) << keep;
}

}  // namespace
}  // namespace perftrain::io
