#include "alloc/stripe_rebuild.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "format/ondisk.h"

namespace ubtrfs::alloc {
namespace UBTRFS_UNITY_ID {

using namespace ubtrfs::format;

constexpr uint64_t kMiB = 1 << 20, kSl = 64 * 1024;
constexpr uint64_t kStripeSize = 8 * kSl;  // 8 rows

// A chunk of `profile` over `n` memory devices (stripe i on device i + 1 at
// 1 MiB), written whole with random data through ChunkIo, so every stripe
// holds what the profile puts there (copies, elements, P and Q).
struct Array {
  Array(uint64_t profile, uint32_t n) {
    const uint32_t sub = profile == kBlockGroupRaid10 ? 2 : 1;
    std::vector<uint8_t> item(sizeof(Chunk) + n * sizeof(format::Stripe));
    auto* c = reinterpret_cast<Chunk*>(item.data());
    const uint32_t data = DataStripesFor(profile, n);
    c->length = kStripeSize * data;
    c->stripe_len = kSl;
    c->type = kBlockGroupData | profile;
    c->sector_size = 4096;
    c->num_stripes = static_cast<uint16_t>(n);
    c->sub_stripes = static_cast<uint16_t>(sub);
    auto* s = reinterpret_cast<format::Stripe*>(item.data() + sizeof(Chunk));
    std::map<uint64_t, uint64_t> sizes;
    for (uint32_t i = 0; i < n; ++i) {
      s[i].devid = profile == kBlockGroupDup ? 1 : i + 1;
      s[i].offset = kMiB + (profile == kBlockGroupDup ? i * kStripeSize : 0);
    }
    const uint32_t ndevs = profile == kBlockGroupDup ? 1 : n;
    for (uint32_t i = 0; i < ndevs; ++i) {
      const std::vector<uint8_t> zero(kMiB + 2 * kStripeSize, 0);
      devs.Add(i + 1, io::NewMemoryDevice("d" + std::to_string(i + 1), zero));
      sizes[i + 1] = zero.size();
    }
    map = std::make_unique<ChunkMap>(sizes);
    EXPECT_TRUE(map->AddChunk(0, item, 4096).ok());
    logical.resize(c->length.get());
    std::mt19937 rng(static_cast<uint32_t>(profile + n));
    for (auto& b : logical) b = static_cast<uint8_t>(rng());
    ChunkIo io(map.get(), &devs);
    EXPECT_TRUE(io.Write(0, logical).ok());
    chunk = *map->Find(0);
  }
  // What stripe `i` holds now.
  std::vector<uint8_t> StripeBytes(size_t i) {
    std::vector<uint8_t> out(kStripeSize);
    EXPECT_TRUE(devs.ReadAt(chunk.stripes[i].devid, chunk.stripes[i].physical, out).ok());
    return out;
  }
  // The devices other than `lost`.
  void Lose(const std::set<uint64_t>& lost) {
    for (auto& [id, d] : devs.Release()) {
      if (!lost.count(id)) degraded.Add(id, std::move(d));
    }
  }
  std::vector<uint8_t> logical;
  io::DeviceSet devs, degraded;
  std::unique_ptr<ChunkMap> map;
  ChunkInfo chunk;
};

struct Case {
  uint64_t profile;
  uint32_t n;
  std::set<uint64_t> lost;
};

TEST(StripeRebuild, EveryRedundantProfileGivesBackWhatTheLostDevicesHeld) {
  const std::vector<Case> cases = {
      {kBlockGroupRaid1, 2, {1}},       {kBlockGroupRaid1c3, 3, {2, 3}}, {kBlockGroupRaid1c4, 4, {1, 2, 4}},
      {kBlockGroupRaid10, 4, {2, 3}},   {kBlockGroupRaid5, 3, {3}},      {kBlockGroupRaid5, 4, {1}},
      {kBlockGroupRaid6, 4, {1, 4}},    {kBlockGroupRaid6, 5, {2, 3}},   {kBlockGroupRaid6, 3, {2}},
  };
  for (const Case& t : cases) {
    SCOPED_TRACE(ProfileName(t.profile) + " over " + std::to_string(t.n));
    Array a(t.profile, t.n);
    std::map<size_t, std::vector<uint8_t>> held;
    for (size_t i = 0; i < t.n; ++i) {
      if (t.lost.count(a.chunk.stripes[i].devid)) held[i] = a.StripeBytes(i);
    }
    a.Lose(t.lost);
    EXPECT_EQ(WhyNotRebuildable(a.chunk, a.degraded), "");
    ChunkIo io(a.map.get(), &a.degraded);
    for (const auto& [i, want] : held) {
      SCOPED_TRACE("stripe " + std::to_string(i));
      std::vector<uint8_t> got(kStripeSize);
      ASSERT_TRUE(RebuildStripeRange(io, a.chunk, i, 0, got).ok());
      EXPECT_TRUE(got == want);
      // A range across element boundaries, not starting at one.
      std::vector<uint8_t> part(9 * 8192);
      ASSERT_TRUE(RebuildStripeRange(io, a.chunk, i, 3 * 4096, part).ok());
      EXPECT_TRUE(std::equal(part.begin(), part.end(), want.begin() + 3 * 4096));
    }
  }
}

TEST(StripeRebuild, OneCopyProfilesAndTooManyLostAreRefused) {
  const std::vector<Case> cases = {
      {uint64_t{0}, 1, {1}},  {kBlockGroupDup, 2, {1}},         {kBlockGroupRaid0, 3, {2}},
      {kBlockGroupRaid1, 2, {1, 2}}, {kBlockGroupRaid10, 4, {3, 4}},  {kBlockGroupRaid5, 3, {1, 3}},
      {kBlockGroupRaid6, 4, {1, 2, 3}},
  };
  for (const Case& t : cases) {
    SCOPED_TRACE(ProfileName(t.profile) + " over " + std::to_string(t.n));
    Array a(t.profile, t.n);
    a.Lose(t.lost);
    EXPECT_NE(WhyNotRebuildable(a.chunk, a.degraded), "");
    ChunkIo io(a.map.get(), &a.degraded);
    std::vector<uint8_t> got(4096);
    size_t index = 0;
    while (!t.lost.count(a.chunk.stripes[index].devid)) ++index;
    const Status s = RebuildStripeRange(io, a.chunk, index, 0, got);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.ToString().find("missing device"), std::string::npos) << s.ToString();
  }
}

TEST(StripeRebuild, NothingLostIsRebuildable) {
  Array a(kBlockGroupRaid0, 2);
  EXPECT_EQ(WhyNotRebuildable(a.chunk, a.devs), "");
}

}  // namespace
}  // namespace ubtrfs::alloc
