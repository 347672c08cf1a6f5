// Which files hold a logical address, offline (ubtrfs/inspect.h
// ResolveLogical, `ubtrfs inspect logical-resolve`), judged by the kernel:
// an image with reflinks, a file split by a punched hole, a compressed
// extent, a preallocated one written in the middle, hard links, nested
// subvolumes and a snapshot whose leaves were copied on write on both
// sides. Loop-mounted, FIEMAP gives the data extents, and btrfs-progs'
// `inspect-internal logical-resolve` (the kernel's LOGICAL_INO and
// INO_PATHS) answers for addresses in each; unmounted, ubtrfs must give
// the same answers -- and again with the extent tree's root damaged, from
// the file trees alone. Once for an image the kernel wrote, once for one
// ubtrfs wrote.
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "format/ondisk.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "txn/devices.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/inspect.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

using ubtrfs::Filesystem;
using ubtrfs::InodeId;
using ubtrfs::LogicalResolveOptions;
using ubtrfs::OpenOptions;
using Triple = std::tuple<uint64_t, uint64_t, uint64_t>;  // (inode, offset, root)

struct Probe {
  uint64_t logical = 0;
  std::string what;  // file and extent, for messages
};

// The data extents of `path` on a mounted btrfs, as FIEMAP reports them.
std::vector<fiemap_extent> Extents(const std::string& path) {
  std::vector<fiemap_extent> out;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return out;
  constexpr int kMax = 64;
  std::vector<uint8_t> buf(sizeof(fiemap) + kMax * sizeof(fiemap_extent));
  auto* fm = reinterpret_cast<fiemap*>(buf.data());
  fm->fm_start = 0;
  fm->fm_length = FIEMAP_MAX_OFFSET;
  fm->fm_flags = FIEMAP_FLAG_SYNC;
  fm->fm_extent_count = kMax;
  if (::ioctl(fd, FS_IOC_FIEMAP, fm) == 0) {
    for (uint32_t i = 0; i < fm->fm_mapped_extents; ++i) {
      const fiemap_extent& e = fm->fm_extents[i];
      if (e.fe_flags & (FIEMAP_EXTENT_DATA_INLINE | FIEMAP_EXTENT_DELALLOC | FIEMAP_EXTENT_UNKNOWN)) continue;
      out.push_back(e);
    }
  }
  ::close(fd);
  return out;
}

// Two addresses in each extent of each file: its first byte and a block in
// its middle (the first only, for a compressed one: FIEMAP's length is the
// data's, not the disk's).
std::vector<Probe> ProbesOf(const std::string& mnt, const std::vector<std::string>& files) {
  std::vector<Probe> probes;
  std::set<uint64_t> seen;
  for (const auto& f : files) {
    for (const auto& e : Extents(mnt + "/" + f)) {
      std::vector<uint64_t> at = {e.fe_physical};
      if (!(e.fe_flags & FIEMAP_EXTENT_ENCODED) && e.fe_length >= 8192) {
        at.push_back(e.fe_physical + (e.fe_length / 2 & ~uint64_t{4095}) + 100);
      }
      for (uint64_t l : at) {
        if (seen.insert(l).second) {
          probes.push_back({l, f + " @" + std::to_string(e.fe_logical) + (e.fe_flags & FIEMAP_EXTENT_ENCODED
                                                                               ? " (compressed)"
                                                                               : "")});
        }
      }
    }
  }
  return probes;
}

struct Answer {
  std::set<Triple> inodes;      // -P
  std::set<Triple> all;         // -P -o
  std::set<std::string> paths;  // without -P, from the top level
  std::string error;
  bool scanned = false;  // ubtrfs searched every file tree (no extent tree)
};

std::set<Triple> ParseInodes(const std::string& out) {
  std::set<Triple> s;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long ino = 0, off = 0, root = 0;
    if (std::sscanf(line.c_str(), "inode %llu offset %llu root %llu", &ino, &off, &root) == 3) {
      s.insert({ino, off, root});
    }
  }
  return s;
}

