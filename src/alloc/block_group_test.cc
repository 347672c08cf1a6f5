#include "alloc/block_group.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "format/ondisk.h"

namespace ubtrfs::alloc {
namespace UBTRFS_UNITY_ID {

using format::kBlockGroupData;
using format::kBlockGroupMetadata;

constexpr uint64_t kUnit = 4096;
constexpr uint64_t kNode = 16384;
constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kGiB = 1ULL << 30;

using Extents = std::vector<std::pair<uint64_t, uint64_t>>;

Extents Used(const BlockGroup& g) {
  Extents e;
  g.ForEachUsedExtent([&](uint64_t s, uint64_t l) { e.emplace_back(s, l); });
  return e;
}
Extents FreeExtents(const BlockGroup& g) {
  Extents e;
  g.ForEachFreeExtent([&](uint64_t s, uint64_t l) { e.emplace_back(s, l); });
  return e;
}
Extents Pinned(const BlockGroup& g) {
  Extents e;
  g.ForEachPinnedExtent([&](uint64_t s, uint64_t l) { e.emplace_back(s, l); });
  return e;
}

TEST(BlockGroup, StartsFree) {
  BlockGroup g(8 * kMiB, 8 * kMiB, kBlockGroupMetadata, kUnit);
  EXPECT_EQ(g.start(), 8 * kMiB);
  EXPECT_EQ(g.length(), 8 * kMiB);
  EXPECT_EQ(g.end(), 16 * kMiB);
  EXPECT_EQ(g.flags(), kBlockGroupMetadata);
  EXPECT_EQ(g.used_bytes(), 0u);
  EXPECT_EQ(g.pinned_bytes(), 0u);
  EXPECT_EQ(g.free_bytes(), 8 * kMiB);
  EXPECT_FALSE(g.has_clone());
  EXPECT_EQ(FreeExtents(g), (Extents{{8 * kMiB, 8 * kMiB}}));
  EXPECT_TRUE(Used(g).empty());
  EXPECT_TRUE(g.Contains(8 * kMiB));
  EXPECT_TRUE(g.Contains(16 * kMiB - 1));
  EXPECT_FALSE(g.Contains(16 * kMiB));
  EXPECT_FALSE(g.Contains(8 * kMiB - 1));
}

TEST(BlockGroup, CreateChecksGeometry) {
  EXPECT_TRUE(BlockGroup::Create(0, kMiB, kBlockGroupData, 4096).ok());
  EXPECT_EQ(BlockGroup::Create(0, kMiB, kBlockGroupData, 3000).status().code(), EINVAL);
  EXPECT_EQ(BlockGroup::Create(0, kMiB, kBlockGroupData, 256).status().code(), EINVAL);
  EXPECT_EQ(BlockGroup::Create(0, kMiB + 512, kBlockGroupData, 4096).status().code(), EINVAL);
  EXPECT_EQ(BlockGroup::Create(512, kMiB, kBlockGroupData, 4096).status().code(), EINVAL);
  EXPECT_EQ(BlockGroup::Create(0, 0, kBlockGroupData, 4096).status().code(), EINVAL);
  EXPECT_EQ(BlockGroup::Create(~0ULL - 4095, 8192, kBlockGroupData, 4096).status().code(), EINVAL);
}

TEST(BlockGroup, SuccessiveAllocationsAreContiguous) {
  BlockGroup g(kMiB, 4 * kMiB, kBlockGroupMetadata, kUnit);
  uint64_t expect = kMiB;
  for (int i = 0; i < 100; ++i) {
    auto a = g.Allocate(kNode, kNode);
    ASSERT_TRUE(a.has_value());
    EXPECT_EQ(*a, expect);
    expect += kNode;
  }
  EXPECT_EQ(g.used_bytes(), 100 * kNode);
  EXPECT_EQ(Used(g), (Extents{{kMiB, 100 * kNode}}));
  // Mixed sizes stay contiguous too.
  auto a = g.Allocate(3 * kUnit, kUnit);
  auto b = g.Allocate(kUnit, kUnit);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, expect);
  EXPECT_EQ(*b, expect + 3 * kUnit);
}

TEST(BlockGroup, AlignsLogicalAddressNotGroupOffset) {
  // The group starts 4 KiB past a 16 KiB boundary: the first aligned node is
  // 12 KiB into the group.
  const uint64_t start = kMiB + kUnit;
  BlockGroup g(start, kMiB, kBlockGroupMetadata, kUnit);
  auto a = g.Allocate(kNode, kNode);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, kMiB + kNode);
  // A small allocation fills the gap before the node; the next node goes
  // to the next aligned slot, not right after the small one.
  auto s = g.Allocate(kUnit, kUnit);
  ASSERT_TRUE(s);
  EXPECT_EQ(*s, kMiB + 2 * kNode);
  auto b = g.Allocate(kNode, kNode);
  ASSERT_TRUE(b);
  EXPECT_EQ(*b, kMiB + 3 * kNode);
  // A 64 KiB alignment that is not a power-of-two multiple of the start.
  auto c = g.Allocate(kUnit, 64 * 1024);
  ASSERT_TRUE(c);
  EXPECT_EQ(*c % (64 * 1024), 0u);
  // align 0 means "unit".
  auto d = g.Allocate(kUnit, 0);
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, *c + kUnit);
}

