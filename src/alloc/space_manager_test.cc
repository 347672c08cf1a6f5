#include "alloc/space_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "format/ondisk.h"

namespace ubtrfs::alloc {
namespace UBTRFS_UNITY_ID {

using format::kBlockGroupData;
using format::kBlockGroupDup;
using format::kBlockGroupMetadata;
using format::kBlockGroupSystem;

constexpr uint64_t kUnit = 4096;
constexpr uint64_t kNode = 16384;
constexpr uint64_t kMiB = 1 << 20;

TEST(SpaceManager, AddGroupChecksItsArguments) {
  SpaceManager sm(kUnit);
  ASSERT_TRUE(sm.AddGroup(8 * kMiB, 8 * kMiB, kBlockGroupMetadata | kBlockGroupDup).ok());
  Status overlap_end = sm.AddGroup(4 * kMiB, 5 * kMiB, kBlockGroupData);
  EXPECT_EQ(overlap_end.code(), EINVAL);
  EXPECT_NE(overlap_end.message().find("overlaps block group [8388608, +8388608)"), std::string::npos)
      << overlap_end.ToString();
  EXPECT_EQ(sm.AddGroup(15 * kMiB, 2 * kMiB, kBlockGroupData).code(), EINVAL);  // overlaps the start
  EXPECT_EQ(sm.AddGroup(9 * kMiB, kMiB, kBlockGroupData).code(), EINVAL);       // inside
  EXPECT_EQ(sm.AddGroup(32 * kMiB, kMiB, kBlockGroupDup).code(), EINVAL);       // no type bits
  EXPECT_EQ(sm.AddGroup(32 * kMiB + 1, kMiB, kBlockGroupData).code(), EINVAL);  // unaligned
  EXPECT_TRUE(sm.AddGroup(4 * kMiB, 4 * kMiB, kBlockGroupData).ok());           // touching is fine
  EXPECT_TRUE(sm.AddGroup(16 * kMiB, kMiB, kBlockGroupSystem).ok());
  EXPECT_EQ(sm.group_count(), 3u);
}

TEST(SpaceManager, RoutesAllocationsByKind) {
  SpaceManager sm(kUnit);
  ASSERT_TRUE(sm.AddGroup(1 * kMiB, kMiB, kBlockGroupSystem).ok());
  ASSERT_TRUE(sm.AddGroup(2 * kMiB, kMiB, kBlockGroupMetadata | kBlockGroupDup).ok());
  ASSERT_TRUE(sm.AddGroup(3 * kMiB, kMiB, kBlockGroupData).ok());
  auto sys = sm.Allocate(kBlockGroupSystem, kNode, kNode);
  auto meta = sm.Allocate(kBlockGroupMetadata, kNode, kNode);
  auto data = sm.Allocate(kBlockGroupData, kUnit, kUnit);
  ASSERT_TRUE(sys.ok() && meta.ok() && data.ok());
  EXPECT_EQ(*sys, 1 * kMiB);
  EXPECT_EQ(*meta, 2 * kMiB);
  EXPECT_EQ(*data, 3 * kMiB);
  // Profile bits in the kind are ignored.
  auto meta2 = sm.Allocate(kBlockGroupMetadata | kBlockGroupDup, kNode, kNode);
  ASSERT_TRUE(meta2.ok());
  EXPECT_EQ(*meta2, 2 * kMiB + kNode);
}

TEST(SpaceManager, MixedGroupServesDataAndMetadataButNotSystem) {
  SpaceManager sm(kUnit);
  ASSERT_TRUE(sm.AddGroup(kMiB, kMiB, kBlockGroupData | kBlockGroupMetadata).ok());
  auto m = sm.Allocate(kBlockGroupMetadata, kNode, kNode);
  auto d = sm.Allocate(kBlockGroupData, kUnit, kUnit);
  ASSERT_TRUE(m.ok() && d.ok());
  EXPECT_EQ(*m, kMiB);
  EXPECT_EQ(*d, kMiB + kNode);
  EXPECT_EQ(sm.Allocate(kBlockGroupSystem, kNode, kNode).status().code(), ENOSPC);
  EXPECT_EQ(sm.TotalsFor(kBlockGroupData).used_bytes, kNode + kUnit);
  EXPECT_EQ(sm.TotalsFor(kBlockGroupMetadata).used_bytes, kNode + kUnit);
  EXPECT_EQ(sm.TotalsFor(kBlockGroupSystem).groups, 0u);
}

TEST(SpaceManager, RejectsMalformedRequests) {
  SpaceManager sm(kUnit);
  ASSERT_TRUE(sm.AddGroup(kMiB, kMiB, kBlockGroupData | kBlockGroupMetadata).ok());
  EXPECT_EQ(sm.Allocate(0, kNode, kNode).status().code(), EINVAL);
  EXPECT_EQ(sm.Allocate(kBlockGroupDup, kNode, kNode).status().code(), EINVAL);
  EXPECT_EQ(sm.Allocate(kBlockGroupData | kBlockGroupMetadata, kNode, kNode).status().code(), EINVAL);
  EXPECT_EQ(sm.Allocate(kBlockGroupData, 0, kUnit).status().code(), EINVAL);
  EXPECT_EQ(sm.Allocate(kBlockGroupData, 100, kUnit).status().code(), EINVAL);
  EXPECT_EQ(sm.Allocate(kBlockGroupData, kUnit, 100).status().code(), EINVAL);
  auto zero_align = sm.Allocate(kBlockGroupData, kUnit, 0);
  ASSERT_TRUE(zero_align.ok());
  EXPECT_EQ(*zero_align, kMiB);
}

TEST(SpaceManager, EnospcNamesTheKindAndSize) {
  SpaceManager sm(kUnit);
  auto none = sm.Allocate(kBlockGroupMetadata, kNode, kNode);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), ENOSPC);
  EXPECT_NE(none.status().message().find("no free metadata space for 16384 bytes"), std::string::npos)
      << none.status().ToString();