std::set<std::string> ParsePaths(const std::string& out, const std::string& prefix) {
  std::set<std::string> s;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) s.insert(line.substr(prefix.size()));
  }
  return s;
}

// btrfs-progs asking the kernel, on the mount at `mnt`. The paths come from
// inode-resolve in each subvolume (the kernel's INO_PATHS): btrfs-progs 6.2's
// logical-resolve prints paths only for the mounted subvolume ("subvol sv
// could not be accessed: not mounted" for the others).
Answer AskKernel(const std::string& mnt, uint64_t logical) {
  Answer a;
  const std::string l = std::to_string(logical);
  CommandResult p = RunCommand({"btrfs", "inspect-internal", "logical-resolve", "-P", l, mnt});
  CommandResult o = RunCommand({"btrfs", "inspect-internal", "logical-resolve", "-P", "-o", l, mnt});
  if (!p.ok() || !o.ok()) {
    a.error = "btrfs inspect-internal logical-resolve " + l + ": " + (!p.ok() ? p : o).Describe();
    return a;
  }
  a.inodes = ParseInodes(p.out);
  a.all = ParseInodes(o.out);
  for (const auto& [ino, off, root] : a.inodes) {
    std::string sub;
    if (root != 5) {
      CommandResult s = RunCommand({"btrfs", "inspect-internal", "subvolid-resolve", std::to_string(root), mnt});
      if (!s.ok() || s.out.empty()) {
        a.error = "subvolid-resolve " + std::to_string(root) + ": " + s.Describe();
        return a;
      }
      sub = "/" + s.out.substr(0, s.out.find('\n'));
    }
    CommandResult n = RunCommand({"btrfs", "inspect-internal", "inode-resolve", std::to_string(ino), mnt + sub});
    if (!n.ok()) {
      a.error = "inode-resolve " + std::to_string(ino) + " " + mnt + sub + ": " + n.Describe();
      return a;
    }
    for (const auto& path : ParsePaths(n.out, mnt)) a.paths.insert(path);
  }
  return a;
}

Answer AskUbtrfs(const std::string& image, uint64_t logical) {
  Answer a;
  LogicalResolveOptions o;
  auto r = ubtrfs::ResolveLogical(image, OpenOptions{}, logical, o);
  o.ignore_offset = true;
  o.paths = false;
  auto all = ubtrfs::ResolveLogical(image, OpenOptions{}, logical, o);
  if (!r.ok() || !all.ok()) {
    a.error = (!r.ok() ? r : all).status().ToString();
    return a;
  }
  for (const auto& ref : r->refs) {
    a.inodes.insert({ref.inode, ref.offset, ref.root});
    for (const auto& p : ref.paths) a.paths.insert("/" + p);
  }
  for (const auto& ref : all->refs) a.all.insert({ref.inode, ref.offset, ref.root});
  for (const auto& e : r->errors) a.error += e + "; ";
  for (const auto& w : r->warnings) a.scanned |= w.find("every file tree searched") != std::string::npos;
  return a;
}

