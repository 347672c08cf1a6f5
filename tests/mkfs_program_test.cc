// mkfs.ubtrfs, the mkfs verb as a program of its own (src/cli/mkfs_main.cc):
// it must make the very image `ubtrfs mkfs` makes from the same arguments,
// and take and refuse what the verb takes and refuses. And the library call
// both are made of (ubtrfs::Mkfs, include/ubtrfs/mkfs.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "support/tree_gen.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/mkfs.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif
#ifndef UBTRFS_MKFS_PATH
#error "UBTRFS_MKFS_PATH must name the mkfs.ubtrfs executable"
#endif

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

const std::string kCli = UBTRFS_CLI_PATH;
const std::string kMkfs = UBTRFS_MKFS_PATH;

// Runs `ubtrfs mkfs ARGS IMG` or `mkfs.ubtrfs ARGS IMG` with a fixed
// SOURCE_DATE_EPOCH, so that two runs can be compared byte for byte.
CommandResult Build(bool program, const std::vector<std::string>& args, const std::string& img) {
  std::vector<std::string> argv = {"env", "SOURCE_DATE_EPOCH=1700000000"};
  if (program) {
    argv.push_back(kMkfs);
  } else {
    argv.insert(argv.end(), {kCli, "mkfs"});
  }
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(img);
  return RunCommand(argv);
}

