// The tree writer against a std::map model: random inserts, batched inserts,
// updates that grow and shrink items, deletes of single items and ranges,
// across commits, with every block re-verified by the read side's checker
// and the committed tree proven untouched while a transaction runs.
#include "tree/writer.h"
#include "stats/stats.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <optional>
#include <map>
#include <mutex>
#include <thread>
#include <random>
#include <set>

#include "format/checksum.h"

namespace ubtrfs::tree {
namespace UBTRFS_UNITY_ID {

using namespace ubtrfs::format;

constexpr uint64_t kOwner = kFsTreeObjectid;

// Committed blocks, by address.
class CleanStore final : public BlockSource {
 public:
  Result<BlockRef> Read(const BlockCheck& check) override {
    auto it = blocks_.find(check.bytenr);
    if (it == blocks_.end()) return Status::Corrupt("no block " + std::to_string(check.bytenr));
    return it->second;
  }
  std::map<uint64_t, BlockRef> blocks_;
};

// Hands out addresses; freed ones become reusable only after commit, and
// freeing something not allocated is an error.
class TestAllocator final : public BlockAllocator {
 public:
  explicit TestAllocator(uint32_t nodesize) : nodesize_(nodesize) {}
  Result<uint64_t> AllocTreeBlock(uint64_t, int) override {
    std::lock_guard lock(mu_);
    uint64_t b;
    if (!free_.empty()) {
      b = *free_.begin();
      free_.erase(free_.begin());
    } else {
      b = next_;
      next_ += nodesize_;
    }
    used_.insert(b);
    return b;
  }
  Status FreeTreeBlock(uint64_t bytenr, uint64_t, int, bool created_here) override {
    std::lock_guard lock(mu_);
    if (!used_.erase(bytenr)) return Status::Error(EIO, "double free of " + std::to_string(bytenr));
    // A block created in this transaction was never committed: reusable now.
    if (created_here) free_.insert(bytenr); else pinned_.insert(bytenr);
    return Status::Ok();
  }
  void Commit() {
    free_.insert(pinned_.begin(), pinned_.end());
    pinned_.clear();
  }
  std::set<uint64_t> used_, free_, pinned_;

 private:
  std::mutex mu_;  // concurrent writers allocate at once
  uint32_t nodesize_;
  uint64_t next_ = 1 << 20;
};

class WriterHarness {
 public:
  explicit WriterHarness(uint32_t nodesize) : alloc_(nodesize) {
    params_.nodesize = nodesize;
    params_.csum_type = 0;
    std::memset(params_.fsid, 0x5a, kFsidSize);
    std::memcpy(tmpl_.fsid, params_.fsid, kFsidSize);
    dirty_ = std::make_unique<DirtyBlocks>(&clean_, params_, tmpl_, &alloc_, 10);
    auto leaf = dirty_->New(kOwner, 0);
    EXPECT_TRUE(leaf.ok());
    root_ = RootPtr{(*leaf)->bytenr(), 0, 10, kOwner};
    writer_ = std::make_unique<TreeWriter>(dirty_.get(), &root_, kOwner);
  }

  // Seals every dirty block as commit would, moves it to the clean store.
  void Commit() {
    for (auto& [bytenr, b] : dirty_->All()) {
      CsumBytes c = ComputeCsum(0, b->bytes().subspan(kCsumSize));
      std::memcpy(b->mutable_bytes(), c.data(), kCsumSize);
      clean_.blocks_[bytenr] = b;
    }
    for (uint64_t f : alloc_.pinned_) clean_.blocks_.erase(f);
    alloc_.Commit();
    dirty_->Reset(dirty_->transid() + 1);
    snapshot_.clear();
    for (auto& [bytenr, b] : clean_.blocks_) snapshot_[bytenr] = std::vector<uint8_t>(b->bytes().begin(), b->bytes().end());
  }

