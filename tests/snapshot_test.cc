// Snapshots the kernel made, changed by ubtrfs: tree blocks and data extents
// shared between a subvolume and its snapshots are copied on write with the
// kernel's reference rules, so each side changes alone, btrfs check counts
// every reference right, and the kernel sees what ubtrfs sees.
//
// Needs root and working loop mounts; skipped otherwise.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

size_t CountInDump(const std::string& img, const std::string& word) {
  CommandResult r = RunCommand({"btrfs", "inspect-internal", "dump-tree", "-t", "extent", img});
  size_t n = 0;
  for (size_t at = r.out.find(word); at != std::string::npos; at = r.out.find(word, at + 1)) ++n;
  return n;
}

// The kernel's layout: subvolume /sv with small and big files in a tree of
// several levels (4 KiB nodes), then /snap (writable) and /snap_ro
// (read-only) snapshots of it, a snapshot of the top level, and changes to
// /sv after the snapshots so that some blocks are shared and some not.
struct SnapshotImage {
  TempDir tmp{"ubtrfs-snap"};
  std::string img = tmp.Sub("img"), mnt = tmp.Sub("mnt");

  std::string Make() {
    if (mkdir(mnt.c_str(), 0755) != 0) return "mkdir " + mnt + ": " + strerror(errno);
    if (std::string e = RunMkfs(img, "", 4096, "crc32c", 512ull << 20); !e.empty()) return e;
    LoopMount m;
    if (std::string e = m.Mount(img, mnt); !e.empty()) return e;
    if (std::string e = MustRun({"btrfs", "subvolume", "create", mnt + "/sv"}); !e.empty()) return e;
    if (mkdir((mnt + "/sv/d").c_str(), 0755) != 0) return "mkdir sv/d";
    for (int i = 0; i < 600; ++i) WriteHostFile(mnt + "/sv/d/f" + std::to_string(i), "file " + std::to_string(i));
    for (int i = 0; i < 8; ++i) WriteHostFile(mnt + "/sv/big" + std::to_string(i), SeededBytes(300000, i));
    WriteHostFile(mnt + "/top", "top file");
    if (std::string e = MustRun({"sync"}); !e.empty()) return e;
    for (const auto& argv : std::vector<std::vector<std::string>>{
             {"btrfs", "subvolume", "snapshot", mnt + "/sv", mnt + "/snap"},
             {"btrfs", "subvolume", "snapshot", "-r", mnt + "/sv", mnt + "/snap_ro"},
             {"btrfs", "subvolume", "snapshot", mnt, mnt + "/topsnap"}}) {
      if (std::string e = MustRun(argv); !e.empty()) return e;
    }
    // Unshare a little of /sv before ubtrfs sees it.
    WriteHostFile(mnt + "/sv/d/f0", "changed by the kernel");
    WriteHostFile(mnt + "/sv/after", SeededBytes(40000, 77));
    return m.Unmount();
  }
};