TEST(MkfsProgram, MakesTheImageTheMkfsVerbMakes) {
  TempDir dir("ubtrfs-mkfs-program");
  const std::string src = dir.Sub("src");
  ASSERT_EQ(::mkdir(src.c_str(), 0755), 0);
  GenerateTree(src, 23, ScaledTreeOptions(300));
  // Times in the past, then every file and symbolic link read once: a read
  // sets the atime where it is not after the mtime (relatime), and the
  // first build must not change what the second sees.
  auto r = RunCommand({"find", src, "-exec", "touch", "-h", "-d", "@1600000000", "{}", "+"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  r = RunCommand({"sh", "-c", "find \"$0\" -type f -exec cat {} + >/dev/null; find \"$0\" -type l -exec readlink {} + >/dev/null", src});
  ASSERT_TRUE(r.ok()) << r.Describe();
  // Plain data, compressed data (the entropy test decides what is stored
  // plain), a shrunk image with another checksum and a subvolume.
  const std::vector<std::vector<std::string>> cases = {
      {"-q", "--size", "256M", "--rootdir", src},
      {"-q", "--size", "256M", "--compress", "zstd", "--rootdir", src},
      {"-q", "--shrink", "--csum", "blake2", "--compress", "lzo", "-L", "x", "--rootdir", src},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(ShellJoin(cases[i]));
    const std::string a = dir.Sub("verb" + std::to_string(i) + ".img");
    const std::string b = dir.Sub("program" + std::to_string(i) + ".img");
    r = Build(false, cases[i], a);
    ASSERT_TRUE(r.ok()) << r.Describe();
    r = Build(true, cases[i], b);
    ASSERT_TRUE(r.ok()) << r.Describe();
    EXPECT_EQ(r.out, "") << "-q prints nothing";
    EXPECT_EQ(Sha256(a), Sha256(b));
    auto fs = ubtrfs::Filesystem::Open(b);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto mism = CompareTreeToImage(src, **fs, CompareOptions{});
    EXPECT_TRUE(mism.empty()) << FormatMismatches(mism);
    if (HaveBtrfsProgs()) {
      EXPECT_EQ(BtrfsCheck(b), "");
    }
  }
}

// A --rootdir of many entries restarts the program with its heap in huge
// pages (cli/huge_pages.h): the image is the one it makes without.
TEST(MkfsProgram, ALargeTreeMakesTheSameImageWithHugePages) {
  TempDir dir("ubtrfs-mkfs-huge");
  const std::string src = dir.Sub("src");
  ASSERT_EQ(::mkdir(src.c_str(), 0755), 0);
  for (int d = 0; d < 3; ++d) {
    const std::string sub = src + "/d" + std::to_string(d);
    ASSERT_EQ(::mkdir(sub.c_str(), 0755), 0);
    for (int i = 0; i < 3400; ++i) {
      const std::string f = sub + "/f" + std::to_string(i);
      const int fd = ::open(f.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
      ASSERT_GE(fd, 0) << f;
      ::close(fd);
    }
  }
  auto r = RunCommand({"find", src, "-exec", "touch", "-h", "-d", "@1600000000", "{}", "+"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  const std::vector<std::string> args = {"-q", "--size", "256M", "--rootdir", src};
  const std::string tuned = dir.Sub("tuned.img"), plain = dir.Sub("plain.img");
  r = Build(true, args, tuned);
  ASSERT_TRUE(r.ok()) << r.Describe();
  std::vector<std::string> argv = {"env", "UBTRFS_HUGE_PAGES=0", "SOURCE_DATE_EPOCH=1700000000", kMkfs};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(plain);
  r = RunCommand(argv);
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(Sha256(tuned), Sha256(plain));
  auto fs = ubtrfs::Filesystem::Open(tuned);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto mism = CompareTreeToImage(src, **fs, CompareOptions{});
  EXPECT_TRUE(mism.empty()) << FormatMismatches(mism);
}

TEST(MkfsProgram, RefusesWhatTheVerbRefuses) {
  TempDir dir("ubtrfs-mkfs-program-errors");
  const std::string img = dir.Sub("x.img");
  // No image: a usage error naming what is missing.
  auto r = RunCommand({kMkfs});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("image"), std::string::npos) << r.Describe();
  // The help is mkfs's options under the program's own name.
  r = RunCommand({kMkfs, "--help"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("Usage: mkfs.ubtrfs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--rootdir"), std::string::npos) << r.out;
  // A bad value, a missing rootdir.
  r = RunCommand({kMkfs, "-q", "--size", "256M", "--csum", "md5", img});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("md5"), std::string::npos) << r.Describe();
  EXPECT_EQ(r.err.rfind("mkfs.ubtrfs: ", 0), 0u) << "errors are under the program's name: " << r.err;
  r = RunCommand({kMkfs, "-q", "--size", "256M", "--rootdir", dir.Sub("missing"), img});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("missing"), std::string::npos) << r.Describe();
  // An existing filesystem stays unless -f.
  r = RunCommand({kMkfs, "-q", "--size", "256M", "-L", "first", img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  const std::string before = Sha256(img);
  r = RunCommand({kMkfs, "-q", "-L", "second", img});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(Sha256(img), before);
  r = RunCommand({kMkfs, "-q", "-f", "-L", "second", img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  auto fs = ubtrfs::Filesystem::Open(img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  EXPECT_EQ((*fs)->Info().label, "second");
}

// A program that builds images calls the library: the same bytes as the
// command from the same values, a report of what was made, and afterwards
// the real clock again for what it writes next.
TEST(MkfsApi, TheLibraryCallMakesWhatTheProgramMakes) {
  TempDir dir("ubtrfs-mkfs-api");
  const std::string src = dir.Sub("src");
  ASSERT_EQ(::mkdir(src.c_str(), 0755), 0);
  GenerateTree(src, 29, ScaledTreeOptions(200));
  ASSERT_EQ(::mkdir((src + "/sv").c_str(), 0755), 0);
  auto r = RunCommand({"find", src, "-exec", "touch", "-h", "-d", "@1600000000", "{}", "+"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  r = RunCommand({"sh", "-c", "find \"$0\" -type f -exec cat {} + >/dev/null; find \"$0\" -type l -exec readlink {} + >/dev/null", src});
  ASSERT_TRUE(r.ok()) << r.Describe();

  ubtrfs::MkfsSpec spec;
  spec.images = {dir.Sub("api.img")};
  spec.size = 256ull << 20;
  spec.label = "built";
  spec.rootdir = src;
  spec.compress = "zstd";
  spec.subvols = {"ro:sv"};
  spec.source_date_epoch = 1700000000;
  ubtrfs::MkfsReport report;
  ubtrfs::Status s = ubtrfs::Mkfs(spec, &report);
  ASSERT_TRUE(s.ok()) << s.ToString();
  r = Build(true, {"-q", "--size", "256M", "-L", "built", "--rootdir", src, "--compress", "zstd", "--subvol", "ro:sv"},
            dir.Sub("program.img"));
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(Sha256(dir.Sub("api.img")), Sha256(dir.Sub("program.img")));

  EXPECT_EQ(report.label, "built");
  EXPECT_EQ(report.nodesize, 16384u);
  EXPECT_EQ(report.csum, "crc32c");
  ASSERT_EQ(report.devices.size(), 1u);
  EXPECT_EQ(report.devices[0].second, 256ull << 20);
  EXPECT_TRUE(report.imported);
  EXPECT_GT(report.import.files, 0u);
  ASSERT_EQ(report.subvols.size(), 1u);
  EXPECT_EQ(report.subvols[0].path, "sv");
  EXPECT_TRUE(report.subvols[0].read_only);
  auto fs = ubtrfs::Filesystem::Open(spec.images[0]);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  EXPECT_EQ((*fs)->Info().fsid, report.fsid);
  fs->reset();

  // Refused: an existing filesystem without force (EEXIST, nothing
  // written), and a bad value naming its option.
  const std::string before = Sha256(spec.images[0]);
  s = ubtrfs::Mkfs(spec);
  EXPECT_EQ(s.code(), EEXIST) << s.ToString();
  EXPECT_EQ(Sha256(spec.images[0]), before);
  ubtrfs::MkfsSpec bad;
  bad.images = {dir.Sub("bad.img")};
  bad.size = 256ull << 20;
  bad.data_profile = "raid7";
  s = ubtrfs::Mkfs(bad);
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("raid7"), std::string::npos) << s.ToString();
  struct stat st;
  EXPECT_NE(::stat(bad.images[0].c_str(), &st), 0) << "nothing created for a refused spec";

  // After the deterministic build the clock is the real one again.
  ubtrfs::MkfsSpec plain;
  plain.images = {dir.Sub("plain.img")};
  plain.size = 256ull << 20;
  ASSERT_TRUE(ubtrfs::Mkfs(plain).ok());
  ubtrfs::OpenOptions oo;
  oo.writable = true;
  fs = ubtrfs::Filesystem::Open(plain.images[0], oo);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto made = (*fs)->Create((*fs)->Root(), "new", ubtrfs::NewInode{});
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  auto attr = (*fs)->GetStat(*made);
  ASSERT_TRUE(attr.ok()) << attr.status().ToString();
  EXPECT_GT(attr->mtime.sec, ::time(nullptr) - 600) << "a file made after the deterministic mkfs has the epoch's time";
}

}  // namespace
}  // namespace ubtrfs_test