TEST(BlockGroup, AlignmentLargerThanTheGroupFindsNothingWhenNoSlotFits) {
  // [1 MiB + 4 KiB, +64 KiB) contains no 1 MiB boundary.
  BlockGroup g(kMiB + kUnit, 64 * 1024, kBlockGroupData, kUnit);
  EXPECT_FALSE(g.Allocate(kUnit, kMiB));
  EXPECT_EQ(g.used_bytes(), 0u);
}

TEST(BlockGroup, RejectsMalformedAllocateArguments) {
  BlockGroup g(0, kMiB, kBlockGroupData, kUnit);
  EXPECT_FALSE(g.Allocate(0, kUnit));
  EXPECT_FALSE(g.Allocate(kUnit + 1, kUnit));
  EXPECT_FALSE(g.Allocate(kUnit, 1000));
  EXPECT_FALSE(g.Allocate(2 * kMiB, kUnit));
  EXPECT_EQ(g.used_bytes(), 0u);
  EXPECT_EQ(g.stats().allocations, 0u);
}

TEST(BlockGroup, ExhaustionReturnsNothing) {
  BlockGroup g(0, kMiB, kBlockGroupMetadata, kUnit);
  std::set<uint64_t> got;
  while (auto a = g.Allocate(kNode, kNode)) got.insert(*a);
  EXPECT_EQ(got.size(), kMiB / kNode);
  EXPECT_EQ(g.free_bytes(), 0u);
  EXPECT_EQ(g.used_bytes(), kMiB);
  EXPECT_FALSE(g.Allocate(kUnit, kUnit));
  EXPECT_TRUE(FreeExtents(g).empty());
}

TEST(BlockGroup, FragmentedSpaceCannotServeALargerRun) {
  BlockGroup g(0, 64 * kUnit, kBlockGroupData, kUnit);
  // Use every other unit.
  for (uint64_t i = 0; i < 64; i += 2) ASSERT_TRUE(g.MarkUsed(i * kUnit, kUnit).ok());
  EXPECT_EQ(g.free_bytes(), 32 * kUnit);
  EXPECT_FALSE(g.Allocate(2 * kUnit, kUnit));
  auto a = g.Allocate(kUnit, kUnit);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, kUnit);
}

TEST(BlockGroup, TailWordBitsAreNeverHandedOut) {
  // 70 units: the second bitmap word holds 6 real bits and 58 padding bits.
  BlockGroup g(0, 70 * kUnit, kBlockGroupData, kUnit);
  auto whole = g.Allocate(70 * kUnit, kUnit);
  ASSERT_TRUE(whole);
  EXPECT_EQ(*whole, 0u);
  EXPECT_FALSE(g.Allocate(kUnit, kUnit));
  ASSERT_TRUE(g.Free(0, 70 * kUnit).ok());
  g.Commit();
  int n = 0;
  while (auto a = g.Allocate(kUnit, kUnit)) {
    EXPECT_LT(*a, 70 * kUnit);
    ++n;
  }
  EXPECT_EQ(n, 70);
  EXPECT_FALSE(g.Allocate(71 * kUnit, kUnit));
}

TEST(BlockGroup, WrapsAroundOnceFromTheCursor) {
  BlockGroup g(0, 16 * kUnit, kBlockGroupData, kUnit);
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(g.Allocate(kUnit, kUnit));
  ASSERT_TRUE(g.Free(2 * kUnit, kUnit).ok());
  g.Commit();
  // The cursor is past the end; the only free unit is behind it.
  auto a = g.Allocate(kUnit, kUnit);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, 2 * kUnit);
  EXPECT_FALSE(g.Allocate(kUnit, kUnit));
}

TEST(BlockGroup, NextFitPrefersSpaceAfterTheCursor) {
  BlockGroup g(0, 16 * kUnit, kBlockGroupData, kUnit);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(g.Allocate(kUnit, kUnit));
  ASSERT_TRUE(g.Free(0, kUnit).ok());
  g.Commit();
  // Unit 0 is free again, but the search continues at the cursor (unit 8).
  auto a = g.Allocate(kUnit, kUnit);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, 8 * kUnit);
}

TEST(BlockGroup, FindsRunStraddlingTheCursorOnWrap) {
  BlockGroup g(0, 8 * kUnit, kBlockGroupData, kUnit);
  ASSERT_TRUE(g.MarkUsed(0, 3 * kUnit).ok());
  ASSERT_TRUE(g.MarkUsed(7 * kUnit, kUnit).ok());
  // Units 3..6 free. Put the cursor at unit 4.
  auto a = g.Allocate(kUnit, kUnit);
  ASSERT_TRUE(a);
  ASSERT_EQ(*a, 3 * kUnit);
  ASSERT_TRUE(g.Free(3 * kUnit, kUnit).ok());
  g.Commit();
  // From the cursor only units 4..6 are free; the run of four starts before.
  auto b = g.Allocate(4 * kUnit, kUnit);
  ASSERT_TRUE(b);
  EXPECT_EQ(*b, 3 * kUnit);
}

