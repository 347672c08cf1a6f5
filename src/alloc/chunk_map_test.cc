#include "alloc/chunk_map.h"

#include <gtest/gtest.h>

#include <vector>

#include "format/ondisk.h"

namespace ubtrfs::alloc {
namespace UBTRFS_UNITY_ID {

using namespace ubtrfs::format;

std::vector<uint8_t> ChunkItem(uint64_t length, uint64_t type, std::vector<std::pair<uint64_t, uint64_t>> stripes,
                               uint16_t sub_stripes = 1) {
  std::vector<uint8_t> buf(sizeof(Chunk) + stripes.size() * sizeof(Stripe));
  auto* c = reinterpret_cast<Chunk*>(buf.data());
  c->length = length;
  c->owner = kExtentTreeObjectid;
  c->stripe_len = 65536;
  c->type = type;
  c->sector_size = 4096;
  c->num_stripes = static_cast<uint16_t>(stripes.size());
  c->sub_stripes = sub_stripes;
  auto* s = reinterpret_cast<Stripe*>(buf.data() + sizeof(Chunk));
  for (size_t i = 0; i < stripes.size(); ++i) {
    s[i].devid = stripes[i].first;
    s[i].offset = stripes[i].second;
  }
  return buf;
}

constexpr uint64_t kMiB = 1 << 20;

// The first piece of each copy.
std::vector<uint64_t> Starts(const std::vector<std::vector<Piece>>& copies) {
  std::vector<uint64_t> out;
  for (const auto& c : copies) out.push_back(c.at(0).physical);
  return out;
}

TEST(ChunkMap, MapsSingleAndDup) {
  ChunkMap m(1, 1024 * kMiB);
  ASSERT_TRUE(m.AddChunk(1 * kMiB, ChunkItem(8 * kMiB, kBlockGroupSystem, {{1, 1 * kMiB}}), 4096).ok());
  ASSERT_TRUE(m.AddChunk(30 * kMiB, ChunkItem(16 * kMiB, kBlockGroupMetadata | kBlockGroupDup,
                                             {{1, 100 * kMiB}, {1, 200 * kMiB}}), 4096).ok());
  auto a = m.Map(2 * kMiB, 4096);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(Starts(*a), std::vector<uint64_t>{2 * kMiB});
  auto b = m.Map(31 * kMiB, 16384);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(Starts(*b), (std::vector<uint64_t>{101 * kMiB, 201 * kMiB}));
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

TEST(ChunkMap, MirrorsGiveOneCopyPerStripe) {
  ChunkMap m({{1, 1024 * kMiB}, {2, 1024 * kMiB}, {3, 1024 * kMiB}});
  ASSERT_TRUE(m.AddChunk(0, ChunkItem(8 * kMiB, kBlockGroupData | kBlockGroupRaid1, {{1, 10 * kMiB}, {2, 20 * kMiB}}),
                         4096).ok());
  ASSERT_TRUE(m.AddChunk(8 * kMiB, ChunkItem(8 * kMiB, kBlockGroupMetadata | kBlockGroupRaid1c3,
                                             {{1, 30 * kMiB}, {2, 40 * kMiB}, {3, 50 * kMiB}}), 4096).ok());
  auto a = m.Map(kMiB, 8192);
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(a->size(), 2u);
  EXPECT_EQ((*a)[1][0].devid, 2u);
  EXPECT_EQ((*a)[1][0].physical, 21 * kMiB);
  EXPECT_EQ((*a)[1][0].length, 8192u);
  auto b = m.Map(9 * kMiB, 4096);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(Starts(*b), (std::vector<uint64_t>{31 * kMiB, 41 * kMiB, 51 * kMiB}));
  EXPECT_EQ(m.Find(8 * kMiB)->mirrors(), 3u);
  // A stripe on a device that is not open (missing) is kept.
  ASSERT_TRUE(m.AddChunk(16 * kMiB, ChunkItem(8 * kMiB, kBlockGroupData | kBlockGroupRaid1,
                                              {{1, 60 * kMiB}, {9, 0}}), 4096).ok());
}

TEST(ChunkMap, Raid0AndRaid10SplitAtStripeBoundaries) {
  ChunkMap m({{1, 1024 * kMiB}, {2, 1024 * kMiB}, {3, 1024 * kMiB}, {4, 1024 * kMiB}});
  // RAID0 over 2: 64 KiB elements alternate 1, 2, 1, 2, ...; 4 MiB per device.
  ASSERT_TRUE(m.AddChunk(0, ChunkItem(8 * kMiB, kBlockGroupData | kBlockGroupRaid0, {{1, 10 * kMiB}, {2, 20 * kMiB}}),
                         4096).ok());
  EXPECT_EQ(m.Find(0)->stripe_size, 4 * kMiB);
  auto a = m.Map(60 * 1024, 136 * 1024);  // elements 0 (4 KiB), 1, 2, 3 (4 KiB)
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(a->size(), 1u);
  const auto& p = (*a)[0];
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].devid, 1u);
  EXPECT_EQ(p[0].physical, 10 * kMiB + 60 * 1024);
  EXPECT_EQ(p[0].length, 4096u);
  EXPECT_EQ(p[1].devid, 2u);
  EXPECT_EQ(p[1].physical, 20 * kMiB);
  EXPECT_EQ(p[1].buf_offset, 4096u);
  EXPECT_EQ(p[2].devid, 1u);
  EXPECT_EQ(p[2].physical, 10 * kMiB + 64 * 1024);
  EXPECT_EQ(p[3].devid, 2u);
  EXPECT_EQ(p[3].physical, 20 * kMiB + 64 * 1024);
  EXPECT_EQ(p[3].length, 4096u);
  // RAID10 over 4: pairs (1,2) and (3,4); element 1 lies on 3 and 4.
  ASSERT_TRUE(m.AddChunk(8 * kMiB, ChunkItem(8 * kMiB, kBlockGroupData | kBlockGroupRaid10,
                                             {{1, 30 * kMiB}, {2, 30 * kMiB}, {3, 30 * kMiB}, {4, 30 * kMiB}}, 2),
                         4096).ok());
  auto b = m.Map(8 * kMiB + 64 * 1024 + 4096, 4096);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->size(), 2u);
  EXPECT_EQ((*b)[0][0].devid, 3u);
  EXPECT_EQ((*b)[1][0].devid, 4u);
  EXPECT_EQ((*b)[0][0].physical, 30 * kMiB + 4096);
  // Element 2 is row 1 of pair (1,2).
  auto c = m.Map(8 * kMiB + 128 * 1024, 4096);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0][0].devid, 1u);
  EXPECT_EQ((*c)[0][0].physical, 30 * kMiB + 64 * 1024);
}

