// The default subvolume (`btrfs subvolume get-default|set-default`): the
// one the kernel mounts and ubtrfs's paths start at when no subvolume is
// named. Set by ubtrfs, seen by the kernel; set by the kernel, seen by
// ubtrfs; through the library and the CLI.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

CommandResult Cli(const std::vector<std::string>& args) { return RunUbtrfs(args); }

TEST(DefaultSubvolume, SetByUbtrfsSeenByTheKernelAndBack) {
  if (std::string why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp("ubtrfs-default");
  const std::string img = tmp.Sub("img");
  ASSERT_EQ(RunMkfs(img, "", 16384, "crc32c", 256ull << 20), "");
  uint64_t root_id = 0, home_id = 0;
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ubtrfs::Filesystem& f = **fs;
    auto def = f.DefaultSubvolume();
    ASSERT_TRUE(def.ok()) << def.status().ToString();
    EXPECT_EQ(*def, 5u);
    auto at = f.CreateSubvolume(f.Root(), "@", ubtrfs::NewInode{0755});
    auto home = f.CreateSubvolume(f.Root(), "@home", ubtrfs::NewInode{0755});
    ASSERT_TRUE(at.ok() && home.ok());
    root_id = at->root;
    home_id = home->root;
    auto etc = f.Mkdir(*at, "etc", ubtrfs::NewInode{0755});
    ASSERT_TRUE(etc.ok());
    auto os = f.Create(*etc, "os-release", ubtrfs::NewInode{0644});
    ASSERT_TRUE(os.ok());
    ASSERT_TRUE(f.Write(*os, 0, SpanOf(std::string("ID=ubtrfs\n"))).ok());
    EXPECT_EQ(f.SetDefaultSubvolume(999).code(), ENOENT);
    EXPECT_EQ(f.SetDefaultSubvolume(2).code(), ENOENT);  // the extent tree: no subvolume
    ASSERT_TRUE(f.SetDefaultSubvolume(root_id).ok());
    auto now = f.DefaultSubvolume();
    ASSERT_TRUE(now.ok());
    EXPECT_EQ(*now, root_id);
    // This view keeps its paths; the default cannot be deleted.
    EXPECT_TRUE(f.Lookup("/@home").ok());
    EXPECT_EQ(f.DeleteSubvolume(f.Root(), "@").code(), EPERM);
  }
  EXPECT_EQ(BtrfsCheck(img), "");
  {
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    EXPECT_EQ((*fs)->Root().root, root_id);
    EXPECT_EQ(ReadImageFile(**fs, "/etc/os-release"), "ID=ubtrfs\n");
    EXPECT_FALSE((*fs)->Lookup("/@home").ok());
    ubtrfs::OpenOptions top;
    top.subvolid = 5;
    auto fs5 = ubtrfs::Filesystem::Open(img, top);
    ASSERT_TRUE(fs5.ok());
    EXPECT_TRUE((*fs5)->Lookup("/@home").ok());
  }
  CommandResult get = Cli({"subvolume", "get-default", img});
  EXPECT_TRUE(get.ok()) << get.Describe();
  EXPECT_EQ(get.out.rfind("ID " + std::to_string(root_id) + " gen ", 0), 0u) << get.out;
  EXPECT_NE(get.out.find(" top level 5 path @\n"), std::string::npos) << get.out;
  CommandResult json = Cli({"subvolume", "get-default", "--json", img});
  EXPECT_EQ(json.out, "{\"id\": " + std::to_string(root_id) + ", \"path\": \"@\"}\n");

  std::string why;
  if (LoopMountsAvailable(&why)) {
    const std::string mnt = tmp.Sub("mnt");
    ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");  // no subvol=: the default
    EXPECT_EQ(ReadHostFile(mnt + "/etc/os-release"), "ID=ubtrfs\n");
    CommandResult k = RunCommand({"btrfs", "subvolume", "get-default", mnt});
    EXPECT_EQ(k.out.rfind("ID " + std::to_string(root_id) + " gen ", 0), 0u) << k.Describe();
    // The kernel sets it back to @home; ubtrfs follows.
    EXPECT_EQ(MustRun({"btrfs", "subvolume", "set-default", std::to_string(home_id), mnt}), "");
    EXPECT_EQ(m.Unmount(), "");
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok());
    auto now = (*fs)->DefaultSubvolume();
    ASSERT_TRUE(now.ok());
    EXPECT_EQ(*now, home_id);
    EXPECT_EQ((*fs)->Root().root, home_id);
  } else {
    std::printf("kernel view not compared: loop mounts unavailable: %s\n", why.c_str());
  }

  // The CLI: by id, and by path from the top level.
  CommandResult set5 = Cli({"subvolume", "set-default", "5", img});
  EXPECT_TRUE(set5.ok()) << set5.Describe();
  EXPECT_EQ(Cli({"subvolume", "get-default", img}).out, "ID 5 (FS_TREE)\n");
  CommandResult by_path = Cli({"subvolume", "set-default", img + ":/@home"});
  EXPECT_TRUE(by_path.ok()) << by_path.Describe();
  EXPECT_NE(Cli({"subvolume", "get-default", img}).out.find(" path @home\n"), std::string::npos);
  EXPECT_EQ(Cli({"subvolume", "set-default", "--subvolid", "5", img + ":/@/etc"}).exit_code, 1);  // not a top
  EXPECT_EQ(Cli({"subvolume", "set-default", "x1", img}).exit_code, 2);
  EXPECT_EQ(Cli({"subvolume", "set-default", "777", img}).exit_code, 1);
  EXPECT_EQ(BtrfsCheck(img), "");
}

}  // namespace
}  // namespace ubtrfs_test
