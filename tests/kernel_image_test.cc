// Images written by the Linux kernel: mkfs an empty image, loop-mount it, fill
// it through the kernel (generated tree, zlib/lzo/zstd compressed files,
// reflinks, subvolumes and snapshots, preallocated extents, nodatasum files,
// many extents, maximal xattrs), unmount, then read it with ubtrfs and compare
// with a read-only kernel mount of the same image: every attribute (incl.
// ctime/atime/otime, inode numbers, directory sizes, allocated bytes, readdir
// order) and every byte.
//
// Needs root and working loop mounts; skipped otherwise.
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "support/tree_gen.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

constexpr uint64_t kInodeNodatasum = 1ull << 0;
constexpr uint64_t kInodeNodatacow = 1ull << 1;

// ---- small file-writing helpers that fail the test with errno context -----

std::string Pattern(size_t n, int kind, uint64_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 12345;
  for (size_t i = 0; i < n; ++i) {
    switch (kind) {
      case 0:  // compressible text
        s[i] = "Lorem ipsum dolor sit amet, consectetur adipiscing elit.\n"[(i + seed) % 57];
        break;
      case 1:  // incompressible
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s[i] = static_cast<char>(x >> 24);
        break;
      case 2:  // zeros
        break;
      default:  // 64 KiB random / 64 KiB text alternating
        if ((i >> 16) & 1) {
          s[i] = static_cast<char>('a' + (i % 7));
        } else {
          x ^= x << 13;
          x ^= x >> 7;
          x ^= x << 17;
          s[i] = static_cast<char>(x >> 24);
        }
    }
  }
  return s;
}

class Writer {
 public:
  void Write(const std::string& path, uint64_t off, const std::string& data, bool create = true) {
    int fd = open(path.c_str(), O_WRONLY | (create ? O_CREAT : 0) | O_CLOEXEC, 0644);
    if (fd < 0) return Fail("open", path);
    if (!data.empty() && pwrite(fd, data.data(), data.size(), static_cast<off_t>(off)) != static_cast<ssize_t>(data.size()))
      Fail("pwrite", path);
    close(fd);
  }
  void Fsync(const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) Fail("fsync", path);
    if (fd >= 0) close(fd);
  }
  void Truncate(const std::string& path, uint64_t size) {
    if (truncate(path.c_str(), static_cast<off_t>(size)) != 0) Fail("truncate", path);
  }
  void Fallocate(const std::string& path, int mode, uint64_t off, uint64_t len) {
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || fallocate(fd, mode, static_cast<off_t>(off), static_cast<off_t>(len)) != 0) Fail("fallocate", path);
    if (fd >= 0) close(fd);
  }
  void CloneRange(const std::string& from, uint64_t from_off, uint64_t len, const std::string& to, uint64_t to_off) {
    int s = open(from.c_str(), O_RDONLY | O_CLOEXEC);
    int d = open(to.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (s < 0 || d < 0) {
      Fail("open for clone", s < 0 ? from : to);
    } else {
      struct file_clone_range r = {s, from_off, len, to_off};
      if (ioctl(d, FICLONERANGE, &r) != 0) Fail("FICLONERANGE", to);
    }
    if (s >= 0) close(s);
    if (d >= 0) close(d);
  }
  void Mkdir(const std::string& path) {
    if (mkdir(path.c_str(), 0755) != 0) Fail("mkdir", path);
  }
  void Run(const std::vector<std::string>& argv) {
    CommandResult r = RunCommand(argv);
    if (!r.ok()) errors_.push_back(fmt::format("{}: {}", ShellJoin(argv), r.Describe()));
  }
  void SetXattr(const std::string& path, const std::string& name, const std::string& value) {
    if (lsetxattr(path.c_str(), name.c_str(), value.data(), value.size(), 0) != 0)
      Fail("setxattr " + name + fmt::format(" ({} bytes)", value.size()), path);
  }
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  void Fail(const std::string& what, const std::string& path) {
    errors_.push_back(fmt::format("{} {}: {}", what, path, strerror(errno)));
  }
  std::vector<std::string> errors_;
};

