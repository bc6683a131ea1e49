// Inputs that used to reach an allocator, the terminal or a loop unchecked,
// run as a user runs them (the real program, real files): each is now a
// one-line error naming the key, option or file, with a non-zero exit and
// nothing written, and no raw control character or non-UTF-8 byte reaches the
// terminal.
#include <gtest/gtest.h>
#include <zlib.h>

#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "base/fs.h"
#include "base/text.h"
#include "io/safetensors.h"
#include "support/test_support.h"
#include "train/config.h"

namespace {

namespace fs = perftrain::fs;
using perftrain::testing::TempDir;
using Result = perftrain::testing::CommandResult;

const std::string kBinary = PERFTRAIN_BINARY;

Result run(const std::string& args) { return perftrain::testing::run_shell(kBinary + " " + args); }

// A tiny DiT on the CPU (on synthetic data: a run of a few steps takes seconds).
const std::string kTinyModel =
    " --device cpu --batch-size 8 --set model.depth=1 --set model.hidden=32 --set model.heads=2 --set model.patch=4"
    " --set model.image_size=8 --set model.in_channels=2 --set model.num_classes=3 --set log.sample_every=0"
    " --set log.every=1 --set log.sample_per_class=1 --set log.sample_classes=2 --set diffusion.sample_steps=1";
const std::string kTiny = kTinyModel + " --data synthetic --set data.synthetic_size=40";

// One line, exit code `code`, naming `want`, every byte printable.
void expect_one_line_error(const Result& r, int code, const std::string& want, const std::string& what) {
  EXPECT_EQ(r.code, code) << what << "\n" << r.output;
  EXPECT_NE(r.output.find(want), std::string::npos) << what << ": want '" << want << "' in\n" << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << what << ": not one line:\n" << r.output;
  EXPECT_TRUE(perftrain::base::is_printable(r.output.substr(0, r.output.size() - 1)))
      << what << ": raw bytes reach the terminal: " << perftrain::base::printable(r.output);
}

// A finished two-step run R under dir; returns its latest step directory.
std::string tiny_run(const TempDir& dir) {
  const Result made = run("train --runs-dir " + dir.path() + " --run-name R --steps 2" + kTiny);
  EXPECT_EQ(made.code, 0) << made.output;
  return dir.file("R/ckpt/step_00000002");
}

// Rewrites the config in a weights file's metadata through `change`.
template <typename F>
void change_saved_config(const std::string& path, F change) {
  const auto file = perftrain::io::SafetensorsFile::open(path);
  perftrain::io::NamedTensors tensors;
  for (const auto& name : file.names()) tensors.emplace_back(name, file.get(name).clone());
  auto meta = file.metadata();
  perftrain::train::TrainConfig cfg = perftrain::train::default_config(false);
  perftrain::train::apply_toml(cfg, meta.at("perftrain.config"), path);
  change(cfg);
  meta["perftrain.config"] = cfg.to_toml();
  meta.erase("perftrain.crc32c.header");  // as an older version wrote it: the values themselves are checked
  perftrain::io::save_safetensors(path + ".new", tensors, meta);
  ASSERT_EQ(std::rename((path + ".new").c_str(), path.c_str()), 0);
}

// Was std::bad_alloc from the loader thread, after the run directory was made.
TEST(HostileInputs, SyntheticSizeBeyondMemoryIsAUsageError) {
  TempDir runs;
  const Result r = run("train --runs-dir " + runs.path() + " --steps 1" + kTiny +
                       " --set data.synthetic_size=100000000000");
  expect_one_line_error(r, 2, "data.synthetic_size 100000000000 (expected an integer from 1 to 100000000)",
                        "synthetic_size");
  EXPECT_TRUE(fs::list_directory(runs.path()).empty());
}

// A checkpoint whose metadata asks for a 65536 x 65536 image at patch 1 (4.3e9
// tokens: torch's allocator enforce when `sample` built the model), or for
// weights no machine holds: `sample` and `--resume` refuse both before
// building anything, as the same values from the command line are refused.
TEST(HostileInputs, CheckpointAskingForAnImpossibleModelIsAUsageError) {
  TempDir tmp;
  const std::string step = tiny_run(tmp);
  const std::string model = step + "/model.safetensors", ema = step + "/ema.safetensors";
  const std::string good_model = perftrain::testing::read_raw(model), good_ema = perftrain::testing::read_raw(ema);
  const std::string config_before = perftrain::testing::read_raw(tmp.file("R/config.toml"));
  struct Case {
    std::string what, sample_says, resume_says;
    void (*change)(perftrain::train::TrainConfig&);
  };
  const std::vector<Case> cases = {
      {"tokens", "model.image_size 65536 at model.patch 1 gives 4294967296 tokens", "model.image_size 65536",
       [](perftrain::train::TrainConfig& c) {
         c.model.image_size = 65536;
         c.model.patch = 1;
       }},
      {"weights", "of weights, more than the", "train.batch_size 8 needs about",
       [](perftrain::train::TrainConfig& c) {
         c.model.depth = 1024;
         c.model.hidden = 65536;
         c.model.heads = 64;
       }},
  };
  for (const Case& c : cases) {
    perftrain::testing::write_raw(model, good_model);
    perftrain::testing::write_raw(ema, good_ema);
    change_saved_config(model, c.change);
    change_saved_config(ema, c.change);
    expect_one_line_error(run("sample --device cpu --ckpt " + tmp.file("R") + " --out " + tmp.file("s.png")), 2,
                          c.sample_says, c.what + " (sample)");
    EXPECT_FALSE(fs::exists(tmp.file("s.png")));
    expect_one_line_error(run("train --resume " + tmp.file("R") + " --steps 4"), 2, c.resume_says,
                          c.what + " (resume)");
    EXPECT_EQ(perftrain::testing::read_raw(tmp.file("R/config.toml")), config_before) << c.what;
  }
}

// The last resort: an allocation that fails although every check passed
// (here a DiT-XL-sized model under a 5 GB address-space limit, about 1 GB
// above what the program's libraries map) ends with one line, exit 1, not
// torch's allocator enforce ("[enforce fail at alloc_cpu.cpp:N] ...").
TEST(HostileInputs, AllocationFailureIsOneLine) {
  TempDir tmp;
  const std::string step = tiny_run(tmp);
  for (const char* file : {"/model.safetensors", "/ema.safetensors"})
    change_saved_config(step + file, [](perftrain::train::TrainConfig& c) {
      c.model.depth = 28;
      c.model.hidden = 1152;
      c.model.heads = 16;
    });
  const Result r = perftrain::testing::run_shell("ulimit -v 5000000 && exec " + kBinary +
                                                 " sample --device cpu --ckpt " + tmp.file("R") + " --out " +
                                                 tmp.file("s.png"));
  expect_one_line_error(r, 1, "perftrain: error: out of memory: ", "allocation failure");
  EXPECT_EQ(r.output.find("enforce"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(tmp.file("s.png")));
}

// getcwd fails in a deleted directory; it used to surface as MKL's fatal
// "cannot load libtorch_cpu.so" from libtorch's initialisers. Now it is
// checked before them.
TEST(HostileInputs, DeletedWorkingDirectoryIsOneLine) {
  TempDir tmp;
  tmp.mkdir("gone");
  const std::string gone = tmp.file("gone");
  const std::vector<std::string> commands = {"train --steps 1 --run-name x" + kTiny, "models", "--version"};
  for (const std::string& args : commands) {
    const Result r = perftrain::testing::run_shell("cd '" + gone + "' && rmdir '" + gone + "' && exec " + kBinary +
                                                   " " + args);
    expect_one_line_error(r, 2, "cannot read the current directory", args);
    EXPECT_NE(r.output.find("it was deleted"), std::string::npos) << r.output;
    tmp.mkdir("gone");
  }
}

// nan and inf passed CLI11's NonNegativeNumber (every comparison with nan is
// false), and its range error printed the largest double as 309 digits.
TEST(HostileInputs, SampleFloatOptionsAreFiniteAndBoundsShort) {
  TempDir tmp;
  tiny_run(tmp);
  const std::string sample = "sample --device cpu --steps 1 --ckpt " + tmp.file("R") + " --out " + tmp.file("g.png");
  for (const char* v : {"nan", "inf", "-1", "1e999"}) {
    const Result r = run(sample + " --cfg-scale " + v);
    expect_one_line_error(r, 2, "--cfg-scale: " + std::string(v) + " is not a finite number from 0 up", v);
  }
  EXPECT_FALSE(fs::exists(tmp.file("g.png")));
  const Result ok = run(sample + " --cfg-scale 1.5 --classes 1 --per-class 1");
  EXPECT_EQ(ok.code, 0) << ok.output;
}

// Every command's CLI11 number checks: a bound is short, nan is refused.
TEST(HostileInputs, NumberOptionsOfEveryCommandGiveShortBounds) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"summary DiT-S/2 --depth -1", "--depth: -1 is not a finite number >= 0"},
      {"models --image-size 0", "--image-size: 0 is not an integer from 1 to 65536"},
      {"models --image-size nan", "--image-size: nan is not an integer from 1 to 65536"},
      {"sample --ckpt x --per-class 2000", "--per-class: 2000 is not an integer from 1 to 1024"},  // its own check kept
  };
  for (const auto& [args, want] : cases) {
    const Result r = run(args);
    expect_one_line_error(r, 2, want, args);
    EXPECT_FALSE(std::regex_search(r.output, std::regex("[0-9]{20}"))) << r.output;
  }
}

