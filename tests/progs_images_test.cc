// Images that a newer btrfs-progs makes than CI's 6.2 (tests/fixtures,
// made by mkfs-6.19-compress.sh): mkfs.btrfs 6.19's own compressed extents
// (its lzo framing and inline compressed extents included), a subvolume of
// each kind its --subvol makes (rw, ro, default) and --inode-flags
// nodatacow. ubtrfs must read them as made and change them; its checker,
// btrfs check and a kernel mount then judge the image.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "support/host_files.h"
#include "support/kernel_view.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "ubtrfs/filesystem.h"

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using ubtrfs_test::BtrfsCheck;
using ubtrfs_test::CommandResult;
using ubtrfs_test::LoopMount;
using ubtrfs_test::ReadHostFile;
using ubtrfs_test::ReadImageFile;
using ubtrfs_test::RunCommand;
using ubtrfs_test::RunUbtrfs;
using ubtrfs_test::SpanOf;
using ubtrfs_test::TempDir;

constexpr uint64_t kInodeNoDataCow = 1u << 1;  // BTRFS_INODE_NODATACOW

// The fixture's files, as mkfs-6.19-compress.sh writes them.
std::string Doc(int i) {
  std::string s;
  for (int j = 1; j <= i * i * 30; ++j) s += "doc " + std::to_string(i) + " line " + std::to_string(j) + "\n";
  return s;
}

std::string RandomBin() {
  uint32_t x = 52;
  std::string s;
  for (int k = 0; k < 16384; ++k) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    s.push_back(static_cast<char>(x & 0xff));
  }
  return s;
}

// Paths from the top level, and what each file holds.
std::map<std::string, std::string> FixtureFiles() {
  std::map<std::string, std::string> f;
  for (int i = 1; i <= 16; ++i) f["/usr/share/doc/f" + std::to_string(i) + ".txt"] = Doc(i);
  f["/usr/share/doc/f3-link.txt"] = Doc(3);
  f["/etc/os-release"] = "ID=fixture\n";
  std::string abc;
  for (int k = 0; k < 1000; ++k) abc += "abc";
  f["/etc/small.txt"] = abc;
  std::string notes, db, cache;
  for (int j = 1; j <= 6000; ++j) {
    notes += "note " + std::to_string(j) + ": the quick brown fox " + std::to_string(j * 7 % 1000) + "\n";
  }
  for (int j = 1; j <= 8000; ++j) {
    char row[64];
    std::snprintf(row, sizeof row, "row %08d value %d\n", j, static_cast<int>(static_cast<int64_t>(j) * j % 99991));
    db += row;
  }
  for (int j = 1; j <= 3000; ++j) cache += "cache " + std::to_string(j) + "\n";
  f["/home/user/notes.txt"] = notes;
  f["/home/user/random.bin"] = RandomBin();
  f["/srv/data/db.bin"] = db;
  f["/var/cache/c.txt"] = cache;
  std::string sparse((3u << 20) + 3, '\0');
  sparse.replace(1u << 20, 8192, std::string(8192, 's'));
  sparse.replace(3u << 20, 3, "end");
  f["/srv/data/sparse"] = sparse;
  return f;
}

Result<std::unique_ptr<Filesystem>> OpenTop(const std::string& img, bool writable) {
  OpenOptions o;
  o.writable = writable;
  o.subvolid = 5;
  return Filesystem::Open(img, o);
}

void ExpectFiles(Filesystem& fs, const std::map<std::string, std::string>& files, const std::string& when) {
  for (const auto& [path, bytes] : files) {
    EXPECT_TRUE(ReadImageFile(fs, path) == bytes) << when << ": " << path << " reads differently";
  }
}

class ProgsImages : public ::testing::TestWithParam<const char*> {};

