#include "check/report.h"

#include <gtest/gtest.h>

namespace ubtrfs::check {
namespace {

TEST(CsumIndex, MergesAdjacentAndOverlappingRuns) {
  CsumIndex c;
  c.Add(4096, 4096);
  c.Add(8192, 8192);   // adjacent: one run
  c.Add(40960, 4096);  // apart
  c.Add(12288, 8192);  // overlaps the first run's end
  ASSERT_EQ(c.runs().size(), 2u);
  EXPECT_EQ(c.runs().begin()->first, 4096u);
  EXPECT_EQ(c.runs().begin()->second, 20480u);
  EXPECT_EQ(c.Covered(0, 65536), 16384u + 4096u);
  EXPECT_EQ(c.Covered(8192, 4096), 4096u);
  EXPECT_EQ(c.Covered(16384, 28672), 4096u + 4096u);
  EXPECT_EQ(c.Covered(20480, 20480), 0u);
  EXPECT_EQ(c.Covered(UINT64_MAX - 10, 100), 0u);  // no overflow
}

TEST(Report, CapsStoredErrorsButCountsAll) {
  CheckResult r;
  Report rep(&r, 2);
  for (int i = 0; i < 5; ++i) rep.Error("e" + std::to_string(i));
  EXPECT_EQ(r.errors.size(), 2u);
  EXPECT_EQ(r.error_count, 5u);
  EXPECT_FALSE(r.clean());
}

TEST(Report, EscapesNamesToPrintableAscii) {
  EXPECT_EQ(Esc("a b"), "a b");
  EXPECT_EQ(Esc(std::string("\n\\\xc3\xa9", 4)), "\\x0a\\x5c\\xc3\\xa9");
  EXPECT_EQ(TreeLabel(5), "fs tree 5");
  EXPECT_EQ(TreeLabel(257), "subvolume 257");
}

TEST(Json, ParsesAsOneObject) {
  CheckResult r;
  r.error_count = 1;
  r.errors.push_back("quote \" and backslash \\");
  r.counts.emplace_back("trees", 3);
  const std::string j = ToJson(r);
  EXPECT_EQ(j, "{\"errors\": [\"quote \\\" and backslash \\\\\"], \"warnings\": [], \"counts\": {\"trees\": 3}, "
               "\"clean\": false}");
}

}  // namespace
}  // namespace ubtrfs::check