// models took a 21-digit size as the largest int64 without a word, and a
// true/false value with a newline in it; bench took --torch-modes without
// --against-torch, where it does nothing.
TEST(HostileInputs, ModelsSizesAndBooleansAreCheckedAndTorchModesNeedsAgainstTorch) {
  const std::string huge = "999999999999999999999";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"models --image-size " + huge, "--image-size: " + huge + " is not an integer from 1 to 65536"},
      {"models --in-channels " + huge, "--in-channels: " + huge + " is not an integer from 1 to 4096"},
      {"models --num-classes " + huge, "--num-classes: " + huge + " is not an integer from 1 to 16777216"},
      {"models --learn-sigma \"$(printf '1\\n2')\"", "--learn-sigma: '1\\x0a2' is not true or false"},
      {"models --learn-sigma \"$(printf 'true\\033[2J')\"", "--learn-sigma: 'true\\x1b[2J' is not true or false"},
      {"bench --device cpu --torch-modes abc", "--torch-modes requires --against-torch"},
      {"bench --device cpu --torch-modes eager-fp32", "--torch-modes requires --against-torch"},
  };
  for (const auto& [args, want] : cases) expect_one_line_error(run(args), 2, want, args);
  // With --against-torch the modes are checked before anything runs.
  TempDir tmp;
  const Result bad = run("bench --device cpu --against-torch --torch-modes abc --out " + tmp.file("b"));
  expect_one_line_error(bad, 2, "unknown torch mode 'abc'", "--torch-modes abc");
  EXPECT_FALSE(fs::exists(tmp.file("b")));
  const Result ok = run("models --learn-sigma off --image-size 8 --in-channels 2 --num-classes 3");
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_NE(ok.output.find("for 2x8x8 inputs, 3 classes, learn_sigma off"), std::string::npos) << ok.output;
}