TEST_P(ProgsImages, Mkfs619CompressedSubvolumesReadAndChange) {
  const std::string alg = GetParam();
  TempDir tmp("ubtrfs-progs-" + alg);
  const std::string img = tmp.Sub("img");
  CommandResult z = RunCommand({"zstd", "-q", "-d",
                                std::string(UBTRFS_SOURCE_DIR) + "/tests/fixtures/mkfs-6.19-" + alg + ".img.zst", "-o", img});
  if (z.exit_code == -1) GTEST_SKIP() << "zstd is not installed";
  ASSERT_TRUE(z.ok()) << z.Describe();
  std::map<std::string, std::string> files = FixtureFiles();

  {  // As mkfs.btrfs made it.
    auto fs = OpenTop(img, false);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    Filesystem& f = **fs;
    ExpectFiles(f, files, "as made");
    auto link = f.Lookup("/usr/os-release");
    ASSERT_TRUE(link.ok());
    auto target = f.ReadLink(*link);
    ASSERT_TRUE(target.ok()) << target.status().ToString();
    EXPECT_EQ(*target, "../etc/os-release");
    auto stat_of = [&](const std::string& path) -> Result<Stat> {
      auto id = f.Lookup(path);
      if (!id.ok()) return id.status();
      return f.GetStat(*id);
    };
    auto a = stat_of("/usr/share/doc/f3.txt");
    auto b = stat_of("/usr/share/doc/f3-link.txt");
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->id.ino, b->id.ino);
    EXPECT_EQ(a->nlink, 2u);
    auto rnd = stat_of("/home/user/random.bin");
    ASSERT_TRUE(rnd.ok());
    EXPECT_NE(rnd->flags & kInodeNoDataCow, 0u) << "--inode-flags nodatacow is lost";
    auto subvols = f.ListSubvolumes();
    ASSERT_TRUE(subvols.ok()) << subvols.status().ToString();
    std::map<std::string, SubvolumeInfo> by_path;
    for (const SubvolumeInfo& s : *subvols) by_path[s.path] = s;
    ASSERT_TRUE(by_path.count("home") && by_path.count("srv") && by_path.count("var"));
    EXPECT_FALSE(by_path["home"].read_only);
    EXPECT_TRUE(by_path["srv"].read_only);
    auto def = f.DefaultSubvolume();
    ASSERT_TRUE(def.ok()) << def.status().ToString();
    EXPECT_EQ(*def, by_path["var"].id);
  }
  {  // Without subvol=/subvolid=, paths start at the default subvolume.
    auto fs = Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    EXPECT_TRUE(ReadImageFile(**fs, "/cache/c.txt") == files["/var/cache/c.txt"]);
  }

  {  // Changes inside mkfs.btrfs's compressed extents, inline ones included.
    auto fs = OpenTop(img, true);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    Filesystem& f = **fs;
    auto write = [&](const std::string& path, uint64_t off, const std::string& bytes) {
      auto id = f.Lookup(path);
      ASSERT_TRUE(id.ok()) << path;
      auto n = f.Write(*id, off, SpanOf(bytes));
      ASSERT_TRUE(n.ok()) << path << ": " << n.status().ToString();
      std::string& model = files[path];
      if (model.size() < off + bytes.size()) model.resize(off + bytes.size(), '\0');
      model.replace(off, bytes.size(), bytes);
    };
    write("/home/user/notes.txt", 100000, "PATCHED");
    write("/usr/share/doc/f1.txt", files["/usr/share/doc/f1.txt"].size(), Doc(7));
    write("/home/user/random.bin", 4096, std::string(8192, 'n'));  // nodatacow: in place
    std::string xyz;
    for (int k = 0; k < 500; ++k) xyz += "xyz";
    write("/etc/small.txt", 0, xyz);
    write("/var/cache/c.txt", 20000, "changed in the default subvolume");
    // The hard link's other name sees the change.
    write("/usr/share/doc/f3.txt", 10, "LINKED");
    files["/usr/share/doc/f3-link.txt"] = files["/usr/share/doc/f3.txt"];

    auto f10 = f.Lookup("/usr/share/doc/f10.txt");
    ASSERT_TRUE(f10.ok());
    AttrChange cut;
    cut.size = 5000;  // inside a compressed extent
    ASSERT_TRUE(f.SetAttr(*f10, cut).ok());
    files["/usr/share/doc/f10.txt"].resize(5000);

    auto doc = f.Lookup("/usr/share/doc");
    auto etc = f.Lookup("/etc");
    ASSERT_TRUE(doc.ok() && etc.ok());
    ASSERT_TRUE(f.Unlink(*doc, "f5.txt").ok());
    files.erase("/usr/share/doc/f5.txt");
    ASSERT_TRUE(f.Rename(*doc, "f6.txt", *etc, "f6.txt").ok());
    files["/etc/f6.txt"] = files["/usr/share/doc/f6.txt"];
    files.erase("/usr/share/doc/f6.txt");

    // --subvol ro: is read-only here too.
    auto db = f.Lookup("/srv/data/db.bin");
    ASSERT_TRUE(db.ok());
    auto refused = f.Write(*db, 0, SpanOf(std::string("x")));
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), EROFS) << refused.status().ToString();
    ASSERT_TRUE(f.Commit().ok());
  }

  CommandResult ours = RunUbtrfs({"check", img});
  EXPECT_EQ(ours.exit_code, 0) << ours.Describe();
  EXPECT_EQ(BtrfsCheck(img), "");
  {
    auto fs = OpenTop(img, false);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ExpectFiles(**fs, files, "after the changes");
    EXPECT_FALSE((*fs)->Lookup("/usr/share/doc/f5.txt").ok());
  }

  const std::string mnt = tmp.Sub("mnt");
  LoopMount m;
  if (!ubtrfs_test::MountKernelView(m, img, mnt, "ro,subvolid=5")) return;
  for (const auto& [path, bytes] : files) {
    EXPECT_TRUE(ReadHostFile(mnt + path) == bytes) << "the kernel reads " << path << " differently";
  }
  struct stat st;
  EXPECT_NE(stat((mnt + "/usr/share/doc/f5.txt").c_str(), &st), 0);
  EXPECT_EQ(m.Unmount(), "");
}

INSTANTIATE_TEST_SUITE_P(Algorithms, ProgsImages, ::testing::Values("zstd", "lzo"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace UBTRFS_UNITY_ID
