// Files we write must load in Python's safetensors (what users' tools run),
// and files it writes must load here.
#include <ATen/ops/arange.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <cstring>

#include "base/error.h"
#include "io/safetensors.h"
#include "support/test_support.h"

namespace perftrain::io {
namespace {

using perftrain::testing::run_command;
using perftrain::testing::TempDir;
using perftrain::testing::write_raw;

int run_python(const TempDir& dir, const std::string& script, const std::string& args) {
  const std::string path = dir.file("script.py");
  write_raw(path, script);
  return run_command(std::string("'") + PERFTRAIN_PYTHON + "' '" + path + "' " + args);
}

// Loads our file, checks dtypes, metadata and one known tensor, then saves
// everything again with Python's writer for the way back.
constexpr const char* kCheckOurs = R"(
import sys, torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
src, dst = sys.argv[1], sys.argv[2]
t = load_file(src)
with safe_open(src, "pt") as f:
    meta = f.metadata()
assert meta == {"origin": "perftrain", "empty": ""}, meta
want = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
        "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8,
        "u8": torch.uint8, "bool": torch.bool, "ramp": torch.float32}
assert set(t) == set(want), sorted(t)
for k, dt in want.items():
    assert t[k].dtype == dt, (k, t[k].dtype)
assert torch.equal(t["ramp"], torch.arange(12, dtype=torch.float32).reshape(3, 4)), t["ramp"]
assert t["f32"].shape == (4, 3, 2), t["f32"].shape
save_file(t, dst, metadata=meta)
)";

TEST(SafetensorsPython, PythonReadsOursAndWeReadItsCopy) {
  TempDir dir;
  const auto f = at::TensorOptions().dtype(at::kFloat);
  const NamedTensors tensors = {
      {"f64", at::randn({3, 5}, f).to(at::kDouble)},
      {"f32", at::randn({2, 3, 4}, f).transpose(0, 2)},
      {"f16", at::randn({7}, f).to(at::kHalf)},
      {"bf16", at::randn({4, 4}, f).to(at::kBFloat16)},
      {"i64", at::randint(-(int64_t(1) << 40), int64_t(1) << 40, {6}, f.dtype(at::kLong))},
      {"i32", at::randint(-100000, 100000, {2, 2}, f.dtype(at::kInt))},
      {"i16", at::randint(-30000, 30000, {5}, f.dtype(at::kShort))},
      {"i8", at::randint(-128, 128, {3}, f.dtype(at::kChar))},
      {"u8", at::randint(0, 256, {1, 9}, f.dtype(at::kByte))},
      {"bool", at::randint(0, 2, {4}, f.dtype(at::kLong)).to(at::kBool)},
      {"ramp", at::arange(12, f).reshape({3, 4})},
  };
  const std::string ours = dir.file("ours.safetensors"), theirs = dir.file("theirs.safetensors");
  save_safetensors(ours, tensors, {{"origin", "perftrain"}, {"empty", ""}});
  ASSERT_EQ(run_python(dir, kCheckOurs, "'" + ours + "' '" + theirs + "'"), 0);

  const auto back = SafetensorsFile::open(theirs);
  EXPECT_EQ(back.metadata().at("origin"), "perftrain");
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(back.contains(name)) << name;
    const at::Tensor a = back.get(name), b = t.contiguous();
    ASSERT_EQ(a.scalar_type(), b.scalar_type()) << name;
    ASSERT_EQ(a.sizes(), b.sizes()) << name;
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), b.nbytes()), 0) << name;
  }
}

constexpr const char* kWriteKnown = R"(
import sys, torch
from safetensors.torch import save_file
save_file({
    "a": torch.arange(24, dtype=torch.float32).reshape(2, 3, 4),
    "h": torch.linspace(-1, 1, 9, dtype=torch.float16),
    "b": torch.arange(5, dtype=torch.bfloat16) * 0.5,
    "d": torch.arange(-3, 3, dtype=torch.int16),
    "e": torch.arange(7, dtype=torch.uint8),
    "m": torch.tensor([True, False, True]),
    "s": torch.tensor(3.5, dtype=torch.float64),
}, sys.argv[1], metadata={"format": "pt"})
)";

TEST(SafetensorsPython, WeReadWhatPythonWrote) {
  TempDir dir;
  const std::string path = dir.file("py.safetensors");
  ASSERT_EQ(run_python(dir, kWriteKnown, "'" + path + "'"), 0);
  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.names().size(), 7u);

  const at::Tensor a = file.get("a");
  ASSERT_EQ(a.sizes(), (std::vector<int64_t>{2, 3, 4}));
  for (int i = 0; i < 24; ++i) EXPECT_EQ(a.data_ptr<float>()[i], float(i));
  const at::Tensor h = file.get("h");
  ASSERT_EQ(h.scalar_type(), at::kHalf);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(float(h.data_ptr<at::Half>()[i]), -1.0f + 0.25f * i);
  const at::Tensor b = file.get("b");
  ASSERT_EQ(b.scalar_type(), at::kBFloat16);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(float(b.data_ptr<at::BFloat16>()[i]), 0.5f * i);
  const at::Tensor d = file.get("d");
  ASSERT_EQ(d.scalar_type(), at::kShort);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(d.data_ptr<int16_t>()[i], i - 3);
  const at::Tensor e = file.get("e");
  for (int i = 0; i < 7; ++i) EXPECT_EQ(e.data_ptr<uint8_t>()[i], i);
  const at::Tensor m = file.get("m");
  ASSERT_EQ(m.scalar_type(), at::kBool);
  EXPECT_EQ(m.data_ptr<bool>()[0], true);
  EXPECT_EQ(m.data_ptr<bool>()[1], false);
  const at::Tensor s = file.get("s");
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.data_ptr<double>()[0], 3.5);
}

// A file torch.save wrote is refused with the Python line that converts it,
// and that line, run as printed, gives a file we read.
TEST(SafetensorsPython, TorchSaveFileGetsAConversionThatWorks) {
  TempDir dir;
  const std::string pt = dir.file("weights.pt");
  ASSERT_EQ(run_python(dir, "import sys, torch\ntorch.save({'w': torch.arange(6.0).reshape(2, 3)}, sys.argv[1])\n",
                       "'" + pt + "'"),
            0);
  const std::string msg = perftrain::testing::error_of<UsageError>([&] { SafetensorsFile::open(pt); });
  const size_t begin = msg.find("python -c \""), end = msg.find('"', begin + 11);
  ASSERT_NE(begin, std::string::npos) << msg;
  ASSERT_NE(end, std::string::npos) << msg;
  ASSERT_EQ(run_command(std::string("'") + PERFTRAIN_PYTHON + "'" + msg.substr(begin + 6, end + 1 - begin - 6)), 0)
      << msg;
  const at::Tensor w = SafetensorsFile::open(dir.file("weights.safetensors")).get("w");
  ASSERT_EQ(w.sizes(), (std::vector<int64_t>{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(w.data_ptr<float>()[i], float(i));
}

}  // namespace
}  // namespace perftrain::io