  // Every committed block is byte-for-byte what the last commit wrote.
  void ExpectCommittedUntouched() {
    for (auto& [bytenr, bytes] : snapshot_) {
      auto it = clean_.blocks_.find(bytenr);
      ASSERT_NE(it, clean_.blocks_.end());
      ASSERT_TRUE(std::equal(bytes.begin(), bytes.end(), it->second->bytes().begin())) << "block " << bytenr;
    }
  }

  // Walks the whole tree, verifying each block as the read side would, and
  // returns its items in order.
  std::map<Key, std::vector<uint8_t>> Walk() {
    std::map<Key, std::vector<uint8_t>> out;
    std::set<uint64_t> seen;
    WalkBlock(BlockCheck{root_.bytenr, root_.level, root_.generation, {}}, true, &out, &seen);
    // Every reachable block is allocated and no allocated block is lost.
    EXPECT_EQ(seen, alloc_.used_);
    return out;
  }

  void WalkBlock(const BlockCheck& check, bool is_root, std::map<Key, std::vector<uint8_t>>* out,
                 std::set<uint64_t>* seen) {
    auto ref = dirty_->Read(check);
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    const TreeBlock& b = **ref;
    seen->insert(b.bytenr());
    std::vector<uint8_t> copy(b.bytes().begin(), b.bytes().end());
    CsumBytes c = ComputeCsum(0, std::span<const uint8_t>(copy).subspan(kCsumSize));
    std::memcpy(copy.data(), c.data(), kCsumSize);
    Status st = VerifyTreeBlock(copy, params_, check);
    ASSERT_TRUE(st.ok()) << st.message();
    if (!is_root && b.is_leaf()) {
      ASSERT_GT(b.nritems(), 0);
    }
    if (b.is_leaf()) {
      for (int i = 0; i < b.nritems(); ++i) {
        auto d = b.item_data(i);
        (*out)[b.key(i)] = std::vector<uint8_t>(d.begin(), d.end());
      }
      return;
    }
    if (!is_root) {
      ASSERT_GT(b.nritems(), 0);
    }
    for (int i = 0; i < b.nritems(); ++i) {
      WalkBlock(BlockCheck{b.child_bytenr(i), b.level() - 1, b.child_generation(i), b.key(i)}, false, out, seen);
    }
  }

  TreeWriter& writer() { return *writer_; }
  RootPtr root_;
  DirtyBlocks& dirty() { return *dirty_; }