TEST(BlockGroup, MarkUsedChecksItsRange) {
  BlockGroup g(kMiB, kMiB, kBlockGroupData, kUnit);
  EXPECT_TRUE(g.MarkUsed(kMiB, 4 * kUnit).ok());
  EXPECT_EQ(g.used_bytes(), 4 * kUnit);
  Status overlap = g.MarkUsed(kMiB + 2 * kUnit, 4 * kUnit);
  EXPECT_EQ(overlap.code(), EINVAL);
  EXPECT_NE(overlap.message().find("already used"), std::string::npos) << overlap.ToString();
  EXPECT_NE(overlap.message().find(std::to_string(kMiB + 2 * kUnit)), std::string::npos) << overlap.ToString();
  EXPECT_EQ(g.MarkUsed(kMiB - kUnit, 2 * kUnit).code(), EINVAL);      // starts before
  EXPECT_EQ(g.MarkUsed(2 * kMiB - kUnit, 2 * kUnit).code(), EINVAL);  // runs past the end
  EXPECT_EQ(g.MarkUsed(2 * kMiB, kUnit).code(), EINVAL);              // just past the end
  EXPECT_EQ(g.MarkUsed(kMiB + 100, kUnit).code(), EINVAL);            // unaligned
  EXPECT_EQ(g.MarkUsed(kMiB + 8 * kUnit, 100).code(), EINVAL);
  EXPECT_EQ(g.MarkUsed(kMiB + 8 * kUnit, 0).code(), EINVAL);
  EXPECT_EQ(g.MarkUsed(~0ULL - 4095, 4096).code(), EINVAL);
  EXPECT_EQ(g.used_bytes(), 4 * kUnit);
  // Pinned space is not there to be claimed either.
  ASSERT_TRUE(g.Free(kMiB, kUnit).ok());
  EXPECT_EQ(g.MarkUsed(kMiB, kUnit).code(), EINVAL);
  g.Commit();
  EXPECT_TRUE(g.MarkUsed(kMiB, kUnit).ok());
  // Allocation skips what MarkUsed claimed.
  auto a = g.Allocate(kUnit, kUnit);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, kMiB + 4 * kUnit);
}

TEST(BlockGroup, DoubleFreeIsAnErrorNamingTheRange) {
  BlockGroup g(kMiB, kMiB, kBlockGroupMetadata, kUnit);
  auto a = g.Allocate(kNode, kNode);
  ASSERT_TRUE(a);
  ASSERT_TRUE(g.Free(*a, kNode).ok());
  Status again = g.Free(*a, kNode);
  EXPECT_EQ(again.code(), EINVAL);
  EXPECT_NE(again.message().find("double free"), std::string::npos) << again.ToString();
  EXPECT_NE(again.message().find("already freed in this transaction"), std::string::npos) << again.ToString();
  EXPECT_NE(again.message().find("[" + std::to_string(*a) + ", +16384)"), std::string::npos) << again.ToString();
  g.Commit();
  Status after_commit = g.Free(*a, kNode);
  EXPECT_EQ(after_commit.code(), EINVAL);
  EXPECT_NE(after_commit.message().find("is not allocated"), std::string::npos) << after_commit.ToString();
  // Never-allocated space.
  Status never = g.Free(kMiB + 64 * kUnit, kUnit);
  EXPECT_EQ(never.code(), EINVAL);
  EXPECT_NE(never.message().find(std::to_string(kMiB + 64 * kUnit)), std::string::npos) << never.ToString();
}

TEST(BlockGroup, FailedFreeChangesNothing) {
  BlockGroup g(0, kMiB, kBlockGroupData, kUnit);
  ASSERT_TRUE(g.MarkUsed(0, 4 * kUnit).ok());
  // Half used, half free: refused as a whole, and it names the free part.
  Status s = g.Free(2 * kUnit, 4 * kUnit);
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("[16384, +8192) is not allocated"), std::string::npos) << s.ToString();
  EXPECT_EQ(g.used_bytes(), 4 * kUnit);
  EXPECT_EQ(g.pinned_bytes(), 0u);
  EXPECT_FALSE(g.has_clone());
  EXPECT_EQ(g.stats().frees, 0u);
  EXPECT_EQ(Used(g), (Extents{{0, 4 * kUnit}}));
}

