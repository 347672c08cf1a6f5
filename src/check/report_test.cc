#include "check/report.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace ubtrfs::check {
namespace UBTRFS_UNITY_ID {

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

// The bytes a JSON string stands for: ToJson writes every byte outside
// printable ASCII as \u00XX, so each code point is one byte of the original.
std::string BytesOf(const nlohmann::json& v) {
  const std::string utf8 = v.get<std::string>();
  std::string out;
  for (size_t i = 0; i < utf8.size();) {
    const auto c = static_cast<unsigned char>(utf8[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      i += 1;
    } else {
      // U+0080..U+00FF: two UTF-8 bytes 110000xx 10xxxxxx.
      EXPECT_EQ(c & 0xfe, 0xc2) << "a code point above U+00FF";
      if (i + 1 >= utf8.size()) break;
      out.push_back(static_cast<char>(((c & 0x03) << 6) | (static_cast<unsigned char>(utf8[i + 1]) & 0x3f)));
      i += 2;
    }
  }
  return out;
}

TEST(Json, ParsesAsOneObject) {
  CheckResult r;
  r.error_count = 3;  // more than are stored
  r.errors.push_back("quote \" and backslash \\");
  r.errors.push_back(std::string("name \x01\x1f\x7f\n\t\xc3\xa9\xff end"));
  r.warnings.push_back("a tree log is present");
  r.counts.emplace_back("trees", 3);
  r.counts.emplace_back("tree_blocks", 1ull << 40);
  const std::string text = CheckJson(r);
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(text)) << text;
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.size(), 4u) << text;
  ASSERT_TRUE(j["errors"].is_array());
  ASSERT_EQ(j["errors"].size(), r.errors.size());
  for (size_t i = 0; i < r.errors.size(); ++i) EXPECT_EQ(BytesOf(j["errors"][i]), r.errors[i]) << i;
  ASSERT_TRUE(j["warnings"].is_array());
  ASSERT_EQ(j["warnings"].size(), 1u);
  EXPECT_EQ(j["warnings"][0].get<std::string>(), r.warnings[0]);
  ASSERT_TRUE(j["counts"].is_object());
  EXPECT_EQ(j["counts"].size(), 2u);
  EXPECT_EQ(j["counts"]["trees"].get<uint64_t>(), 3u);
  EXPECT_EQ(j["counts"]["tree_blocks"].get<uint64_t>(), 1ull << 40);
  ASSERT_TRUE(j["clean"].is_boolean());
  EXPECT_FALSE(j["clean"].get<bool>());
  // Nothing after the object: one object, not a stream of them.
  EXPECT_TRUE(nlohmann::json::accept(text));

  CheckResult ok;
  const nlohmann::json k = nlohmann::json::parse(CheckJson(ok));
  EXPECT_TRUE(k["clean"].get<bool>());
  EXPECT_TRUE(k["errors"].is_array() && k["errors"].empty());
  EXPECT_TRUE(k["warnings"].is_array() && k["warnings"].empty());
  EXPECT_TRUE(k["counts"].is_object() && k["counts"].empty());
}

}  // namespace
}  // namespace ubtrfs::check
