// `ubtrfs stats`: the tree shapes of an image, and the live statistics of a
// mount (through the virtual xattr on its root).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <string>

#include "support/fuse_mount.h"
#include "support/test_util.h"
#include "ubtrfs/filesystem.h"

namespace UBTRFS_UNITY_ID {

using ubtrfs_test::RunCommand;

TEST(StatsCommand, ImageTreeShapesCountItems) {
  ubtrfs_test::TempDir dir("ubtrfs-stats");
  const std::string img = dir.Sub("img");
  ASSERT_EQ(RunCommand({UBTRFS_CLI_PATH, "mkfs", "--size", "128M", img}).exit_code, 0);
  {
    auto fs = ubtrfs::Filesystem::Open(img, ubtrfs::OpenOptions{.writable = true});
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto d = (*fs)->Mkdir((*fs)->Root(), "d", ubtrfs::NewInode{.mode = 0755});
    ASSERT_TRUE(d.ok());
    for (int i = 0; i < 3000; ++i) {
      ASSERT_TRUE((*fs)->Create(*d, "f" + std::to_string(i), ubtrfs::NewInode{.mode = 0644}).ok());
    }
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  auto r = RunCommand({UBTRFS_CLI_PATH, "stats", "--json", img});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The fs tree (5): the root dir (inode, ref), d (inode, ref, its entry in
  // the root: dir item + index), 3000 files x (inode, ref, dir item, index).
  EXPECT_NE(r.out.find("{\"tree\":5,"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"items\":" + std::to_string(2 + 4 + 3000 * 4) + ","), std::string::npos) << r.out;
  auto text = RunCommand({UBTRFS_CLI_PATH, "stats", img});
  ASSERT_EQ(text.exit_code, 0);
  EXPECT_NE(text.out.find("FS_TREE"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("leaf fill"), std::string::npos);

  auto bad = RunCommand({UBTRFS_CLI_PATH, "stats", dir.Sub("missing")});
  EXPECT_EQ(bad.exit_code, 8);
  EXPECT_NE(bad.err.find("No such file"), std::string::npos) << bad.err;
  // A list of no devices at all (only commas) is a missing file, not a crash.
  auto commas = RunCommand({UBTRFS_CLI_PATH, "stats", ",,"});
  EXPECT_EQ(commas.exit_code, 8);
  EXPECT_NE(commas.err.find("No such file"), std::string::npos) << commas.err;
  auto notmount = RunCommand({UBTRFS_CLI_PATH, "stats", dir.path()});
  EXPECT_EQ(notmount.exit_code, 8);
  EXPECT_NE(notmount.err.find("not a ubtrfs mount"), std::string::npos) << notmount.err;
}

TEST(StatsCommand, LiveMountCountsItsOperations) {
  SKIP_IF_NO_FUSE();
  ubtrfs_test::Scratch s;
  ASSERT_EQ(s.Make(), "");
  ubtrfs_test::MountProcess m;
  std::string skip, error;
  if (!m.Start(s.img, s.mnt, s.log, {}, &skip, &error)) {
    if (!skip.empty()) GTEST_SKIP() << skip;
    FAIL() << error;
  }
  for (int i = 0; i < 50; ++i) {
    const std::string p = s.mnt + "/f" + std::to_string(i);
    int fd = ::open(p.c_str(), O_CREAT | O_WRONLY, 0644);
    ASSERT_GE(fd, 0) << p;
    ::close(fd);
  }
  auto r = RunCommand({UBTRFS_CLI_PATH, "stats", "--json", s.mnt});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Each create went through the library: op.create counted all 50.
  const auto pos = r.out.find("\"op.create\":{");
  ASSERT_NE(pos, std::string::npos) << r.out;
  const auto cpos = r.out.find("\"count\":", pos);
  ASSERT_NE(cpos, std::string::npos);
  EXPECT_GE(std::stoull(r.out.substr(cpos + 8)), 50u) << r.out.substr(pos, 200);
  auto text = RunCommand({UBTRFS_CLI_PATH, "stats", s.mnt});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("op.create (ns): count"), std::string::npos) << text.out;
  // Not an xattr of the image: listxattr does not show it.
  char names[256];
  EXPECT_LE(::listxattr(s.mnt.c_str(), names, sizeof names), 0);
  std::string err;
  EXPECT_EQ(m.Unmount(&err), 0) << err;
}

}  // namespace
