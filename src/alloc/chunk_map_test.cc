#include "alloc/chunk_map.h"

#include <gtest/gtest.h>

#include <vector>

#include "format/ondisk.h"

namespace ubtrfs::alloc {
namespace {

using namespace ubtrfs::format;

std::vector<uint8_t> ChunkItem(uint64_t length, uint64_t type, std::vector<std::pair<uint64_t, uint64_t>> stripes) {
  std::vector<uint8_t> buf(sizeof(Chunk) + stripes.size() * sizeof(Stripe));
  auto* c = reinterpret_cast<Chunk*>(buf.data());
  c->length = length;
  c->owner = kExtentTreeObjectid;
  c->stripe_len = 65536;
  c->type = type;
  c->sector_size = 4096;
  c->num_stripes = static_cast<uint16_t>(stripes.size());
  auto* s = reinterpret_cast<Stripe*>(buf.data() + sizeof(Chunk));
  for (size_t i = 0; i < stripes.size(); ++i) {
    s[i].devid = stripes[i].first;
    s[i].offset = stripes[i].second;
  }
  return buf;
}

constexpr uint64_t kMiB = 1 << 20;

TEST(ChunkMap, MapsSingleAndDup) {
  ChunkMap m(1, 1024 * kMiB);
  ASSERT_TRUE(m.AddChunk(1 * kMiB, ChunkItem(8 * kMiB, kBlockGroupSystem, {{1, 1 * kMiB}}), 4096).ok());
  ASSERT_TRUE(m.AddChunk(30 * kMiB, ChunkItem(16 * kMiB, kBlockGroupMetadata | kBlockGroupDup,
                                             {{1, 100 * kMiB}, {1, 200 * kMiB}}), 4096).ok());
  auto a = m.Map(2 * kMiB, 4096);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, std::vector<uint64_t>{2 * kMiB});
  auto b = m.Map(31 * kMiB, 16384);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<uint64_t>{101 * kMiB, 201 * kMiB}));
}

TEST(ChunkMap, RejectsUnmappedAndCrossingRanges) {
  ChunkMap m(1, 1024 * kMiB);
  ASSERT_TRUE(m.AddChunk(1 * kMiB, ChunkItem(8 * kMiB, kBlockGroupData, {{1, 1 * kMiB}}), 4096).ok());
  EXPECT_EQ(m.Map(0, 4096).status().code(), EUCLEAN);
  EXPECT_EQ(m.Map(9 * kMiB, 4096).status().code(), EUCLEAN);
  auto crossing = m.Map(9 * kMiB - 4096, 8192);
  EXPECT_FALSE(crossing.ok());
  EXPECT_NE(crossing.status().message().find("crosses the end of chunk"), std::string::npos);
}

TEST(ChunkMap, RefusesRaidAndOtherDevices) {
  ChunkMap m(1, 1024 * kMiB);
  auto raid = m.AddChunk(0, ChunkItem(8 * kMiB, kBlockGroupData | kBlockGroupRaid1, {{1, 0}, {2, 0}}), 4096);
  EXPECT_EQ(raid.code(), EOPNOTSUPP);
  EXPECT_EQ(raid.message().rfind("unsupported: ", 0), 0u) << raid.message();
  auto other = m.AddChunk(0, ChunkItem(8 * kMiB, kBlockGroupData, {{2, 0}}), 4096);
  EXPECT_EQ(other.code(), EOPNOTSUPP);
}

TEST(ChunkMap, RejectsDamagedChunks) {
  ChunkMap m(1, 64 * kMiB);
  EXPECT_EQ(m.AddChunk(0, ChunkItem(0, kBlockGroupData, {{1, 0}}), 4096).code(), EUCLEAN);
  EXPECT_EQ(m.AddChunk(0, ChunkItem(8 * kMiB, 0, {{1, 0}}), 4096).code(), EUCLEAN);
  // Stripe beyond the end of the device (a truncated image).
  auto beyond = m.AddChunk(0, ChunkItem(8 * kMiB, kBlockGroupData, {{1, 60 * kMiB}}), 4096);
  EXPECT_EQ(beyond.code(), EUCLEAN);
  EXPECT_NE(beyond.message().find("beyond the end of the device"), std::string::npos);
  // Item size not matching num_stripes.
  auto item = ChunkItem(8 * kMiB, kBlockGroupData, {{1, 0}});
  item.resize(item.size() - 1);
  EXPECT_EQ(m.AddChunk(0, item, 4096).code(), EUCLEAN);
  // DUP with one stripe.
  EXPECT_EQ(m.AddChunk(0, ChunkItem(8 * kMiB, kBlockGroupData | kBlockGroupDup, {{1, 0}}), 4096).code(), EUCLEAN);
  // Overlap.
  ASSERT_TRUE(m.AddChunk(0, ChunkItem(8 * kMiB, kBlockGroupData, {{1, 0}}), 4096).ok());
  EXPECT_EQ(m.AddChunk(4 * kMiB, ChunkItem(8 * kMiB, kBlockGroupData, {{1, 16 * kMiB}}), 4096).code(), EUCLEAN);
  // The identical chunk again (sys array + chunk tree) is fine.
  EXPECT_TRUE(m.AddChunk(0, ChunkItem(8 * kMiB, kBlockGroupData, {{1, 0}}), 4096).ok());
}

}  // namespace
}  // namespace ubtrfs::alloc
