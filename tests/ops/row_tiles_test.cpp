// The residual/adaLN backward's row tiles per sample (host rule, no GPU): by
// waves on the slots its block size leaves. The counts fix the kernels'
// summation order, so they are pinned here for the H200's 132 SMs and the
// DiT widths.
#include <gtest/gtest.h>

#include <algorithm>

#include "kernels/residual_adaln.h"

namespace perftrain::kernels {
namespace {

constexpr int kH200Sms = 132;

TEST(RowTiles, ByWavesForTheDiTWidths) {
  // D = 384: 64 threads, 8 blocks per SM, 1056 slots. b256: 4 tiles (1024
  // blocks, one wave); b32: 32 tiles of 8 rows (one wave).
  EXPECT_EQ(residual_adaln_backward_tiles(256, 256, 384, true, kH200Sms), 4);
  EXPECT_EQ(residual_adaln_backward_tiles(32, 256, 384, true, kH200Sms), 32);
  // D = 768: 96 threads, 5 per SM, 660 slots: 5 tiles (1280 blocks, two waves of 52 rows).
  EXPECT_EQ(residual_adaln_backward_tiles(256, 256, 768, true, kH200Sms), 5);
  // D = 1152: 160 threads, 3 per SM, 396 slots: 3 tiles (768 blocks, two waves of 86 rows).
  EXPECT_EQ(residual_adaln_backward_tiles(256, 256, 1152, true, kH200Sms), 3);
}

TEST(RowTiles, EveryTileHasRowsAndEveryCountIsItsOwnTiling) {
  for (const int sms : {1, 8, 132})
    for (const int batch : {1, 3, 32, 256})
      for (const int tokens : {1, 2, 5, 17, 64, 256, 1024})
        for (const int cols : {37, 384, 768, 1152, 4104})
          for (const bool bias : {false, true}) {
            const int t = residual_adaln_backward_tiles(batch, tokens, cols, bias, sms);
            ASSERT_GE(t, 1);
            ASSERT_LE(t, std::max(1, tokens / 4)) << batch << " " << tokens << " " << cols;
            // ceil(tokens / rows_per_tile) == t: no empty tile.
            const int rows = (tokens + t - 1) / t;
            ASSERT_EQ((tokens + rows - 1) / rows, t) << batch << " " << tokens << " " << cols;
          }
}

}  // namespace
}  // namespace perftrain::kernels