  ASSERT_TRUE(sm.AddGroup(kMiB, 4 * kUnit, kBlockGroupData).ok());
  ASSERT_TRUE(sm.Allocate(kBlockGroupData, 4 * kUnit, kUnit).ok());
  auto full = sm.Allocate(kBlockGroupData, kUnit, kUnit);
  EXPECT_EQ(full.status().code(), ENOSPC);
  EXPECT_NE(full.status().message().find("no free data space for 4096 bytes"), std::string::npos)
      << full.status().ToString();
}

TEST(SpaceManager, FillsOneGroupThenMovesOn) {
  SpaceManager sm(kUnit);
  ASSERT_TRUE(sm.AddGroup(kMiB, 4 * kNode, kBlockGroupMetadata).ok());
  ASSERT_TRUE(sm.AddGroup(8 * kMiB, 4 * kNode, kBlockGroupData).ok());
  ASSERT_TRUE(sm.AddGroup(16 * kMiB, 4 * kNode, kBlockGroupMetadata).ok());
  std::vector<uint64_t> got;
  for (int i = 0; i < 8; ++i) {
    auto a = sm.Allocate(kBlockGroupMetadata, kNode, kNode);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    got.push_back(*a);
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(got[i], kMiB + i * kNode);
    EXPECT_EQ(got[4 + i], 16 * kMiB + i * kNode);
  }
  EXPECT_EQ(sm.Allocate(kBlockGroupMetadata, kNode, kNode).status().code(), ENOSPC);
  // Space comes back in the first group after a commit: the search wraps.
  ASSERT_TRUE(sm.Free(got[1], kNode).ok());
  EXPECT_EQ(sm.Allocate(kBlockGroupMetadata, kNode, kNode).status().code(), ENOSPC);
  sm.Commit();
  auto a = sm.Allocate(kBlockGroupMetadata, kNode, kNode);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, got[1]);
}

TEST(SpaceManager, FreeAndMarkUsedRouteToTheGroup) {
  SpaceManager sm(kUnit);
  ASSERT_TRUE(sm.AddGroup(kMiB, kMiB, kBlockGroupData).ok());
  ASSERT_TRUE(sm.AddGroup(2 * kMiB, kMiB, kBlockGroupMetadata).ok());
  ASSERT_TRUE(sm.MarkUsed(2 * kMiB, kNode).ok());
  EXPECT_EQ(sm.FindGroup(2 * kMiB)->used_bytes, kNode);
  EXPECT_EQ(sm.FindGroup(kMiB)->used_bytes, 0u);

  Status outside = sm.Free(8 * kMiB, kUnit);
  EXPECT_EQ(outside.code(), EINVAL);
  EXPECT_NE(outside.message().find("not in any block group"), std::string::npos) << outside.ToString();
  EXPECT_EQ(sm.Free(kMiB - kUnit, kUnit).code(), EINVAL);
  Status across = sm.MarkUsed(2 * kMiB - kUnit, 2 * kUnit);
  EXPECT_EQ(across.code(), EINVAL);
  EXPECT_NE(across.message().find("crosses the end of block group"), std::string::npos) << across.ToString();
  Status dbl = sm.Free(2 * kMiB + kNode, kUnit);
  EXPECT_EQ(dbl.code(), EINVAL);
  EXPECT_NE(dbl.message().find("double free"), std::string::npos) << dbl.ToString();

  ASSERT_TRUE(sm.Free(2 * kMiB, kNode).ok());
  auto info = sm.FindGroup(2 * kMiB + 5);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->start, 2 * kMiB);
  EXPECT_EQ(info->used_bytes, 0u);
  EXPECT_EQ(info->pinned_bytes, kNode);
  EXPECT_TRUE(info->has_clone);
  EXPECT_FALSE(sm.FindGroup(kMiB)->has_clone);
  EXPECT_FALSE(sm.FindGroup(3 * kMiB));
  EXPECT_FALSE(sm.FindGroup(0));
}

