// Compression on write (OpenOptions::compress, mkfs --rootdir --compress,
// mount -o compress=) with btrfs check and the kernel as judges: every file
// reads back equal through ubtrfs and a kernel loop mount, the extent items
// (btrfs inspect-internal dump-tree) really are compressed where the data
// is text and plain where it is random, and a text tree takes about the data
// space the kernel's compress=zstd gives it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "format/ondisk.h"
#include "support/fuse_mount.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/import.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using ubtrfs_test::BtrfsCheck;
using ubtrfs_test::LoopMount;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

const std::string kCli = UBTRFS_CLI_PATH;

// Text-like data: words from a small vocabulary, deterministic per seed.
std::string Text(size_t n, uint32_t seed) {
  static const char* kWords[] = {"extent", "btrfs", "the", "of", "compression", "sector", "kernel", "inode",
                                 "tree", "leaf", "node", "data", "a", "and", "checksum", "write", "\n"};
  std::mt19937 rng(seed);
  std::string s;
  while (s.size() < n) {
    s += kWords[rng() % (sizeof kWords / sizeof *kWords)];
    s += ' ';
  }
  s.resize(n);
  return s;
}

std::string Random(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f << data;
  ASSERT_TRUE(f.good()) << path;
}

std::string ReadHost(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// name -> content of the files every test writes.
std::vector<std::pair<std::string, std::string>> Corpus() {
  return {
      {"tiny.txt", "hello\n"},
      {"small.txt", Text(1500, 1)},       // compressed inline
      {"sector.txt", Text(3900, 2)},      // compressed inline, above max_inline plain
      {"medium.txt", Text(70000, 3)},     // one compressed extent
      {"large.txt", Text(1300000, 4)},    // many 128 KiB extents
      {"random.bin", Random(300000, 5)},  // plain, and NOCOMPRESS
      {"random-small.bin", Random(3000, 6)},
      {"mixed.bin", Text(200000, 7) + Random(200000, 8) + Text(200000, 9)},
  };
}

void MakeTree(const std::string& dir) {
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((dir + "/sub").c_str(), 0755), 0);
  for (const auto& [name, data] : Corpus()) {
    WriteFile(dir + "/" + name, data);
    WriteFile(dir + "/sub/" + name, data);
  }
}

struct ExtentCensus {
  int regular_compressed = 0, regular_plain = 0, inline_compressed = 0, inline_plain = 0;
  int wrong_type = 0;          // compressed with another algorithm than asked
  int not_smaller = 0;         // compressed regular extents with disk bytes >= ram bytes
  int too_large = 0;           // compressed regular extents over 128 KiB of data
  uint64_t disk_bytes = 0, ram_bytes = 0;  // of the compressed regular extents
};

// Walks the file extent items of the top-level subvolume as btrfs-progs
// prints them.
ExtentCensus Census(const std::string& img, int want_type) {
  ExtentCensus c;
  auto r = RunCommand({"btrfs", "inspect-internal", "dump-tree", "-t", "5", img});
  EXPECT_TRUE(r.ok()) << r.Describe();
  std::istringstream in(r.out);
  std::string line;
  uint64_t disk_nr = 0, ram = 0;
  while (std::getline(in, line)) {
    unsigned long long a = 0, b = 0, d = 0;
    int t = 0;
    if (std::sscanf(line.c_str(), " extent data disk byte %llu nr %llu", &a, &b) == 2) {
      disk_nr = b;
    } else if (std::sscanf(line.c_str(), " extent data offset %llu nr %llu ram %llu", &a, &b, &d) == 3) {
      ram = d;
    } else if (std::sscanf(line.c_str(), " extent compression %d", &t) == 1) {
      if (t == 0) {
        ++c.regular_plain;
        continue;
      }
      ++c.regular_compressed;
      if (t != want_type) ++c.wrong_type;
      if (disk_nr >= ram) ++c.not_smaller;
      if (ram > 128 * 1024) ++c.too_large;
      c.disk_bytes += disk_nr;
      c.ram_bytes += ram;
    } else if (std::sscanf(line.c_str(), " inline extent data size %llu ram_bytes %llu compression %d", &a, &b,
                           &t) == 3) {
      if (t == 0) {
        ++c.inline_plain;
      } else {
        ++c.inline_compressed;
        if (t != want_type) ++c.wrong_type;
        if (a >= b) ++c.not_smaller;
      }
    }
  }
  return c;
}

