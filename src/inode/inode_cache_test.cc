#include "inode/inode_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace ubtrfs::inode {
namespace UBTRFS_UNITY_ID {

constexpr uint64_t kFsTree = 5;

format::InodeItem Item(uint64_t root, uint64_t ino) {
  format::InodeItem it{};
  it.size = ino * 10 + root;  // lets any holder check it got the right record
  it.nlink = 1;
  it.mode = 0100644;
  return it;
}

TEST(LatencyHistogramTest, Log2Buckets) {
  EXPECT_EQ(LatencyHistogram::Bucket(0), 0);
  EXPECT_EQ(LatencyHistogram::Bucket(1), 0);
  EXPECT_EQ(LatencyHistogram::Bucket(2), 1);
  EXPECT_EQ(LatencyHistogram::Bucket(3), 1);
  EXPECT_EQ(LatencyHistogram::Bucket(1023), 9);
  EXPECT_EQ(LatencyHistogram::Bucket(1024), 10);
  EXPECT_EQ(LatencyHistogram::Bucket(~uint64_t{0}), 63);
  LatencyHistogram h;
  h.buckets[5] = 90;   // 32..63
  h.buckets[10] = 10;  // 1024..2047
  h.count = 100;
  EXPECT_EQ(h.PercentileUpperBound(0.5), 63u);
  EXPECT_EQ(h.PercentileUpperBound(0.99), 2047u);
  std::string s = h.ToString();
  EXPECT_NE(s.find("32 -> 63"), std::string::npos) << s;
  EXPECT_NE(s.find("1024 -> 2047"), std::string::npos) << s;
}

TEST(InodeCacheTest, InsertLookupRemove) {
  InodeCache cache;
  EXPECT_FALSE(cache.Lookup(kFsTree, 256));
  bool inserted = false;
  InodeRef a = cache.Insert(kFsTree, 256, Item(kFsTree, 256), &inserted);
  ASSERT_TRUE(a);
  EXPECT_TRUE(inserted);
  EXPECT_EQ(a->root, kFsTree);
  EXPECT_EQ(a->ino, 256u);
  EXPECT_EQ(a->item.size.get(), 2565u);
  EXPECT_FALSE(a->dirty.load());
  EXPECT_EQ(a->open_count.load(), 0u);

  InodeRef b = cache.Lookup(kFsTree, 256);
  EXPECT_EQ(b.get(), a.get());
  // A second Insert (a racing loader) gets the cached record, not its copy.
  InodeRef c = cache.Insert(kFsTree, 256, Item(kFsTree, 999), &inserted);
  EXPECT_FALSE(inserted);
  EXPECT_EQ(c.get(), a.get());
  EXPECT_EQ(c->item.size.get(), 2565u);

  // Same inode number, other subvolume: another record.
  InodeRef d = cache.Insert(256, 256, Item(256, 256));
  EXPECT_NE(d.get(), a.get());
  EXPECT_EQ(cache.size(), 2u);

  EXPECT_TRUE(cache.Remove(kFsTree, 256));
  EXPECT_FALSE(cache.Remove(kFsTree, 256));
  EXPECT_FALSE(cache.Lookup(kFsTree, 256));
  EXPECT_EQ(a->item.size.get(), 2565u);  // refs keep the record alive
  EXPECT_EQ(cache.size(), 1u);

  InodeCacheStats s = cache.stats();
  EXPECT_EQ(s.inserts, 2u);
  EXPECT_EQ(s.insert_races, 1u);
  EXPECT_EQ(s.lookups, 3u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.removals, 1u);
  EXPECT_EQ(s.cached, 1u);
  EXPECT_EQ(s.subvolumes, 2u);
  EXPECT_EQ(s.insert_ns.count, 3u);
  EXPECT_EQ(s.lookup_ns.count, 3u);
  EXPECT_GT(s.node_bytes, 0u);
  EXPECT_EQ(s.record_bytes, sizeof(InodeRecord));
}

TEST(InodeCacheTest, FindFirstAtOrAfter) {
  InodeCache cache;
  for (uint64_t ino : {300, 257, 100000, 5000}) cache.Insert(kFsTree, ino, Item(kFsTree, ino));
  cache.Insert(256, 258, Item(256, 258));
  EXPECT_EQ(cache.FindFirstAtOrAfter(kFsTree, 0)->ino, 257u);
  EXPECT_EQ(cache.FindFirstAtOrAfter(kFsTree, 258)->ino, 300u);
  EXPECT_EQ(cache.FindFirstAtOrAfter(kFsTree, 5000)->ino, 5000u);
  EXPECT_EQ(cache.FindFirstAtOrAfter(kFsTree, 5001)->ino, 100000u);
  EXPECT_FALSE(cache.FindFirstAtOrAfter(kFsTree, 100001));
  EXPECT_EQ(cache.FindFirstAtOrAfter(256, 0)->ino, 258u);
  EXPECT_FALSE(cache.FindFirstAtOrAfter(257, 0));
}

TEST(InodeCacheTest, EvictsOnlyIdleRecordsColdFirst) {
  InodeCacheOptions opt;
  opt.capacity = 100;
  InodeCache cache(opt);
  std::vector<InodeRef> held;
  for (uint64_t ino = 0; ino < 100; ++ino) {
    InodeRef r = cache.Insert(kFsTree, ino, Item(kFsTree, ino));
    if (ino < 10) r->dirty = true;
    else if (ino < 20) r->open_count = 1;
    else if (ino < 30) held.push_back(r);
  }
  for (uint64_t ino = 50; ino < 60; ++ino) ASSERT_TRUE(cache.Lookup(kFsTree, ino));  // second chance
  for (uint64_t ino = 100; ino < 150; ++ino) cache.Insert(kFsTree, ino, Item(kFsTree, ino));
  EXPECT_LE(cache.size(), 102u);  // eviction per insert has a scan budget
  cache.Shrink(100);
  EXPECT_EQ(cache.size(), 100u);
  for (uint64_t ino = 0; ino < 30; ++ino) EXPECT_TRUE(cache.Lookup(kFsTree, ino)) << "pinned " << ino;
  for (uint64_t ino = 50; ino < 60; ++ino) EXPECT_TRUE(cache.Lookup(kFsTree, ino)) << "referenced " << ino;
  for (uint64_t ino = 100; ino < 150; ++ino) EXPECT_TRUE(cache.Lookup(kFsTree, ino)) << "newest " << ino;
  EXPECT_EQ(cache.stats().evictions, 50u);

  // Shrinking to nothing keeps exactly the pinned ones.
  cache.Shrink(0);
  EXPECT_EQ(cache.size(), 30u);
  held.clear();
  for (uint64_t ino = 0; ino < 20; ++ino) {
    InodeRef r = cache.Lookup(kFsTree, ino);
    r->dirty = false;
    r->open_count = 0;
  }
  cache.Shrink(0);
  EXPECT_EQ(cache.size(), 0u);
  // Every inode tree node went with the records; the subvolume map's one node stays.
  EXPECT_EQ(cache.stats().node_bytes, RadixTree<InodeRecord*>::kNodeBytes);
}

// With several shards (64-number blocks spread by hash), the answers are the ones one shard
// gives: checked against a std::set on random and extreme inode numbers.
TEST(InodeCacheTest, ShardedFindFirstAtOrAfterMatchesASet) {
  for (uint32_t shards : {1u, 3u, 16u}) {
    InodeCache cache(InodeCacheOptions{.capacity = 1 << 20, .shards = shards});
    std::set<uint64_t> inos = {0, 1, 255, ~uint64_t{0}, ~uint64_t{0} - 1, ~uint64_t{0} - 17};
    std::mt19937_64 rng(shards);
    for (int i = 0; i < 2000; ++i) inos.insert(256 + rng() % 100000);
    for (uint64_t ino : inos) cache.Insert(kFsTree, ino, Item(kFsTree, ino));
    EXPECT_EQ(cache.size(), inos.size());
    std::vector<uint64_t> probes = {0, 1, 2, 256, 100256, ~uint64_t{0} - 40, ~uint64_t{0} - 16, ~uint64_t{0}};
    for (int i = 0; i < 3000; ++i) probes.push_back(rng() % 100300);
    for (uint64_t p : probes) {
      auto want = inos.lower_bound(p);
      InodeRef got = cache.FindFirstAtOrAfter(kFsTree, p);
      ASSERT_EQ(static_cast<bool>(got), want != inos.end()) << "shards " << shards << " from " << p;
      if (got) {
        ASSERT_EQ(got->ino, *want) << "shards " << shards << " from " << p;
        EXPECT_EQ(got->item.size.get(), *want * 10 + kFsTree);
      }
    }
    EXPECT_FALSE(cache.FindFirstAtOrAfter(kFsTree + 1, 0));
  }
}

// Capacity is split over the shards; idle records still go, pinned ones stay.
TEST(InodeCacheTest, ShardedCacheEvictsIdleRecordsToItsCapacity) {
  InodeCache cache(InodeCacheOptions{.capacity = 160, .shards = 16});
  std::vector<InodeRef> pinned;
  for (uint64_t ino = 256; ino < 256 + 5000; ++ino) {
    InodeRef r = cache.Insert(kFsTree, ino, Item(kFsTree, ino));
    if (ino % 100 == 0) pinned.push_back(r);
  }
  EXPECT_LE(cache.size(), 160u + pinned.size());
  for (const InodeRef& r : pinned) EXPECT_EQ(cache.Lookup(kFsTree, r->ino).get(), r.get());
  pinned.clear();
  cache.Shrink(0);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.stats().inserts, 5000u);
}

