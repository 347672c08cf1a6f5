#include "inode/delayed_dir_items.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace ubtrfs::inode {
namespace UBTRFS_UNITY_ID {

constexpr uint64_t kRoot = 5;

std::vector<uint8_t> Item(uint32_t hash) {
  return {static_cast<uint8_t>(hash), static_cast<uint8_t>(hash >> 8), static_cast<uint8_t>(hash >> 16),
          static_cast<uint8_t>(hash >> 24)};
}

TEST(HashSlots, AgreesWithAMapThroughGrowth) {
  HashSlots slots;
  std::map<uint32_t, uint32_t> want;
  std::mt19937 rng(7);
  for (uint32_t h : {0u, 0xffffffffu, 1u}) {
    slots.Set(h, h % 100);
    want[h] = h % 100;
  }
  for (int i = 0; i < 20000; ++i) {
    const uint32_t h = i % 3 ? rng() : rng() % 64;  // dense low hashes too
    const uint32_t v = rng() % 1000;
    if (i % 2) {
      slots.Set(h, v);
      want[h] = v;
    } else {  // Insert keeps a present value
      EXPECT_EQ(slots.Insert(h, v), want.emplace(h, v).second) << h;
    }
  }
  EXPECT_EQ(slots.size(), want.size());
  for (const auto& [h, v] : want) {
    uint32_t got = 12345;
    ASSERT_TRUE(slots.Find(h, &got)) << h;
    EXPECT_EQ(got, v);
  }
  for (int i = 0; i < 20000; ++i) {
    const uint32_t h = rng();
    EXPECT_EQ(slots.Find(h), want.count(h) > 0) << h;
  }
}

TEST(DelayedDirItems, IndexQueueFindAndFlushInHashOrder) {
  DelayedDirItems d(DelayedDirItems::Options{.index_after = 4, .dir_batch = 6, .total_limit = 1000});
  bool flush = false;
  uint64_t creates = 0;
  // No index: the caller uses the tree.
  EXPECT_EQ(d.Add(kRoot, 300, 1, Item(1), &flush), DelayedDirItems::Verdict::kNoIndex);
  std::vector<uint8_t> got;
  EXPECT_EQ(d.Find(kRoot, 300, 1, &got), DelayedDirItems::Probe::kUnknown);
  // Creates are counted (this first Add was not one); the fourth asks for an index.
  for (uint32_t h = 2; h <= 4; ++h) {
    EXPECT_EQ(d.Add(kRoot, 300, h, Item(h), &flush, &creates), DelayedDirItems::Verdict::kNoIndex);
  }
  EXPECT_EQ(creates, 3u);
  EXPECT_EQ(d.Add(kRoot, 300, 5, Item(5), &flush, &creates), DelayedDirItems::Verdict::kConsiderIndex);
  EXPECT_EQ(creates, 4u);
  // The tree has hashes 10 and 20.
  const std::vector<uint64_t> in_tree = {10, 20};
  d.SetIndex(kRoot, 300, in_tree);
  EXPECT_TRUE(d.HasIndex(kRoot, 300));
  // Indexed: no more asking, and a counted create is judged like any add.
  EXPECT_EQ(d.Add(kRoot, 300, 10, Item(10), &flush, &creates), DelayedDirItems::Verdict::kMayExist);
  EXPECT_EQ(creates, 5u);
  EXPECT_EQ(d.Find(kRoot, 300, 20, &got), DelayedDirItems::Probe::kUnknown);
  EXPECT_EQ(d.Find(kRoot, 300, 30, &got), DelayedDirItems::Probe::kAbsent);
  // New hashes queue until the batch size says flush.
  const std::vector<uint32_t> order = {50, 40, 90, 70, 60};
  for (uint32_t h : order) {
    EXPECT_EQ(d.Add(kRoot, 300, h, Item(h), &flush), DelayedDirItems::Verdict::kQueued);
    EXPECT_FALSE(flush);
  }
  EXPECT_EQ(d.Add(kRoot, 300, 40, Item(40), &flush), DelayedDirItems::Verdict::kMayExist);  // queued already
  EXPECT_EQ(d.Add(kRoot, 300, 80, Item(80), &flush), DelayedDirItems::Verdict::kQueued);
  EXPECT_TRUE(flush);
  EXPECT_EQ(d.PendingIn(kRoot, 300), 6u);
  ASSERT_EQ(d.Find(kRoot, 300, 70, &got), DelayedDirItems::Probe::kPending);
  EXPECT_EQ(got, Item(70));
  // The immediate path records its hash.
  d.NoteInserted(kRoot, 300, 30);
  EXPECT_EQ(d.Find(kRoot, 300, 30, &got), DelayedDirItems::Probe::kUnknown);

  std::vector<uint32_t> inserted;
  ASSERT_TRUE(d.FlushDir(kRoot, 300, [&](uint64_t root, uint64_t dir, std::span<const uint32_t> hashes,
                                         std::span<const std::span<const uint8_t>> items) {
                 EXPECT_EQ(root, kRoot);
                 EXPECT_EQ(dir, 300u);
                 EXPECT_EQ(hashes.size(), items.size());
                 for (size_t i = 0; i < hashes.size(); ++i) {
                   EXPECT_TRUE(std::ranges::equal(items[i], Item(hashes[i])));
                   std::vector<uint8_t> seen;
                   // Still visible while the flush runs.
                   EXPECT_EQ(d.Find(kRoot, 300, hashes[i], &seen), DelayedDirItems::Probe::kPending);
                   inserted.push_back(hashes[i]);
                 }
                 return Status::Ok();
               }).ok());
  EXPECT_EQ(inserted, (std::vector<uint32_t>{40, 50, 60, 70, 80, 90}));
  EXPECT_EQ(d.PendingIn(kRoot, 300), 0u);
  EXPECT_EQ(d.Find(kRoot, 300, 70, &got), DelayedDirItems::Probe::kUnknown);  // now the tree's
  EXPECT_EQ(d.Add(kRoot, 300, 70, Item(70), &flush), DelayedDirItems::Verdict::kMayExist);

  // Another directory is independent; Forget drops the index.
  EXPECT_EQ(d.Find(kRoot, 301, 70, &got), DelayedDirItems::Probe::kUnknown);
  d.Forget(kRoot, 300);
  EXPECT_FALSE(d.HasIndex(kRoot, 300));
  EXPECT_EQ(d.Add(kRoot, 300, 1000, Item(1000), &flush), DelayedDirItems::Verdict::kNoIndex);
}

TEST(DelayedDirItems, TotalLimitAndFlushAllAndFailures) {
  DelayedDirItems d(DelayedDirItems::Options{.index_after = 1, .dir_batch = 100, .total_limit = 5});
  bool flush = false;
  for (uint64_t dir : {400, 401, 402}) d.SetIndex(kRoot, dir, {});
  int queued = 0;
  for (uint32_t h = 1; h <= 2; ++h) {
    for (uint64_t dir : {400, 401}) {
      EXPECT_EQ(d.Add(kRoot, dir, h, Item(h), &flush), DelayedDirItems::Verdict::kQueued);
      EXPECT_FALSE(flush);
      ++queued;
    }
  }
  EXPECT_EQ(d.Add(kRoot, 402, 7, Item(7), &flush), DelayedDirItems::Verdict::kQueued);
  EXPECT_TRUE(flush);  // five queued in all
  // A failing insert stops the flush and keeps the queue (the file system
  // aborts the transaction then).
  Status st = d.FlushDir(kRoot, 402, [](uint64_t, uint64_t, std::span<const uint32_t>,
                                        std::span<const std::span<const uint8_t>>) {
    return Status::Error(ENOSPC, "full");
  });
  EXPECT_EQ(st.code(), ENOSPC);
  EXPECT_EQ(d.PendingIn(kRoot, 402), 1u);
  std::set<std::pair<uint64_t, uint32_t>> tree;
  ASSERT_TRUE(d.FlushAll([&](uint64_t, uint64_t dir, std::span<const uint32_t> hashes,
                             std::span<const std::span<const uint8_t>>) {
                 for (uint32_t hash : hashes) EXPECT_TRUE(tree.insert({dir, hash}).second);
                 return Status::Ok();
               }).ok());
  EXPECT_EQ(tree.size(), 5u);
  for (uint64_t dir : {400, 401, 402}) EXPECT_EQ(d.PendingIn(kRoot, dir), 0u);
  // The total is back to zero: four more queue without a flush request.
  for (uint32_t h = 10; h < 14; ++h) {
    EXPECT_EQ(d.Add(kRoot, 400, h, Item(h), &flush), DelayedDirItems::Verdict::kQueued);
    EXPECT_FALSE(flush);
  }
}

// The total over all directories is counted in steps; a directory that
// reaches its batch on a step still counts that step, so flushing it takes
// off what was added and the total never drifts (a drift below zero once
// made every step ask for a flush).
TEST(DelayedDirItems, TotalStaysExactAcrossBatchFlushes) {
  DelayedDirItems d(DelayedDirItems::Options{.index_after = 1, .dir_batch = 1024, .total_limit = 64 * 64});
  const auto none = [](uint64_t, uint64_t, std::span<const uint32_t>, std::span<const std::span<const uint8_t>>) {
    return Status::Ok();
  };
  bool flush = false;
  d.SetIndex(kRoot, 600, {});
  d.SetIndex(kRoot, 601, {});
  uint32_t h = 1;
  for (int round = 0; round < 3; ++round) {
    for (int i = 1; i <= 1024; ++i, ++h) {
      ASSERT_EQ(d.Add(kRoot, 600, h, Item(h), &flush), DelayedDirItems::Verdict::kQueued);
      ASSERT_EQ(flush, i == 1024) << "round " << round << " item " << i;
    }
    ASSERT_TRUE(d.FlushDir(kRoot, 600, none).ok());
  }
  // Another directory's first steps find the total at zero.
  for (int i = 1; i <= 1000; ++i, ++h) {
    ASSERT_EQ(d.Add(kRoot, 601, h, Item(h), &flush), DelayedDirItems::Verdict::kQueued);
    ASSERT_FALSE(flush) << "item " << i;
  }
}

// A reader looking names up while the directory's holder queues and flushes
// never sees a published name as absent: it is queued, or in the tree.
TEST(DelayedDirItems, ConcurrentFindNeverMissesAPublishedName) {
  DelayedDirItems d(DelayedDirItems::Options{.index_after = 1, .dir_batch = 64, .total_limit = 1 << 20});
  d.SetIndex(kRoot, 500, {});
  std::mutex tree_mu;
  std::set<uint32_t> tree;
  std::vector<uint32_t> hashes(20000);
  std::mt19937 rng(11);
  std::set<uint32_t> distinct;
  for (auto& h : hashes) {
    do h = rng(); while (!distinct.insert(h).second);
  }
  std::atomic<size_t> published{0};
  auto insert = [&](uint64_t, uint64_t, std::span<const uint32_t> hashes, std::span<const std::span<const uint8_t>>) {
    for (uint32_t hash : hashes) {  // one at a time, as the tree gets them
      std::lock_guard lock(tree_mu);
      tree.insert(hash);
    }
    return Status::Ok();
  };
  std::thread writer([&] {
    bool flush = false;
    for (size_t i = 0; i < hashes.size(); ++i) {
      ASSERT_EQ(d.Add(kRoot, 500, hashes[i], Item(hashes[i]), &flush), DelayedDirItems::Verdict::kQueued);
      published.store(i + 1, std::memory_order_release);
      if (flush) {
        ASSERT_TRUE(d.FlushDir(kRoot, 500, insert).ok());
      }
    }
    ASSERT_TRUE(d.FlushDir(kRoot, 500, insert).ok());
  });
  size_t misses = 0, probes = 0;
  while (published.load(std::memory_order_acquire) < hashes.size()) {
    const size_t n = published.load(std::memory_order_acquire);
    if (n == 0) continue;
    const uint32_t h = hashes[rng() % n];
    std::vector<uint8_t> item;
    const auto p = d.Find(kRoot, 500, h, &item);
    ++probes;
    if (p == DelayedDirItems::Probe::kPending) {
      if (item != Item(h)) ++misses;
    } else {
      std::lock_guard lock(tree_mu);
      if (p != DelayedDirItems::Probe::kUnknown || !tree.count(h)) ++misses;
    }
  }
  writer.join();
  EXPECT_EQ(misses, 0u) << "of " << probes;
  EXPECT_EQ(tree.size(), hashes.size());
}

}  // namespace
}  // namespace ubtrfs::inode