// A model's float keys out of range printed 1e300 as its 301 digits.
TEST(HostileInputs, ModelFloatKeysOutOfRangeAreShort) {
  TempDir runs;
  const std::string train = "train --runs-dir " + runs.path() + " --steps 1" + kTiny;
  expect_one_line_error(run(train + " --set model.mlp_ratio=1e300"), 2, "model.mlp_ratio 1e+300 must be a number in (0, 64]",
                        "mlp_ratio");
  expect_one_line_error(run(train + " --set model.class_dropout=1e300"), 2, "model.class_dropout 1e+300 must be in [0, 1)",
                        "class_dropout");
  EXPECT_TRUE(fs::list_directory(runs.path()).empty());
}

// A --set value with a newline carried extra TOML: here a [run] table that
// would have renamed the run.
TEST(HostileInputs, SetValueWithANewlineIsRefused) {
  TempDir runs;
  const Result r = perftrain::testing::run_shell(
      kBinary + " train --runs-dir " + runs.path() + " --steps 1" + kTiny +
      " --set \"$(printf 'train.lr=1e-3\\n[run]\\nname = \"smuggled\"')\"");
  expect_one_line_error(r, 2, "a value is one line", "--set with a newline");
  EXPECT_TRUE(fs::list_directory(runs.path()).empty());
}

