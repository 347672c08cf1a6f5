#include "inode/radix_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

namespace ubtrfs::inode {
namespace UBTRFS_UNITY_ID {

using Tree = RadixTree<uint64_t>;
constexpr uint64_t kMax = ~uint64_t{0};

// Compares every observable of the tree with the model.
void ExpectSame(const Tree& t, const std::map<uint64_t, uint64_t>& m) {
  ASSERT_TRUE(t.CheckInvariants());
  ASSERT_EQ(t.size(), m.size());
  auto mi = m.begin();
  for (auto it = t.begin(); it != t.end(); ++it, ++mi) {
    ASSERT_NE(mi, m.end());
    ASSERT_EQ(it.key(), mi->first);
    ASSERT_EQ(it.value(), mi->second);
  }
  ASSERT_EQ(mi, m.end());
}

enum class Keys { kDense, kSparse, kHuge, kMixed };

uint64_t PickKey(Keys kind, std::mt19937_64& rng) {
  switch (kind) {
    case Keys::kDense:
      return 256 + rng() % 5000;
    case Keys::kSparse:
      return (rng() % 2000) * 7919 * 1021;  // spread over ~2^34, many leaves with one key
    case Keys::kHuge:
      switch (rng() % 4) {
        case 0: return kMax - rng() % 300;
        case 1: return rng() % 300;
        case 2: return (uint64_t{1} << (rng() % 64)) + rng() % 3 - 1;
        default: return rng();
      }
    case Keys::kMixed:
      break;
  }
  return PickKey(static_cast<Keys>(rng() % 3), rng);
}

void RandomOps(Keys kind, uint64_t seed, int ops) {
  std::mt19937_64 rng(seed);
  Tree t;
  std::map<uint64_t, uint64_t> m;
  for (int i = 0; i < ops; ++i) {
    uint64_t k = PickKey(kind, rng);
    switch (rng() % 10) {
      case 0:
      case 1:
      case 2: {  // Store (insert or replace)
        uint64_t v = rng();
        bool fresh = m.find(k) == m.end();
        ASSERT_EQ(t.Store(k, v), fresh) << k;
        m[k] = v;
        break;
      }
      case 3: {  // TryStoreReserved keeps an existing value
        uint64_t v = rng();
        auto [slot, added] = t.TryStoreReserved(Tree::Reserve(k), k, v);
        auto [mit, madded] = m.try_emplace(k, v);
        ASSERT_EQ(added, madded);
        ASSERT_EQ(*slot, mit->second);
        break;
      }
      case 4:
      case 5: {  // Erase
        ASSERT_EQ(t.Erase(k), m.erase(k) == 1) << k;
        break;
      }
      case 6:
      case 7: {  // Find
        const uint64_t* v = t.Find(k);
        auto mit = m.find(k);
        ASSERT_EQ(v != nullptr, mit != m.end()) << k;
        if (v != nullptr) {
          ASSERT_EQ(*v, mit->second);
        }
        break;
      }
      default: {  // FindFirstAtOrAfter
        auto got = t.FindFirstAtOrAfter(k);
        auto mit = m.lower_bound(k);
        ASSERT_EQ(got.has_value(), mit != m.end()) << k;
        if (got) {
          ASSERT_EQ(got->first, mit->first);
          ASSERT_EQ(got->second, mit->second);
        }
        auto lb = t.lower_bound(k);
        ASSERT_EQ(lb == t.end(), mit == m.end());
        if (mit != m.end()) {
          ASSERT_EQ(lb.key(), mit->first);
        }
        break;
      }
    }
    if (i % 4999 == 0) ExpectSame(t, m);
  }
  ExpectSame(t, m);
  // Empty it in random order; every node must go.
  std::vector<uint64_t> keys;
  for (auto& [k, v] : m) keys.push_back(k);
  std::shuffle(keys.begin(), keys.end(), rng);
  for (uint64_t k : keys) ASSERT_TRUE(t.Erase(k));
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.node_count(), 0u);
  EXPECT_EQ(t.memory_bytes(), 0u);
  EXPECT_EQ(t.height(), 0u);
  EXPECT_TRUE(t.CheckInvariants());
}

TEST(RadixTreeTest, RandomOpsDenseKeysMatchMap) { RandomOps(Keys::kDense, 1, 60000); }
TEST(RadixTreeTest, RandomOpsSparseKeysMatchMap) { RandomOps(Keys::kSparse, 2, 60000); }
TEST(RadixTreeTest, RandomOpsHugeKeysMatchMap) { RandomOps(Keys::kHuge, 3, 60000); }
TEST(RadixTreeTest, RandomOpsMixedKeysMatchMap) {
  for (uint64_t seed = 10; seed < 20; ++seed) RandomOps(Keys::kMixed, seed, 8000);
}

TEST(RadixTreeTest, HeightFollowsLargestKey) {
  EXPECT_EQ(Tree::HeightFor(0), 1u);
  EXPECT_EQ(Tree::HeightFor(63), 1u);
  EXPECT_EQ(Tree::HeightFor(64), 2u);
  EXPECT_EQ(Tree::HeightFor(4095), 2u);
  EXPECT_EQ(Tree::HeightFor(4096), 3u);
  EXPECT_EQ(Tree::HeightFor(uint64_t{1} << 60), 11u);
  EXPECT_EQ(Tree::HeightFor(kMax), 11u);
  EXPECT_EQ(Tree::MaxKey(11), kMax);

  Tree t;
  ASSERT_TRUE(t.Store(5, 50));
  EXPECT_EQ(t.height(), 1u);
  EXPECT_EQ(t.node_count(), 1u);
  ASSERT_TRUE(t.Store(64, 640));
  EXPECT_EQ(t.height(), 2u);
  EXPECT_EQ(t.node_count(), 3u);  // root + two leaves
  ASSERT_TRUE(t.Store(kMax, 1));
  EXPECT_EQ(t.height(), 11u);
  EXPECT_TRUE(t.CheckInvariants());
  ASSERT_TRUE(t.Erase(kMax));
  EXPECT_EQ(t.height(), 2u);  // the levels above fall away with the key
  ASSERT_TRUE(t.Erase(64));
  EXPECT_EQ(t.height(), 1u);
  EXPECT_EQ(t.node_count(), 1u);
  EXPECT_TRUE(t.CheckInvariants());
  ASSERT_EQ(*t.Find(5), 50u);
}

TEST(RadixTreeTest, ExtremeKeys) {
  Tree t;
  EXPECT_EQ(t.Find(0), nullptr);
  EXPECT_EQ(t.Find(kMax), nullptr);
  EXPECT_FALSE(t.Erase(0));
  EXPECT_FALSE(t.FindFirstAtOrAfter(0).has_value());
  EXPECT_TRUE(t.begin() == t.end());

  ASSERT_TRUE(t.Store(kMax, 7));
  ASSERT_TRUE(t.Store(0, 3));
  EXPECT_FALSE(t.Store(0, 4));  // replaced
  EXPECT_EQ(*t.Find(0), 4u);
  EXPECT_EQ(*t.Find(kMax), 7u);
  EXPECT_EQ(t.Find(kMax - 1), nullptr);
  EXPECT_EQ(t.FindFirstAtOrAfter(1)->first, kMax);
  EXPECT_EQ(t.FindFirstAtOrAfter(kMax)->first, kMax);
  EXPECT_EQ(t.FindFirstAtOrAfter(0)->first, 0u);

  std::vector<uint64_t> seen;
  for (auto [k, v] : t) seen.push_back(k);
  EXPECT_EQ(seen, (std::vector<uint64_t>{0, kMax}));

  ASSERT_TRUE(t.Erase(0));
  EXPECT_FALSE(t.FindFirstAtOrAfter(0)->first != kMax);
  ASSERT_TRUE(t.Erase(kMax));
  EXPECT_EQ(t.node_count(), 0u);
}

TEST(RadixTreeTest, IterationCrossesLeavesInOrder) {
  Tree t;
  std::vector<uint64_t> want;
  for (uint64_t k = 0; k < 5000; k += 3) {
    t.Store(k * 41, k);
    want.push_back(k * 41);
  }
  std::vector<uint64_t> got;
  for (auto it = t.begin(); it != t.end(); it++) got.push_back(it->first);
  EXPECT_EQ(got, want);
  const Tree& ct = t;
  size_t n = 0;
  for (auto it = ct.lower_bound(want[100] + 1); it != ct.end(); ++it) ++n;
  EXPECT_EQ(n, want.size() - 101);
}

// The reservation covers every shape: StoreReserved takes nodes from it and
// never from operator new.
TEST(RadixTreeTest, StoreReservedNeverAllocates) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 3000; ++round) {
    Tree t;
    // A random shape: a few keys of assorted sizes.
    int n = static_cast<int>(rng() % 6);
    for (int i = 0; i < n; ++i) t.Store(PickKey(Keys::kHuge, rng), 1);
    uint64_t key = PickKey(Keys::kHuge, rng);

    Tree::Reservation res = Tree::Reserve(key);
    ASSERT_EQ(res.nodes(), Tree::NodesForKey(key));
    size_t spare = Tree::ThreadSpareNodes();
    size_t nodes = t.node_count();
    uint64_t allocs = Tree::ThreadAllocations();
    t.StoreReserved(std::move(res), key, 2);
    EXPECT_EQ(Tree::ThreadAllocations(), allocs) << "StoreReserved allocated";
    size_t used = t.node_count() - nodes;
    EXPECT_LE(used, Tree::NodesForKey(key));
    EXPECT_EQ(Tree::ThreadSpareNodes(), spare - used);
    EXPECT_EQ(*t.Find(key), 2u);
    EXPECT_TRUE(t.CheckInvariants());
  }
}

