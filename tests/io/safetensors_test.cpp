#include "io/safetensors.h"

#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include "base/error.h"
#include "support/test_support.h"

namespace perftrain::io {
namespace {

using perftrain::testing::error_of;
using perftrain::testing::TempDir;
using perftrain::testing::write_raw;

// Bitwise equality, so that the test means "the same bytes came back".
void expect_same(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.scalar_type(), b.scalar_type()) << what;
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  EXPECT_EQ(std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.nbytes()), 0) << what;
}

// One tensor of every supported dtype, with random values and varied shapes
// (a scalar, an empty one, a non-contiguous one).
NamedTensors random_tensors() {
  const auto f = at::TensorOptions().dtype(at::kFloat);
  return {
      {"f64", at::randn({3, 5}, f).to(at::kDouble)},
      {"f32", at::randn({2, 3, 4}, f).transpose(0, 2)},
      {"f16", at::randn({7}, f).to(at::kHalf)},
      {"bf16", at::randn({4, 4}, f).to(at::kBFloat16)},
      {"i64", at::randint(-(int64_t(1) << 40), int64_t(1) << 40, {6}, f.dtype(at::kLong))},
      {"i32", at::randint(-100000, 100000, {2, 2}, f.dtype(at::kInt))},
      {"i16", at::randint(-30000, 30000, {5}, f.dtype(at::kShort))},
      {"i8", at::randint(-128, 128, {3}, f.dtype(at::kChar))},  // 3 bytes: the next tensor is misaligned
      {"u8", at::randint(0, 256, {1, 9}, f.dtype(at::kByte))},
      {"bool", at::randint(0, 2, {4}, f.dtype(at::kLong)).to(at::kBool)},
      {"scalar", at::randn({}, f)},
      {"empty", at::randn({0, 3}, f)},
  };
}

TEST(Safetensors, RoundTripAllDtypes) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  const NamedTensors tensors = random_tensors();
  save_safetensors(path, tensors, {{"step", "42"}, {"model", "DiT-S/2"}});
  const auto file = SafetensorsFile::open(path);
  std::vector<std::string> expected_names;
  for (const auto& [name, t] : tensors) expected_names.push_back(name);
  EXPECT_EQ(file.names(), expected_names);
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"step", "42"}, {"model", "DiT-S/2"}}));
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(file.contains(name));
    expect_same(file.get(name), t, name);
  }
  EXPECT_FALSE(file.contains("nope"));
  const std::string msg = error_of<RuntimeError>([&] { file.get("nope"); });
  EXPECT_NE(msg.find(path), std::string::npos);
  EXPECT_NE(msg.find("nope"), std::string::npos);
}

TEST(Safetensors, HeaderIsPaddedTo8Bytes) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  save_safetensors(path, {{"x", at::randn({3})}});
  const std::string bytes = perftrain::testing::read_raw(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 12);
}

TEST(Safetensors, TensorOutlivesTheFileObject) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  const at::Tensor x = at::randn({100});
  save_safetensors(path, {{"x", x}});
  at::Tensor view;
  {
    const auto file = SafetensorsFile::open(path);
    view = file.get("x");
  }
  expect_same(view, x, "x after the file object is gone");
}

