// perftrain extract as a process: killed with SIGKILL while it writes its
// shards, rerun, and the result equals an uninterrupted run's byte for byte
// (the rerun keeps the complete shards, removes what the kill left half
// written and continues); then a latent model trained on the shards is
// sampled through the VAE (`sample --vae`: PNG grid and ADM's .npz at the
// decoded size), and refused without it.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "base/fs.h"
#include "io/npz.h"
#include "support/image_files.h"
#include "support/test_support.h"
#include "support/vae_folder.h"

namespace perftrain {
namespace {

using perftrain::testing::contains;
using perftrain::testing::read_raw;
using perftrain::testing::run_shell;
using perftrain::testing::TempDir;

std::string perftrain_cmd(const std::string& args) { return std::string(PERFTRAIN_BINARY) + " " + args; }

std::vector<std::string> shard_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& n : fs::list_directory(dir))
    if (n.rfind("latents-", 0) == 0) out.push_back(n);
  return out;
}

TEST(ExtractCli, KilledAndRerunEqualsAnUninterruptedRun) {
  TempDir tmp;
  // 32 images cropped to 96 px, one latent per shard: the kill lands after
  // the second shard, long before the last.
  perftrain::testing::write_image_folder(tmp.file("images"), {"a", "b"}, 16);
  perftrain::testing::write_random_vae(tmp.file("vae"));
  const std::string args = "extract --data-path " + tmp.file("images") + " --vae " + tmp.file("vae") +
                           " --image-size 96 --batch-size 1 --shard-size 1 --device cpu --out ";
  const auto ref = run_shell(perftrain_cmd(args + tmp.file("ref")));
  ASSERT_EQ(ref.code, 0) << ref.output;
  ASSERT_EQ(shard_files(tmp.file("ref")).size(), 32u);

  // A real process and a real signal: started in the background, SIGKILLed
  // as soon as its second shard is there. It runs in steps of 10 ms between
  // SIGSTOP and SIGCONT, the shards looked for while it is stopped: on a
  // loaded machine a watcher that only polls can wake after the last shard
  // (a shard takes milliseconds here).
  const std::string out = tmp.file("out");
  const std::string killed = run_shell(
      perftrain_cmd(args + out) + " > " + tmp.file("killed.log") + " 2>&1 & pid=$!; n=0; "
      "while [ ! -e " + out + "/latents-000001.safetensors ] && kill -0 $pid 2>/dev/null && [ $n -lt 30000 ]; "
      "do kill -CONT $pid; sleep 0.01; kill -STOP $pid; n=$((n+1)); done; "
      "kill -9 $pid; kill -CONT $pid 2>/dev/null; { wait $pid; } 2>/dev/null; echo \"exit=$?\"").output;
  ASSERT_TRUE(contains(killed, "exit=137")) << killed << read_raw(tmp.file("killed.log"));
  const size_t left = shard_files(out).size();
  ASSERT_GE(left, 2u);
  ASSERT_LT(left, 32u) << "the kill came after the last shard";
  std::printf("    killed with %zu of 32 shards written\n", left);

  const auto rerun = run_shell(perftrain_cmd(args + out));
  ASSERT_EQ(rerun.code, 0) << rerun.output;
  EXPECT_TRUE(contains(rerun.output, "resuming after ")) << rerun.output;
  const auto names = shard_files(out);
  ASSERT_EQ(names, shard_files(tmp.file("ref")));
  for (const auto& n : names) EXPECT_EQ(read_raw(out + "/" + n), read_raw(tmp.file("ref") + "/" + n)) << n;
  for (const auto& n : fs::list_directory(out)) EXPECT_NE(n[0], '.') << "left over: " << n;

  // Other settings into the same --out: refused, one line, exit non-zero.
  const auto other = run_shell(perftrain_cmd(args + out + " --flip"));
  EXPECT_NE(other.code, 0);
  EXPECT_TRUE(contains(other.output, "holds shards of other settings")) << other.output;
}

TEST(ExtractCli, ALatentModelSamplesThroughTheVae) {
  TempDir tmp;
  perftrain::testing::write_image_folder(tmp.file("images"), {"a", "b"}, 2);
  perftrain::testing::write_random_vae(tmp.file("vae"));
  const auto ex = run_shell(perftrain_cmd("extract --data-path " + tmp.file("images") + " --vae " + tmp.file("vae") +
                                          " --image-size 32 --device cpu --out " + tmp.file("latents")));
  ASSERT_EQ(ex.code, 0) << ex.output;
  const auto train = run_shell(perftrain_cmd(
      "train --device cpu --data latents --data-path " + tmp.file("latents") + " --runs-dir " + tmp.path() +
      " --run-name run --steps 1 --batch-size 4 --set model.depth=1 --set model.hidden=32 --set model.heads=2"
      " --set model.patch=4 --set model.image_size=16 --set model.in_channels=4 --set model.num_classes=2"
      " --set log.sample_every=0 --set log.sample_classes=2 --set log.sample_per_class=1"
      " --set diffusion.sample_steps=1"));
  ASSERT_EQ(train.code, 0) << train.output;
  const std::string run = tmp.file("run");

  const auto refused = run_shell(perftrain_cmd("sample --ckpt " + run + " --npz " + tmp.file("s.npz") + " --samples 3"));
  EXPECT_NE(refused.code, 0);
  EXPECT_TRUE(contains(refused.output, "needs their VAE: --vae DIR")) << refused.output;
  EXPECT_FALSE(fs::exists(tmp.file("s.npz")));

  const auto npz = run_shell(perftrain_cmd("sample --ckpt " + run + " --vae " + tmp.file("vae") + " --npz " +
                                           tmp.file("s.npz") + " --samples 3 --steps 2"));
  ASSERT_EQ(npz.code, 0) << npz.output;
  EXPECT_TRUE(contains(npz.output, "arr_0 uint8 [3, 32, 32, 3]")) << npz.output;
  EXPECT_TRUE(contains(npz.output, "from the run's latent shards")) << npz.output;
  const auto arrays = io::read_npz(tmp.file("s.npz"));
  EXPECT_EQ(arrays.at("arr_0").sizes(), at::IntArrayRef({3, 32, 32, 3}));

  const auto grid = run_shell(perftrain_cmd("sample --ckpt " + run + " --vae " + tmp.file("vae") + " --out " +
                                            tmp.file("g.png") + " --classes 2 --per-class 1 --steps 2"));
  ASSERT_EQ(grid.code, 0) << grid.output;
  EXPECT_TRUE(fs::is_regular_file(tmp.file("g.png")));

  const auto bad = run_shell(perftrain_cmd("sample --ckpt " + run + " --vae " + tmp.file("images") + " --out " +
                                           tmp.file("b.png")));
  EXPECT_NE(bad.code, 0);
  EXPECT_TRUE(contains(bad.output, "--vae " + tmp.file("images") + " has no config.json")) << bad.output;
}

}  // namespace
}  // namespace perftrain
