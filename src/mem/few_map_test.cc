// FewMap against std::map: random inserts, updates and erases keep the same
// entries in the same order, across the move between the inline entry and
// the vector in both directions.
#include "mem/few_map.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

namespace ubtrfs::mem {
namespace UBTRFS_UNITY_ID {

template <typename K, typename V>
std::vector<std::pair<K, V>> Entries(const FewMap<K, V>& m) {
  return std::vector<std::pair<K, V>>(m.begin(), m.end());
}

TEST(FewMap, MatchesStdMap) {
  std::mt19937_64 rng(33);
  for (int round = 0; round < 200; ++round) {
    FewMap<int, long> few;
    std::map<int, long> model;
    const int keys = 1 + static_cast<int>(rng() % 6);  // mostly few, as delayed refs have
    for (int step = 0; step < 60; ++step) {
      const int k = static_cast<int>(rng() % keys);
      if (rng() % 3 == 0) {
        few.erase(k);
        model.erase(k);
      } else {
        const long d = static_cast<long>(rng() % 5) - 2;
        few[k] += d;
        model[k] += d;
      }
      ASSERT_EQ(few.size(), model.size());
      ASSERT_EQ(few.empty(), model.empty());
      ASSERT_EQ(Entries(few), (std::vector<std::pair<int, long>>(model.begin(), model.end()))) << "round " << round;
    }
  }
}

TEST(FewMap, OneEntryThenMoreThenOneAgain) {
  FewMap<int, int> m;
  EXPECT_TRUE(m.empty());
  m[5] = 1;
  EXPECT_EQ(m.size(), 1u);
  EXPECT_EQ(m.begin()->first, 5);
  m[2] = 2;
  m[9] = 3;
  EXPECT_EQ(Entries(m), (std::vector<std::pair<int, int>>{{2, 2}, {5, 1}, {9, 3}}));
  m.erase(2);
  m.erase(9);
  EXPECT_EQ(Entries(m), (std::vector<std::pair<int, int>>{{5, 1}}));
  m.erase(7);  // absent: nothing happens
  EXPECT_EQ(m.size(), 1u);
  m.erase(5);
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.begin(), m.end());
}

}  // namespace
}  // namespace ubtrfs::mem