TEST(KernelSnapshots, EverySideChangesAloneAndChecksClean) {
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  SnapshotImage im;
  ASSERT_EQ(im.Make(), "");
  ASSERT_EQ(BtrfsCheck(im.img), "");
  const size_t full_before = CountInDump(im.img, "FULL_BACKREF");

  const std::string patch(4096, 'P');
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(im.img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ubtrfs::Filesystem& f = **fs;
    ubtrfs::NewInode attrs;
    attrs.mode = 0644;
    // The subvolume: an overwrite inside a shared extent, a truncate, an
    // unlink of a shared file, many unlinks and creates (splits and merges
    // of shared leaves).
    for (const std::string side : {"/sv", "/snap"}) {
      auto d = f.Lookup(side + "/d");
      ASSERT_TRUE(d.ok()) << side << ": " << d.status().ToString();
      auto b1 = f.Lookup(side + "/big1");
      ASSERT_TRUE(b1.ok());
      ASSERT_TRUE(f.Write(*b1, side == "/sv" ? 8192 : 65536, SpanOf(patch)).ok());
      auto b2 = f.Lookup(side + "/big2");
      ASSERT_TRUE(b2.ok());
      ubtrfs::AttrChange t;
      t.size = side == "/sv" ? 100000 : 5000;
      ASSERT_TRUE(f.SetAttr(*b2, t).ok());
      auto root = f.Lookup(side);
      ASSERT_TRUE(root.ok());
      ASSERT_TRUE(f.Unlink(*root, side == "/sv" ? "big3" : "big4").ok());
      const int first = side == "/sv" ? 1 : 2;
      for (int i = first; i < 600; i += 3) ASSERT_TRUE(f.Unlink(*d, "f" + std::to_string(i)).ok()) << side << i;
      for (int i = 0; i < 300; ++i) {
        auto c = f.Create(*d, "new" + std::to_string(i), attrs);
        ASSERT_TRUE(c.ok()) << c.status().ToString();
        ASSERT_TRUE(f.Write(*c, 0, SpanOf(side + " " + std::to_string(i))).ok());
      }
    }
    // The read-only snapshot refuses.
    auto ro = f.Lookup("/snap_ro/d");
    ASSERT_TRUE(ro.ok());
    EXPECT_EQ(f.Unlink(*ro, "f5").code(), EROFS);
    // The top-level snapshot holds the subvolumes only as empty dirs; its
    // own file changes.
    auto top = f.Lookup("/topsnap/top");
    ASSERT_TRUE(top.ok()) << top.status().ToString();
    ASSERT_TRUE(f.Write(*top, 0, SpanOf(std::string("TOP"))).ok());
    auto st = f.Commit();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  ASSERT_EQ(BtrfsCheck(im.img), "");
  EXPECT_GT(CountInDump(im.img, "FULL_BACKREF"), full_before) << "no shared block was copied: nothing tested";

  // Each side kept its own bytes.
  {
    auto fs = ubtrfs::Filesystem::Open(im.img);
    ASSERT_TRUE(fs.ok());
    std::string sv1 = SeededBytes(300000, 1), snap1 = sv1, ro1 = sv1;
    sv1.replace(8192, patch.size(), patch);
    snap1.replace(65536, patch.size(), patch);
    EXPECT_TRUE(ReadImageFile(**fs, "/sv/big1") == sv1) << "content of " "/sv/big1";
    EXPECT_TRUE(ReadImageFile(**fs, "/snap/big1") == snap1) << "content of " "/snap/big1";
    EXPECT_TRUE(ReadImageFile(**fs, "/snap_ro/big1") == ro1) << "content of " "/snap_ro/big1";
    EXPECT_TRUE(ReadImageFile(**fs, "/snap/big3") == SeededBytes(300000, 3)) << "content of " "/snap/big3";
    EXPECT_TRUE(ReadImageFile(**fs, "/sv/big4") == SeededBytes(300000, 4)) << "content of " "/sv/big4";
    EXPECT_EQ(ReadImageFile(**fs, "/snap_ro/d/f0"), "file 0");
    EXPECT_EQ(ReadImageFile(**fs, "/sv/d/f0"), "changed by the kernel");
    EXPECT_EQ(ReadImageFile(**fs, "/top"), "top file");
    EXPECT_EQ(ReadImageFile(**fs, "/topsnap/top"), "TOP file");
  }

  // The CLI on both sides.
  const std::string host = im.tmp.Sub("host");
  ASSERT_EQ(mkdir(host.c_str(), 0755), 0);
  for (int i = 0; i < 30; ++i) WriteHostFile(host + "/h" + std::to_string(i), SeededBytes(5000 + i * 100, 500 + i));
  for (const std::vector<std::string>& argv : std::vector<std::vector<std::string>>{
           {UBTRFS_CLI_PATH, "cp", host, im.img + ":/snap/"},
           {UBTRFS_CLI_PATH, "rm", "-r", im.img + ":/sv/d"}}) {
    CommandResult r = RunCommand(argv);
    EXPECT_TRUE(r.ok()) << ShellJoin(argv) << ": " << r.Describe();
    EXPECT_EQ(BtrfsCheck(im.img), "") << "after " << ShellJoin(argv);
  }

  // The kernel sees what ubtrfs sees, writes, and ubtrfs changes it again.
  {
    auto fs = ubtrfs::Filesystem::Open(im.img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    LoopMount m;
    ASSERT_EQ(m.Mount(im.img, im.mnt, "ro"), "");
    CompareOptions opts = KernelMountCompareOptions();
    // Where a subvolume was when the top level was snapshotted the kernel
    // shows an empty directory stamped with the time of each lookup.
    opts.skip_times = [](const std::string& rel) { return rel.rfind("topsnap/", 0) == 0 && rel.find('/', 8) == std::string::npos && rel != "topsnap/top"; };
    auto mismatches = CompareTreeToImage(im.mnt, **fs, opts);
    EXPECT_TRUE(mismatches.empty()) << FormatMismatches(mismatches);
    EXPECT_TRUE(ReadHostFile(im.mnt + "/snap/host/h7") == SeededBytes(5700, 507)) << "content of " "/snap/host/h7";
    EXPECT_EQ(m.Unmount(), "");
  }
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(im.img, im.mnt), "");
    WriteHostFile(im.mnt + "/snap/d/kernel", SeededBytes(70000, 9));
    EXPECT_EQ(unlink((im.mnt + "/snap/big5").c_str()), 0);
    WriteHostFile(im.mnt + "/sv/big6", "rewritten by the kernel");
    EXPECT_EQ(m.Unmount(), "");
  }
  ASSERT_EQ(BtrfsCheck(im.img), "");
  for (const std::vector<std::string>& argv : std::vector<std::vector<std::string>>{
           {UBTRFS_CLI_PATH, "rm", "-r", im.img + ":/snap/d"},
           {UBTRFS_CLI_PATH, "rm", im.img + ":/snap/big0", im.img + ":/sv/big0"}}) {
    CommandResult r = RunCommand(argv);
    EXPECT_TRUE(r.ok()) << ShellJoin(argv) << ": " << r.Describe();
    EXPECT_EQ(BtrfsCheck(im.img), "") << "after " << ShellJoin(argv);
  }
  auto fs = ubtrfs::Filesystem::Open(im.img);
  ASSERT_TRUE(fs.ok());
  EXPECT_TRUE(ReadImageFile(**fs, "/snap_ro/big0") == SeededBytes(300000, 0)) << "content of " "/snap_ro/big0";
}

}  // namespace
}  // namespace ubtrfs_test

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