uint64_t IncompatFlags(const std::string& img) {
  auto fs = Filesystem::Open(img);
  EXPECT_TRUE(fs.ok()) << fs.status().ToString();
  return fs.ok() ? (*fs)->Info().incompat_flags : 0;
}

// Every corpus file under `at` (top and sub/) reads back equal through ubtrfs.
void ExpectEqualViaUbtrfs(const std::string& img, const std::string& at) {
  auto fs = Filesystem::Open(img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  for (const std::string& dir : {at, at + "/sub"}) {
    for (const auto& [name, data] : Corpus()) {
      auto id = (*fs)->Lookup(dir + "/" + name);
      ASSERT_TRUE(id.ok()) << dir << "/" << name << ": " << id.status().ToString();
      std::vector<uint8_t> buf(data.size() + 10);
      auto n = (*fs)->Read(*id, 0, buf);
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      ASSERT_EQ(*n, data.size()) << name;
      EXPECT_EQ(std::memcmp(buf.data(), data.data(), data.size()), 0) << dir << "/" << name;
    }
  }
}

// ... and through a kernel loop mount (skips where loop mounts do not work).
void ExpectEqualViaKernel(const std::string& img, const std::string& mnt, const std::string& at) {
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  mkdir(mnt.c_str(), 0755);
  LoopMount m;
  ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
  for (const std::string& dir : {mnt + at, mnt + at + "/sub"}) {
    for (const auto& [name, data] : Corpus()) {
      EXPECT_TRUE(ReadHost(dir + "/" + name) == data) << "kernel reads " << dir << "/" << name << " differently";
    }
  }
  ASSERT_EQ(m.Unmount(), "");
}

std::string MakeUbtrfsImage(const TempDir& t, const std::vector<std::string>& extra = {}) {
  const std::string img = t.Sub("img");
  std::vector<std::string> argv = {kCli, "mkfs", "-q", "--size", "512M"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back(img);
  auto r = RunCommand(argv);
  EXPECT_TRUE(r.ok()) << r.Describe();
  return img;
}

void ExpectCompressedCensus(const std::string& img, int type) {
  const ExtentCensus c = Census(img, type);
  EXPECT_GT(c.regular_compressed, 10) << "text should give compressed regular extents";
  EXPECT_GE(c.inline_compressed, 2) << "small text files should be compressed inline";
  EXPECT_GE(c.regular_plain, 4) << "random data should be stored plain";
  EXPECT_EQ(c.wrong_type, 0);
  EXPECT_EQ(c.not_smaller, 0);
  EXPECT_EQ(c.too_large, 0);
  EXPECT_LT(c.disk_bytes * 2, c.ram_bytes) << "text compresses to less than half";
}

class CompressWriteTest : public ::testing::TestWithParam<std::string> {
 protected:
  int Type() const { return GetParam() == "zlib" ? 1 : GetParam() == "lzo" ? 2 : 3; }
  uint64_t Incompat() const {
    return GetParam() == "zstd" ? format::kIncompatCompressZstd
           : GetParam() == "lzo" ? format::kIncompatCompressLzo
                                 : 0;
  }
};

// Through the library: each file written in 1 MiB calls, as cp does.
TEST_P(CompressWriteTest, Library) {
  TempDir t("ubtrfs-compress");
  const std::string img = MakeUbtrfsImage(t);
  {
    OpenOptions oo;
    oo.writable = true;
    ASSERT_TRUE(ParseCompressSpec(GetParam(), &oo.compress).ok());
    auto fs = Filesystem::Open(img, oo);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    NewInode dattrs;
    dattrs.mode = 0755;
    auto top = (*fs)->Mkdir((*fs)->Root(), "top", dattrs);
    ASSERT_TRUE(top.ok());
    auto sub = (*fs)->Mkdir(*top, "sub", dattrs);
    ASSERT_TRUE(sub.ok());
    for (InodeId dir : {*top, *sub}) {
      for (const auto& [name, data] : Corpus()) {
        NewInode a;
        a.mode = 0644;
        auto f = (*fs)->Create(dir, name, a);
        ASSERT_TRUE(f.ok()) << f.status().ToString();
        for (size_t off = 0; off < data.size(); off += 1 << 20) {
          const size_t n = std::min<size_t>(1 << 20, data.size() - off);
          auto w = (*fs)->Write(*f, off, std::span(reinterpret_cast<const uint8_t*>(data.data()) + off, n));
          ASSERT_TRUE(w.ok()) << w.status().ToString();
        }
      }
    }
    // As the kernel: random data fails the sampling heuristic, is stored
    // plain and leaves the file as it was; a tiny file passes the heuristic
    // (its sector is mostly zeros), does not compress and is marked
    // NOCOMPRESS.
    auto r = (*fs)->Lookup("/top/random.bin");
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE((*fs)->GetStat(*r)->flags & format::kInodeNocompress);
    auto tiny = (*fs)->Lookup("/top/tiny.txt");
    ASSERT_TRUE(tiny.ok());
    EXPECT_TRUE((*fs)->GetStat(*tiny)->flags & format::kInodeNocompress);
    auto m = (*fs)->Lookup("/top/medium.txt");
    ASSERT_TRUE(m.ok());
    EXPECT_FALSE((*fs)->GetStat(*m)->flags & format::kInodeNocompress);
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  EXPECT_EQ(BtrfsCheck(img), "");
  EXPECT_EQ(IncompatFlags(img) & (format::kIncompatCompressZstd | format::kIncompatCompressLzo), Incompat());
  ExpectCompressedCensus(img, Type());
  ExpectEqualViaUbtrfs(img, "/top");
  ExpectEqualViaKernel(img, t.Sub("mnt"), "/top");
}

// ubtrfs mkfs --rootdir --compress ALG (the bulk import).
TEST_P(CompressWriteTest, MkfsRootdir) {
  TempDir t("ubtrfs-compress");
  MakeTree(t.Sub("src"));
  const std::string img = MakeUbtrfsImage(t, {"--rootdir", t.Sub("src"), "--compress", GetParam()});
  EXPECT_EQ(BtrfsCheck(img), "");
  EXPECT_EQ(IncompatFlags(img) & (format::kIncompatCompressZstd | format::kIncompatCompressLzo), Incompat());
  ExpectCompressedCensus(img, Type());
  ExpectEqualViaUbtrfs(img, "");
  ExpectEqualViaKernel(img, t.Sub("mnt"), "");
}

// The bulk import reads and compresses file data ahead of its writes
// (fs/compress_ahead.h): the extents must be those of the plain write path
// (ubtrfs cp), byte for byte in size, a sparse file's holes included.
TEST_P(CompressWriteTest, MkfsRootdirCompressesAsTheWritePath) {
  TempDir t("ubtrfs-compress");
  MakeTree(t.Sub("src"));
  const std::string holey = t.Sub("src") + "/holey.txt";
  const std::string a = Text(300000, 11), b = Text(300000, 12);
  {
    const int fd = ::open(holey.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, a.data(), a.size(), 0), static_cast<ssize_t>(a.size()));
    ASSERT_EQ(::pwrite(fd, b.data(), b.size(), 5 << 19), static_cast<ssize_t>(b.size()));
    ASSERT_EQ(::ftruncate(fd, 4 << 20), 0);
    ::close(fd);
  }
  const std::string bulk = MakeUbtrfsImage(t, {"--rootdir", t.Sub("src"), "--compress", GetParam()});
  TempDir t2("ubtrfs-compress");
  const std::string plain = MakeUbtrfsImage(t2);
  auto r = RunCommand({kCli, "cp", "--compress", GetParam(), t.Sub("src"), plain + ":/in"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(BtrfsCheck(bulk), "");
  const ExtentCensus x = Census(bulk, Type()), y = Census(plain, Type());
  EXPECT_GT(x.regular_compressed, 20);
  EXPECT_EQ(x.regular_compressed, y.regular_compressed);
  EXPECT_EQ(x.regular_plain, y.regular_plain);
  EXPECT_EQ(x.disk_bytes, y.disk_bytes);
  EXPECT_EQ(x.ram_bytes, y.ram_bytes);
  auto fs = Filesystem::Open(bulk);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto id = (*fs)->Lookup("/holey.txt");
  ASSERT_TRUE(id.ok());
  std::string want(4 << 20, '\0');
  want.replace(0, a.size(), a);
  want.replace(5 << 19, b.size(), b);
  std::string got(want.size() + 1, 'x');
  auto n = (*fs)->Read(*id, 0, std::span(reinterpret_cast<uint8_t*>(got.data()), got.size()));
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  got.resize(*n);
  EXPECT_TRUE(got == want);
  auto rnd = (*fs)->Lookup("/random.bin");
  ASSERT_TRUE(rnd.ok());
  EXPECT_FALSE((*fs)->GetStat(*rnd)->flags & format::kInodeNocompress);
}

// ubtrfs cp --compress ALG:LEVEL into an existing image.
TEST_P(CompressWriteTest, CpWithLevel) {
  TempDir t("ubtrfs-compress");
  MakeTree(t.Sub("src"));
  const std::string img = MakeUbtrfsImage(t);
  const std::string spec = GetParam() == "lzo" ? "lzo" : GetParam() + ":7";
  auto r = RunCommand({kCli, "cp", "--compress", spec, t.Sub("src"), img + ":/in"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(BtrfsCheck(img), "");
  ExpectCompressedCensus(img, Type());
  ExpectEqualViaUbtrfs(img, "/in");
  ExpectEqualViaKernel(img, t.Sub("mnt"), "/in");
}

INSTANTIATE_TEST_SUITE_P(Algorithms, CompressWriteTest, ::testing::Values("zstd", "zlib", "lzo"));

TEST(CompressWrite, BadSpecsAreRefused) {
  TempDir t("ubtrfs-compress");
  MakeTree(t.Sub("src"));
  for (const char* spec : {"gzip", "zstd:99", "zlib:0", "lzo:3", "zstd:x"}) {
    auto r = RunCommand({kCli, "mkfs", "-q", "--size", "256M", "--rootdir", t.Sub("src"), "--compress", spec,
                         t.Sub("img")});
    EXPECT_NE(r.exit_code, 0) << spec;
  }
}

// compress-force: random data is tried on every range and never marks the
// file NOCOMPRESS; the property overrides the algorithm, "no" turns it off.
TEST(CompressWrite, ForceAndProperty) {
  TempDir t("ubtrfs-compress");
  const std::string img = MakeUbtrfsImage(t);
  const std::string text = Text(600000, 11), rnd = Random(300000, 12);
  {
    OpenOptions oo;
    oo.writable = true;
    oo.compress.force = true;
    ASSERT_TRUE(ParseCompressSpec("zstd", &oo.compress).ok());
    EXPECT_TRUE(oo.compress.force);
    auto fs = Filesystem::Open(img, oo);
    ASSERT_TRUE(fs.ok());
    NewInode a;
    a.mode = 0644;
    auto put = [&](InodeId f, const std::string& d) {
      auto w = (*fs)->Write(f, 0, std::span(reinterpret_cast<const uint8_t*>(d.data()), d.size()));
      ASSERT_TRUE(w.ok()) << w.status().ToString();
    };
    auto r = (*fs)->Create((*fs)->Root(), "mixed", a);
    ASSERT_TRUE(r.ok());
    put(*r, rnd + text);
    EXPECT_FALSE((*fs)->GetStat(*r)->flags & format::kInodeNocompress) << "force never marks";
    // The property picks lzo for this file (and sets COMPRESS).
    auto p = (*fs)->Create((*fs)->Root(), "lzo", a);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE((*fs)->SetXattr(*p, "btrfs.compression", "lzo").ok());
    EXPECT_TRUE((*fs)->GetStat(*p)->flags & format::kInodeCompress);
    put(*p, text);
    EXPECT_EQ((*fs)->SetXattr(*p, "btrfs.compression", "gzip").code(), EINVAL);
  }
  {
    // Without a mount option: the property alone compresses, "none" stops it.
    OpenOptions oo;
    oo.writable = true;
    auto fs = Filesystem::Open(img, oo);
    ASSERT_TRUE(fs.ok());
    NewInode a;
    a.mode = 0755;
    auto d = (*fs)->Mkdir((*fs)->Root(), "zlibdir", a);
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE((*fs)->SetXattr(*d, "btrfs.compression", "zlib").ok());
    a.mode = 0644;
    auto f = (*fs)->Create(*d, "inherits", a);  // takes the directory's property
    ASSERT_TRUE(f.ok());
    auto v = (*fs)->GetXattr(*f, "btrfs.compression");
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, "zlib");
    ASSERT_TRUE((*fs)->Write(*f, 0, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size())).ok());
    auto n = (*fs)->Create((*fs)->Root(), "none", a);
    ASSERT_TRUE(n.ok());
    ASSERT_TRUE((*fs)->SetXattr(*n, "btrfs.compression", "none").ok());
    EXPECT_TRUE((*fs)->GetStat(*n)->flags & format::kInodeNocompress);
    ASSERT_TRUE((*fs)->Write(*n, 0, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size())).ok());
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  EXPECT_EQ(BtrfsCheck(img), "");
  auto dump = RunCommand({"btrfs", "inspect-internal", "dump-tree", "-t", "5", img});
  ASSERT_TRUE(dump.ok());
  EXPECT_NE(dump.out.find("extent compression 1 (zlib)"), std::string::npos);
  EXPECT_NE(dump.out.find("extent compression 2 (lzo)"), std::string::npos);
  EXPECT_NE(dump.out.find("extent compression 3 (zstd)"), std::string::npos);
  // Forced random ranges stay plain (no sector saved) but the text after them compressed.
  const ExtentCensus c = Census(img, 0);
  EXPECT_GT(c.regular_plain, 2);
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  mkdir(t.Sub("mnt").c_str(), 0755);
  LoopMount m;
  ASSERT_EQ(m.Mount(img, t.Sub("mnt"), "ro"), "");
  EXPECT_TRUE(ReadHost(t.Sub("mnt/mixed")) == rnd + text);
  EXPECT_TRUE(ReadHost(t.Sub("mnt/lzo")) == text);
  EXPECT_TRUE(ReadHost(t.Sub("mnt/zlibdir/inherits")) == text);
  EXPECT_TRUE(ReadHost(t.Sub("mnt/none")) == text);
  ASSERT_EQ(m.Unmount(), "");
}

// Through a FUSE mount with -o compress=zstd: files copied in by the host.
TEST(CompressWrite, FuseMount) {
  SKIP_IF_NO_FUSE();
  ubtrfs_test::Scratch s;
  ASSERT_EQ(s.Make(512ull << 20), "");
  ubtrfs_test::MountProcess mount;
  START_MOUNT(mount, s, "-o", "compress=zstd");
  ASSERT_EQ(mkdir((s.mnt + "/top").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((s.mnt + "/top/sub").c_str(), 0755), 0);
  for (const std::string& dir : {s.mnt + "/top", s.mnt + "/top/sub"}) {
    for (const auto& [name, data] : Corpus()) WriteFile(dir + "/" + name, data);
  }
  std::string err;
  ASSERT_EQ(mount.Unmount(&err), 0) << err << mount.Log();
  EXPECT_EQ(BtrfsCheck(s.img), "");
  const ExtentCensus c = Census(s.img, 3);
  EXPECT_GT(c.regular_compressed, 10);
  EXPECT_EQ(c.wrong_type, 0);
  EXPECT_EQ(c.not_smaller, 0);
  EXPECT_EQ(c.too_large, 0);
  EXPECT_LT(c.disk_bytes * 2, c.ram_bytes);
  EXPECT_TRUE(IncompatFlags(s.img) & format::kIncompatCompressZstd);
  ExpectEqualViaUbtrfs(s.img, "/top");
  ExpectEqualViaKernel(s.img, s.dir.Sub("kmnt"), "/top");
}

// "Data, single: total=..., used=N" of `btrfs filesystem df -b` on a mount.
uint64_t DataUsed(const std::string& mnt) {
  auto r = RunCommand({"btrfs", "filesystem", "df", "-b", mnt});
  EXPECT_TRUE(r.ok()) << r.Describe();
  const size_t at = r.out.find("Data, ");
  if (at == std::string::npos) return 0;
  const size_t u = r.out.find("used=", at);
  return u == std::string::npos ? 0 : std::stoull(r.out.substr(u + 5));
}

// A generated text tree: mkfs --rootdir --compress zstd within 5% of the
// data space the kernel takes with compress=zstd for the same tree.
TEST(CompressWrite, SizeMatchesKernelZstd) {
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << "loop mounts unavailable: " << why;
  if (auto m = ubtrfs_test::MkfsMissingReason(); !m.empty()) GTEST_SKIP() << m;
  TempDir t("ubtrfs-compress");
  const std::string src = t.Sub("src");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  std::mt19937 rng(42);
  for (int d = 0; d < 20; ++d) {
    const std::string dir = src + "/d" + std::to_string(d);
    ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
    for (int f = 0; f < 40; ++f) {
      // Sizes as in a documentation tree: mostly a few KiB, some large.
      const size_t size = f % 10 == 0 ? 200000 + rng() % 400000 : 3000 + rng() % 30000;
      WriteFile(dir + "/f" + std::to_string(f) + ".txt", Text(size, static_cast<uint32_t>(d * 100 + f)));
    }
  }
  const std::string ours = MakeUbtrfsImage(t, {"--rootdir", src, "--compress", "zstd"});
  const std::string kimg = t.Sub("kernel.img");
  ASSERT_EQ(ubtrfs_test::RunMkfs(kimg, "", 16384, "crc32c", 512ull << 20), "");
  const std::string mnt = t.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  uint64_t kernel_used = 0, our_used = 0;
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(kimg, mnt, "compress=zstd"), "");
    auto r = RunCommand({"cp", "-a", src + "/.", mnt});
    ASSERT_TRUE(r.ok()) << r.Describe();
    RunCommand({"sync"});
    ASSERT_EQ(m.Unmount(), "");
    ASSERT_EQ(m.Mount(kimg, mnt, "ro"), "");
    kernel_used = DataUsed(mnt);
    ASSERT_EQ(m.Unmount(), "");
  }
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(ours, mnt, "ro"), "");
    our_used = DataUsed(mnt);
    ASSERT_EQ(m.Unmount(), "");
  }
  RecordProperty("kernel_data_used", std::to_string(kernel_used));
  RecordProperty("ubtrfs_data_used", std::to_string(our_used));
  std::printf("data used: kernel compress=zstd %llu, ubtrfs mkfs --compress zstd %llu\n",
              static_cast<unsigned long long>(kernel_used), static_cast<unsigned long long>(our_used));
  ASSERT_GT(kernel_used, 0u);
  EXPECT_LE(static_cast<double>(our_used), kernel_used * 1.05);
  EXPECT_GE(static_cast<double>(our_used), kernel_used * 0.95);
}

}  // namespace