// Flips a bit in every copy of the extent tree's root block.
void DamageExtentTreeRoot(const std::string& image) {
  auto devs = ubtrfs::txn::OpenDevices(ubtrfs::txn::DeviceSpec::Of(image, 0, 0, {}));
  ASSERT_TRUE(devs.ok()) << devs.status().ToString();
  auto vol = ubtrfs::txn::Volume::Open(std::move(*devs), ubtrfs::txn::VolumeOptions{});
  ASSERT_TRUE(vol.ok()) << vol.status().ToString();
  auto root = (*vol)->FindRoot(ubtrfs::format::kExtentTreeObjectid);
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  auto copies = (*vol)->chunks().MapPhysical(root->ref.bytenr, (*vol)->nodesize());
  ASSERT_TRUE(copies.ok()) << copies.status().ToString();
  const int fd = ::open(image.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  for (uint64_t phys : *copies) {
    uint8_t b = 0;
    const off_t at = static_cast<off_t>(phys + (*vol)->nodesize() / 2);
    ASSERT_EQ(::pread(fd, &b, 1, at), 1);
    b ^= 8;
    ASSERT_EQ(::pwrite(fd, &b, 1, at), 1);
  }
  ::close(fd);
}

std::string Show(const std::set<Triple>& s) {
  std::string out;
  for (const auto& [i, o, r] : s) out += "(" + std::to_string(i) + "," + std::to_string(o) + "," + std::to_string(r) + ")";
  return out;
}

std::string Show(const std::set<std::string>& s) {
  std::string out;
  for (const auto& p : s) out += p + " ";
  return out;
}

// The files every image of this suite holds (paths from the top level).
// sv/small100 sits in a leaf of sv that neither side changed after the
// snapshot: only a search from each root finds that snap shares it.
// c clones the middle of a's extent to its offset 0: the back reference's
// offset (file offset - extent offset) wraps around.
const std::vector<std::string> kFiles = {"a",      "b",        "c",          "z/text", "p", "sv/f", "sv/inner/g",
                                         "snap/f", "snap/new", "sv/small100"};

// Mounts `image`, collects probes and the kernel's answers, unmounts, then
// asks ubtrfs. Returns how many probes had references (each must match).
int CompareWithKernel(const std::string& image, const std::string& mnt) {
  LoopMount m;
  std::string e = m.Mount(image, mnt, "ro");
  EXPECT_TRUE(e.empty()) << e;
  if (!e.empty()) return 0;
  std::vector<Probe> probes = ProbesOf(mnt, kFiles);
  std::vector<Answer> kernel;
  for (const auto& p : probes) kernel.push_back(AskKernel(mnt, p.logical));
  // The command line, on a hard-linked file and a nested subvolume.
  struct stat st{};
  EXPECT_EQ(::stat((mnt + "/a").c_str(), &st), 0);
  const std::string a_ino = std::to_string(st.st_ino);
  const CommandResult links = RunCommand({"btrfs", "inspect-internal", "inode-resolve", a_ino, mnt});
  const CommandResult inner = RunCommand({"btrfs", "inspect-internal", "subvolid-resolve", "257", mnt});
  e = m.Unmount();
  EXPECT_TRUE(e.empty()) << e;
  EXPECT_GE(probes.size(), 12u) << "too few data extents found with FIEMAP";
  EXPECT_TRUE(links.ok() && inner.ok()) << links.Describe() << inner.Describe();
  CommandResult r = RunUbtrfs({"inspect", "inode-resolve", image, a_ino});
  EXPECT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(Show(ParsePaths(r.out, "")), Show(ParsePaths(links.out, mnt))) << "inode-resolve " << a_ino;
  EXPECT_EQ(ParsePaths(r.out, "").size(), 2u) << r.out;
  r = RunUbtrfs({"inspect", "subvolid-resolve", image, "257"});
  EXPECT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(r.out, "/" + inner.out);
  int with_refs = 0, shared = 0;
  for (size_t i = 0; i < probes.size(); ++i) {
    const Probe& p = probes[i];
    const Answer& k = kernel[i];
    if (!k.error.empty()) {
      ADD_FAILURE() << p.what << ": " << k.error;
      continue;
    }
    Answer u = AskUbtrfs(image, p.logical);
    EXPECT_TRUE(u.error.empty()) << p.what << " (" << p.logical << "): " << u.error;
    EXPECT_EQ(Show(u.inodes), Show(k.inodes)) << p.what << " (" << p.logical << "): -P";
    EXPECT_EQ(Show(u.all), Show(k.all)) << p.what << " (" << p.logical << "): -P -o";
    EXPECT_EQ(Show(u.paths), Show(k.paths)) << p.what << " (" << p.logical << "): paths";
    if (!k.inodes.empty()) ++with_refs;
    std::map<uint64_t, std::set<uint64_t>> roots_of;  // inode -> roots (a leaf shared by snapshots)
    for (const auto& [ino, off, root] : k.inodes) roots_of[ino].insert(root);
    for (const auto& [ino, roots] : roots_of) shared += roots.size() > 1;
    if (i == 0) {  // the command line prints the same paths
      CommandResult c = RunUbtrfs({"inspect", "logical-resolve", image, std::to_string(p.logical)});
      EXPECT_TRUE(c.ok()) << c.Describe();
      EXPECT_EQ(Show(ParsePaths(c.out, "")), Show(k.paths));
      c = RunUbtrfs({"inspect", "logical-resolve", "-P", image, std::to_string(p.logical)});
      EXPECT_EQ(Show(ParseInodes(c.out)), Show(k.inodes));
    }
  }
  EXPECT_GT(shared, 0) << "no probe found a leaf that snapshots share";
  // Without the extent tree (its root damaged), every file tree is searched
  // for the items instead: the same answers.
  DamageExtentTreeRoot(image);
  for (size_t i = 0; i < probes.size(); ++i) {
    const Probe& p = probes[i];
    const Answer& k = kernel[i];
    if (!k.error.empty()) continue;
    Answer u = AskUbtrfs(image, p.logical);
    EXPECT_TRUE(u.error.empty()) << p.what << " (" << p.logical << "), no extent tree: " << u.error;
    EXPECT_TRUE(u.scanned) << p.what << ": no warning of the file trees searched";
    EXPECT_EQ(Show(u.inodes), Show(k.inodes)) << p.what << " (" << p.logical << "), no extent tree: -P";
    EXPECT_EQ(Show(u.all), Show(k.all)) << p.what << " (" << p.logical << "), no extent tree: -P -o";
    EXPECT_EQ(Show(u.paths), Show(k.paths)) << p.what << " (" << p.logical << "), no extent tree: paths";
  }
  return with_refs;
}

class InspectResolveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
    if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs' btrfs command is not installed";
    std::string why;
    if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "the kernel answers on a loop mount: " << why;
    img_ = tmp_.Sub("img");
    mnt_ = tmp_.Sub("mnt");
    ::mkdir(mnt_.c_str(), 0755);
  }

  TempDir tmp_{"ubtrfs-resolve"};
  std::string img_, mnt_;
};