// Snapshots ubtrfs makes: the kernel lists them with the right parent and
// flags, mounts them, sends the read-only one, deletes them; each side
// changes alone and btrfs check counts every shared reference right.
TEST(UbtrfsSnapshots, KernelListsMountsSendsAndDeletesThem) {
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  TempDir tmp("ubtrfs-mksnap");
  const std::string img = tmp.Sub("img"), mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ASSERT_EQ(RunMkfs(img, "", 4096, "crc32c", 512ull << 20), "");
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    ASSERT_EQ(MustRun({"btrfs", "subvolume", "create", mnt + "/sv"}), "");
    ASSERT_EQ(mkdir((mnt + "/sv/d").c_str(), 0755), 0);
    for (int i = 0; i < 500; ++i) WriteHostFile(mnt + "/sv/d/f" + std::to_string(i), "file " + std::to_string(i));
    for (int i = 0; i < 4; ++i) WriteHostFile(mnt + "/sv/big" + std::to_string(i), SeededBytes(200000, i));
    WriteHostFile(mnt + "/top", "top");
    ASSERT_EQ(m.Unmount(), "");
  }
  const std::string patch(4096, 'Q');
  uint64_t snap_id = 0, ro_id = 0;
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ubtrfs::Filesystem& f = **fs;
    auto sv = f.Lookup("/sv");
    ASSERT_TRUE(sv.ok());
    // An uncommitted change goes into the snapshot too: it is committed first.
    auto b0 = f.Lookup("/sv/big0");
    ASSERT_TRUE(b0.ok());
    ASSERT_TRUE(f.Write(*b0, 0, SpanOf(patch)).ok());
    auto snap = f.CreateSnapshot(*sv, f.Root(), "snap", false);
    ASSERT_TRUE(snap.ok()) << snap.status().ToString();
    auto ro = f.CreateSnapshot(*sv, f.Root(), "snap_ro", true);
    ASSERT_TRUE(ro.ok()) << ro.status().ToString();
    snap_id = snap->root;
    ro_id = ro->root;
    EXPECT_NE(snap_id, sv->root);
    EXPECT_EQ(f.CreateSnapshot(*sv, f.Root(), "snap", false).status().code(), EEXIST);
    auto d = f.Lookup("/sv/d");
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(f.CreateSnapshot(*d, f.Root(), "x", false).status().code(), EINVAL);
    auto top = f.CreateSnapshot(f.Root(), *sv, "topsnap", false);
    ASSERT_TRUE(top.ok()) << top.status().ToString();
    // Each side changes alone.
    auto b1 = f.Lookup("/sv/big1");
    ASSERT_TRUE(b1.ok());
    ASSERT_TRUE(f.Write(*b1, 4096, SpanOf(patch)).ok());
    auto sd = f.Lookup("/snap/d");
    ASSERT_TRUE(sd.ok()) << sd.status().ToString();
    for (int i = 0; i < 500; i += 2) ASSERT_TRUE(f.Unlink(*sd, "f" + std::to_string(i)).ok()) << i;
    ubtrfs::NewInode attrs;
    attrs.mode = 0644;
    auto c = f.Create(*sd, "in_snap", attrs);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(f.Write(*c, 0, SpanOf(SeededBytes(30000, 5))).ok());
    auto rod = f.Lookup("/snap_ro/d");
    ASSERT_TRUE(rod.ok());
    EXPECT_EQ(f.Unlink(*rod, "f1").code(), EROFS);
    ASSERT_TRUE(f.Commit().ok());
  }
  ASSERT_EQ(BtrfsCheck(img), "");
  {
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok());
    std::string big0 = SeededBytes(200000, 0), big1 = SeededBytes(200000, 1), big1_sv = big1;
    big0.replace(0, patch.size(), patch);
    big1_sv.replace(4096, patch.size(), patch);
    EXPECT_TRUE(ReadImageFile(**fs, "/snap/big0") == big0) << "content of " "/snap/big0";
    EXPECT_TRUE(ReadImageFile(**fs, "/snap_ro/big1") == big1) << "content of " "/snap_ro/big1";
    EXPECT_TRUE(ReadImageFile(**fs, "/sv/big1") == big1_sv) << "content of " "/sv/big1";
    EXPECT_EQ(ReadImageFile(**fs, "/sv/d/f0"), "file 0");
    EXPECT_EQ(ReadImageFile(**fs, "/sv/topsnap/top"), "top");
    auto gone = (*fs)->Lookup("/snap/d/f0");
    EXPECT_FALSE(gone.ok());
  }
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok());
    CompareOptions opts = KernelMountCompareOptions();
    // The kernel's placeholders for the subvolumes the top level held.
    opts.skip_times = [](const std::string& rel) {
      return rel == "sv/topsnap/sv" || rel == "sv/topsnap/snap" || rel == "sv/topsnap/snap_ro";
    };
    auto mismatches = CompareTreeToImage(mnt, **fs, opts);
    EXPECT_TRUE(mismatches.empty()) << FormatMismatches(mismatches);
    CommandResult list = RunCommand({"btrfs", "subvolume", "list", "-quR", mnt});
    ASSERT_TRUE(list.ok()) << list.Describe();
    CommandResult show = RunCommand({"btrfs", "subvolume", "show", mnt + "/sv"});
    ASSERT_TRUE(show.ok()) << show.Describe();
    const size_t at = show.out.find("UUID:");
    ASSERT_NE(at, std::string::npos) << show.out;
    std::string sv_uuid = show.out.substr(at + 5);
    sv_uuid = sv_uuid.substr(sv_uuid.find_first_not_of(" \t"), 36);
    EXPECT_NE(list.out.find("ID " + std::to_string(snap_id) + " "), std::string::npos) << list.out;
    EXPECT_NE(list.out.find("parent_uuid " + sv_uuid), std::string::npos) << list.out;
    CommandResult prop = RunCommand({"btrfs", "property", "get", mnt + "/snap_ro", "ro"});
    EXPECT_NE(prop.out.find("ro=true"), std::string::npos) << prop.Describe();
    // send of the read-only snapshot, received into a fresh file system.
    const std::string stream = tmp.Sub("stream");
    EXPECT_EQ(MustRun({"btrfs", "send", "-f", stream, mnt + "/snap_ro"}), "");
    EXPECT_EQ(m.Unmount(), "");
    (void)ro_id;
    const std::string img2 = tmp.Sub("img2"), mnt2 = tmp.Sub("mnt2");
    ASSERT_EQ(mkdir(mnt2.c_str(), 0755), 0);
    ASSERT_EQ(RunMkfs(img2, "", 16384, "crc32c", 512ull << 20), "");
    LoopMount m2;
    ASSERT_EQ(m2.Mount(img2, mnt2), "");
    EXPECT_EQ(MustRun({"btrfs", "receive", "-f", stream, mnt2}), "");
    EXPECT_TRUE(ReadHostFile(mnt2 + "/snap_ro/big1") == SeededBytes(200000, 1)) << "content of " "/snap_ro/big1";
    EXPECT_EQ(ReadHostFile(mnt2 + "/snap_ro/d/f7"), "file 7");
    EXPECT_EQ(m2.Unmount(), "");
  }
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, "subvol=snap"), "");
    EXPECT_TRUE(ReadHostFile(mnt + "/d/in_snap") == SeededBytes(30000, 5));
    EXPECT_EQ(m.Unmount(), "");
  }
  {
    // The kernel deletes them and frees what only they held.
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    EXPECT_EQ(MustRun({"btrfs", "subvolume", "delete", mnt + "/snap", mnt + "/snap_ro", mnt + "/sv/topsnap"}), "");
    EXPECT_EQ(MustRun({"btrfs", "subvolume", "sync", mnt}), "");
    EXPECT_EQ(m.Unmount(), "");
  }
  EXPECT_EQ(BtrfsCheck(img), "");
  // ubtrfs changes the rest again.
  CommandResult r = RunCommand({UBTRFS_CLI_PATH, "rm", "-r", img + ":/sv/d"});
  EXPECT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(BtrfsCheck(img), "");
}

}  // namespace
}  // namespace ubtrfs_test

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