TEST(Safetensors, SaveRejectsBadInput) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  const at::Tensor x = at::randn({2});
  EXPECT_NE(error_of<UsageError>([&] { save_safetensors(path, {{"a", x}, {"a", x}}); }).find("'a'"),
            std::string::npos);
  error_of<UsageError>([&] { save_safetensors(path, {{"__metadata__", x}}); });
  const std::string msg =
      error_of<UsageError>([&] { save_safetensors(path, {{"c", x.to(at::kComplexFloat)}}); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_TRUE(dir.entries().empty());
  error_of<RuntimeError>([&] { save_safetensors(dir.file("missing/t.safetensors"), {{"a", x}}); });
}

// A file with the given header text and `data` bytes after it.
std::string file_bytes(const std::string& header, size_t data, uint64_t declared_len = ~0ull) {
  const uint64_t n = declared_len == ~0ull ? header.size() : declared_len;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + std::string(data, '\0');
}

struct CorruptCase {
  const char* name;
  std::string bytes;
  const char* expect;  // a phrase the message must contain
};

TEST(Safetensors, CorruptFilesNameTheFileAndTheProblem) {
  const std::vector<CorruptCase> cases = {
      {"empty", "", "shorter than the 8-byte"},
      {"short", "abc", "shorter than the 8-byte"},
      {"header_past_end", file_bytes("{}", 0, 1000), "runs past the end"},
      {"header_huge", file_bytes("{}", 0, 1ull << 40), "100 MiB"},
      {"bad_json", file_bytes("{\"a\": [1, 2", 0), "does not parse"},
      {"not_object", file_bytes("[1, 2]", 0), "not an object"},
      {"unknown_dtype", file_bytes(R"({"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1),
       "unsupported dtype F8_E4M3"},
      {"no_dtype", file_bytes(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), "no dtype"},
      {"negative_shape", file_bytes(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
       "negative"},
      {"float_shape", file_bytes(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
       "non-integer"},
      {"size_mismatch", file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8),
       "needs 8"},
      {"reversed", file_bytes(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 8), "data_offsets"},
      {"bad_offsets", file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4),
       "data_offsets"},
      {"past_end", file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 8),
       "past the end"},
      {"overlap",
       file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                  8),
       "overlap"},
      {"metadata_not_string", file_bytes(R"({"__metadata__":{"k":1}})", 0), "not a string"},
      {"entry_not_object", file_bytes(R"({"a":3})", 0), "not an object"},
  };
  TempDir dir;
  for (const auto& c : cases) {
    const std::string path = dir.file(std::string(c.name) + ".safetensors");
    write_raw(path, c.bytes);
    const std::string msg = error_of<RuntimeError>([&] { SafetensorsFile::open(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
  }
}

// The first bytes torch.save writes: its zip format (a local file header for
// "archive/data.pkl") and its legacy format (pickle protocol 2, then the
// magic number as a LONG1); and pickle.dump's protocol 4.
const std::string kTorchZip("PK\x03\x04\x00\x00\x08\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
                            "\x00\x00\x00\x00\x00\x00\x10\x00\x12\x00" "archive/data.pklFB", 48);
const std::string kTorchLegacy("\x80\x02\x8a\x0al\xfc\x9c\x46\xf9\x20j\xa8P\x19.\x80", 16);
const std::string kPickle4("\x80\x04\x95\x0a\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01" "a\x94K\x01s.", 21);

TEST(Safetensors, TorchPickleFilesAreNamedWithTheWayToConvert) {
  TempDir dir;
  for (const auto& [name, bytes, what] : {std::tuple{"model.pt", kTorchZip, "zip"},
                                          std::tuple{"legacy.pth", kTorchLegacy, "pickle"},
                                          std::tuple{"dump.safetensors", kPickle4, "pickle"}}) {
    const std::string path = dir.file(name);
    write_raw(path, bytes + std::string(64, '\0'));
    const std::string msg = error_of<UsageError>([&] { SafetensorsFile::open(path); });
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find(path + ": a PyTorch"), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_NE(msg.find("not safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("save_file"), std::string::npos) << msg;
  }
  EXPECT_NE(error_of<UsageError>([&] { SafetensorsFile::open(dir.file("model.pt")); })
                .find("'" + dir.file("model.safetensors") + "'"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { SafetensorsFile::open(dir.file("dump.safetensors")); })
                .find("'" + dir.file("dump.converted.safetensors") + "'"),
            std::string::npos);
}

// A header length whose low bytes read 0x80 0x02 (640) or "PK\3\4" is a
// safetensors file all the same: its header starts with '{' at byte 8.
TEST(Safetensors, HeaderLengthsThatLookLikePickleStillRead) {
  TempDir dir;
  for (const uint64_t len : {uint64_t(0x280), uint64_t(0x04034B50)}) {
    std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
    header.append(len - header.size(), ' ');
    const std::string path = dir.file("h.safetensors");
    write_raw(path, file_bytes(header, 2));
    EXPECT_EQ(SafetensorsFile::open(path).get("a").numel(), 2) << len;
  }
}

TEST(Safetensors, EmptyTensorsOverlapNothing) {
  TempDir dir;
  const std::string path = dir.file("e.safetensors");
  write_raw(path, file_bytes(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("a":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                             8));
  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file.get("a").numel(), 0);
  EXPECT_EQ(file.get("b").numel(), 2);
}

TEST(Safetensors, MissingFileIsNamed) {
  TempDir dir;
  const std::string path = dir.file("nope.safetensors");
  const std::string msg = error_of<RuntimeError>([&] { SafetensorsFile::open(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  error_of<RuntimeError>([&] { SafetensorsFile::open(dir.path()); });  // a directory
}

TEST(Safetensors, ParseErrorGivesTheByte) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_raw(path, file_bytes("{\"a\": x}", 0));  // 'x' is at header byte 6, file byte 14
  const std::string msg = error_of<RuntimeError>([&] { SafetensorsFile::open(path); });
  EXPECT_NE(msg.find("byte 14"), std::string::npos) << msg;
}

}  // namespace
}  // namespace perftrain::io