TEST(InodeCacheTest, CollectDirtyInKeyOrderAcrossBatches) {
  for (uint32_t shards : {1u, 16u}) {
  InodeCacheOptions opt;
  opt.capacity = 1 << 20;
  opt.shards = shards;
  InodeCache cache(opt);
  std::vector<std::pair<uint64_t, uint64_t>> want;
  for (uint64_t root : {kFsTree, uint64_t{256}, uint64_t{300}}) {
    for (uint64_t ino = 256; ino < 256 + 3000; ++ino) {
      InodeRef r = cache.Insert(root, ino, Item(root, ino));
      if (ino % 7 == 0 || (root == 300 && ino > 3000)) {
        r->dirty = true;
        want.emplace_back(root, ino);
      }
    }
  }
  cache.Insert(~uint64_t{0}, ~uint64_t{0}, Item(0, 0))->dirty = true;
  want.emplace_back(~uint64_t{0}, ~uint64_t{0});
  std::vector<std::pair<uint64_t, uint64_t>> got;
  for (const InodeRef& r : cache.CollectDirty()) got.emplace_back(r->root, r->ino);
  EXPECT_EQ(got, want) << "shards " << shards;
  }
}

TEST(InodeCacheTest, DestructorLeavesHeldRecordsAlive) {
  InodeRef kept;
  {
    InodeCache cache;
    kept = cache.Insert(kFsTree, 300, Item(kFsTree, 300));
    for (uint64_t ino = 301; ino < 400; ++ino) cache.Insert(kFsTree, ino, Item(kFsTree, ino));
  }
  EXPECT_EQ(kept->ino, 300u);
  EXPECT_EQ(kept->item.size.get(), 3005u);
}