TEST(SpaceManager, FreedSpaceIsNotReusedBeforeCommitInAnyGroup) {
  SpaceManager sm(kUnit);
  ASSERT_TRUE(sm.AddGroup(kMiB, 2 * kNode, kBlockGroupMetadata).ok());
  ASSERT_TRUE(sm.AddGroup(4 * kMiB, 2 * kNode, kBlockGroupMetadata).ok());
  std::vector<uint64_t> v;
  for (int i = 0; i < 4; ++i) v.push_back(*sm.Allocate(kBlockGroupMetadata, kNode, kNode));
  ASSERT_TRUE(sm.Free(v[0], kNode).ok());
  ASSERT_TRUE(sm.Free(v[3], kNode).ok());
  EXPECT_EQ(sm.TotalsFor(kBlockGroupMetadata).pinned_bytes, 2 * kNode);
  EXPECT_EQ(sm.Allocate(kBlockGroupMetadata, kNode, kNode).status().code(), ENOSPC);
  int clones = 0;
  sm.ForEachGroup([&](const BlockGroup& g) { clones += g.has_clone(); });
  EXPECT_EQ(clones, 2);
  sm.Commit();
  sm.ForEachGroup([&](const BlockGroup& g) { EXPECT_FALSE(g.has_clone()); });
  std::set<uint64_t> again;
  for (int i = 0; i < 2; ++i) again.insert(*sm.Allocate(kBlockGroupMetadata, kNode, kNode));
  EXPECT_EQ(again, (std::set<uint64_t>{v[0], v[3]}));
  EXPECT_EQ(sm.stats().clones_made, 2u);
}

TEST(SpaceManager, TotalsAndIteration) {
  SpaceManager sm(kUnit);
  ASSERT_TRUE(sm.AddGroup(kMiB, kMiB, kBlockGroupData).ok());
  ASSERT_TRUE(sm.AddGroup(4 * kMiB, kMiB, kBlockGroupData).ok());
  ASSERT_TRUE(sm.AddGroup(2 * kMiB, kMiB, kBlockGroupMetadata).ok());
  ASSERT_TRUE(sm.MarkUsed(4 * kMiB, 10 * kUnit).ok());
  ASSERT_TRUE(sm.Free(4 * kMiB, 2 * kUnit).ok());
  SpaceManager::Totals t = sm.TotalsFor(kBlockGroupData);
  EXPECT_EQ(t.groups, 2u);
  EXPECT_EQ(t.total_bytes, 2 * kMiB);
  EXPECT_EQ(t.used_bytes, 8 * kUnit);
  EXPECT_EQ(t.pinned_bytes, 2 * kUnit);
  EXPECT_EQ(t.free_bytes, 2 * kMiB - 10 * kUnit);
  EXPECT_EQ(sm.TotalsFor(kBlockGroupMetadata).free_bytes, kMiB);
  std::vector<uint64_t> starts;
  sm.ForEachGroup([&](const BlockGroup& g) { starts.push_back(g.start()); });
  EXPECT_EQ(starts, (std::vector<uint64_t>{kMiB, 2 * kMiB, 4 * kMiB}));
  EXPECT_EQ(SpaceManager::KindName(kBlockGroupData | kBlockGroupMetadata), "data+metadata");
}

// The txn layer's hook: make a chunk of the kind asked for, at the next free
// logical address.
struct ChunkMaker {
  SpaceManager* sm;
  uint64_t next = 64 * kMiB;
  uint64_t size = kMiB;
  int calls = 0;
  uint64_t last_kind = 0;
  uint64_t last_min_len = 0;

  Status operator()(uint64_t kind, uint64_t min_len) {
    ++calls;
    last_kind = kind;
    last_min_len = min_len;
    const uint64_t len = std::max(size, min_len);
    UB_RETURN_IF_ERROR(sm->AddGroup(next, len, kind));
    next += len;
    return Status::Ok();
  }
};

