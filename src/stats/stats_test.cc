#include "stats/stats.h"

#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace ubtrfs::stats {
namespace UBTRFS_UNITY_ID {

TEST(Stats, Log2BucketsAndPercentiles) {
  Histogram& h = GetHistogram("test.buckets", "ns");
  h.Reset();
  h.Record(0);   // bucket 0
  h.Record(1);   // bucket 1: [1,1]
  h.Record(3);   // bucket 2: [2,3]
  h.Record(4);   // bucket 3: [4,7]
  h.Record(1000);  // bucket 10: [512,1023]
  HistogramSnapshot s = h.Snapshot("test.buckets", "ns");
  ASSERT_EQ(s.buckets.size(), 11u);
  EXPECT_EQ(s.buckets[0], 1u);
  EXPECT_EQ(s.buckets[1], 1u);
  EXPECT_EQ(s.buckets[2], 1u);
  EXPECT_EQ(s.buckets[3], 1u);
  EXPECT_EQ(s.buckets[10], 1u);
  EXPECT_EQ(s.count, 5u);
  EXPECT_EQ(s.sum, 1008u);
  EXPECT_EQ(s.max, 1000u);
  EXPECT_EQ(s.PercentileBound(50), 3u);
  EXPECT_EQ(s.PercentileBound(100), 1023u);
}

TEST(Stats, RegistryIsSharedAndResettable) {
  Counter& a = GetCounter("test.counter");
  a.Reset();
  GetCounter("test.counter").Add(3);
  a.Add();
  StatsSnapshot snap = CollectStats();
  EXPECT_EQ(snap.Counter("test.counter"), 4u);
  EXPECT_NE(snap.ToJson().find("\"test.counter\":4"), std::string::npos);
  ResetStats();
  EXPECT_EQ(CollectStats().Counter("test.counter"), 0u);
}

TEST(Stats, ConcurrentRecordingLosesNothing) {
  Histogram& h = GetHistogram("test.concurrent", "ns");
  h.Reset();
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&h, t] {
      for (int i = 0; i < 10000; ++i) h.Record(uint64_t(i + t));
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(h.Snapshot("x", "ns").count, 40000u);
  EXPECT_EQ(h.Snapshot("x", "ns").max, 10002u);
}

TEST(Stats, TextShowsBars) {
  Histogram& h = GetHistogram("test.text", "items");
  h.Reset();
  for (int i = 0; i < 10; ++i) h.Record(100);
  std::string text = CollectStats().ToText();
  EXPECT_NE(text.find("test.text (items): count 10"), std::string::npos);
  EXPECT_NE(text.find("64 -> 127"), std::string::npos);
}

}  // namespace
}  // namespace ubtrfs::stats
