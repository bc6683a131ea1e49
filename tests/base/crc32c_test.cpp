#include "base/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace perftrain::base {
namespace {

// Bit-at-a-time CRC32C, the definition the fast paths must agree with.
uint32_t crc_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

TEST(Crc32c, KnownValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // RFC 3720 (iSCSI) B.4: 32 bytes of zeros and of 0xFF.
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
}

TEST(Crc32c, MatchesBitwiseDefinitionOnRandomLengthsAndOffsets) {
  std::mt19937 rng(1234);
  std::vector<unsigned char> buf(4099);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (int trial = 0; trial < 200; ++trial) {
    const size_t off = rng() % 17, n = rng() % (buf.size() - off);
    const uint32_t want = crc_bitwise(buf.data() + off, n);
    ASSERT_EQ(crc32c(buf.data() + off, n), want) << "offset " << off << " length " << n;
    ASSERT_EQ(crc32c_extend_portable(0, buf.data() + off, n), want) << "offset " << off << " length " << n;
  }
}

TEST(Crc32c, ExtendEqualsWhole) {
  std::mt19937 rng(99);
  std::vector<unsigned char> buf(1000);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t cut : {0u, 1u, 7u, 8u, 333u, 999u, 1000u})
    EXPECT_EQ(crc32c_extend(crc32c(buf.data(), cut), buf.data() + cut, buf.size() - cut), crc32c(buf.data(), buf.size()))
        << "cut at " << cut;
}

TEST(Crc32c, DetectsOneFlippedBit) {
  std::vector<unsigned char> buf(4096);
  std::mt19937 rng(5);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  const uint32_t before = crc32c(buf.data(), buf.size());
  buf[1234] ^= 0x10;
  EXPECT_NE(crc32c(buf.data(), buf.size()), before);
}

TEST(Crc32c, MaskedMatchesTfRecordDefinition) {
  const uint32_t c = crc32c("abc", 3);
  EXPECT_EQ(crc32c_masked(c), static_cast<uint32_t>(((c >> 15) | (c << 17)) + 0xa282ead8u));
  EXPECT_NE(crc32c_masked(c), c);
}

}  // namespace
}  // namespace perftrain::base