TEST(SpaceManager, NewChunkHookAddsAGroupWhenFull) {
  SpaceManager sm(kUnit);
  ASSERT_TRUE(sm.AddGroup(kMiB, 2 * kNode, kBlockGroupMetadata).ok());
  ChunkMaker maker{&sm};
  sm.set_new_chunk_hook([&](uint64_t kind, uint64_t min_len) { return maker(kind, min_len); });
  ASSERT_TRUE(sm.Allocate(kBlockGroupMetadata, kNode, kNode).ok());
  ASSERT_TRUE(sm.Allocate(kBlockGroupMetadata, kNode, kNode).ok());
  EXPECT_EQ(maker.calls, 0);
  auto a = sm.Allocate(kBlockGroupMetadata | kBlockGroupDup, kNode, kNode);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(*a, 64 * kMiB);
  EXPECT_EQ(maker.calls, 1);
  EXPECT_EQ(maker.last_kind, kBlockGroupMetadata);
  EXPECT_EQ(maker.last_min_len, kNode);
  EXPECT_EQ(sm.group_count(), 2u);
  // The new group has room: no more hook calls for a while.
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(sm.Allocate(kBlockGroupMetadata, kNode, kNode).ok());
  EXPECT_EQ(maker.calls, 1);
  // A request larger than any chunk passes its size on.
  auto big = sm.Allocate(kBlockGroupData, 3 * kMiB, kUnit);
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(maker.calls, 2);
  EXPECT_EQ(maker.last_kind, kBlockGroupData);
  EXPECT_EQ(maker.last_min_len, 3 * kMiB);
}