TEST(RadixTreeTest, WorstCaseShapesUseTheWholeReservation) {
  {
    // Height 11 because of 2^64 - 1; a small key far from it needs 10 nodes.
    Tree t;
    t.Store(kMax, 1);
    size_t before = t.node_count();
    auto res = Tree::Reserve(0);
    t.StoreReserved(std::move(res), 0, 2);
    EXPECT_EQ(t.node_count() - before, 10u);
    EXPECT_EQ(Tree::NodesForKey(0), 10u);
  }
  {
    // Height 1; a key of height 11 needs 10 new levels and a 10-node path.
    Tree t;
    t.Store(1, 1);
    auto res = Tree::Reserve(kMax);
    t.StoreReserved(std::move(res), kMax, 2);
    EXPECT_EQ(t.node_count(), 21u);
    EXPECT_EQ(Tree::NodesForKey(kMax), 20u);
  }
}

TEST(RadixTreeTest, ReservationReturnsUnusedNodes) {
  Tree::TrimThreadCache();
  EXPECT_EQ(Tree::ThreadSpareNodes(), 0u);
  uint64_t allocs = Tree::ThreadAllocations();
  {
    auto a = Tree::Reserve(300);
    auto b = Tree::Reserve(301);  // two live claims need two sets of nodes
    EXPECT_EQ(Tree::ThreadAllocations() - allocs, 2 * Tree::NodesForKey(300));
    Tree::Reservation moved = std::move(a);
    EXPECT_EQ(a.nodes(), 0u);
    EXPECT_EQ(moved.nodes(), Tree::NodesForKey(300));
  }
  // Unused nodes stay in the pool (up to the slack) for the next reservation.
  EXPECT_EQ(Tree::ThreadSpareNodes(), 2 * Tree::NodesForKey(300));
  allocs = Tree::ThreadAllocations();
  { auto c = Tree::Reserve(302); }
  EXPECT_EQ(Tree::ThreadAllocations(), allocs) << "a warm pool serves a reservation without malloc";
  Tree::TrimThreadCache();
  EXPECT_EQ(Tree::ThreadSpareNodes(), 0u);
}