TEST(ChunkMap, Raid5DataRotatesWithParity) {
  ChunkMap m({{1, 1024 * kMiB}, {2, 1024 * kMiB}, {3, 1024 * kMiB}});
  ASSERT_TRUE(m.AddChunk(0, ChunkItem(8 * kMiB, kBlockGroupData | kBlockGroupRaid5,
                                      {{1, 10 * kMiB}, {2, 10 * kMiB}, {3, 10 * kMiB}}), 4096).ok());
  // Row 0: data on stripes 0, 1 (P on 2); row 1: data on 1, 2 (P on 0).
  auto a = m.Map(128 * 1024, 4096);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)[0][0].devid, 2u);
  EXPECT_EQ((*a)[0][0].physical, 10 * kMiB + 64 * 1024);
  auto b = m.Map(192 * 1024, 4096);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)[0][0].devid, 3u);
}

TEST(ChunkMap, RefusesBadStripeCounts) {
  ChunkMap m({{1, 1024 * kMiB}, {2, 1024 * kMiB}});
  EXPECT_EQ(m.AddChunk(0, ChunkItem(8 * kMiB, kBlockGroupData | kBlockGroupRaid1, {{1, 0}}), 4096).code(), EUCLEAN);
  EXPECT_EQ(m.AddChunk(0, ChunkItem(8 * kMiB, kBlockGroupData | kBlockGroupRaid1c3, {{1, 0}, {2, 0}}), 4096).code(),
            EUCLEAN);
  EXPECT_EQ(m.AddChunk(0, ChunkItem(8 * kMiB, kBlockGroupData | kBlockGroupRaid10, {{1, 0}, {2, 0}}, 1), 4096).code(),
            EUCLEAN);
  EXPECT_EQ(m.AddChunk(0, ChunkItem(8 * kMiB, kBlockGroupData | kBlockGroupRaid6, {{1, 0}, {2, 0}}), 4096).code(),
            EUCLEAN);
  EXPECT_EQ(m.AddChunk(0, ChunkItem(8 * kMiB, kBlockGroupData | kBlockGroupRaid1 | kBlockGroupRaid0,
                                    {{1, 0}, {2, 0}}), 4096).code(),
            EUCLEAN);
  // RAID0 whose length does not split into its stripes.
  EXPECT_EQ(m.AddChunk(0, ChunkItem(8 * kMiB + 4096, kBlockGroupData | kBlockGroupRaid0, {{1, 0}, {2, 0}}), 4096).code(),
            EUCLEAN);
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