// Four threads insert, look up, remove, pin and dirty overlapping inodes of
// two subvolumes with a small capacity, so eviction runs all the time. Run it
// under TSan (-DUBTRFS_TSAN=ON).
class InodeCacheShardsTest : public ::testing::TestWithParam<uint32_t> {};
INSTANTIATE_TEST_SUITE_P(Shards, InodeCacheShardsTest, ::testing::Values(1u, 16u));

TEST_P(InodeCacheShardsTest, ConcurrentMixedOperations) {
  InodeCacheOptions opt;
  opt.capacity = 400;
  opt.shards = GetParam();
  InodeCache cache(opt);
  constexpr int kThreads = 4;
  constexpr int kOps = 40000;
  constexpr uint64_t kInodes = 1500;
  constexpr uint64_t kPinnedRoot = 7;  // only thread 0 touches it; its records stay pinned
  std::atomic<uint64_t> lookups{0}, failures{0};

  auto worker = [&](int id) {
    std::mt19937_64 rng(1000 + id);
    std::vector<InodeRef> held;
    std::vector<InodeRef> pinned;
    if (id == 0) {
      for (uint64_t ino = 256; ino < 306; ++ino) pinned.push_back(cache.Insert(kPinnedRoot, ino, Item(kPinnedRoot, ino)));
    }
    auto check = [&](const InodeRef& r, uint64_t root, uint64_t ino) {
      if (r->root != root || r->ino != ino || r->item.size.get() != ino * 10 + root) failures.fetch_add(1);
    };
    for (int i = 0; i < kOps; ++i) {
      uint64_t root = rng() % 2 == 0 ? kFsTree : 256;
      uint64_t ino = 256 + rng() % kInodes;
      switch (rng() % 12) {
        case 0:
        case 1:
        case 2:
        case 3: {
          lookups.fetch_add(1, std::memory_order_relaxed);
          if (InodeRef r = cache.Lookup(root, ino)) check(r, root, ino);
          break;
        }
        case 4:
        case 5:
        case 6: {
          InodeRef r = cache.Insert(root, ino, Item(root, ino));
          check(r, root, ino);
          if (rng() % 4 == 0) held.push_back(std::move(r));
          break;
        }
        case 7:
          cache.Remove(root, ino);
          break;
        case 8:
          if (InodeRef r = cache.FindFirstAtOrAfter(root, ino)) {
            if (r->root != root || r->ino < ino) failures.fetch_add(1);
          }
          break;
        case 9:  // a holder dirties and opens its inode, then cleans and closes it
          if (!held.empty()) {
            InodeRef& r = held[rng() % held.size()];
            r->open_count.fetch_add(1);
            r->dirty = true;
            r->dirty = false;
            r->open_count.fetch_sub(1);
          }
          break;
        case 10:
          if (!held.empty()) held.erase(held.begin() + static_cast<long>(rng() % held.size()));
          if (held.size() > 20) held.clear();
          break;
        default:
          if (rng() % 64 == 0) {
            auto dirty = cache.CollectDirty();
            for (size_t k = 1; k < dirty.size(); ++k) {
              auto a = std::make_pair(dirty[k - 1]->root, dirty[k - 1]->ino);
              auto b = std::make_pair(dirty[k]->root, dirty[k]->ino);
              if (!(a < b)) failures.fetch_add(1);
            }
          } else {
            cache.stats();
          }
          break;
      }
    }
    for (const InodeRef& r : pinned) {
      if (cache.Lookup(kPinnedRoot, r->ino).get() != r.get()) failures.fetch_add(1);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();

  EXPECT_EQ(failures.load(), 0u);
  InodeCacheStats s = cache.stats();
  EXPECT_EQ(s.inserts - s.evictions - s.removals, s.cached);
  EXPECT_EQ(s.cached, cache.size());
  EXPECT_LE(s.cached, opt.capacity + 200);  // eviction per insert has a scan budget; pinned records count too
  EXPECT_GT(s.evictions, 0u);
  EXPECT_EQ(s.lookups, lookups.load() + 50);  // + thread 0's final check of its pinned records
  EXPECT_EQ(s.insert_ns.count, s.inserts + s.insert_races);
  EXPECT_EQ(s.lookup_ns.count, s.lookups);
  cache.Shrink(0);
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace ubtrfs::inode

namespace ubtrfs::inode {
namespace UBTRFS_UNITY_ID {

// A run of changes without a commit pins every record (dirty): the cache
// grows past its capacity, and each insert still looks at no more than a
// bounded number of records for eviction (it once walked them all, making
// long runs of creates quadratic).
TEST(InodeCacheTest, PinnedRecordsBoundTheEvictionScan) {
  InodeCacheOptions o;
  o.capacity = 100;
  InodeCache cache(o);
  constexpr uint64_t kInodes = 20000;
  for (uint64_t ino = 256; ino < 256 + kInodes; ++ino) {
    InodeRef r = cache.Insert(5, ino, Item(5, ino));
    r->dirty.store(true);
  }
  InodeCacheStats s = cache.stats();
  EXPECT_EQ(s.cached, kInodes);  // nothing could go
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_LE(s.evict_scans, kInodes * InodeCache::kMaxEvictScanForTests());
  // Once clean, the next inserts evict back towards the capacity.
  for (InodeRef& r : cache.CollectDirty()) r->dirty.store(false);
  for (uint64_t ino = 256 + kInodes; ino < 256 + kInodes + 2000; ++ino) cache.Insert(5, ino, Item(5, ino));
  s = cache.stats();
  EXPECT_GT(s.evictions, 2000u);
  EXPECT_LT(s.cached, kInodes);
}

}  // namespace
}  // namespace ubtrfs::inode