TEST(BlockGroup, FreeOutsideTheGroupOrUnalignedIsAnError) {
  BlockGroup g(kMiB, kMiB, kBlockGroupData, kUnit);
  ASSERT_TRUE(g.MarkUsed(kMiB, kMiB).ok());
  Status below = g.Free(kMiB - kUnit, kUnit);
  EXPECT_EQ(below.code(), EINVAL);
  EXPECT_NE(below.message().find("outside block group"), std::string::npos) << below.ToString();
  EXPECT_EQ(g.Free(2 * kMiB - kUnit, 2 * kUnit).code(), EINVAL);
  EXPECT_EQ(g.Free(2 * kMiB, kUnit).code(), EINVAL);
  EXPECT_EQ(g.Free(kMiB + 1, kUnit).code(), EINVAL);
  EXPECT_EQ(g.Free(kMiB, kUnit - 1).code(), EINVAL);
  EXPECT_EQ(g.Free(kMiB, 0).code(), EINVAL);
  EXPECT_EQ(g.Free(kMiB, ~0ULL - 4095).code(), EINVAL);
  EXPECT_FALSE(g.has_clone());
  EXPECT_EQ(g.used_bytes(), kMiB);
}

// The clone rule: space freed in the running transaction is not handed out
// until Commit().
TEST(BlockGroup, FreedSpaceIsNotReusedBeforeCommit) {
  BlockGroup g(0, 64 * kNode, kBlockGroupMetadata, kUnit);
  std::vector<uint64_t> blocks;
  for (int i = 0; i < 64; ++i) blocks.push_back(*g.Allocate(kNode, kNode));
  ASSERT_FALSE(g.Allocate(kNode, kNode));
  g.Commit();  // nothing freed yet: a no-op
  EXPECT_FALSE(g.has_clone());

  const uint64_t x = blocks[10];
  ASSERT_TRUE(g.Free(x, kNode).ok());
  EXPECT_TRUE(g.has_clone());
  EXPECT_EQ(g.pinned_bytes(), kNode);
  EXPECT_EQ(g.used_bytes(), 63 * kNode);
  EXPECT_EQ(g.free_bytes(), 0u);
  // Free in the bitmap (the state that will be committed) ...
  EXPECT_EQ(FreeExtents(g), (Extents{{x, kNode}}));
  EXPECT_EQ(Pinned(g), (Extents{{x, kNode}}));
  // ... but not allocatable, at any size or alignment.
  EXPECT_FALSE(g.Allocate(kNode, kNode));
  EXPECT_FALSE(g.Allocate(kUnit, kUnit));
  g.Commit();
  EXPECT_FALSE(g.has_clone());
  EXPECT_EQ(g.pinned_bytes(), 0u);
  EXPECT_EQ(g.free_bytes(), kNode);
  auto again = g.Allocate(kNode, kNode);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, x);
}

// A commit whose superblock is written while the next transaction runs:
// what the sealed transaction freed stays pinned until its Commit(), and so
// does what the next one frees of the sealed transaction's blocks -- past
// that Commit(), until its own.
TEST(BlockGroup, SealedFreesStayPinnedUntilTheirCommitAndLaterOnesUntilTheNext) {
  BlockGroup g(0, 8 * kNode, kBlockGroupMetadata, kUnit);
  std::vector<uint64_t> b;
  for (int i = 0; i < 4; ++i) b.push_back(*g.Allocate(kNode, kNode));
  g.Commit();
  ASSERT_TRUE(g.Free(b[0], kNode).ok());  // freed by transaction N
  const uint64_t n_block = *g.Allocate(kNode, kNode);  // written by N
  g.Seal();                                            // N's superblock is being written
  EXPECT_TRUE(g.has_clone());
  ASSERT_TRUE(g.Free(n_block, kNode).ok());  // N+1 frees a block of N
  ASSERT_TRUE(g.Free(b[1], kNode).ok());     // and one of N-1
  EXPECT_EQ(g.pinned_bytes(), 3 * kNode);
  // Only the never-touched tail is handed out meanwhile.
  std::set<uint64_t> got;
  while (auto a = g.Allocate(kNode, kNode)) got.insert(*a);
  EXPECT_EQ(got.size(), 3u);
  for (uint64_t x : {b[0], b[1], n_block}) EXPECT_FALSE(got.count(x)) << x;
  for (uint64_t x : got) ASSERT_TRUE(g.Free(x, kNode).ok());  // N+1's own: pinned too (freed since a commit)
  EXPECT_EQ(g.pinned_bytes(), 6 * kNode);

  g.Commit();  // N is on disk: only what N freed comes back
  EXPECT_EQ(g.pinned_bytes(), 5 * kNode);
  EXPECT_EQ(g.free_bytes(), kNode);
  EXPECT_EQ(*g.Allocate(kNode, kNode), b[0]);
  EXPECT_FALSE(g.Allocate(kNode, kNode));
  g.Commit();  // N+1: no seal in between, so it is sealed and committed at once
  EXPECT_FALSE(g.has_clone());
  EXPECT_EQ(g.pinned_bytes(), 0u);
  EXPECT_EQ(g.free_bytes(), 5 * kNode);
}