// Files that exercise compressed extents: inline compressed, exactly one
// 128 KiB compressed extent, many extents, incompressible data, partial
// overwrites and truncation inside compressed extents, holes, and clones that
// reference compressed extents at an offset.
void WriteCompressionFiles(Writer& w, const std::string& dir) {
  struct F {
    const char* name;
    size_t size;
    int kind;
  };
  static const F kFiles[] = {
      {"tiny", 10, 0},          {"inline_1000", 1000, 0}, {"inline_2000", 2000, 0}, {"text_3000", 3000, 0},
      {"text_4096", 4096, 0},   {"text_5000", 5000, 0},   {"text_128k", 131072, 0}, {"text_128k_1", 131073, 0},
      {"text_3m", 3145728 + 123, 0}, {"random_1m", 1048576, 1}, {"random_100", 100, 1}, {"zeros_1m", 1048576, 2},
      {"mixed_2m", 2097152 + 17, 3}};
  for (const auto& f : kFiles) w.Write(dir + "/" + f.name, 0, Pattern(f.size, f.kind, f.size));
  // Overwrite the middle of a compressed extent after it reached the disk.
  std::string ow = dir + "/overwritten";
  w.Write(ow, 0, Pattern(1048576, 0, 7));
  w.Fsync(ow);
  w.Write(ow, 300001, Pattern(5000, 1, 8), false);
  w.Fsync(ow);
  w.Write(ow, 700000, Pattern(70000, 0, 9), false);
  w.Truncate(ow, 900001);
  // Holes between compressed extents.
  std::string holes = dir + "/holes";
  w.Write(holes, 0, Pattern(200000, 0, 10));
  w.Write(holes, 1500000, Pattern(100000, 3, 11), false);
  w.Truncate(holes, 2097152 + 5);
  // Clones of compressed extents, at an offset into them.
  w.Fsync(dir + "/text_3m");
  w.Write(dir + "/cloned", 0, Pattern(4096 * 40, 1, 12));
  w.CloneRange(dir + "/text_3m", 131072, 262144, dir + "/cloned", 65536);
  w.CloneRange(dir + "/text_3m", 1048576, 4096 * 3, dir + "/cloned", 4096 * 39);
}

