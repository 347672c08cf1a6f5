// The decisions of compression on write (fs/compress_write.h), without an
// image: spec parsing, the policy from flags and property, the heuristic,
// the one-sector rule and the range plan.
#include "fs/compress_write.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "format/ondisk.h"
#include "fs/compress.h"

namespace ubtrfs::fs {
namespace UBTRFS_UNITY_ID {

std::vector<uint8_t> TextBytes(size_t n) {
  const std::string w = "the kernel writes compressed extents of file data ";
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(w[i % w.size()] + (i / 997) % 3);
  return v;
}

std::vector<uint8_t> RandomBytes(size_t n) {
  std::mt19937 rng(7);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(CompressSpec, ParsesTheKernelsValues) {
  CompressOptions c;
  ASSERT_TRUE(ParseCompressSpec("zstd:-5", &c).ok());
  EXPECT_EQ(c.algorithm, CompressAlgorithm::kZstd);
  EXPECT_EQ(c.level, -5);
  ASSERT_TRUE(ParseCompressSpec("zlib:9", &c).ok());
  EXPECT_EQ(c.algorithm, CompressAlgorithm::kZlib);
  EXPECT_EQ(c.level, 9);
  c.force = true;
  ASSERT_TRUE(ParseCompressSpec("lzo", &c).ok());
  EXPECT_EQ(c.algorithm, CompressAlgorithm::kLzo);
  EXPECT_TRUE(c.force) << "force is the caller's";
  ASSERT_TRUE(ParseCompressSpec("no", &c).ok());
  EXPECT_EQ(c.algorithm, CompressAlgorithm::kNone);
  for (const char* bad : {"", "gzip", "zlib:10", "zstd:16", "zstd:0", "lzo:1", "zstd:", "zlib:3x"}) {
    EXPECT_FALSE(ParseCompressSpec(bad, &c).ok()) << bad;
  }
}

TEST(CompressPolicy, FlagsPropertyAndForce) {
  CompressOptions zstd{CompressAlgorithm::kZstd, 5, false};
  EXPECT_EQ(ChooseCompression(zstd, 0, 0).type, format::kCompressZstd);
  EXPECT_EQ(ChooseCompression(zstd, 0, 0).level, 5);
  EXPECT_FALSE(ChooseCompression(zstd, format::kInodeNocompress, 0).on());
  EXPECT_FALSE(ChooseCompression(zstd, format::kInodeNodatasum, 0).on());
  EXPECT_FALSE(ChooseCompression(CompressOptions{}, 0, 0).on());
  // The property alone compresses and picks the algorithm (default level).
  auto p = ChooseCompression(zstd, format::kInodeCompress, format::kCompressLzo);
  EXPECT_EQ(p.type, format::kCompressLzo);
  EXPECT_TRUE(p.by_property);
  // COMPRESS without a property or mount option: zlib, as chattr +c.
  EXPECT_EQ(ChooseCompression(CompressOptions{}, format::kInodeCompress, 0).type, format::kCompressZlib);
  zstd.force = true;
  EXPECT_TRUE(ChooseCompression(zstd, format::kInodeNocompress, 0).on()) << "force overrides NOCOMPRESS";
  EXPECT_FALSE(ChooseCompression(zstd, format::kInodeNodatacow, 0).on());
}

TEST(CompressPolicy, PropertyValuesAndFlags) {
  EXPECT_EQ(PropertyType("zstd:3"), format::kCompressZstd);
  EXPECT_EQ(PropertyType("none"), 0);
  EXPECT_FALSE(PropertyType("gzip").has_value());
  EXPECT_EQ(FlagsForProperty(format::kInodeNocompress, "zlib"), format::kInodeCompress);
  EXPECT_EQ(FlagsForProperty(format::kInodeCompress, "no"), format::kInodeNocompress);
  EXPECT_EQ(FlagsForProperty(format::kInodeCompress | 1, std::nullopt), 1u);
}

TEST(CompressHeuristic, TextYesRandomNo) {
  EXPECT_TRUE(LooksCompressible(TextBytes(128 * 1024)));
  EXPECT_FALSE(LooksCompressible(RandomBytes(128 * 1024)));
  EXPECT_TRUE(LooksCompressible(std::vector<uint8_t>(4096, 0)));
}

// 128 KiB whose sampled bytes (16 of every 256, as the kernel samples)
// cycle through `values` byte values equally: a byte set and a core set
// large enough that the entropy decides.
std::vector<uint8_t> EvenlySampled(unsigned values) {
  std::vector<uint8_t> v(128 * 1024, 0);
  size_t k = 0;
  for (size_t i = 0; i + 16 <= v.size(); i += 256) {
    for (size_t j = 0; j < 16; ++j) v[i + j] = static_cast<uint8_t>(k++ % values);
  }
  return v;
}

TEST(CompressHeuristic, EntropyCountedInQuarterBitsAsTheKernel) {
  EXPECT_TRUE(LooksCompressible(EvenlySampled(72)));    // 6.25 bits a byte: 78%
  EXPECT_FALSE(LooksCompressible(EvenlySampled(127)));  // 7 bits
  // log2(80) is 6.32 bits (79%, under the 80% line), but the kernel rounds
  // each log2 of n^4 down: 6.5 bits, 81%, stored plain.
  EXPECT_FALSE(LooksCompressible(EvenlySampled(80)));
}

TEST(CompressRange, SavesASectorOrIsIncompressible) {
  WriteCompression c{format::kCompressZstd, 0, false, false};
  auto text = TextBytes(128 * 1024);
  auto r = CompressRange(c, text, text, 4096);
  ASSERT_EQ(r.kind, RangeResult::kCompressed);
  EXPECT_EQ(r.bytes.size() % 4096, 0u);
  std::vector<uint8_t> back(text.size());
  ASSERT_TRUE(Decompress(format::kCompressZstd, r.bytes, back, 4096).ok());
  EXPECT_EQ(back, text);
  auto rnd = RandomBytes(128 * 1024);
  EXPECT_EQ(CompressRange(c, rnd, rnd, 4096).kind, RangeResult::kPlain) << "the heuristic says no";
  c.force = true;
  EXPECT_EQ(CompressRange(c, rnd, rnd, 4096).kind, RangeResult::kIncompressible);
}

TEST(CompressRange, PlanCutsEvery128KiBAndSkipsZeros) {
  std::vector<uint8_t> buf(300 * 1024, 1);
  std::fill(buf.begin() + 8192, buf.begin() + 12288, 0);
  auto plan = PlanRanges(buf, 4096);
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[0].pos, 0u);
  EXPECT_EQ(plan[0].len, 8192u);
  EXPECT_EQ(plan[1].pos, 12288u);
  EXPECT_EQ(plan[1].len, 128u * 1024);
  EXPECT_EQ(plan[3].pos + plan[3].len, buf.size());
}

TEST(CompressInlineTest, SmallTextInlineTinyFails) {
  WriteCompression c{format::kCompressZlib, 0, false, false};
  bool failed = true;
  auto text = TextBytes(3000);
  auto z = CompressInline(c, text, 4096, 2048, &failed);
  ASSERT_TRUE(z.has_value());
  EXPECT_FALSE(failed);
  EXPECT_LE(z->size(), 2048u);
  const std::vector<uint8_t> tiny = {'h', 'i', '\n'};
  EXPECT_FALSE(CompressInline(c, tiny, 4096, 2048, &failed).has_value());
  EXPECT_TRUE(failed) << "the kernel marks a tiny incompressible file NOCOMPRESS";
}

}  // namespace
}  // namespace ubtrfs::fs