// A sealed transaction whose superblock was never written is sealed again
// with the next: nothing either freed is handed out before one Commit().
TEST(BlockGroup, SealingTwiceKeepsBothTransactionsPinned) {
  BlockGroup g(0, 4 * kNode, kBlockGroupMetadata, kUnit);
  std::vector<uint64_t> b;
  for (int i = 0; i < 4; ++i) b.push_back(*g.Allocate(kNode, kNode));
  g.Commit();
  ASSERT_TRUE(g.Free(b[0], kNode).ok());
  g.Seal();
  ASSERT_TRUE(g.Free(b[1], kNode).ok());
  g.Seal();
  EXPECT_EQ(g.pinned_bytes(), 2 * kNode);
  EXPECT_FALSE(g.Allocate(kNode, kNode));
  g.Commit();
  EXPECT_FALSE(g.has_clone());
  EXPECT_EQ(g.free_bytes(), 2 * kNode);
}

TEST(BlockGroup, FreedSpaceIsSkippedWhileOtherSpaceIsHandedOut) {
  BlockGroup g(0, kMiB, kBlockGroupMetadata, kUnit);
  std::vector<uint64_t> first;
  for (int i = 0; i < 8; ++i) first.push_back(*g.Allocate(kNode, kNode));
  for (uint64_t b : first) ASSERT_TRUE(g.Free(b, kNode).ok());
  // Drain the group: nothing of the first eight comes back.
  int n = 0;
  while (auto a = g.Allocate(kUnit, kUnit)) {
    EXPECT_GE(*a, 8 * kNode) << "pinned space handed out at " << *a;
    ++n;
  }
  EXPECT_EQ(n, static_cast<int>((kMiB - 8 * kNode) / kUnit));
  EXPECT_EQ(g.pinned_bytes(), 8 * kNode);
  g.Commit();
  EXPECT_EQ(g.free_bytes(), 8 * kNode);
  auto a = g.Allocate(8 * kNode, kNode);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, 0u);
}

TEST(BlockGroup, SpaceAllocatedAndFreedInOneTransactionStaysPinned) {
  BlockGroup g(0, 4 * kNode, kBlockGroupMetadata, kUnit);
  auto a = g.Allocate(kNode, kNode);
  ASSERT_TRUE(g.Free(*a, kNode).ok());  // makes the clone
  auto b = g.Allocate(kNode, kNode);    // allocated after the clone was taken
  ASSERT_TRUE(b);
  ASSERT_TRUE(g.Free(*b, kNode).ok());
  EXPECT_EQ(g.pinned_bytes(), 2 * kNode);
  auto c = g.Allocate(kNode, kNode);
  auto d = g.Allocate(kNode, kNode);
  ASSERT_TRUE(c && d);
  EXPECT_FALSE(g.Allocate(kNode, kNode));
  for (uint64_t v : {*c, *d}) {
    EXPECT_NE(v, *a);
    EXPECT_NE(v, *b);
  }
  EXPECT_EQ(g.stats().clones_made, 1u);
}

// The clone-bitmap rule with the next-fit cursor and the pinned-bytes guard
// out of the way: the cursor points at the range just freed, and the guard
// passes because other space is free. Only the clone keeps the search from
// handing the freed range back in the same transaction.
TEST(BlockGroup, CloneBitmapFreedRangeAtTheCursorIsNotReallocated) {
  constexpr uint64_t kStart = 3 * kGiB;  // a group not at 0: addresses are logical
  BlockGroup g(kStart, 16 * kNode, kBlockGroupMetadata, kUnit);
  for (int i = 0; i < 16; ++i) ASSERT_EQ(*g.Allocate(kNode, kNode), kStart + i * kNode);
  // The last allocation ended at the group's end: the cursor is back at 0.
  ASSERT_TRUE(g.Free(kStart + 12 * kNode, 4 * kNode).ok());
  g.Commit();  // nodes 12-15 free for good
  ASSERT_TRUE(g.Free(kStart, 4 * kNode).ok());  // nodes 0-3 freed in this transaction, right at the cursor
  EXPECT_EQ(g.pinned_bytes(), 4 * kNode);
  EXPECT_EQ(g.free_bytes(), 4 * kNode);
  // Free in the bitmap, where the cursor starts: still not handed out.
  EXPECT_EQ(*g.Allocate(kNode, kNode), kStart + 12 * kNode);
  EXPECT_EQ(*g.Allocate(kUnit, kUnit), kStart + 13 * kNode);
  EXPECT_EQ(*g.Allocate(2 * kNode, kNode), kStart + 14 * kNode);
  EXPECT_EQ(*g.Allocate(kNode - kUnit, kUnit), kStart + 13 * kNode + kUnit);
  EXPECT_FALSE(g.Allocate(kUnit, kUnit)) << "only pinned space is left";
  g.Commit();
  EXPECT_EQ(*g.Allocate(4 * kNode, kNode), kStart);
}

