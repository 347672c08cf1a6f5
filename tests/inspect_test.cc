// The raw-tree API (ubtrfs/inspect.h) and the check API (ubtrfs/check.h),
// through the public headers only, as an application (or the CLI) sees
// them: an image made and written by the library, then its trees dumped and
// measured, its member superblock read, and it checked and scrubbed.
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_util.h"
#include "ubtrfs/check.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/inspect.h"
#include "ubtrfs/mkfs.h"

namespace UBTRFS_UNITY_ID {

using ubtrfs_test::TempDir;

// The whole of what DumpTree printed to `f`.
std::string ReadBack(std::FILE* f) {
  std::string text;
  std::rewind(f);
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  return text;
}

class InspectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    image_ = dir_.Sub("fs.img");
    ubtrfs::MkfsSpec spec;
    spec.images = {image_};
    spec.size = 128ull << 20;
    ASSERT_TRUE(ubtrfs::Mkfs(spec).ok());
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(image_, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    for (int i = 0; i < kFiles; ++i) {
      auto f = (*fs)->Create((*fs)->Root(), "file-" + std::to_string(i), {.mode = 0644});
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      const std::string data(5000, static_cast<char>('a' + i % 26));
      ASSERT_TRUE((*fs)->Write(*f, 0, std::span(reinterpret_cast<const uint8_t*>(data.data()), data.size())).ok());
    }
    ASSERT_TRUE((*fs)->Commit().ok());
    info_ = (*fs)->Info();
  }

  static constexpr int kFiles = 300;
  TempDir dir_{"ubtrfs-inspect"};
  std::string image_;
  ubtrfs::FsInfo info_;
};

TEST_F(InspectTest, TreeShapesCountTheFilesItems) {
  auto shapes = ubtrfs::TreeShapes(image_, {});
  ASSERT_TRUE(shapes.ok()) << shapes.status().ToString();
  const ubtrfs::TreeShape* fs_tree = nullptr;
  uint64_t last = 0;
  for (const auto& t : *shapes) {
    EXPECT_TRUE(t.error.empty()) << t.name << ": " << t.error;
    EXPECT_GE(t.tree, last) << "not in objectid order";
    last = t.tree;
    EXPECT_GE(t.levels, 1) << t.name;
    EXPECT_GT(t.leaves, 0u) << t.name;
    EXPECT_LE(t.leaf_bytes_used, t.leaf_bytes) << t.name;
    if (t.tree == 5) fs_tree = &t;
  }
  ASSERT_NE(fs_tree, nullptr);
  EXPECT_EQ(fs_tree->name, "FS_TREE");
  // Each file: an inode item, an inode ref, a dir item, a dir index, an
  // extent item (5000 bytes are not inline).
  EXPECT_GE(fs_tree->items, 5u * kFiles);
  EXPECT_GT(fs_tree->levels, 1) << "300 files do not fit one 16 KiB leaf";
  EXPECT_GT(fs_tree->nodes, 0u);
}

TEST_F(InspectTest, DumpTreePrintsTheFilesAndSaysWhatWasNotThere) {
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  ubtrfs::DumpTreeOptions d;
  d.tree = ubtrfs::ParseTreeName("fs");
  auto r = ubtrfs::DumpTree(image_, {}, d, out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->clean());
  const std::string text = ReadBack(out);
  std::fclose(out);
  EXPECT_NE(text.find("fs tree key (FS_TREE ROOT_ITEM 0)"), std::string::npos);
  for (int i : {0, 150, kFiles - 1}) {
    EXPECT_NE(text.find("name: file-" + std::to_string(i) + "\n"), std::string::npos) << "file-" << i;
  }

  // A tree the image does not have (no quotas), and a block that is none.
  out = std::tmpfile();
  d.tree = ubtrfs::ParseTreeName("quota-tree");
  r = ubtrfs::DumpTree(image_, {}, d, out);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->tree_not_found);
  EXPECT_FALSE(r->clean());
  d = {};
  d.blocks = {12345};
  r = ubtrfs::DumpTree(image_, {}, d, out);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->block_errors, 1);
  EXPECT_NE(ReadBack(out).find("ERROR: "), std::string::npos);
  std::fclose(out);

  // Not an image: an error, nothing printed.
  const std::string junk = dir_.Sub("junk");
  std::FILE* j = std::fopen(junk.c_str(), "wb");
  ASSERT_NE(j, nullptr);
  std::fputs(std::string(1 << 20, 'x').c_str(), j);
  std::fclose(j);
  EXPECT_FALSE(ubtrfs::DumpTree(junk, {}, {}, stdout).ok());
  EXPECT_FALSE(ubtrfs::TreeShapes(junk, {}).ok());
  EXPECT_FALSE(ubtrfs::ReadMemberInfo(junk, {}).ok());
  EXPECT_FALSE(ubtrfs::DumpTree(dir_.Sub("missing"), {}, {}, stdout).ok());
}

