#include "fs/dir_names.h"

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace ubtrfs::fsimpl {
namespace UBTRFS_UNITY_ID {

std::vector<DirEntry> Entries(const std::vector<std::string>& names) {
  std::vector<DirEntry> v;
  uint64_t index = 2;
  for (const auto& n : names) v.push_back(DirEntry{n, InodeId{5, 256 + index}, 8, index++});
  return v;
}

TEST(DirNames, InvalidNamesAreNamedAndValidOnesPass) {
  EXPECT_EQ(InvalidNameReason("a"), nullptr);
  EXPECT_EQ(InvalidNameReason("..."), nullptr);
  EXPECT_EQ(InvalidNameReason(std::string(255, 'x')), nullptr);
  EXPECT_NE(InvalidNameReason(""), nullptr);
  EXPECT_NE(InvalidNameReason("."), nullptr);
  EXPECT_NE(InvalidNameReason(".."), nullptr);
  EXPECT_NE(InvalidNameReason("a/b"), nullptr);
  EXPECT_NE(InvalidNameReason("/"), nullptr);
  EXPECT_NE(InvalidNameReason(std::string("a\0b", 3)), nullptr);
  EXPECT_NE(InvalidNameReason(std::string(256, 'x')), nullptr);
  EXPECT_EQ(PrintableName(std::string("a/\0\n\\", 5)), "a/\\x00\\x0a\\x5c");
}

TEST(DirNames, FirstEntryOfANameWinsAndOrderIsKept) {
  auto v = Entries({"b", "a", "..", "b", "c", "a", "a/b", "b"});
  std::vector<SkippedEntry> skipped;
  FilterDirEntries(&v, &skipped);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].name, "b");
  EXPECT_EQ(v[0].index, 2u);
  EXPECT_EQ(v[1].name, "a");
  EXPECT_EQ(v[1].index, 3u);
  EXPECT_EQ(v[2].name, "c");
  ASSERT_EQ(skipped.size(), 5u);
  EXPECT_EQ(skipped[0].name, "..");
  EXPECT_EQ(skipped[1].name, "b");
  EXPECT_EQ(skipped[1].index, 5u);
  EXPECT_EQ(skipped[1].reason, "duplicate of the entry at index 2");
  EXPECT_EQ(skipped[2].reason, "duplicate of the entry at index 3");
  EXPECT_EQ(skipped[3].reason, "name contains '/'");
  EXPECT_EQ(skipped[4].reason, "duplicate of the entry at index 2");
  // Without a list the entries are still left out.
  auto w = Entries({"x", "x", "."});
  FilterDirEntries(&w, nullptr);
  ASSERT_EQ(w.size(), 1u);
}

TEST(DirNames, LargeListingAgreesWithASetModel) {
  std::mt19937_64 rng(7);
  std::vector<std::string> names;
  for (int i = 0; i < 200000; ++i) {
    // One name in twenty repeats an earlier one.
    if (!names.empty() && rng() % 20 == 0) names.push_back(names[rng() % names.size()]);
    else names.push_back("n" + std::to_string(rng() % 1000000000));
  }
  auto v = Entries(names);
  std::vector<SkippedEntry> skipped;
  FilterDirEntries(&v, &skipped);
  std::set<std::string> seen;
  std::vector<std::string> want;
  size_t dups = 0;
  for (const auto& n : names) {
    if (seen.insert(n).second) want.push_back(n);
    else ++dups;
  }
  ASSERT_EQ(v.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(v[i].name, want[i]) << i;
  EXPECT_EQ(skipped.size(), dups);
}

}  // namespace
}  // namespace ubtrfs::fsimpl
