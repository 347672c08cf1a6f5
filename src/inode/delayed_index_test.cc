// The seed rule of the delayed dir-index items (docs/DESIGN.md, "The four
// mechanisms", 1): a flush takes runs of consecutive indexes, one batch per
// what an empty leaf holds (node size minus the leaf header), so every batch
// but a run's tail fills a leaf; entries cancelled before the flush never
// reach the tree; the items are copied into the tree and the path let go of
// before the queue frees them.
//
// The expected batches are computed here from the rule itself (items per
// empty leaf = (nodesize - header) / (item + item header)) and compared with
// the tree's contents and with the delayed_index.* statistics, the instance's
// and the process's.
#include "inode/delayed_index.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "stats/stats.h"
#include "tree/cursor.h"
#include "tree/writer.h"

namespace ubtrfs::inode {
namespace UBTRFS_UNITY_ID {

using format::Key;
using tree::BlockCheck;
using tree::BlockRef;

constexpr uint64_t kRoot = format::kFsTreeObjectid;
constexpr uint64_t kDir = 256;
constexpr uint32_t kLeafHeader = sizeof(format::Header);
constexpr uint32_t kItemHeader = sizeof(format::Item);

class NoCleanBlocks final : public tree::BlockSource {
 public:
  Result<BlockRef> Read(const BlockCheck& check) override {
    return Status::Corrupt("no committed block " + std::to_string(check.bytenr));
  }
};

class BumpAllocator final : public tree::BlockAllocator {
 public:
  explicit BumpAllocator(uint32_t nodesize) : nodesize_(nodesize) {}
  Result<uint64_t> AllocTreeBlock(uint64_t, int) override {
    const uint64_t b = next_;
    next_ += nodesize_;
    return b;
  }
  Status FreeTreeBlock(uint64_t, uint64_t, int, bool) override { return Status::Ok(); }

 private:
  uint32_t nodesize_;
  uint64_t next_ = 1 << 20;
};

// One empty fs tree in a running transaction.
class Tree {
 public:
  explicit Tree(uint32_t nodesize) : alloc_(nodesize) {
    params_.nodesize = nodesize;
    params_.csum_type = 0;
    std::memset(params_.fsid, 0x5a, format::kFsidSize);
    std::memcpy(tmpl_.fsid, params_.fsid, format::kFsidSize);
    dirty_ = std::make_unique<tree::DirtyBlocks>(&clean_, params_, tmpl_, &alloc_, 10);
    auto leaf = dirty_->New(kRoot, 0);
    EXPECT_TRUE(leaf.ok());
    root_ = tree::RootPtr{(*leaf)->bytenr(), 0, 10, kRoot};
    writer_ = std::make_unique<tree::TreeWriter>(dirty_.get(), &root_, kRoot);
  }

  DelayedDirIndex::WriterFn Fn() {
    return [this](uint64_t root) -> Result<tree::TreeWriter*> {
      ++writer_calls;
      if (root != kRoot) return Status::Invalid("unexpected root " + std::to_string(root));
      return writer_.get();
    };
  }

  std::map<Key, std::vector<uint8_t>> Items() {
    std::map<Key, std::vector<uint8_t>> out;
    tree::Cursor c(dirty_.get(), writer_->LiveRef());
    EXPECT_TRUE(c.SeekFirst().ok());
    while (c.Valid()) {
      out[c.key()] = std::vector<uint8_t>(c.data().begin(), c.data().end());
      EXPECT_TRUE(c.Next().ok());
    }
    return out;
  }

  tree::DirtyBlocks& dirty() { return *dirty_; }
  tree::TreeWriter& writer() { return *writer_; }
  int writer_calls = 0;

