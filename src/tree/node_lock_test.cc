#include "tree/node_lock.h"

#include <atomic>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ubtrfs/stats.h"

namespace ubtrfs::tree {
namespace UBTRFS_UNITY_ID {

TEST(NodeLock, ModesAndCompatibility) {
  NodeLock l;
  l.LockShared();
  l.LockShared();
  EXPECT_EQ(l.readers(), 2u);
  // Intent coexists with readers; a second intent does not.
  EXPECT_TRUE(l.TryLockIntent());
  EXPECT_FALSE(l.TryLockIntent());
  EXPECT_TRUE(l.TryLockShared());
  l.UnlockShared();
  l.UnlockShared();
  l.UnlockShared();
  l.LockWrite();  // no readers left: immediate
  EXPECT_TRUE(l.write_held());
  EXPECT_FALSE(l.TryLockShared());  // write keeps readers out
  l.UnlockWrite();
  EXPECT_TRUE(l.intent_held());  // releasing write leaves intent
  EXPECT_TRUE(l.TryLockShared());
  l.UnlockShared();
  l.UnlockIntent();
  EXPECT_FALSE(l.intent_held());
  EXPECT_EQ(l.readers(), 0u);
}

TEST(NodeLock, WriteWaitsForReadersToDrain) {
  NodeLock l;
  l.LockShared();
  std::atomic<bool> wrote{false};
  std::thread w([&] {
    l.LockIntent();
    l.LockWrite();
    wrote = true;
    l.UnlockWrite();
    l.UnlockIntent();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(wrote.load());
  l.UnlockShared();
  w.join();
  EXPECT_TRUE(wrote.load());
}

// Writers keep a == b (changed in two steps under the write lock); readers
// must never see them differ; intent holders must never overlap.
TEST(NodeLock, ConcurrentReadersIntentAndWriters) {
  NodeLock l;
  uint64_t a = 0, b = 0;  // guarded by l
  std::atomic<int> intent_inside{0};
  std::atomic<bool> bad{false};
  const StatsSnapshot before = CollectStats();
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        l.LockShared();
        if (a != b) bad = true;
        l.UnlockShared();
      }
    });
  }
  for (int t = 0; t < 3; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 5000; ++i) {
        l.LockIntent();
        if (intent_inside.fetch_add(1) != 0) bad = true;
        const uint64_t seen = a;  // intent may read while readers run
        l.LockWrite();
        a = seen + 1;
        b = seen + 1;
        l.UnlockWrite();
        intent_inside.fetch_sub(1);
        l.UnlockIntent();
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_FALSE(bad.load());
  EXPECT_EQ(a, 15000u);
  EXPECT_EQ(b, 15000u);
  const StatsSnapshot after = CollectStats();
  EXPECT_EQ(after.Counter("lock.conversions"), before.Counter("lock.conversions"));
}

}  // namespace
}  // namespace ubtrfs::tree