TEST(ParseTreeName, NamesAndNumbers) {
  EXPECT_EQ(ubtrfs::ParseTreeName("root"), 1u);
  EXPECT_EQ(ubtrfs::ParseTreeName("extent-tree"), 2u);
  EXPECT_EQ(ubtrfs::ParseTreeName("CHUNK"), 3u);
  EXPECT_EQ(ubtrfs::ParseTreeName("free_space"), 10u);
  EXPECT_EQ(ubtrfs::ParseTreeName("257"), 257u);
  EXPECT_EQ(ubtrfs::ParseTreeName("-7"), static_cast<uint64_t>(-7));  // TREE_LOG
  EXPECT_FALSE(ubtrfs::ParseTreeName("bogus").has_value());
  EXPECT_FALSE(ubtrfs::ParseTreeName("").has_value());
  EXPECT_FALSE(ubtrfs::ParseTreeName("123456789012345678901").has_value());
}

TEST_F(InspectTest, MemberInfoIsWhatTheOpenFilesystemSays) {
  auto m = ubtrfs::ReadMemberInfo(image_, {});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->fsid, info_.fsid);
  EXPECT_EQ(m->generation, info_.generation);
  EXPECT_EQ(m->nodesize, info_.nodesize);
  EXPECT_EQ(m->sectorsize, info_.sectorsize);
  EXPECT_EQ(m->total_bytes, info_.total_bytes);
  EXPECT_EQ(m->bytes_used, info_.bytes_used);
  EXPECT_EQ(m->csum_type, info_.csum_type);
  EXPECT_EQ(m->devid, 1u);
  EXPECT_TRUE(m->devices_missing.empty());
  EXPECT_EQ(ubtrfs::IncompatFeatureNames(m->incompat_flags), ubtrfs::IncompatFeatureNames(info_.incompat_flags));
  EXPECT_NE(ubtrfs::IncompatFeatureNames(m->incompat_flags).find("skinny-metadata"), std::string::npos);
}

TEST_F(InspectTest, CheckAndScrubOfAGoodImage) {
  auto c = ubtrfs::CheckImage(image_, {.check_data_csum = true});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->clean()) << (c->errors.empty() ? "" : c->errors.front());
  EXPECT_NE(ubtrfs::CheckJson(*c).find("\"clean\": true"), std::string::npos);

  ubtrfs::ScrubOptions so;
  so.readonly = true;
  auto s = ubtrfs::ScrubImage(image_, so);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->errors_found(), 0u);
  EXPECT_GE(s->data_bytes, uint64_t{kFiles} * 4096);
  EXPECT_GT(s->tree_blocks, 0u);
  EXPECT_NE(ubtrfs::ScrubSummary(*s).find("no errors found"), std::string::npos);

  EXPECT_FALSE(ubtrfs::CheckImage(dir_.Sub("missing")).ok());
  EXPECT_FALSE(ubtrfs::ScrubImage(dir_.Sub("missing"), so).ok());
}

}  // namespace