uint64_t UsedBytes(const std::string& img) {
  auto fs = ubtrfs::Filesystem::Open(img);
  if (!fs.ok()) return 0;
  auto st = (*fs)->StatFs();
  return st.ok() ? st->used_bytes : 0;
}

// Subvolumes ubtrfs creates, lists and deletes: the kernel lists the same
// ids and paths, deleting a subvolume whose blocks a snapshot shares keeps
// the snapshot whole, and deleting the last holder gives the space back.
TEST(UbtrfsSubvolumes, CreateListDeleteAsTheKernelSeesThem) {
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  TempDir tmp("ubtrfs-subvols");
  const std::string img = tmp.Sub("img"), mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ASSERT_EQ(RunMkfs(img, "", 4096, "crc32c", 512ull << 20), "");
  const uint64_t used_empty = UsedBytes(img);
  uint64_t a_id = 0, snap_id = 0, nested_id = 0;
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ubtrfs::Filesystem& f = **fs;
    ubtrfs::NewInode attrs;
    attrs.mode = 0750;
    attrs.uid = 1234;
    auto a = f.CreateSubvolume(f.Root(), "a", attrs);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    a_id = a->root;
    EXPECT_EQ(f.CreateSubvolume(f.Root(), "a", attrs).status().code(), EEXIST);
    attrs.mode = 0644;
    auto d = f.Mkdir(*a, "d", ubtrfs::NewInode{0755});
    ASSERT_TRUE(d.ok());
    for (int i = 0; i < 400; ++i) {
      auto c = f.Create(*d, "f" + std::to_string(i), attrs);
      ASSERT_TRUE(c.ok());
      ASSERT_TRUE(f.Write(*c, 0, SpanOf(i % 40 == 0 ? SeededBytes(100000, i) : "small " + std::to_string(i))).ok());
    }
    auto nested = f.CreateSubvolume(*d, "nested", attrs);
    ASSERT_TRUE(nested.ok()) << nested.status().ToString();
    nested_id = nested->root;
    auto nf = f.Create(*nested, "in_nested", attrs);
    ASSERT_TRUE(nf.ok());
    ASSERT_TRUE(f.Write(*nf, 0, SpanOf(std::string("nested"))).ok());
    auto snap = f.CreateSnapshot(*a, f.Root(), "a_snap", false);
    ASSERT_TRUE(snap.ok()) << snap.status().ToString();
    snap_id = snap->root;

    auto list = f.ListSubvolumes();
    ASSERT_TRUE(list.ok()) << list.status().ToString();
    std::map<uint64_t, std::string> paths;
    for (const auto& s : *list) paths[s.id] = s.path;
    EXPECT_EQ(paths[a_id], "a");
    EXPECT_EQ(paths[nested_id], "a/d/nested");
    EXPECT_EQ(paths[snap_id], "a_snap");
    for (const auto& s : *list) {
      if (s.id == snap_id) {
        bool same = true;
        for (const auto& o : *list) if (o.id == a_id) same = o.uuid == s.parent_uuid;
        EXPECT_TRUE(same) << "the snapshot's parent uuid is a's uuid";
      }
      if (s.id == nested_id) {
        EXPECT_EQ(s.parent_id, a_id);
      }
    }
    // a holds nested: not deletable yet.
    EXPECT_EQ(f.DeleteSubvolume(f.Root(), "a").code(), ENOTEMPTY);
    EXPECT_EQ(f.DeleteSubvolume(*a, "d").code(), EINVAL);
    ASSERT_TRUE(f.DeleteSubvolume(*d, "nested").ok());
    // The snapshot changes; then a, which shares its blocks, goes.
    auto sd = f.Lookup("/a_snap/d");
    ASSERT_TRUE(sd.ok());
    for (int i = 0; i < 400; i += 3) ASSERT_TRUE(f.Unlink(*sd, "f" + std::to_string(i)).ok());
    ASSERT_TRUE(f.Commit().ok());
    ASSERT_TRUE(f.DeleteSubvolume(f.Root(), "a").ok());
    EXPECT_FALSE(f.Lookup("/a").ok());
  }
  ASSERT_EQ(BtrfsCheck(img), "");
  {
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok());
    EXPECT_EQ(ReadImageFile(**fs, "/a_snap/d/f1"), "small 1");
    EXPECT_TRUE(ReadImageFile(**fs, "/a_snap/d/f40") == SeededBytes(100000, 40)) << "content of /a_snap/d/f40";
    EXPECT_FALSE((*fs)->Lookup("/a_snap/d/f3").ok());
    auto list = (*fs)->ListSubvolumes();
    ASSERT_TRUE(list.ok());
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ((*list)[0].id, snap_id);
  }
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    CommandResult list = RunCommand({"btrfs", "subvolume", "list", mnt});
    ASSERT_TRUE(list.ok()) << list.Describe();
    EXPECT_NE(list.out.find("ID " + std::to_string(snap_id) + " "), std::string::npos) << list.out;
    EXPECT_NE(list.out.find("path a_snap"), std::string::npos) << list.out;
    EXPECT_EQ(list.out.find("path a\n"), std::string::npos) << list.out;
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok());
    CompareOptions opts = KernelMountCompareOptions();
    opts.skip_times = [](const std::string& rel) { return rel == "a_snap/d/nested"; };  // the kernel's placeholder
    auto mismatches = CompareTreeToImage(mnt, **fs, opts);
    EXPECT_TRUE(mismatches.empty()) << FormatMismatches(mismatches);
    // The kernel makes one, and ubtrfs deletes it.
    EXPECT_EQ(MustRun({"btrfs", "subvolume", "create", mnt + "/k"}), "");
    WriteHostFile(mnt + "/k/file", SeededBytes(50000, 3));
    EXPECT_EQ(m.Unmount(), "");
  }
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok());
    ASSERT_TRUE((*fs)->DeleteSubvolume((*fs)->Root(), "k").ok());
    ASSERT_TRUE((*fs)->DeleteSubvolume((*fs)->Root(), "a_snap").ok());
  }
  ASSERT_EQ(BtrfsCheck(img), "");
  // Every data extent and every tree block the subvolumes held is free
  // again (the trees ubtrfs keeps, e.g. the UUID tree, may hold a block more).
  const uint64_t used_end = UsedBytes(img);
  EXPECT_LE(used_end, used_empty + 8 * 4096) << "empty " << used_empty << " end " << used_end;
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    CommandResult list = RunCommand({"btrfs", "subvolume", "list", mnt});
    EXPECT_EQ(list.out, "") << list.Describe();
    EXPECT_EQ(m.Unmount(), "");
  }
}

}  // namespace
}  // namespace ubtrfs_test

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