 private:
  TreeParams params_;
  HeaderTemplate tmpl_;
  CleanStore clean_;
  TestAllocator alloc_;
  std::unique_ptr<DirtyBlocks> dirty_;
  std::unique_ptr<TreeWriter> writer_;
  std::map<uint64_t, std::vector<uint8_t>> snapshot_;
};

// The first difference between two item maps, or "" when equal.
std::string Diff(const std::map<Key, std::vector<uint8_t>>& got, const std::map<Key, std::vector<uint8_t>>& want) {
  for (auto g = got.begin(), w = want.begin();; ++g, ++w) {
    if (g == got.end() && w == want.end()) return "";
    if (g == got.end()) return "missing " + KeyToString(w->first);
    if (w == want.end()) return "extra " + KeyToString(g->first);
    if (g->first != w->first) return "key " + KeyToString(g->first) + " where " + KeyToString(w->first) + " belongs";
    if (g->second != w->second) return "data of " + KeyToString(g->first);
  }
}

std::vector<uint8_t> Payload(std::mt19937_64& rng, size_t max) {
  std::vector<uint8_t> d(rng() % (max + 1));
  for (auto& c : d) c = static_cast<uint8_t>(rng());
  return d;
}

void RunRandom(uint32_t nodesize, int steps, uint64_t seed, size_t max_item) {
  WriterHarness h(nodesize);
  std::map<Key, std::vector<uint8_t>> model;
  std::mt19937_64 rng(seed);
  auto random_key = [&] { return Key{256 + rng() % 400, static_cast<uint8_t>(1 + rng() % 3), rng() % 50}; };
  for (int step = 0; step < steps; ++step) {
    const int op = static_cast<int>(rng() % 100);
    if (op < 40) {
      Key k = random_key();
      auto d = Payload(rng, max_item);
      Status st = h.writer().Insert(k, d);
      if (model.count(k)) {  // NOLINT
        ASSERT_EQ(st.code(), EEXIST);
      } else {
        ASSERT_TRUE(st.ok()) << st.message();
        model[k] = d;
      }
    } else if (op < 46) {
      // Ascending keys scattered over the tree, as queued DIR_ITEMs are (by
      // hash); now and then one of them exists, which stops the batch there.
      std::set<Key> pick;
      const int n = 1 + static_cast<int>(rng() % 60);
      for (int i = 0; i < n; ++i) {
        Key k = random_key();
        if (!model.count(k)) pick.insert(k);
      }
      std::optional<Key> clash;
      if (!model.empty() && rng() % 6 == 0) {
        auto it = model.begin();
        std::advance(it, rng() % model.size());
        clash = it->first;
        pick.insert(it->first);
      }
      std::vector<Key> keys(pick.begin(), pick.end());
      std::vector<std::vector<uint8_t>> data;
      std::vector<std::span<const uint8_t>> spans;
      for (size_t i = 0; i < keys.size(); ++i) data.push_back(Payload(rng, max_item));
      for (const auto& d : data) spans.emplace_back(d);
      Status st = h.writer().InsertSorted(keys, spans);
      size_t inserted = keys.size();
      if (clash) {
        ASSERT_EQ(st.code(), EEXIST) << st.ToString();
        inserted = static_cast<size_t>(std::find(keys.begin(), keys.end(), *clash) - keys.begin());
      } else {
        ASSERT_TRUE(st.ok()) << st.ToString();
      }
      for (size_t i = 0; i < inserted; ++i) model[keys[i]] = data[i];
    } else if (op < 50) {
      // A batch of consecutive offsets, as delayed dir-index items are.
      Key k = random_key();
      std::vector<Key> keys;
      std::vector<std::vector<uint8_t>> data;
      const int n = 1 + static_cast<int>(rng() % 40);
      for (int i = 0; i < n; ++i) {
        Key ki{k.objectid, k.type, k.offset * 1000 + 1000000 + static_cast<uint64_t>(i)};
        if (model.count(ki)) break;
        keys.push_back(ki);
        data.push_back(Payload(rng, std::min<size_t>(max_item, 120)));
      }
      Status st = h.writer().InsertBatch(keys, data);
      ASSERT_TRUE(st.ok()) << st.message();
      for (size_t i = 0; i < keys.size(); ++i) model[keys[i]] = data[i];
    } else if (op < 65 && !model.empty()) {
      auto it = model.begin();
      std::advance(it, rng() % model.size());
      auto d = Payload(rng, max_item);
      Status st = h.writer().Update(it->first, d);
      ASSERT_TRUE(st.ok()) << st.message();
      it->second = d;
    } else if (op < 90 && !model.empty()) {
      auto it = model.begin();
      std::advance(it, rng() % model.size());
      Status st = h.writer().Delete(it->first);
      ASSERT_TRUE(st.ok()) << st.message();
      model.erase(it);
    } else if (op < 93 && !model.empty()) {
      // Delete a run of items from one leaf.
      auto it = model.begin();
      std::advance(it, rng() % model.size());
      WritePath path;
      auto found = h.writer().SearchForWrite(it->first, 0, &path);
      ASSERT_TRUE(found.ok() && *found);
      int nr = 1 + static_cast<int>(rng() % 8);
      nr = std::min(nr, path.leaf().nritems() - path.slot());
      for (int i = 0; i < nr; ++i) model.erase(path.leaf().key(path.slot() + i));
      ASSERT_TRUE(h.writer().DeleteItems(&path, path.slot(), nr).ok());
    } else if (op < 96) {
      Key k = random_key();
      ASSERT_EQ(h.writer().Delete(k).code(), model.count(k) ? 0 : ENOENT);
      model.erase(k);
    } else {
      h.ExpectCommittedUntouched();
      h.Commit();
    }
    if (step % 500 == 0 || step == steps - 1) {
      ASSERT_EQ(Diff(h.Walk(), model), "") << "step " << step;
    }
  }
  h.ExpectCommittedUntouched();
  h.Commit();
  ASSERT_EQ(Diff(h.Walk(), model), "");
  // Emptying the tree shrinks it back to one leaf.
  for (auto& [k, v] : model) ASSERT_TRUE(h.writer().Delete(k).ok());
  EXPECT_TRUE(h.Walk().empty());
  EXPECT_EQ(h.root_.level, 0);
}

// Peek (the lock-free lookup) agrees with Get through table growth, drops
// and address reuse: a dropped block is either not found or marked dropped,
// and after Reset nothing is found.
TEST(DirtyBlocksPeek, AgreesWithGetThroughGrowthDropsAndReuse) {
  WriterHarness h(4096);
  DirtyBlocks& d = h.dirty();
  std::vector<std::shared_ptr<TreeBlock>> live;
  for (int i = 0; i < 3000; ++i) {
    auto b = d.New(kOwner, 0);
    ASSERT_TRUE(b.ok());
    live.push_back(*b);
  }
  for (const auto& b : live) ASSERT_EQ(d.Peek(b->bytenr()), b.get());
  EXPECT_EQ(d.Peek(live.back()->bytenr() + 4096 * 100), nullptr);
  // Drop every third block; reuse brings its address back with a new block.
  std::vector<std::shared_ptr<TreeBlock>> dropped;
  for (size_t i = 0; i < live.size(); i += 3) {
    ASSERT_TRUE(d.Free(*live[i], kOwner).ok());
    TreeBlock* p = d.Peek(live[i]->bytenr());
    EXPECT_TRUE(p == nullptr || p->dropped.load()) << live[i]->bytenr();
    EXPECT_TRUE(live[i]->dropped.load());
    dropped.push_back(live[i]);
  }
  for (size_t i = 0; i < dropped.size(); ++i) {
    auto b = d.New(kOwner, 0);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(d.Peek((*b)->bytenr()), b->get());
    EXPECT_EQ(d.Get((*b)->bytenr()).get(), b->get());
    EXPECT_FALSE((*b)->dropped.load());
  }
  for (size_t i = 0; i < live.size(); ++i) {
    if (i % 3 != 0) {
      EXPECT_EQ(d.Peek(live[i]->bytenr()), d.Get(live[i]->bytenr()).get());
    }
  }
  d.Reset(d.transid() + 1);
  for (const auto& b : live) EXPECT_EQ(d.Peek(b->bytenr()), nullptr);
}

TEST(TreeWriter, RandomOpsMatchModel4K) { RunRandom(4096, 6000, 1, 300); }
TEST(TreeWriter, RandomOpsMatchModel16K) { RunRandom(16384, 6000, 2, 2000); }
TEST(TreeWriter, RandomOpsMatchModelBigItems) { RunRandom(4096, 3000, 3, 3900); }

// Longer runs over many seeds: UBTRFS_SOAK_SEEDS=N (./test --soak sets it).
TEST(TreeWriter, SoakManySeeds) {
  const char* env = std::getenv("UBTRFS_SOAK_SEEDS");
  const int seeds = env ? std::atoi(env) : 0;
  if (seeds == 0) GTEST_SKIP() << "set UBTRFS_SOAK_SEEDS=N for the long run";
  for (int s = 0; s < seeds; ++s) {
    RunRandom(s % 2 ? 4096 : 16384, 20000, 1000 + s, s % 3 == 0 ? 3900 : 500);
    if (HasFatalFailure()) FAIL() << "seed " << 1000 + s;
  }
}

TEST(TreeWriter, SequentialBatchesFillLeaves) {
  WriterHarness h(16384);
  // 100,000 dir-index-like items in batches that each fill a leaf.
  const uint32_t item = 40;
  const int per_leaf = static_cast<int>((16384 - sizeof(Header)) / (item + sizeof(Item)));
  uint64_t next = 2;
  while (next < 100002) {
    std::vector<Key> keys;
    std::vector<std::vector<uint8_t>> data;
    for (int i = 0; i < per_leaf && next < 100002; ++i, ++next) {
      keys.push_back(Key{256, kDirIndexKey, next});
      data.push_back(std::vector<uint8_t>(item, static_cast<uint8_t>(next)));
    }
    ASSERT_TRUE(h.writer().InsertBatch(keys, data).ok());
  }
  auto all = h.Walk();
  EXPECT_EQ(all.size(), 100000u);
  EXPECT_EQ(h.writer().stats().batch_inserts, (100000u + per_leaf - 1) / per_leaf);
  EXPECT_GE(h.root_.level, 1);
}

TEST(TreeWriter, RejectsOversizedItems) {
  WriterHarness h(4096);
  std::vector<uint8_t> big(h.writer().MaxItemSize() + 1);
  EXPECT_EQ(h.writer().Insert(Key{1, 1, 1}, big).code(), EINVAL);
  big.pop_back();
  EXPECT_TRUE(h.writer().Insert(Key{1, 1, 1}, big).ok());
  EXPECT_TRUE(h.writer().Insert(Key{1, 1, 2}, big).ok());  // needs a split into a fresh leaf
  EXPECT_EQ(h.Walk().size(), 2u);
}

// Sorted updates against a model: items of the same size are rewritten in
// place leaf by leaf, others grow or shrink, across leaves of a deep tree;
// a missing key fails with ENOENT after the keys before it.
TEST(TreeWriter, UpdateSortedMatchesModel) {
  WriterHarness h(4096);
  std::map<Key, std::vector<uint8_t>> model;
  std::mt19937_64 rng(33);
  for (uint64_t i = 0; i < 3000; ++i) {
    const Key k{256 + i / 3, static_cast<uint8_t>(1 + i % 3), 0};
    auto d = Payload(rng, 120);
    ASSERT_TRUE(h.writer().Insert(k, d).ok());
    model[k] = d;
  }
  h.Commit();
  for (int round = 0; round < 4; ++round) {
    std::vector<Key> keys;
    std::vector<std::vector<uint8_t>> data;
    for (const auto& [k, d] : model) {
      if (rng() % 3 != 0) continue;
      keys.push_back(k);
      std::vector<uint8_t> nd = rng() % 8 == 0 ? Payload(rng, 200) : std::vector<uint8_t>(d.size());
      if (nd.size() == d.size()) {
        for (auto& c : nd) c = static_cast<uint8_t>(rng());
      }
      data.push_back(nd);
    }
    std::vector<std::span<const uint8_t>> spans(data.begin(), data.end());
    Status st = h.writer().UpdateSorted(keys, spans);
    ASSERT_TRUE(st.ok()) << st.message();
    for (size_t i = 0; i < keys.size(); ++i) model[keys[i]] = data[i];
    ASSERT_EQ(Diff(h.Walk(), model), "") << "round " << round;
    h.ExpectCommittedUntouched();
    h.Commit();
  }
  // A key that is not there: the one before it is updated, then ENOENT.
  const Key there{256, 1, 0}, absent{256, 1, 5};
  std::vector<uint8_t> nd(model[there].size(), 0xab);
  std::vector<Key> keys{there, absent};
  std::vector<std::span<const uint8_t>> spans{nd, nd};
  EXPECT_EQ(h.writer().UpdateSorted(keys, spans).code(), ENOENT);
  model[there] = nd;
  EXPECT_EQ(Diff(h.Walk(), model), "");
}

// Runs of fixed-size entries (checksum items): a run that starts where the
// item before it in the leaf ends is appended to it, up to the size limit;
// a gap, another type or a full item starts a new item.
TEST(TreeWriter, RunItemsAppendWhereTheyAdjoin) {
  WriterHarness h(4096);
  constexpr uint64_t kStride = 4096;
  constexpr uint32_t kEntry = 4, kMax = 64;
  auto run = [](uint64_t offset, int n) {
    std::vector<uint8_t> d;
    for (int i = 0; i < n; ++i) {
      const uint32_t v = static_cast<uint32_t>(offset / kStride) + static_cast<uint32_t>(i);
      d.insert(d.end(), reinterpret_cast<const uint8_t*>(&v), reinterpret_cast<const uint8_t*>(&v) + 4);
    }
    return d;
  };
  auto put = [&](uint64_t offset, int n, uint8_t type = 128) {
    auto r = h.writer().InsertOrAppendRun(Key{7, type, offset}, run(offset, n), kEntry, kStride, kMax);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() && *r;
  };
  EXPECT_FALSE(put(0, 2));           // [0, 2 entries)
  EXPECT_TRUE(put(2 * kStride, 3));  // adjoins: one item of 5
  EXPECT_FALSE(put(6 * kStride, 1)); // a gap of one entry
  EXPECT_TRUE(put(7 * kStride, 9));  // 10 entries = 40 bytes
  EXPECT_FALSE(put(17 * kStride, 7)); // 40 + 28 > 64: a new item
  EXPECT_FALSE(put(24 * kStride, 1, 129));  // adjoins in offset, another type
  EXPECT_FALSE(put(30 * kStride, 1));       // the item before it is of type 129
  auto got = h.writer().InsertOrAppendRun(Key{7, 128, 0}, run(0, 1), kEntry, kStride, kMax);
  EXPECT_EQ(got.status().code(), EEXIST);
  std::map<Key, std::vector<uint8_t>> want;
  want[Key{7, 128, 0}] = run(0, 5);
  want[Key{7, 128, 6 * kStride}] = run(6 * kStride, 10);
  want[Key{7, 128, 17 * kStride}] = run(17 * kStride, 7);
  want[Key{7, 129, 24 * kStride}] = run(24 * kStride, 1);
  want[Key{7, 128, 30 * kStride}] = run(30 * kStride, 1);
  EXPECT_EQ(Diff(h.Walk(), want), "");
}

// Threads put runs of one shared, growing range in whatever order they get
// to it (as writers of checksums for extents allocated back to back do):
// every entry ends up in exactly one item, at the place its offset says,
// and runs written after their neighbour share items.
TEST(ConcurrentTreeWriter, RunItemsAppendedByManyThreads) {
  WriterHarness h(4096);
  h.dirty().set_concurrent(true);
  constexpr uint64_t kStride = 4096;
  constexpr uint32_t kMax = 400;
  std::atomic<uint64_t> next{0};
  std::atomic<int> appends{0};
  std::vector<std::string> failures(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < 3000 && failures[t].empty(); ++i) {
        const uint64_t n = 1 + rng() % 3;
        const uint64_t first = next.fetch_add(n);
        std::vector<uint8_t> d;
        for (uint64_t e = first; e < first + n; ++e) {
          const uint32_t v = static_cast<uint32_t>(e * 2654435761u);
          d.insert(d.end(), reinterpret_cast<const uint8_t*>(&v), reinterpret_cast<const uint8_t*>(&v) + 4);
        }
        auto r = h.writer().InsertOrAppendRun(Key{7, 128, first * kStride}, d, 4, kStride, kMax);
        if (!r.ok()) failures[t] = r.status().ToString();
        else if (*r) appends.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& f : failures) ASSERT_EQ(f, "");
  h.dirty().set_concurrent(false);
  uint64_t expect = 0;
  size_t items = 0;
  for (const auto& [k, d] : h.Walk()) {
    ASSERT_EQ(k.offset, expect * kStride) << "items overlap or leave a gap";
    ASSERT_LE(d.size(), kMax);
    for (size_t i = 0; i < d.size() / 4; ++i, ++expect) {
      uint32_t v;
      std::memcpy(&v, d.data() + i * 4, 4);
      ASSERT_EQ(v, static_cast<uint32_t>(expect * 2654435761u)) << "entry " << expect;
    }
    ++items;
  }
  EXPECT_EQ(expect, next.load());
  EXPECT_GT(appends.load(), 0);
  EXPECT_EQ(items + static_cast<size_t>(appends.load()), 12000u);
}

// Several writer threads change one tree at once (each its own keys, spread
// over the whole key space so that they share leaves and nodes) while reader
// threads scan it and look keys up; node locks keep every reader's view
// ordered and every writer's change whole. The tree ends equal to the union
// of the writers' models, with every block valid and none lost.
// prefill: items (of a key type the writers never touch) inserted and
// committed before the threads start, so that the writers' first change of
// each leaf copies it (TreeWriter::TryCopyLeaf) under parents already copied.
void RunConcurrent(uint32_t nodesize, int writers, int readers, int steps, uint64_t seed, int prefill = 0) {
  WriterHarness h(nodesize);
  std::map<Key, std::vector<uint8_t>> base;
  if (prefill > 0) {
    std::mt19937_64 rng(seed);
    for (int i = 0; i < prefill; ++i) {
      const Key k{256 + static_cast<uint64_t>(i) * 3000 / prefill, 3, static_cast<uint64_t>(i)};
      auto d = Payload(rng, 200);
      ASSERT_TRUE(h.writer().Insert(k, d).ok());
      base[k] = d;
    }
    h.Commit();
  }
  const uint64_t copies_before = stats::GetCounter("tree.search.copy_leaf").Get();
  h.dirty().set_concurrent(true);
  std::vector<std::map<Key, std::vector<uint8_t>>> models(writers);
  std::atomic<int> running{writers};
  std::atomic<uint64_t> scans{0}, lookups{0};
  std::vector<std::string> failures(writers + readers);
  std::vector<std::thread> threads;
  for (int t = 0; t < writers; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed * 100 + t);
      auto& model = models[t];
      auto key = [&] { return Key{256 + rng() % 3000, 1, static_cast<uint64_t>(t) << 32 | (rng() % 64)}; };
      for (int step = 0; step < steps && failures[t].empty(); ++step) {
        const int op = static_cast<int>(rng() % 100);
        Status st;
        if (op < 45) {
          Key k = key();
          auto d = Payload(rng, 300);
          st = h.writer().Insert(k, d);
          if (model.count(k)) {
            if (st.code() != EEXIST) failures[t] = "insert of an existing key: " + st.ToString();
            continue;
          }
          model[k] = d;
        } else if (op < 55) {
          Key k = key();
          std::vector<Key> keys;
          std::vector<std::vector<uint8_t>> data;
          for (uint64_t i = 0; i < 1 + rng() % 20; ++i) {
            Key ki{k.objectid, 2, (static_cast<uint64_t>(t) << 32) | (k.offset * 64 + i)};
            if (model.count(ki)) break;
            keys.push_back(ki);
            data.push_back(Payload(rng, 100));
          }
          if (keys.empty()) continue;
          st = h.writer().InsertBatch(keys, data);
          for (size_t i = 0; i < keys.size(); ++i) model[keys[i]] = data[i];
        } else if (op < 60) {
          // Scattered ascending keys in one call (InsertSorted).
          std::set<Key> pick;
          for (uint64_t i = 0; i < 1 + rng() % 30; ++i) {
            Key k = key();
            if (!model.count(k)) pick.insert(k);
          }
          std::vector<Key> keys(pick.begin(), pick.end());
          std::vector<std::vector<uint8_t>> data;
          std::vector<std::span<const uint8_t>> spans;
          for (size_t i = 0; i < keys.size(); ++i) data.push_back(Payload(rng, 200));
          for (const auto& d : data) spans.emplace_back(d);
          st = h.writer().InsertSorted(keys, spans);
          for (size_t i = 0; i < keys.size(); ++i) model[keys[i]] = data[i];
        } else if (op < 85 && !model.empty()) {
          auto it = model.lower_bound(key());
          if (it == model.end()) it = model.begin();
          st = h.writer().Delete(it->first);
          model.erase(it);
        } else if (!model.empty()) {
          auto it = model.lower_bound(key());
          if (it == model.end()) it = model.begin();
          it->second = Payload(rng, 400);
          st = h.writer().Update(it->first, it->second);
        }
        if (!st.ok()) failures[t] = "step " + std::to_string(step) + ": " + st.ToString();
      }
      running.fetch_sub(1);
    });
  }
  for (int r = 0; r < readers; ++r) {
    threads.emplace_back([&, r] {
      std::mt19937_64 rng(seed * 1000 + r);
      std::string& fail = failures[writers + r];
      while (running.load() > 0 && fail.empty()) {
        {
          Cursor c(&h.dirty(), h.writer().LiveRef());
          Status st = c.Seek(Key{256 + rng() % 3000, 0, 0});
          std::optional<Key> prev;
          for (int i = 0; st.ok() && c.Valid() && i < 500; ++i) {
            if (prev && !(*prev < c.key())) fail = "scan out of order at " + KeyToString(c.key()) + " after " + KeyToString(*prev) + " slot " + std::to_string(c.slot()) + "/" + std::to_string(c.leaf().nritems()) + " level " + std::to_string(c.leaf().level()) + " gen " + std::to_string(c.leaf().generation()) + " i " + std::to_string(i);
            prev = c.key();
            st = c.Next();
          }
          if (!st.ok()) fail = "scan: " + st.ToString();
          scans.fetch_add(1);
        }
        auto item = LookupItem(&h.dirty(), h.writer().LiveRef(), Key{256 + rng() % 3000, 1, rng() % 64});
        if (!item.ok()) fail = "lookup: " + item.status().ToString();
        lookups.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& f : failures) ASSERT_EQ(f, "");
  h.dirty().set_concurrent(false);
  std::map<Key, std::vector<uint8_t>> want = base;
  for (const auto& m : models) want.insert(m.begin(), m.end());
  ASSERT_EQ(Diff(h.Walk(), want), "") << "seed " << seed;
  EXPECT_GT(scans.load() + lookups.load(), 0u);
  EXPECT_EQ(h.writer().stats().leaf_splits.load() > 0, true);
  if (prefill > 0) {
    EXPECT_GT(stats::GetCounter("tree.search.copy_leaf").Get(), copies_before);
  }
}

TEST(ConcurrentTreeWriter, WritersAndReadersShareOneTree) {
  for (uint64_t seed = 1; seed <= 2; ++seed) RunConcurrent(4096, 4, 2, 2000, seed);
}

TEST(ConcurrentTreeWriter, ManyWritersSmallNodes) {
  // 4 KiB nodes with 8 writers: frequent splits, pushes and merges under contention.
  RunConcurrent(4096, 8, 1, 1500, 7);
}

TEST(ConcurrentTreeWriter, WritersCopyCommittedLeaves) {
  // A committed tree of 4 KiB nodes: the writers' first change of each leaf
  // copies it with only its parent in intent.
  for (uint64_t seed = 3; seed <= 4; ++seed) RunConcurrent(4096, 4, 2, 2000, seed, 3000);
}

}  // namespace
}  // namespace ubtrfs::tree