TEST(BlockGroup, CloneBitmapFreeAndReallocateInOneTransactionGetsOtherSpace) {
  // The only free space in the group besides the range just freed is a
  // single node at the end; every allocation of the transaction must land
  // there or nowhere, whatever its size and alignment.
  BlockGroup g(0, 16 * kNode, kBlockGroupMetadata, kUnit);
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(g.Allocate(kNode, kNode));
  ASSERT_TRUE(g.Free(15 * kNode, kNode).ok());
  g.Commit();
  // Free nodes 3, 4 and 9 (three clones' worth of chances for the bug).
  for (uint64_t n : {3, 4, 9}) ASSERT_TRUE(g.Free(n * kNode, kNode).ok());
  EXPECT_EQ(Pinned(g), (Extents{{3 * kNode, 2 * kNode}, {9 * kNode, kNode}}));
  EXPECT_FALSE(g.Allocate(2 * kNode, kNode)) << "a two-node run exists only in pinned space";
  EXPECT_EQ(*g.Allocate(kUnit, 2 * kUnit), 15 * kNode);
  EXPECT_EQ(*g.Allocate(2 * kUnit, 2 * kUnit), 15 * kNode + 2 * kUnit);
  // The cursor wrapped to 0 and passes nodes 3, 4 and 9 again.
  EXPECT_EQ(*g.Allocate(kUnit, kUnit), 15 * kNode + kUnit);
  EXPECT_FALSE(g.Allocate(kUnit, kUnit));
  EXPECT_EQ(g.pinned_bytes(), 3 * kNode);
  EXPECT_EQ(Used(g), (Extents{{0, 3 * kNode}, {5 * kNode, 4 * kNode}, {10 * kNode, 6 * kNode}}));
}

TEST(BlockGroup, CloneBitmapPinsSpaceAllocatedAfterTheCloneWasMade) {
  // Node 5 is free when the clone is taken, then allocated and freed in the
  // same transaction: the clone's copy alone would call it free, so Free
  // must pin it too. Four scattered free units keep the pinned guard from
  // answering first; none of them makes an aligned node.
  BlockGroup g(0, 10 * kNode, kBlockGroupMetadata, kUnit);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(g.Allocate(kNode, kNode));
  const std::vector<uint64_t> scattered = {30 * kUnit, 33 * kUnit, 36 * kUnit, 38 * kUnit};
  for (uint64_t u : scattered) ASSERT_TRUE(g.Free(u, kUnit).ok());
  ASSERT_TRUE(g.Free(5 * kNode, kNode).ok());
  g.Commit();                                       // cursor at 0
  ASSERT_TRUE(g.Free(0, kUnit).ok());               // the clone is made here
  EXPECT_EQ(*g.Allocate(kNode, kNode), 5 * kNode);  // free in both maps
  ASSERT_TRUE(g.Free(5 * kNode, kNode).ok());       // freed after the clone was made
  EXPECT_EQ(g.free_bytes(), 4 * kUnit);
  EXPECT_FALSE(g.Allocate(kNode, kNode)) << "node 5 is pinned, no other aligned node is free";
  for (uint64_t u : scattered) EXPECT_EQ(*g.Allocate(kUnit, kUnit), u);
  EXPECT_FALSE(g.Allocate(kUnit, kUnit));
  EXPECT_EQ(Pinned(g), (Extents{{0, kUnit}, {5 * kNode, kNode}}));
  g.Commit();
  EXPECT_EQ(*g.Allocate(kNode, kNode), 5 * kNode);
}

TEST(BlockGroup, CloneIsOnePageAlignedCopyPerTransaction) {
  const uint64_t bitmaps0 = BlockGroup::bitmap_bytes_in_use();
  const uint64_t clones0 = BlockGroup::clone_bytes_in_use();
  {
    // 1 GiB at 4 KiB: 262144 bits = 32 KiB of bitmap.
    BlockGroup g(kGiB, kGiB, kBlockGroupData, kUnit);
    EXPECT_EQ(BlockGroup::bitmap_bytes_in_use() - bitmaps0, 32768u);
    std::vector<uint64_t> v;
    for (int i = 0; i < 4; ++i) v.push_back(*g.Allocate(kNode, kNode));
    EXPECT_EQ(BlockGroup::clone_bytes_in_use(), clones0);
    ASSERT_TRUE(g.Free(v[0], kNode).ok());
    EXPECT_EQ(BlockGroup::clone_bytes_in_use() - clones0, 32768u);
    ASSERT_TRUE(g.Free(v[1], kNode).ok());
    ASSERT_TRUE(g.Free(v[2], kNode).ok());
    EXPECT_EQ(BlockGroup::clone_bytes_in_use() - clones0, 32768u);
    EXPECT_EQ(g.stats().clones_made, 1u);
    g.Commit();
    EXPECT_EQ(BlockGroup::clone_bytes_in_use(), clones0);
    ASSERT_TRUE(g.Free(v[3], kNode).ok());
    EXPECT_EQ(g.stats().clones_made, 2u);
    // Destroying a group with a live clone gives the memory back.
  }
  EXPECT_EQ(BlockGroup::bitmap_bytes_in_use(), bitmaps0);
  EXPECT_EQ(BlockGroup::clone_bytes_in_use(), clones0);
  {
    // A small bitmap (16 units = 8 bytes) still gets a whole page.
    BlockGroup g(0, 16 * kUnit, kBlockGroupData, kUnit);
    ASSERT_TRUE(g.MarkUsed(0, kUnit).ok());
    ASSERT_TRUE(g.Free(0, kUnit).ok());
    EXPECT_EQ(BlockGroup::clone_bytes_in_use() - clones0, 4096u);
  }
  EXPECT_EQ(BlockGroup::clone_bytes_in_use(), clones0);
}