// A run name with an escape sequence was echoed raw ("run: runs/...") and
// made a directory of that name.
TEST(HostileInputs, RunNameWithControlCharactersIsRefused) {
  TempDir runs;
  const Result r = perftrain::testing::run_shell(kBinary + " train --runs-dir " + runs.path() + " --steps 1" + kTiny +
                                                 " --run-name \"$(printf 'a\\033[2Jb')\"");
  expect_one_line_error(r, 2, "run.name (--run-name) 'a\\x1b[2Jb' holds control characters", "run name");
  EXPECT_TRUE(fs::list_directory(runs.path()).empty());
  // The runs directory likewise (it is echoed in the "run:" line).
  const Result d = perftrain::testing::run_shell(kBinary + " train --runs-dir \"" + runs.path() +
                                                 "/$(printf 'a\\033[2Jb')\" --steps 1" + kTiny);
  expect_one_line_error(d, 2, "run.dir (--runs-dir) '" + runs.path() + "/a\\x1b[2Jb' holds control characters",
                        "runs dir");
  EXPECT_TRUE(fs::list_directory(runs.path()).empty());
  // And --out, which bench, profile and sample echo when they write.
  for (const char* cmd : {"bench --device cpu", "profile --device cpu", "sample --ckpt x"}) {
    const Result o = perftrain::testing::run_shell(kBinary + " " + cmd + " --out \"" + runs.path() +
                                                   "/$(printf 'o\\033[31m')\"");
    expect_one_line_error(o, 2, "--out: '" + runs.path() + "/o\\x1b[31m' holds control characters", cmd);
  }
  EXPECT_TRUE(fs::list_directory(runs.path()).empty());
}

// A latent shard whose header names a tensor with an escape sequence, or
// holds bytes that are not UTF-8: the error echoes them escaped.
TEST(HostileInputs, ShardHeaderBytesAreEchoedEscaped) {
  TempDir tmp;
  const std::vector<std::pair<std::string, std::string>> headers = {
      {R"({"\u001b[31mlatents": {"dtype": "Q8", "shape": [1], "data_offsets": [0, 1]}})", "\\x1b[31mlatents"},
      {"{\"lat\xff\xfe\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", "\\xff"},
  };
  for (const auto& [header, want] : headers) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    perftrain::testing::write_raw(tmp.file("shard.safetensors"), bytes + header + std::string(4, '\0'));
    const Result r = run("train --runs-dir " + tmp.path() + " --run-name L --steps 1" + kTinyModel +
                         " --data latents --data-path " + tmp.file("shard.safetensors"));
    expect_one_line_error(r, 1, want, want);
    EXPECT_NE(r.output.find(tmp.file("shard.safetensors")), std::string::npos) << r.output;
  }
}

// A gzip bomb as Fashion-MNIST's training images (an idx header announcing
// 10 x 28 x 28 bytes, then 64 MiB of zeros): refused at the first byte past
// the announced size, naming the file.
TEST(HostileInputs, GzipBombAsFashionMnistNamesTheFile) {
  TempDir tmp;
  tmp.mkdir("fm");
  const std::string images = tmp.file("fm/train-images-idx3-ubyte.gz");
  gzFile gz = gzopen(images.c_str(), "wb1");
  ASSERT_NE(gz, nullptr);
  const std::string header = {0, 0, 8, 3, 0, 0, 0, 10, 0, 0, 0, 28, 0, 0, 0, 28};
  gzwrite(gz, header.data(), static_cast<unsigned>(header.size()));
  const std::string zeros(1 << 20, '\0');
  for (int i = 0; i < 64; ++i) gzwrite(gz, zeros.data(), static_cast<unsigned>(zeros.size()));
  ASSERT_EQ(gzclose(gz), Z_OK);
  const std::string labels = {0, 0, 8, 1, 0, 0, 0, 10, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  perftrain::testing::write_raw(tmp.file("fm/train-labels-idx1-ubyte"), labels);
  const Result r = run("train --runs-dir " + tmp.path() + " --run-name F --device cpu --steps 1 --data-path " +
                       tmp.file("fm"));
  expect_one_line_error(r, 1, images + ": trailing garbage: the decompressed stream goes on past the 7840 data bytes",
                        "gzip bomb");
}

}  // namespace