TEST(RadixTreeTest, MemoryReturnsToZero) {
  Tree::TrimThreadCache();
  const int64_t live0 = Tree::LiveNodes();
  {
    Tree t;
    for (uint64_t k = 256; k < 256 + 100000; ++k) t.Store(k, k);
    for (uint64_t k = 0; k < 2000; ++k) t.Store(k * 0x9E3779B97F4A7C15ULL, k);
    EXPECT_GT(t.memory_bytes(), 100000 / 64 * Tree::kNodeBytes);
    EXPECT_EQ(static_cast<int64_t>(t.node_count()), Tree::LiveNodes() - live0 - static_cast<int64_t>(Tree::ThreadSpareNodes()));
    std::vector<uint64_t> keys;
    for (auto it = t.begin(); it != t.end(); ++it) keys.push_back(it.key());
    for (uint64_t k : keys) ASSERT_TRUE(t.Erase(k));
    EXPECT_EQ(t.memory_bytes(), 0u);
    EXPECT_EQ(t.node_count(), 0u);
    EXPECT_TRUE(t.empty());
  }
  Tree::TrimThreadCache();
  EXPECT_EQ(Tree::LiveNodes(), live0);
  {
    Tree t;  // Clear() and the destructor free nodes too
    for (uint64_t k = 0; k < 10000; ++k) t.Store(k * 977, k);
    Tree moved = std::move(t);
    EXPECT_EQ(t.size(), 0u);
    EXPECT_EQ(moved.size(), 10000u);
  }
  Tree::TrimThreadCache();
  EXPECT_EQ(Tree::LiveNodes(), live0);
}

// Values with a destructor are destroyed exactly once: on replace, erase,
// Clear and tree destruction.
struct Counted {
  static inline int live = 0;
  int v = 0;
  explicit Counted(int x) : v(x) { ++live; }
  Counted(Counted&& o) noexcept : v(o.v) { ++live; }
  Counted& operator=(Counted&& o) noexcept {
    v = o.v;
    return *this;
  }
  ~Counted() { --live; }
};

TEST(RadixTreeTest, NonTrivialValuesAreDestroyed) {
  {
    RadixTree<Counted> t;
    for (int i = 0; i < 1000; ++i) t.Store(static_cast<uint64_t>(i) * 13, Counted(i));
    EXPECT_EQ(Counted::live, 1000);
    t.Store(13, Counted(-1));
    EXPECT_EQ(Counted::live, 1000);
    EXPECT_EQ(t.Find(13)->v, -1);
    for (int i = 0; i < 500; ++i) t.Erase(static_cast<uint64_t>(i) * 13);
    EXPECT_EQ(Counted::live, 500);
    auto [slot, added] = t.TryStoreReserved(RadixTree<Counted>::Reserve(13 * 600), 13 * 600, Counted(7));
    EXPECT_FALSE(added);
    EXPECT_EQ(slot->v, 600);
    EXPECT_EQ(Counted::live, 500);
  }
  EXPECT_EQ(Counted::live, 0);
}

}  // namespace
}  // namespace ubtrfs::inode