TEST(BlockGroup, ExtentIteration) {
  BlockGroup g(kMiB, 32 * kUnit, kBlockGroupData, kUnit);
  ASSERT_TRUE(g.MarkUsed(kMiB, 4 * kUnit).ok());
  ASSERT_TRUE(g.MarkUsed(kMiB + 10 * kUnit, 20 * kUnit).ok());
  ASSERT_TRUE(g.Free(kMiB + 12 * kUnit, 2 * kUnit).ok());
  EXPECT_EQ(Used(g), (Extents{{kMiB, 4 * kUnit}, {kMiB + 10 * kUnit, 2 * kUnit}, {kMiB + 14 * kUnit, 16 * kUnit}}));
  EXPECT_EQ(FreeExtents(g),
            (Extents{{kMiB + 4 * kUnit, 6 * kUnit}, {kMiB + 12 * kUnit, 2 * kUnit}, {kMiB + 30 * kUnit, 2 * kUnit}}));
  EXPECT_EQ(Pinned(g), (Extents{{kMiB + 12 * kUnit, 2 * kUnit}}));
  g.Commit();
  EXPECT_TRUE(Pinned(g).empty());
}

TEST(BlockGroup, ExtentIterationAcrossWordBoundaries) {
  BlockGroup g(0, 200 * kUnit, kBlockGroupData, kUnit);
  ASSERT_TRUE(g.MarkUsed(60 * kUnit, 70 * kUnit).ok());   // units 60..129, spans words 0..2
  ASSERT_TRUE(g.MarkUsed(190 * kUnit, 10 * kUnit).ok());  // to the last unit
  EXPECT_EQ(Used(g), (Extents{{60 * kUnit, 70 * kUnit}, {190 * kUnit, 10 * kUnit}}));
  EXPECT_EQ(FreeExtents(g), (Extents{{0, 60 * kUnit}, {130 * kUnit, 60 * kUnit}}));
}

TEST(BlockGroup, StatsCount) {
  BlockGroup g(0, kMiB, kBlockGroupData, kUnit);
  auto a = g.Allocate(kNode, kNode);
  auto b = g.Allocate(kNode, kNode);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(g.Free(*a, kNode).ok());
  ASSERT_TRUE(g.Free(*b, kUnit).ok());
  EXPECT_FALSE(g.Free(*b, kUnit).ok());  // failures are not counted
  g.Commit();
  EXPECT_EQ(g.stats().allocations, 2u);
  EXPECT_EQ(g.stats().frees, 2u);
  EXPECT_EQ(g.stats().clones_made, 1u);
  EXPECT_EQ(g.stats().bytes_pinned, kNode + kUnit);
  EXPECT_EQ(g.pinned_bytes(), 0u);
}

// A randomized run against a plain model: a set of used units, the pinned
// units of the running transaction (freed since the last Seal or Commit)
// and of the sealed one, and whether each clone should exist.
struct ModelParams {
  uint64_t start;
  uint64_t units;
  uint32_t seed;
};

class BlockGroupModel : public ::testing::TestWithParam<ModelParams> {};