CommandResult Cli(const std::vector<std::string>& args) { return RunUbtrfs(args); }

// `ubtrfs subvolume` on an image ubtrfs made: the kernel agrees with what
// create, snapshot, list and delete did; wrong uses exit non-zero.
TEST(SubvolumeCli, CreateSnapshotListDelete) {
  TempDir tmp("ubtrfs-subvol-cli");
  const std::string img = tmp.Sub("img"), host = tmp.Sub("f");
  ASSERT_EQ(truncate(img.c_str(), 0), -1);
  {
    std::ofstream f(img);
  }
  ASSERT_EQ(truncate(img.c_str(), 300 << 20), 0);
  ASSERT_TRUE(Cli({"mkfs", img}).ok());
  WriteHostFile(host, SeededBytes(70000, 11));
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"subvolume", "create", img + ":/a"},
           {"cp", host, img + ":/a/"},
           {"subvolume", "snapshot", "-r", img + ":/a", img + ":/snap"},
           {"subvolume", "snapshot", img + ":/a", img + ":/a"},
           {"rm", img + ":/a/f"}}) {
    CommandResult r = Cli(args);
    ASSERT_TRUE(r.ok()) << ShellJoin(args) << ": " << r.Describe();
  }
  EXPECT_EQ(BtrfsCheck(img), "");
  CommandResult list = Cli({"subvolume", "list", img});
  ASSERT_TRUE(list.ok()) << list.Describe();
  EXPECT_NE(list.out.find("top level 5 path a\n"), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("top level 5 path snap\n"), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("top level 256 path a/a\n"), std::string::npos) << list.out;
  CommandResult json = Cli({"subvolume", "list", "--json", img});
  EXPECT_NE(json.out.find("\"path\": \"snap\""), std::string::npos) << json.out;
  EXPECT_NE(json.out.find("\"read_only\": true"), std::string::npos) << json.out;
  // The read-only snapshot refuses; the writable one took the file along.
  EXPECT_FALSE(Cli({"rm", img + ":/snap/f"}).ok());
  EXPECT_EQ(Cli({"subvolume", "delete", img + ":/a"}).exit_code, 1);  // holds a/a: ENOTEMPTY
  EXPECT_NE(Cli({"subvolume", "delete", img + ":/nope"}).exit_code, 0);
  EXPECT_NE(Cli({"subvolume", "snapshot", img + ":/a"}).exit_code, 0);
  {
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok());
    EXPECT_TRUE(ReadImageFile(**fs, "/snap/f") == SeededBytes(70000, 11)) << "content of /snap/f";
    EXPECT_TRUE(ReadImageFile(**fs, "/a/a/f") == SeededBytes(70000, 11)) << "content of /a/a/f";
    EXPECT_FALSE((*fs)->Lookup("/a/f").ok());
  }
  ASSERT_TRUE(Cli({"subvolume", "delete", img + ":/a/a", img + ":/snap"}).ok());
  EXPECT_EQ(BtrfsCheck(img), "");
  list = Cli({"subvolume", "list", img});
  EXPECT_EQ(list.out, "ID 256 gen " + list.out.substr(11, list.out.find(' ', 11) - 11) + " top level 5 path a\n");
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "kernel view not compared: loop mounts unavailable: " << why;
  LoopMount m;
  const std::string mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
  CommandResult klist = RunCommand({"btrfs", "subvolume", "list", mnt});
  EXPECT_NE(klist.out.find("top level 5 path a\n"), std::string::npos) << klist.Describe();
  EXPECT_EQ(klist.out.find("snap"), std::string::npos) << klist.out;
  EXPECT_EQ(m.Unmount(), "");
}

}  // namespace
}  // namespace ubtrfs_test