void FillImage(Writer& w, const std::string& mnt, uint32_t nodesize) {
  // 1. The generated tree (every kind of entry, xattrs, odd names, ...).
  w.Mkdir(mnt + "/tree");
  try {
    GenerateTree(mnt + "/tree", 777, ScaledTreeOptions(2000));
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }

  // 2. A subvolume with a tree and a nested subvolume; a writable snapshot
  //    that is then changed (shared and unshared extents, a placeholder for
  //    the nested subvolume) and a read-only snapshot.
  w.Run({"btrfs", "subvolume", "create", mnt + "/subvol"});
  w.Mkdir(mnt + "/subvol/tree");
  try {
    GenerateTree(mnt + "/subvol/tree", 778, ScaledTreeOptions(300));
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  w.Run({"btrfs", "subvolume", "create", mnt + "/subvol/nested"});
  w.Write(mnt + "/subvol/nested/inner_file", 0, Pattern(50000, 1, 13));
  w.Mkdir(mnt + "/subvol/nested/dir");
  w.Write(mnt + "/subvol/nested/dir/small", 0, "small file in a nested subvolume\n");
  w.Run({"sync"});
  w.Run({"btrfs", "subvolume", "snapshot", mnt + "/subvol", mnt + "/snap"});
  w.Run({"btrfs", "subvolume", "snapshot", "-r", mnt + "/subvol", mnt + "/snap_ro"});
  w.Write(mnt + "/snap/tree/sizes/size_1048577", 4096 * 10 + 5, Pattern(10000, 1, 14), false);
  w.Write(mnt + "/snap/new_in_snapshot", 0, Pattern(3000, 0, 15));
  if (unlink((mnt + "/snap/tree/sizes/size_4097").c_str()) != 0)
    ADD_FAILURE() << "unlink in snapshot: " << strerror(errno);

  // 3. Preallocated extents, partly written; prealloc past EOF; punched holes.
  std::string pre = mnt + "/prealloc";
  w.Mkdir(pre);
  w.Fallocate(pre + "/partly_written", 0, 0, 1048576);
  w.Write(pre + "/partly_written", 4096 + 100, Pattern(10000, 1, 16), false);
  w.Fsync(pre + "/partly_written");
  w.Write(pre + "/partly_written", 700000, Pattern(3, 0, 17), false);
  w.Fallocate(pre + "/only_prealloc", 0, 0, 3 * 1048576 + 4096);
  w.Write(pre + "/past_eof", 0, Pattern(20000, 1, 18));
  w.Fallocate(pre + "/past_eof", FALLOC_FL_KEEP_SIZE, 20000, 1048576);
  w.Write(pre + "/punched", 0, Pattern(1048576, 1, 19));
  w.Fsync(pre + "/punched");
  w.Fallocate(pre + "/punched", FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 5000, 200000);
  w.Fallocate(pre + "/punched", FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1048576 - 4096, 4096);

  // 4. nodatasum (chattr +C: NODATACOW implies NODATASUM): inherited from a
  //    directory, and set on an empty file.
  std::string nocow = mnt + "/nocow";
  w.Mkdir(nocow);
  w.Run({"chattr", "+C", nocow});
  w.Write(nocow + "/inherited", 0, Pattern(300000, 1, 20));
  w.Write(nocow + "/small", 0, Pattern(1500, 0, 21));
  w.Write(mnt + "/nocow_file", 0, "");
  w.Run({"chattr", "+C", mnt + "/nocow_file"});
  w.Write(mnt + "/nocow_file", 0, Pattern(2 * 1048576 + 3, 1, 22), false);

  // 5. Many extents in one file (gaps keep them apart): extent items span
  //    many leaves. Inline data followed by growth.
  std::string misc = mnt + "/misc";
  w.Mkdir(misc);
  {
    std::string p = misc + "/many_extents";
    std::string block = Pattern(4096, 1, 23);
    int fd = open(p.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      ADD_FAILURE() << "open " << p << ": " << strerror(errno);
    } else {
      for (int i = 0; i < 1500; ++i) {
        block[0] = static_cast<char>(i);
        block[1] = static_cast<char>(i >> 8);
        if (pwrite(fd, block.data(), block.size(), static_cast<off_t>(i) * 8192) != 4096) {
          ADD_FAILURE() << "pwrite " << p << ": " << strerror(errno);
          break;
        }
      }
      close(fd);
    }
  }
  w.Write(misc + "/inline_then_truncated_up", 0, Pattern(100, 0, 24));
  w.Fsync(misc + "/inline_then_truncated_up");
  w.Truncate(misc + "/inline_then_truncated_up", 10000);
  w.Write(misc + "/inline_then_extended", 0, Pattern(100, 0, 25));
  w.Fsync(misc + "/inline_then_extended");
  w.Write(misc + "/inline_then_extended", 8192, Pattern(10, 0, 26), false);
  // The largest xattr value that fits in one leaf item, and many xattrs.
  const std::string xname = "user.max";
  size_t max_value = nodesize - 101 /*header*/ - 25 /*item*/ - 30 /*dir_item*/ - xname.size();
  max_value = std::min<size_t>(max_value, 65536);
  w.Write(misc + "/xattr_max", 0, "x");
  w.SetXattr(misc + "/xattr_max", xname, Pattern(max_value, 1, 27));
  w.Write(misc + "/xattr_many", 0, "");
  for (int i = 0; i < 300; ++i) w.SetXattr(misc + "/xattr_many", fmt::format("user.attr{:04d}", i), Pattern(i, 1, i));
  // Renames and deletions leave gaps in DIR_INDEX numbering.
  for (int i = 0; i < 50; ++i) w.Write(misc + fmt::format("/churn{:02d}", i), 0, Pattern(i * 10, 0, i));
  for (int i = 0; i < 50; i += 2) unlink((misc + fmt::format("/churn{:02d}", i)).c_str());
  for (int i = 1; i < 50; i += 4)
    rename((misc + fmt::format("/churn{:02d}", i)).c_str(), (misc + fmt::format("/renamed{:02d}", i)).c_str());

  // 6. Compression: per-directory property (zlib, lzo, zstd), chattr +c,
  //    and a compress-force mount option.
  for (const char* alg : {"zlib", "lzo", "zstd"}) {
    std::string d = mnt + "/comp_" + alg;
    w.Mkdir(d);
    w.Run({"btrfs", "property", "set", d, "compression", alg});
    WriteCompressionFiles(w, d);
  }
  w.Mkdir(mnt + "/comp_chattr");
  w.Run({"chattr", "+c", mnt + "/comp_chattr"});
  WriteCompressionFiles(w, mnt + "/comp_chattr");
  w.Run({"sync"});
  w.Run({"mount", "-o", "remount,compress-force=zstd:9", mnt});
  w.Mkdir(mnt + "/comp_force_zstd");
  WriteCompressionFiles(w, mnt + "/comp_force_zstd");
  w.Run({"sync"});
  w.Run({"mount", "-o", "remount,compress-force=lzo", mnt});
  w.Mkdir(mnt + "/comp_force_lzo");
  WriteCompressionFiles(w, mnt + "/comp_force_lzo");
  w.Run({"sync"});
}

struct KernelCase {
  const char* name;
  uint32_t nodesize;
  const char* csum;
  std::vector<std::string> mkfs_extra;
};

void PrintTo(const KernelCase& c, std::ostream* os) { *os << c.name; }

class KernelImageTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(KernelImageTest, KernelWrittenImageReadsLikeTheKernel) {
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  const KernelCase& kc = GetParam();
  TempDir tmp("ubtrfs-kernel");
  std::string image = tmp.Sub("image.img"), mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  std::string err = RunMkfs(image, "", kc.nodesize, kc.csum, 1ull << 30, kc.mkfs_extra);
  ASSERT_TRUE(err.empty()) << err;

  {
    LoopMount m;
    std::string e = m.Mount(image, mnt);
    ASSERT_TRUE(e.empty()) << e;
    Writer w;
    FillImage(w, mnt, kc.nodesize);
    for (const auto& x : w.errors()) ADD_FAILURE() << "filling the image: " << x;
    e = m.Unmount();
    ASSERT_TRUE(e.empty()) << e;
  }

  auto fs = ubtrfs::Filesystem::Open(image);
  ASSERT_TRUE(fs.ok()) << "Open(" << image << "): " << fs.status().ToString();
  ubtrfs::Filesystem& f = **fs;
  EXPECT_TRUE(f.Warnings().empty()) << "unexpected warning: " << f.Warnings().front();
  EXPECT_EQ(f.Info().nodesize, kc.nodesize);

  LoopMount ro;
  std::string e = ro.Mount(image, mnt, "ro");
  ASSERT_TRUE(e.empty()) << e;

  CompareOptions opts = KernelMountCompareOptions();
  // In a snapshot, the entry of a subvolume nested in the snapshotted
  // subvolume is not a link to that subvolume (its ROOT_BACKREF names the
  // original parent): the kernel shows an empty directory (inode 2) whose
  // times are made up when the inode is instantiated, so only those cannot be
  // compared.
  opts.skip_times = [](const std::string& rel) { return rel == "snap/nested" || rel == "snap_ro/nested"; };
  CompareStats cs;
  auto mismatches = CompareTreeToImage(mnt, f, opts, "/", &cs);
  EXPECT_TRUE(mismatches.empty()) << "kernel mount " << mnt << " vs ubtrfs reading " << image << ": "
                                  << FormatMismatches(mismatches);
  EXPECT_GT(cs.entries, 2500u);

  // A comparison rooted inside a subvolume (paths through it).
  auto sub = CompareTreeToImage(mnt + "/snap/tree", f, KernelMountCompareOptions(), "/snap/tree");
  EXPECT_TRUE(sub.empty()) << "rooted at /snap/tree: " << FormatMismatches(sub);

  // Subvolumes are separate trees: different InodeId.root, ino 256 at the top.
  for (const char* p : {"/subvol", "/subvol/nested", "/snap", "/snap_ro"}) {
    auto id = f.Lookup(p);
    ASSERT_TRUE(id.ok()) << p << ": " << id.status().ToString();
    EXPECT_NE(id->root, f.Root().root) << p;
    EXPECT_EQ(id->ino, 256u) << p;
  }
  // nodatasum flags.
  for (const char* p : {"/nocow/inherited", "/nocow_file"}) {
    auto id = f.Lookup(p);
    ASSERT_TRUE(id.ok()) << p << ": " << id.status().ToString();
    auto st = f.GetStat(*id);
    ASSERT_TRUE(st.ok()) << p << ": " << st.status().ToString();
    EXPECT_EQ(st->flags & (kInodeNodatasum | kInodeNodatacow), kInodeNodatasum | kInodeNodatacow)
        << p << " flags 0x" << std::hex << st->flags;
  }
  // statfs agrees with the kernel's, to the block; on this read-only loop
  // device the kernel counts nothing of the data chunks' free space as
  // available (tests/statfs_kernel_test.cc compares avail too, on mounts of
  // writable devices).
  auto sfs = f.StatFs();
  ASSERT_TRUE(sfs.ok()) << sfs.status().ToString();
  struct statvfs sv;
  ASSERT_EQ(statvfs(mnt.c_str(), &sv), 0);
  EXPECT_EQ(sfs->block_size, sv.f_bsize);
  EXPECT_EQ(sfs->node_size, kc.nodesize);
  EXPECT_EQ(sfs->name_max, sv.f_namemax);
  EXPECT_EQ(sfs->total_bytes, sv.f_blocks * sv.f_frsize);
  EXPECT_EQ(sfs->free_bytes, sv.f_bfree * sv.f_frsize);
  EXPECT_LE(sv.f_bavail * sv.f_frsize, sfs->avail_bytes);

  e = ro.Unmount();
  EXPECT_TRUE(e.empty()) << e;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, KernelImageTest,
    ::testing::Values(KernelCase{"node16k_crc32c", 16384, "crc32c", {}},
                      KernelCase{"node4k_xxhash_holes", 4096, "xxhash", {"-O", "^no-holes"}},
                      KernelCase{"node64k_blake2", 65536, "blake2", {}}),
    [](const ::testing::TestParamInfo<KernelCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ubtrfs_test