TEST_P(BlockGroupModel, RandomOpsMatchModel) {
  const ModelParams p = GetParam();
  BlockGroup g(p.start, p.units * kUnit, kBlockGroupMetadata, kUnit);
  std::mt19937_64 rng(p.seed);
  auto rand = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };

  std::set<uint64_t> used, pinned, sealed;
  bool clone = false, sealed_clone = false;
  std::vector<std::pair<uint64_t, uint64_t>> live;  // (first unit, units) handed out, for choosing frees
  uint64_t allocs_ok = 0, allocs_failed = 0, frees_ok = 0, commits = 0, seals = 0, refused = 0;

  auto unavailable = [&](uint64_t u) { return used.count(u) || pinned.count(u) || sealed.count(u); };
  auto seal = [&] {
    if (!clone) return;
    sealed.insert(pinned.begin(), pinned.end());
    pinned.clear();
    clone = false;
    sealed_clone = true;
  };
  auto to_unit = [&](uint64_t addr) { return (addr - p.start) / kUnit; };
  auto units_of = [&](const Extents& ex) {
    std::set<uint64_t> s;
    for (auto [st, len] : ex)
      for (uint64_t u = to_unit(st); u < to_unit(st + len); ++u) s.insert(u);
    return s;
  };

  for (int step = 0; step < 20000; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const uint64_t op = rand(100);
    if (op < 45) {
      const uint64_t n = 1 + rand(rand(4) == 0 ? 24 : 4);
      const uint64_t a = uint64_t{1} << rand(3);  // 1, 2 or 4 units
      auto r = g.Allocate(n * kUnit, a * kUnit);
      if (r) {
        ASSERT_EQ(*r % (a * kUnit), 0u);
        ASSERT_GE(*r, p.start);
        const uint64_t u0 = to_unit(*r);
        ASSERT_LE(u0 + n, p.units);
        for (uint64_t u = u0; u < u0 + n; ++u) {
          ASSERT_FALSE(used.count(u)) << "allocated used unit " << u;
          ASSERT_FALSE(pinned.count(u)) << "allocated pinned unit " << u << " before commit";
          ASSERT_FALSE(sealed.count(u)) << "allocated unit " << u << " of the sealed transaction before its commit";
          used.insert(u);
        }
        live.emplace_back(u0, n);
        ++allocs_ok;
      } else {
        // Nothing fits: check that the model agrees no aligned run exists.
        for (uint64_t s = 0; s + n <= p.units; ++s) {
          if ((p.start / kUnit + s) % a != 0) continue;
          bool fits = true;
          for (uint64_t u = s; u < s + n && fits; ++u) fits = !unavailable(u);
          ASSERT_FALSE(fits) << "allocator missed a free run of " << n << " at unit " << s;
        }
        ++allocs_failed;
      }
    } else if (op < 80) {
      if (live.empty()) continue;
      // Free all or part of something handed out earlier.
      const size_t i = rand(live.size());
      auto [u0, n] = live[i];
      const uint64_t off = rand(n);
      const uint64_t len = 1 + rand(n - off);
      ASSERT_TRUE(g.Free(p.start + (u0 + off) * kUnit, len * kUnit).ok());
      live.erase(live.begin() + i);
      if (off > 0) live.emplace_back(u0, off);
      if (off + len < n) live.emplace_back(u0 + off + len, n - off - len);
      for (uint64_t u = u0 + off; u < u0 + off + len; ++u) {
        used.erase(u);
        pinned.insert(u);
      }
      clone = true;
      ++frees_ok;
    } else if (op < 84) {
      g.Seal();
      seal();
      ++seals;
    } else if (op < 88) {
      g.Commit();
      if (!sealed_clone) seal();
      sealed.clear();
      sealed_clone = false;
      ++commits;
    } else if (op < 95) {
      // A free that touches at least one unit that is not used must be refused
      // as a whole.
      const uint64_t s = rand(p.units);
      const uint64_t n = 1 + rand(std::min<uint64_t>(8, p.units - s));
      bool all_used = true;
      for (uint64_t u = s; u < s + n; ++u) all_used = all_used && used.count(u);
      if (all_used) continue;
      const uint64_t before_used = g.used_bytes();
      Status st = g.Free(p.start + s * kUnit, n * kUnit);
      ASSERT_EQ(st.code(), EINVAL) << st.ToString();
      ASSERT_NE(st.message().find("double free"), std::string::npos) << st.ToString();
      ASSERT_EQ(g.used_bytes(), before_used);
      ++refused;
    } else {
      // MarkUsed succeeds exactly when the range is neither used nor pinned.
      const uint64_t s = rand(p.units);
      const uint64_t n = 1 + rand(std::min<uint64_t>(4, p.units - s));
      bool clear = true;
      for (uint64_t u = s; u < s + n; ++u) clear = clear && !unavailable(u);
      Status st = g.MarkUsed(p.start + s * kUnit, n * kUnit);
      ASSERT_EQ(st.ok(), clear) << st.ToString();
      if (clear) {
        for (uint64_t u = s; u < s + n; ++u) used.insert(u);
        live.emplace_back(s, n);
      }
    }

    ASSERT_EQ(g.used_bytes(), used.size() * kUnit);
    ASSERT_EQ(g.pinned_bytes(), (pinned.size() + sealed.size()) * kUnit);
    ASSERT_EQ(g.free_bytes(), (p.units - used.size() - pinned.size() - sealed.size()) * kUnit);
    ASSERT_EQ(g.has_clone(), clone || sealed_clone);
    if (step % 16 == 0) {
      ASSERT_EQ(units_of(Used(g)), used);
      std::set<uint64_t> all_pinned = pinned;
      all_pinned.insert(sealed.begin(), sealed.end());
      ASSERT_EQ(units_of(Pinned(g)), all_pinned);
      std::set<uint64_t> free_view = units_of(FreeExtents(g));
      ASSERT_EQ(free_view.size() + used.size(), p.units);
      for (uint64_t u : used) ASSERT_FALSE(free_view.count(u));
    }
  }
  // The run must have exercised every path, exhaustion included.
  EXPECT_GT(allocs_ok, 1000u);
  EXPECT_GT(allocs_failed, 10u);
  EXPECT_GT(frees_ok, 1000u);
  EXPECT_GT(commits, 100u);
  EXPECT_GT(seals, 100u);
  EXPECT_GT(refused, 100u);
}

INSTANTIATE_TEST_SUITE_P(BlockGroupShapes, BlockGroupModel,
                         ::testing::Values(ModelParams{0, 256, 1},             // whole words
                                           ModelParams{kMiB + kUnit, 250, 2},  // misaligned start, ragged tail
                                           ModelParams{3 * kUnit, 97, 3},      // small, tight
                                           ModelParams{kGiB, 1000, 4}));

}  // namespace
}  // namespace ubtrfs::alloc