TEST(SpaceManager, EnospcWhenTheHookDeclines) {
  SpaceManager sm(kUnit);
  ASSERT_TRUE(sm.AddGroup(kMiB, kNode, kBlockGroupMetadata).ok());
  int calls = 0;
  sm.set_new_chunk_hook([&](uint64_t, uint64_t) {
    ++calls;
    return Status::Error(ENOSPC, "device full");
  });
  ASSERT_TRUE(sm.Allocate(kBlockGroupMetadata, kNode, kNode).ok());
  auto r = sm.Allocate(kBlockGroupMetadata, kNode, kNode);
  EXPECT_EQ(r.status().code(), ENOSPC);
  EXPECT_NE(r.status().message().find("no free metadata space for 16384 bytes"), std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("device full"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(calls, 1);  // once per failing allocation, no retry loop
}

TEST(SpaceManager, EnospcWhenTheHookAddsNothing) {
  SpaceManager sm(kUnit);
  int calls = 0;
  sm.set_new_chunk_hook([&](uint64_t, uint64_t) {
    ++calls;
    return Status::Ok();
  });
  EXPECT_EQ(sm.Allocate(kBlockGroupData, kUnit, kUnit).status().code(), ENOSPC);
  EXPECT_EQ(calls, 1);
}

TEST(SpaceManager, HookErrorsOtherThanEnospcPropagate) {
  SpaceManager sm(kUnit);
  sm.set_new_chunk_hook([](uint64_t, uint64_t) { return Status::IoError("writing the chunk item"); });
  auto r = sm.Allocate(kBlockGroupData, kUnit, kUnit);
  EXPECT_EQ(r.status().code(), EIO);
  EXPECT_NE(r.status().message().find("adding a chunk: writing the chunk item"), std::string::npos)
      << r.status().ToString();
}

TEST(SpaceManager, HookMayAllocateSystemSpaceWithoutRecursing) {
  SpaceManager sm(kUnit);
  ASSERT_TRUE(sm.AddGroup(kMiB, kNode, kBlockGroupSystem).ok());
  int calls = 0;
  Status nested;
  sm.set_new_chunk_hook([&](uint64_t kind, uint64_t min_len) -> Status {
    ++calls;
    // The chunk item goes into the chunk tree, which lives in system space.
    auto sys = sm.Allocate(kBlockGroupSystem, kNode, kNode);
    if (!sys.ok()) {
      nested = sys.status();
      return sys.status();
    }
    return sm.AddGroup(64 * kMiB * calls, std::max(kMiB, min_len), kind);
  });
  auto a = sm.Allocate(kBlockGroupData, kUnit, kUnit);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(*a, 64 * kMiB);
  EXPECT_EQ(calls, 1);
  // System space is now gone: the nested allocation must fail with ENOSPC
  // instead of calling the hook again (which would deadlock or recurse).
  auto b = sm.Allocate(kBlockGroupMetadata, kNode, kNode);
  EXPECT_EQ(b.status().code(), ENOSPC);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(nested.code(), ENOSPC);
  EXPECT_NE(nested.message().find("no free system space"), std::string::npos) << nested.ToString();
}

TEST(SpaceManager, HookIsAskedAgainWhenItsChunkIsTakenBeforeTheRetry) {
  SpaceManager sm(kUnit);
  int calls = 0;
  std::vector<uint64_t> stolen;
  uint64_t next = 64 * kMiB;
  sm.set_new_chunk_hook([&](uint64_t kind, uint64_t) -> Status {
    ++calls;
    UB_RETURN_IF_ERROR(sm.AddGroup(next, kNode, kind));
    next += kMiB;
    // Stand in for another thread that finds the new group first.
    if (calls == 1) stolen.push_back(*sm.Allocate(kind, kNode, kNode));
    return Status::Ok();
  });
  auto a = sm.Allocate(kBlockGroupMetadata, kNode, kNode);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(stolen, std::vector<uint64_t>{64 * kMiB});
  EXPECT_EQ(*a, 65 * kMiB);
}

TEST(SpaceManager, HookRoundsAreBounded) {
  SpaceManager sm(kUnit);
  int calls = 0;
  sm.set_new_chunk_hook([&](uint64_t kind, uint64_t) -> Status {
    ++calls;
    // Always too small for the request.
    return sm.AddGroup(64 * kMiB * calls, kNode, kind);
  });
  auto r = sm.Allocate(kBlockGroupData, 2 * kNode, kUnit);
  EXPECT_EQ(r.status().code(), ENOSPC);
  EXPECT_EQ(calls, SpaceManager::kMaxChunkRounds);
  EXPECT_NE(r.status().message().find("new chunks added, none with room"), std::string::npos) << r.status().ToString();
}

// Threads allocate, free and commit at once. A ledger outside the manager
// checks that no block is handed out while live or while pinned (freed since
// the last commit), and the hook adds groups as space runs out.
TEST(SpaceManager, ConcurrentAllocateFreeCommit) {
  SpaceManager sm(kUnit);
  ASSERT_TRUE(sm.AddGroup(kMiB, 64 * kNode, kBlockGroupMetadata).ok());
  std::atomic<uint64_t> next_chunk{64 * kMiB};
  std::atomic<int> hook_calls{0};
  std::atomic<int> hook_running{0};
  std::atomic<bool> hook_overlap{false};
  sm.set_new_chunk_hook([&](uint64_t kind, uint64_t) {
    if (hook_running.fetch_add(1) != 0) hook_overlap = true;
    ++hook_calls;
    Status s = sm.AddGroup(next_chunk.fetch_add(kMiB), kMiB, kind);
    hook_running.fetch_sub(1);
    return s;
  });

  std::mutex ledger_mu;
  std::set<uint64_t> live, pinned;
  std::atomic<int> violations{0};
  std::atomic<int> errors{0};
  constexpr int kThreads = 4;
  constexpr int kOps = 5000;

  auto worker = [&](int id) {
    std::mt19937 rng(id);
    std::vector<uint64_t> mine;
    for (int i = 0; i < kOps; ++i) {
      const int op = static_cast<int>(rng() % 100);
      if (op < 55 || mine.empty()) {
        auto a = sm.Allocate(kBlockGroupMetadata, kNode, kNode);
        if (!a.ok()) {
          ++errors;
          continue;
        }
        std::lock_guard l(ledger_mu);
        if (live.count(*a) || pinned.count(*a)) ++violations;
        live.insert(*a);
        mine.push_back(*a);
      } else if (op < 97) {
        const size_t k = rng() % mine.size();
        const uint64_t b = mine[k];
        mine[k] = mine.back();
        mine.pop_back();
        // Ledger first, so the block cannot be seen as live by whoever gets
        // it next (it cannot be handed out before Free returns anyway).
        std::lock_guard l(ledger_mu);
        live.erase(b);
        pinned.insert(b);
        if (!sm.Free(b, kNode).ok()) ++errors;
      } else {
        std::lock_guard l(ledger_mu);
        sm.Commit();
        pinned.clear();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
  for (auto& t : threads) t.join();

  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_FALSE(hook_overlap.load());
  EXPECT_GT(hook_calls.load(), 0);
  EXPECT_EQ(sm.group_count(), 1u + hook_calls.load());
  SpaceManager::Totals t = sm.TotalsFor(kBlockGroupMetadata);
  EXPECT_EQ(t.used_bytes, live.size() * kNode);
  EXPECT_EQ(t.pinned_bytes, pinned.size() * kNode);
  EXPECT_EQ(t.used_bytes + t.pinned_bytes + t.free_bytes, t.total_bytes);
}

}  // namespace
}  // namespace ubtrfs::alloc