 private:
  tree::TreeParams params_;
  tree::HeaderTemplate tmpl_;
  NoCleanBlocks clean_;
  BumpAllocator alloc_;
  std::unique_ptr<tree::DirtyBlocks> dirty_;
  tree::RootPtr root_;
  std::unique_ptr<tree::TreeWriter> writer_;
};

// A DIR_INDEX-like item of `size` bytes whose bytes name its index.
std::vector<uint8_t> ItemFor(uint64_t index, uint32_t size) {
  std::vector<uint8_t> d(size);
  for (uint32_t i = 0; i < size; ++i) d[i] = static_cast<uint8_t>(index * 131 + i * 7 + (index >> 8));
  return d;
}

uint32_t PerLeaf(uint32_t nodesize, uint32_t item) { return (nodesize - kLeafHeader) / (item + kItemHeader); }

// What the rule says a flush of these queued indexes does: each run of
// consecutive indexes splits into batches of per_leaf, the last one (the
// run's tail) possibly shorter.
struct Expected {
  uint64_t batches = 0, full = 0, items = 0;
  std::vector<uint64_t> sizes;  // every batch's item count, in order
};
Expected Rule(const std::set<uint64_t>& indexes, uint32_t per_leaf) {
  Expected e;
  auto flush_run = [&](uint64_t len) {
    while (len > 0) {
      const uint64_t n = std::min<uint64_t>(len, per_leaf);
      e.sizes.push_back(n);
      ++e.batches;
      len -= n;
    }
  };
  uint64_t run = 0, prev = 0;
  for (uint64_t i : indexes) {
    if (run > 0 && i != prev + 1) {
      flush_run(run);
      run = 0;
    }
    ++run;
    prev = i;
  }
  flush_run(run);
  e.items = indexes.size();
  // Counted as full (delayed_index.full_leaf_batches): a batch that ended
  // because the next queued item would not fit the leaf, i.e. every batch
  // that holds a whole leaf and is not the last of the flush.
  for (size_t i = 0; i + 1 < e.sizes.size(); ++i) e.full += e.sizes[i] == per_leaf;
  return e;
}

std::array<uint64_t, 16> Log2Buckets(const std::vector<uint64_t>& sizes) {
  std::array<uint64_t, 16> b{};
  for (uint64_t n : sizes) ++b[std::min<size_t>(std::bit_width(n) - 1, 15)];
  return b;
}

// Every queued item that was not cancelled is in the tree with its bytes,
// and nothing else is.
void ExpectTreeHolds(Tree& t, const std::set<uint64_t>& indexes, uint32_t size) {
  auto items = t.Items();
  ASSERT_EQ(items.size(), indexes.size());
  for (uint64_t i : indexes) {
    auto it = items.find(Key{kDir, format::kDirIndexKey, i});
    ASSERT_NE(it, items.end()) << "index " << i << " missing";
    ASSERT_EQ(it->second, ItemFor(i, size)) << "index " << i << " has other bytes";
  }
}

struct ProcessCounters {
  uint64_t batches, full, items, cancelled;
  static ProcessCounters Now() {
    StatsSnapshot s = CollectStats();
    return {s.Counter("delayed_index.batches"), s.Counter("delayed_index.full_leaf_batches"),
            s.Counter("delayed_index.items_inserted"), s.Counter("delayed_index.cancelled")};
  }
};

TEST(DelayedIndexBatchSize, RunsOfSuccessorsFillAnEmptyLeaf) {
  constexpr uint32_t kNode = 4096;
  constexpr uint32_t kSize = 37;  // 62 bytes with its header: 64 per 4 KiB leaf
  const uint32_t per_leaf = PerLeaf(kNode, kSize);
  ASSERT_EQ(per_leaf, 64u);  // sanity of the arithmetic: full batches and tails in different log2 buckets
  Tree t(kNode);
  DelayedDirIndex d(kNode);
  // Runs: 2..201 (200 items: 3 full leaves and a tail of 8), 300..427
  // (exactly two leaves), 1000 alone, 2000..2064 (a leaf and one).
  std::set<uint64_t> indexes;
  for (uint64_t i = 2; i < 202; ++i) indexes.insert(i);
  for (uint64_t i = 300; i < 428; ++i) indexes.insert(i);
  indexes.insert(1000);
  for (uint64_t i = 2000; i <= 2064; ++i) indexes.insert(i);
  // Queued out of order: the queue sorts them, the runs are by index.
  for (auto it = indexes.rbegin(); it != indexes.rend(); ++it) d.Add(kRoot, kDir, *it, ItemFor(*it, kSize));
  ASSERT_EQ(d.pending_count(), indexes.size());
  const ProcessCounters before = ProcessCounters::Now();
  ASSERT_TRUE(d.Flush(t.Fn()).ok());
  const ProcessCounters after = ProcessCounters::Now();

  const Expected want = Rule(indexes, per_leaf);
  const DelayedIndexStats s = d.stats();
  EXPECT_EQ(s.batches, want.batches);
  EXPECT_EQ(s.full_batches, want.full);
  EXPECT_EQ(s.items, want.items);
  EXPECT_EQ(s.batch_size_log2, Log2Buckets(want.sizes));
  // Every batch that is not a run's tail holds exactly what an empty leaf
  // holds: 64 items, the only batches in bucket [64, 128).
  EXPECT_EQ(s.batch_size_log2[6], 6u) << "3 + 2 + 1 full leaves, nothing else holds 64 or more";
  EXPECT_EQ(want.full, 6u) << "the rule's own arithmetic";
  EXPECT_EQ(after.batches - before.batches, want.batches);
  EXPECT_EQ(after.full - before.full, want.full);
  EXPECT_EQ(after.items - before.items, want.items);
  EXPECT_EQ(d.pending_count(), 0u);
  EXPECT_EQ(d.Pending(kRoot, kDir), nullptr);
  ExpectTreeHolds(t, indexes, kSize);
}

TEST(DelayedIndexBatchSize, NoBatchExceedsOrFallsShortOfALeaf) {
  // Item sizes that leave different remainders in a 16 KiB leaf: the batch
  // is what fits the empty leaf exactly, never one more, never one less.
  constexpr uint32_t kNode = 16384;
  for (uint32_t size : {30u, 37u, 100u, 255u + 30u}) {
    SCOPED_TRACE("item size " + std::to_string(size));
    const uint32_t per_leaf = PerLeaf(kNode, size);
    Tree t(kNode);
    DelayedDirIndex d(kNode);
    std::set<uint64_t> indexes;
    for (uint64_t i = 2; i < 2 + 3 * per_leaf + 1; ++i) indexes.insert(i);
    for (uint64_t i : indexes) d.Add(kRoot, kDir, i, ItemFor(i, size));
    StatsSnapshot s0 = CollectStats();
    const HistogramSnapshot* h0 = s0.FindHistogram("delayed_index.batch_items");
    const uint64_t count0 = h0 ? h0->count : 0, sum0 = h0 ? h0->sum : 0;
    ASSERT_TRUE(d.Flush(t.Fn()).ok());
    StatsSnapshot s1 = CollectStats();
    const HistogramSnapshot* h1 = s1.FindHistogram("delayed_index.batch_items");
    ASSERT_NE(h1, nullptr);
    EXPECT_EQ(h1->count - count0, 4u);  // three full leaves and a tail of one
    EXPECT_EQ(h1->sum - sum0, indexes.size());
    EXPECT_EQ(d.stats().batches, 4u);
    EXPECT_EQ(d.stats().full_batches, 3u);
    // per_leaf + 1 items do not fit one empty leaf; per_leaf do.
    EXPECT_GT(uint64_t(per_leaf + 1) * (size + kItemHeader), kNode - kLeafHeader);
    EXPECT_LE(uint64_t(per_leaf) * (size + kItemHeader), kNode - kLeafHeader);
    ExpectTreeHolds(t, indexes, size);
  }
}

TEST(DelayedIndexCancel, CancelledItemsNeverReachTheTree) {
  constexpr uint32_t kNode = 4096;
  constexpr uint32_t kSize = 37;
  const uint32_t per_leaf = PerLeaf(kNode, kSize);
  Tree t(kNode);
  DelayedDirIndex d(kNode);
  std::set<uint64_t> indexes;
  for (uint64_t i = 2; i < 2 + 5 * per_leaf; ++i) {
    d.Add(kRoot, kDir, i, ItemFor(i, kSize));
    indexes.insert(i);
  }
  // Cancel the first, the last, a block in the middle and every 17th: each
  // leaves a gap, so the runs around it are batched apart.
  std::set<uint64_t> cancel = {2, 1 + 5 * per_leaf};
  for (uint64_t i = 100; i < 110; ++i) cancel.insert(i);
  for (uint64_t i = 5; i < 2 + 5 * per_leaf; i += 17) cancel.insert(i);
  const ProcessCounters before = ProcessCounters::Now();
  for (uint64_t i : cancel) {
    EXPECT_TRUE(d.Cancel(kRoot, kDir, i)) << i;
    indexes.erase(i);
  }
  EXPECT_FALSE(d.Cancel(kRoot, kDir, 100)) << "cancelled twice";
  EXPECT_FALSE(d.Cancel(kRoot, kDir, 1)) << "never queued";
  EXPECT_FALSE(d.Cancel(kRoot, kDir + 1, 3)) << "another directory";
  EXPECT_EQ(d.pending_count(), indexes.size());
  ASSERT_TRUE(d.Flush(t.Fn()).ok());
  const ProcessCounters after = ProcessCounters::Now();

  const Expected want = Rule(indexes, per_leaf);
  EXPECT_EQ(d.stats().cancelled, cancel.size());
  EXPECT_EQ(after.cancelled - before.cancelled, cancel.size());
  EXPECT_EQ(d.stats().items, indexes.size());
  EXPECT_EQ(d.stats().batches, want.batches);
  EXPECT_EQ(d.stats().full_batches, want.full);
  auto items = t.Items();
  for (uint64_t i : cancel) EXPECT_EQ(items.count(Key{kDir, format::kDirIndexKey, i}), 0u) << "cancelled " << i;
  ExpectTreeHolds(t, indexes, kSize);
  // Everything cancelled: the flush does not touch the tree at all.
  DelayedDirIndex d2(kNode);
  Tree t2(kNode);
  for (uint64_t i = 2; i < 10; ++i) d2.Add(kRoot, kDir, i, ItemFor(i, kSize));
  for (uint64_t i = 2; i < 10; ++i) EXPECT_TRUE(d2.Cancel(kRoot, kDir, i));
  ASSERT_TRUE(d2.Flush(t2.Fn()).ok());
  EXPECT_EQ(t2.writer_calls, 0);
  EXPECT_EQ(d2.stats().batches, 0u);
  EXPECT_TRUE(t2.Items().empty());
}

TEST(DelayedIndexRelease, PathReleasedBeforeQueuedItemsAreFreed) {
  // In concurrent mode every block the flush searched through carries node
  // locks. After the flush no lock may be left (the batches' paths were let
  // go of), and each item's bytes must be the queued ones (copied into the
  // leaf before the queue let go of them), while other directories' queues
  // are untouched.
  constexpr uint32_t kNode = 4096;
  constexpr uint32_t kSize = 37;
  const uint32_t per_leaf = PerLeaf(kNode, kSize);
  Tree t(kNode);
  t.dirty().set_concurrent(true);
  DelayedDirIndex d(kNode);
  std::set<uint64_t> indexes;
  for (uint64_t i = 2; i < 2 + 7 * per_leaf + 5; ++i) {
    d.Add(kRoot, kDir, i, ItemFor(i, kSize));
    indexes.insert(i);
  }
  d.Add(kRoot, kDir + 1, 2, ItemFor(99, kSize));  // another directory, not flushed
  ASSERT_TRUE(d.FlushDir(kRoot, kDir, t.Fn()).ok());
  for (auto& [bytenr, b] : t.dirty().All()) {
    EXPECT_EQ(b->lock.readers(), 0u) << "block " << bytenr;
    EXPECT_FALSE(b->lock.intent_held()) << "block " << bytenr;
    EXPECT_FALSE(b->lock.write_held()) << "block " << bytenr;
    // A lock left held would make this wait forever; a try must succeed.
    ASSERT_TRUE(b->lock.TryLockIntent()) << "block " << bytenr;
    b->lock.UnlockIntent();
  }
  // Another writer can take the whole path now (a held intent on the root
  // pointer or a block would block this insert).
  ASSERT_TRUE(t.writer().Insert(Key{kDir, format::kDirIndexKey, 1}, ItemFor(1, kSize)).ok());
  indexes.insert(1);
  t.dirty().set_concurrent(false);
  ExpectTreeHolds(t, indexes, kSize);
  EXPECT_EQ(d.Pending(kRoot, kDir), nullptr);
  const DelayedDirIndex::Queue* other = d.Pending(kRoot, kDir + 1);
  ASSERT_NE(other, nullptr);
  ASSERT_EQ(other->size(), 1u);
  EXPECT_EQ(other->front().second, ItemFor(99, kSize));
}

TEST(DelayedIndexBatchSize, EarlyFlushWritesFullLeavesOnlyAndKeepsTheTail) {
  constexpr uint32_t kNode = 4096;
  constexpr uint32_t kSize = 37;
  const uint32_t per_leaf = PerLeaf(kNode, kSize);
  Tree t(kNode);
  DelayedDirIndex d(kNode);
  std::set<uint64_t> all;
  for (uint64_t i = 2; i < 2 + 2 * per_leaf + 22; ++i) {
    d.Add(kRoot, kDir, i, ItemFor(i, kSize));
    all.insert(i);
  }
  ASSERT_TRUE(d.FlushDir(kRoot, kDir, t.Fn(), /*full_batches_only=*/true).ok());
  EXPECT_EQ(d.stats().batches, 2u);
  EXPECT_EQ(d.stats().full_batches, 2u);
  std::set<uint64_t> in_tree(all.begin(), std::next(all.begin(), 2 * per_leaf));
  ExpectTreeHolds(t, in_tree, kSize);
  // The 22-item tail stays queued, bytes intact, until a later flush.
  const DelayedDirIndex::Queue* q = d.Pending(kRoot, kDir);
  ASSERT_NE(q, nullptr);
  ASSERT_EQ(q->size(), 22u);
  for (const auto& [index, item] : *q) {
    EXPECT_EQ(in_tree.count(index), 0u);
    EXPECT_EQ(item, ItemFor(index, kSize)) << index;
  }
  EXPECT_EQ(d.pending_count(), 22u);
  ASSERT_TRUE(d.Flush(t.Fn()).ok());
  EXPECT_EQ(d.stats().batches, 3u);
  EXPECT_EQ(d.pending_count(), 0u);
  ExpectTreeHolds(t, all, kSize);
}

TEST(DelayedIndexBatchSize, HundredThousandEntriesInFullLeaves) {
  // A directory of 100,000 creates ("f000000" ... : a DIR_INDEX item of 30
  // bytes plus the 7-byte name) in 16 KiB nodes, flushed at once.
  constexpr uint32_t kNode = 16384;
  constexpr uint32_t kSize = 30 + 7;
  constexpr uint64_t kEntries = 100000;
  const uint32_t per_leaf = PerLeaf(kNode, kSize);
  Tree t(kNode);
  DelayedDirIndex d(kNode);
  for (uint64_t i = 2; i < 2 + kEntries; ++i) d.Add(kRoot, kDir, i, ItemFor(i, kSize));
  const ProcessCounters before = ProcessCounters::Now();
  ASSERT_TRUE(d.Flush(t.Fn()).ok());
  const ProcessCounters after = ProcessCounters::Now();
  const uint64_t batches = after.batches - before.batches;
  const uint64_t full = after.full - before.full;
  EXPECT_EQ(after.items - before.items, kEntries);
  EXPECT_EQ(batches, (kEntries + per_leaf - 1) / per_leaf);
  EXPECT_EQ(full, batches - 1) << "every batch but the tail fills a leaf";
  EXPECT_GT(double(full) / double(batches), 0.99);
  EXPECT_EQ(d.stats().batches, batches);
  EXPECT_EQ(d.stats().full_batches, full);
  // Leaf fill: the batches landed as whole leaves.
  uint64_t leaves = 0, items = 0;
  for (auto& [bytenr, b] : t.dirty().All()) {
    if (!b->is_leaf()) continue;
    ++leaves;
    items += b->nritems();
    if (b->nritems() < static_cast<int>(per_leaf)) {
      EXPECT_EQ(b->key(0).offset, 2 + (kEntries / per_leaf) * per_leaf) << "only the tail leaf is short";
    }
  }
  EXPECT_EQ(items, kEntries);
  EXPECT_EQ(leaves, batches);
  auto got = t.Items();
  ASSERT_EQ(got.size(), kEntries);
  EXPECT_EQ(got.begin()->first.offset, 2u);
  EXPECT_EQ(got.rbegin()->first.offset, 1 + kEntries);
}

}  // namespace
}  // namespace ubtrfs::inode