TEST_F(InspectResolveTest, AnImageTheKernelWroteAnswersAsTheKernel) {
  ASSERT_EQ(RunMkfs(img_, "", 0, "", 256ull << 20), "");
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img_, mnt_), "");
    const std::string& d = mnt_;
    WriteRandomFile(d + "/a", 384 << 10, 1);
    WriteRandomFile(d + "/sv-f", 200 << 10, 2);
    WriteRandomFile(d + "/inner-g", 64 << 10, 3);
    const std::string script =
        "set -e; cd '" + d + "'; sync; mkdir d; ln a d/hard; cp --reflink=always a b; "
        "fallocate -p -o 131072 -l 65536 b; touch c; xfs_io -c 'reflink a 131072 0 65536' c >/dev/null; "
        "mkdir z; btrfs property set z compression zstd; "
        "yes 'the same line of text, over and over' | head -c 262144 > z/text; "
        "fallocate -l 1048576 p; dd if=a of=p bs=4096 count=1 seek=64 conv=notrunc status=none; "
        "btrfs -q subvolume create sv; mv sv-f sv/f; btrfs -q subvolume create sv/inner; mv inner-g sv/inner/g; "
        "for i in $(seq 1 200); do head -c 3000 a > sv/small$i; done; sync; "
        "btrfs -q subvolume snapshot sv snap; sync; "
        "head -c 5000 a > sv/new-in-sv; dd if=/dev/zero of=snap/f bs=4096 count=1 conv=notrunc status=none; "
        "cp --reflink=always sv/f snap/new; sync";
    CommandResult r = RunCommand({"bash", "-c", script});
    ASSERT_TRUE(r.ok()) << r.Describe();
    ASSERT_EQ(m.Unmount(), "");
  }
  EXPECT_GE(CompareWithKernel(img_, mnt_), 12);
}

TEST_F(InspectResolveTest, AnImageUbtrfsWroteAnswersAsTheKernel) {
  ASSERT_EQ(RunMkfs(img_, "", 0, "", 256ull << 20), "");
  {
    auto fs = OpenWritable(img_);
    ASSERT_TRUE(fs);
    Filesystem& f = *fs;
    const InodeId root = f.Root();
    ubtrfs::NewInode file;
    file.mode = 0644;
    ubtrfs::NewInode dir;
    dir.mode = 0755;
    auto put = [&](InodeId in, const std::string& name, const std::string& bytes) {
      auto id = f.Create(in, name, file);
      EXPECT_TRUE(id.ok()) << name << ": " << id.status().ToString();
      if (!id.ok()) return InodeId{};
      auto w = f.Write(*id, 0, SpanOf(bytes));
      EXPECT_TRUE(w.ok()) << name << ": " << w.status().ToString();
      return *id;
    };
    const std::string a_bytes = SeededBytes(384 << 10, 1);
    const InodeId a = put(root, "a", a_bytes);
    ASSERT_TRUE(f.Commit().ok());
    auto d = f.Mkdir(root, "d", dir);
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE(f.Link(a, *d, "hard").ok());
    const InodeId b = put(root, "b", "");
    ASSERT_TRUE(f.Clone(a, 0, b, 0, a_bytes.size()).ok());
    ASSERT_TRUE(f.Fallocate(b, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 131072, 65536).ok());
    const InodeId c = put(root, "c", "");
    ASSERT_TRUE(f.Clone(a, 131072, c, 0, 65536).ok());
    auto z = f.Mkdir(root, "z", dir);
    ASSERT_TRUE(z.ok());
    ASSERT_TRUE(f.SetXattr(*z, "btrfs.compression", "zstd").ok());
    std::string text;
    while (text.size() < 262144) text += "the same line of text, over and over\n";
    put(*z, "text", text);
    const InodeId p = put(root, "p", "");
    ASSERT_TRUE(f.Fallocate(p, 0, 0, 1 << 20).ok());
    ASSERT_TRUE(f.Write(p, 64 * 4096, SpanOf(a_bytes.substr(0, 4096))).ok());
    auto sv = f.CreateSubvolume(root, "sv", dir);
    ASSERT_TRUE(sv.ok()) << sv.status().ToString();
    const InodeId sv_f = put(*sv, "f", SeededBytes(200 << 10, 2));
    auto inner = f.CreateSubvolume(*sv, "inner", dir);
    ASSERT_TRUE(inner.ok());
    put(*inner, "g", SeededBytes(64 << 10, 3));
    for (int i = 1; i <= 200; ++i) put(*sv, "small" + std::to_string(i), a_bytes.substr(0, 3000));
    ASSERT_TRUE(f.Commit().ok());
    auto snap = f.CreateSnapshot(*sv, root, "snap", false);
    ASSERT_TRUE(snap.ok()) << snap.status().ToString();
    ASSERT_TRUE(f.Commit().ok());
    put(*sv, "new-in-sv", a_bytes.substr(0, 5000));
    auto snap_f = f.LookupChild(*snap, "f");
    ASSERT_TRUE(snap_f.ok());
    ASSERT_TRUE(f.Write(*snap_f, 0, SpanOf(std::string(4096, '\0'))).ok());
    const InodeId snap_new = put(*snap, "new", "");
    ASSERT_TRUE(f.Clone(sv_f, 0, snap_new, 0, 200 << 10).ok());
    ASSERT_TRUE(f.Commit().ok());
  }
  EXPECT_EQ(BtrfsCheck(img_), "");
  EXPECT_GE(CompareWithKernel(img_, mnt_), 12);
}

}  // namespace UBTRFS_UNITY_ID
}  // namespace ubtrfs_test
