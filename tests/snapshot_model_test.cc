// Random operations over a subvolume and its snapshots, against a host
// model: each subvolume or snapshot is a host directory; a snapshot is a
// copy of its source's directory at that moment. Files are created,
// written, overwritten, truncated, cloned (reflink), linked, renamed and
// removed inside any writable one; snapshots (writable or read-only) are
// taken of any, and deleted. Every block and extent is shared somewhere
// along the way, so every rule of shared copy on write and of the delayed
// references is exercised. After each commit each subvolume equals its
// model through ubtrfs; `btrfs check` is clean at every checkpoint; at the
// end the kernel sees the same trees.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

namespace stdfs = std::filesystem;
using ubtrfs::InodeId;

struct Subvol {
  std::string name;  // at the image's top level, and host_/name
  bool read_only = false;
};

class SnapshotModel {
 public:
  SnapshotModel(const std::string& host, const std::string& img, uint64_t seed)
      : host_(host), img_(img), rng_(seed) {}

  void Open() {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(img_, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    fs_ = std::move(*fs);
  }
  void Close() { fs_.reset(); }
  ubtrfs::Filesystem& fs() { return *fs_; }

  void Start() {
    ubtrfs::NewInode a;
    a.mode = 0755;
    auto w = fs_->CreateSubvolume(fs_->Root(), "w", a);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    stdfs::create_directory(host_ + "/w");
    subvols_.push_back({"w", false});
  }

  void Step() {
    const int op = static_cast<int>(rng_() % 100);
    if (op < 20) return CreateFile();
    if (op < 40) return Overwrite();
    if (op < 46) return Truncate();
    if (op < 54) return Unlink();
    if (op < 60) return MakeDir();
    if (op < 66) return Rename();
    if (op < 70) return Link();
    if (op < 82) return Clone();
    if (op < 92) return Snapshot();
    if (op < 97) return DropSnapshot();
    if (op < 98) return FlipReadOnly();
    if (op < 99) return NewSubvolume();
    return RefusedWrite();
  }
  int ro_flips() const { return ro_flips_; }
  int refused() const { return refused_; }

  void CompareAll() {
    CompareOptions o;
    o.compare_mtime = o.compare_dir_mtime = o.compare_symlink_mtime = false;
    o.compare_top_attrs = false;
    for (const Subvol& s : subvols_) {
      auto m = CompareTreeToImage(host_ + "/" + s.name, *fs_, o, "/" + s.name);
      EXPECT_TRUE(m.empty()) << s.name << ": " << FormatMismatches(m);
    }
  }
  const std::vector<Subvol>& subvols() const { return subvols_; }
  int snapshots_made() const { return snapshots_made_; }
  int clones_made() const { return clones_made_; }

 private:
  const Subvol* PickSubvol(bool writable) {
    std::vector<const Subvol*> c;
    for (const Subvol& s : subvols_) {
      if (!writable || !s.read_only) c.push_back(&s);
    }
    return c.empty() ? nullptr : c[rng_() % c.size()];
  }
  // A random entry (file or dir) inside subvolume s, relative to its top.
  std::string PickIn(const Subvol& s, bool want_dir) {
    std::vector<std::string> dirs{""}, files;
    for (auto it = stdfs::recursive_directory_iterator(host_ + "/" + s.name); it != stdfs::recursive_directory_iterator();
         ++it) {
      const std::string rel = stdfs::relative(it->path(), host_ + "/" + s.name).string();
      (it->is_directory() ? dirs : files).push_back(rel);
    }
    std::sort(dirs.begin(), dirs.end());
    std::sort(files.begin(), files.end());
    if (want_dir) return dirs[rng_() % dirs.size()];
    return files.empty() ? "" : files[rng_() % files.size()];
  }
  std::string Name() { return std::string(1, static_cast<char>('a' + rng_() % 6)) + std::to_string(rng_() % 5); }
  static std::string Join(const std::string& a, const std::string& b) { return a.empty() ? b : a + "/" + b; }
  std::string HostPath(const Subvol& s, const std::string& rel) { return host_ + "/" + s.name + (rel.empty() ? "" : "/" + rel); }
  std::string ImgPath(const Subvol& s, const std::string& rel) { return "/" + s.name + (rel.empty() ? "" : "/" + rel); }
  std::vector<uint8_t> Data(size_t n) {
    std::vector<uint8_t> d(n);
    const uint8_t fill = static_cast<uint8_t>(rng_());
    for (auto& b : d) b = rng_() % 4 == 0 ? static_cast<uint8_t>(rng_()) : fill;
    return d;
  }
  void Agree(const std::string& what, int host_errno, const ubtrfs::Status& st) {
    EXPECT_EQ(st.code(), host_errno) << what << ": host " << strerror(host_errno) << ", image " << st.ToString();
  }

  void CreateFile() {
    const Subvol* s = PickSubvol(true);
    if (!s) return;
    const std::string dir = PickIn(*s, true), rel = Join(dir, Name());
    int fd = open(HostPath(*s, rel).c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    const int e = fd < 0 ? errno : 0;
    auto d = Data(rng_() % 3 == 0 ? 4096 * (1 + rng_() % 64) : 1 + rng_() % 9000);
    if (fd >= 0) {
      ASSERT_EQ(write(fd, d.data(), d.size()), static_cast<ssize_t>(d.size()));
      close(fd);
    }
    auto dir_id = fs_->Lookup(ImgPath(*s, dir));
    ASSERT_TRUE(dir_id.ok());
    ubtrfs::NewInode a;
    a.mode = 0644;
    auto c = fs_->Create(*dir_id, SplitName(rel), a);
    Agree("create " + ImgPath(*s, rel), e, c.status());
    if (c.ok()) {
      ASSERT_TRUE(fs_->Write(*c, 0, d).ok());
    }
  }
  static std::string SplitName(const std::string& rel) {
    const size_t p = rel.rfind('/');
    return p == std::string::npos ? rel : rel.substr(p + 1);
  }
  static std::string SplitDir(const std::string& rel) {
    const size_t p = rel.rfind('/');
    return p == std::string::npos ? "" : rel.substr(0, p);
  }
  void Overwrite() {
    const Subvol* s = PickSubvol(true);
    if (!s) return;
    const std::string rel = PickIn(*s, false);
    if (rel.empty()) return;
    const uint64_t off = rng_() % 2 ? 4096 * (rng_() % 40) : rng_() % 200000;
    auto d = Data(1 + rng_() % (rng_() % 3 ? 6000 : 70000));
    int fd = open(HostPath(*s, rel).c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, d.data(), d.size(), static_cast<off_t>(off)), static_cast<ssize_t>(d.size()));
    close(fd);
    auto id = fs_->Lookup(ImgPath(*s, rel));
    ASSERT_TRUE(id.ok());
    auto n = fs_->Write(*id, off, d);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
  }
  void Truncate() {
    const Subvol* s = PickSubvol(true);
    if (!s) return;
    const std::string rel = PickIn(*s, false);
    if (rel.empty()) return;
    const uint64_t size = rng_() % 2 ? 4096 * (rng_() % 30) : rng_() % 150000;
    ASSERT_EQ(truncate(HostPath(*s, rel).c_str(), static_cast<off_t>(size)), 0);
    auto id = fs_->Lookup(ImgPath(*s, rel));
    ASSERT_TRUE(id.ok());
    ubtrfs::AttrChange c;
    c.size = size;
    ASSERT_TRUE(fs_->SetAttr(*id, c).ok());
  }
  void Unlink() {
    const Subvol* s = PickSubvol(true);
    if (!s) return;
    const std::string rel = PickIn(*s, false);
    if (rel.empty()) return;
    ASSERT_EQ(unlink(HostPath(*s, rel).c_str()), 0);
    auto dir = fs_->Lookup(ImgPath(*s, SplitDir(rel)));
    ASSERT_TRUE(dir.ok());
    ASSERT_TRUE(fs_->Unlink(*dir, SplitName(rel)).ok()) << rel;
  }
  void MakeDir() {
    const Subvol* s = PickSubvol(true);
    if (!s) return;
    const std::string dir = PickIn(*s, true), rel = Join(dir, Name());
    const int e = mkdir(HostPath(*s, rel).c_str(), 0755) == 0 ? 0 : errno;
    auto d = fs_->Lookup(ImgPath(*s, dir));
    ASSERT_TRUE(d.ok());
    ubtrfs::NewInode a;
    a.mode = 0755;
    Agree("mkdir " + ImgPath(*s, rel), e, fs_->Mkdir(*d, SplitName(rel), a).status());
  }
  void Rename() {
    const Subvol* s = PickSubvol(true);
    if (!s) return;
    const std::string from = PickIn(*s, false);
    if (from.empty()) return;
    const std::string to = Join(PickIn(*s, true), Name());
    const int e = rename(HostPath(*s, from).c_str(), HostPath(*s, to).c_str()) == 0 ? 0 : errno;
    auto fd = fs_->Lookup(ImgPath(*s, SplitDir(from)));
    auto td = fs_->Lookup(ImgPath(*s, SplitDir(to)));
    ASSERT_TRUE(fd.ok() && td.ok());
    Agree("rename " + from + " " + to, e, fs_->Rename(*fd, SplitName(from), *td, SplitName(to), 0));
  }
  void Link() {
    const Subvol* s = PickSubvol(true);
    if (!s) return;
    const std::string from = PickIn(*s, false);
    if (from.empty()) return;
    const std::string to = Join(PickIn(*s, true), Name());
    const int e = link(HostPath(*s, from).c_str(), HostPath(*s, to).c_str()) == 0 ? 0 : errno;
    auto src = fs_->Lookup(ImgPath(*s, from));
    auto td = fs_->Lookup(ImgPath(*s, SplitDir(to)));
    ASSERT_TRUE(src.ok() && td.ok());
    Agree("link " + from + " " + to, e, fs_->Link(*src, *td, SplitName(to)));
  }
  // A sector-aligned reflink from any subvolume (read-only ones too) into a
  // writable one; the model copies the bytes.
  void Clone() {
    const Subvol* from = PickSubvol(false);
    const Subvol* to = PickSubvol(true);
    if (!from || !to) return;
    const std::string src = PickIn(*from, false), dst = PickIn(*to, false);
    if (src.empty() || dst.empty()) return;
    struct stat ss, ds;
    ASSERT_EQ(stat(HostPath(*from, src).c_str(), &ss), 0);
    ASSERT_EQ(stat(HostPath(*to, dst).c_str(), &ds), 0);
    if (ss.st_ino == ds.st_ino && from == to) return;  // one inode: overlap rules, not this test's subject
    const uint64_t ssec = static_cast<uint64_t>(ss.st_size) / 4096, dsec = static_cast<uint64_t>(ds.st_size) / 4096;
    if (ssec == 0) return;
    const uint64_t soff = 4096 * (rng_() % ssec), len = 4096 * (1 + rng_() % std::min<uint64_t>(ssec - soff / 4096, 16));
    const uint64_t doff = 4096 * (rng_() % (dsec + 1));
    std::vector<uint8_t> buf(len);
    int sfd = open(HostPath(*from, src).c_str(), O_RDONLY), dfd = open(HostPath(*to, dst).c_str(), O_WRONLY);
    ASSERT_TRUE(sfd >= 0 && dfd >= 0);
    ASSERT_EQ(pread(sfd, buf.data(), len, static_cast<off_t>(soff)), static_cast<ssize_t>(len));
    ASSERT_EQ(pwrite(dfd, buf.data(), len, static_cast<off_t>(doff)), static_cast<ssize_t>(len));
    close(sfd);
    close(dfd);
    auto si = fs_->Lookup(ImgPath(*from, src));
    auto di = fs_->Lookup(ImgPath(*to, dst));
    ASSERT_TRUE(si.ok() && di.ok());
    ubtrfs::Status st = fs_->Clone(*si, soff, *di, doff, len);
    ASSERT_TRUE(st.ok()) << "clone " << ImgPath(*from, src) << "@" << soff << " -> " << ImgPath(*to, dst) << "@" << doff
                         << " len " << len << ": " << st.ToString();
    ++clones_made_;
  }
  void Snapshot() {
    const Subvol* src = PickSubvol(false);
    if (!src || subvols_.size() >= 8) return;
    const bool ro = rng_() % 3 == 0;
    const std::string name = "s" + std::to_string(++snap_seq_);
    stdfs::copy(host_ + "/" + src->name, host_ + "/" + name,
                stdfs::copy_options::recursive | stdfs::copy_options::copy_symlinks);
    // stdfs::copy loses hard links; the model rebuilds them from the source.
    RelinkLike(host_ + "/" + src->name, host_ + "/" + name);
    auto sid = fs_->Lookup("/" + src->name);
    ASSERT_TRUE(sid.ok());
    auto made = fs_->CreateSnapshot(*sid, fs_->Root(), name, ro);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    subvols_.push_back({name, ro});
    ++snapshots_made_;
  }
  // Gives `copy` the hard links `orig` has (same relative paths).
  void RelinkLike(const std::string& orig, const std::string& copy) {
    std::map<ino_t, std::string> first;
    std::vector<std::string> rels;
    for (auto it = stdfs::recursive_directory_iterator(orig); it != stdfs::recursive_directory_iterator(); ++it) {
      if (it->is_regular_file()) rels.push_back(stdfs::relative(it->path(), orig).string());
    }
    std::sort(rels.begin(), rels.end());
    for (const auto& rel : rels) {
      struct stat st;
      ASSERT_EQ(lstat((orig + "/" + rel).c_str(), &st), 0);
      auto [it, fresh] = first.emplace(st.st_ino, rel);
      if (fresh) continue;
      ASSERT_EQ(unlink((copy + "/" + rel).c_str()), 0);
      ASSERT_EQ(link((copy + "/" + it->second).c_str(), (copy + "/" + rel).c_str()), 0);
    }
  }
  // `btrfs property set SV ro true|false` on any subvolume.
  void FlipReadOnly() {
    Subvol& s = subvols_[rng_() % subvols_.size()];
    auto top = fs_->Lookup("/" + s.name);
    ASSERT_TRUE(top.ok());
    ubtrfs::Status st = fs_->SetSubvolumeReadOnly(*top, !s.read_only);
    ASSERT_TRUE(st.ok()) << "ro " << s.name << ": " << st.ToString();
    s.read_only = !s.read_only;
    auto now = fs_->SubvolumeReadOnly(*top);
    ASSERT_TRUE(now.ok());
    EXPECT_EQ(*now, s.read_only) << s.name;
    ++ro_flips_;
  }
  void NewSubvolume() {
    if (subvols_.size() >= 8) return;
    const std::string name = "v" + std::to_string(++snap_seq_);
    auto made = fs_->CreateSubvolume(fs_->Root(), name, ubtrfs::NewInode{0755});
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    ASSERT_TRUE(stdfs::create_directory(host_ + "/" + name));
    ASSERT_EQ(chmod((host_ + "/" + name).c_str(), 0755), 0);
    subvols_.push_back({name, false});
  }
  // A change inside a read-only subvolume: EROFS, nothing changes (the
  // comparison after the next commit says so).
  void RefusedWrite() {
    std::vector<const Subvol*> ro;
    for (const Subvol& s : subvols_) {
      if (s.read_only) ro.push_back(&s);
    }
    if (ro.empty()) return;
    const Subvol& s = *ro[rng_() % ro.size()];
    const std::string f = PickIn(s, false);
    ubtrfs::Status st;
    if (!f.empty() && rng_() % 2) {
      auto id = fs_->Lookup(ImgPath(s, f));
      ASSERT_TRUE(id.ok());
      st = rng_() % 2 ? fs_->Write(*id, 0, Data(100)).status() : fs_->Unlink(*fs_->Lookup(ImgPath(s, Parent(f))), Base(f));
    } else {
      auto dir = fs_->Lookup(ImgPath(s, PickIn(s, true)));
      ASSERT_TRUE(dir.ok());
      st = fs_->Create(*dir, Name(), ubtrfs::NewInode{0644}).status();
    }
    EXPECT_EQ(st.code(), EROFS) << "a change in read-only " << s.name << ": " << st.ToString();
    ++refused_;
  }
  static std::string Parent(const std::string& rel) {
    const size_t at = rel.rfind('/');
    return at == std::string::npos ? "" : rel.substr(0, at);
  }
  static std::string Base(const std::string& rel) {
    const size_t at = rel.rfind('/');
    return at == std::string::npos ? rel : rel.substr(at + 1);
  }
  void DropSnapshot() {
    if (subvols_.size() < 2) return;
    const size_t i = 1 + rng_() % (subvols_.size() - 1);
    const std::string name = subvols_[i].name;
    stdfs::remove_all(host_ + "/" + name);
    ubtrfs::Status st = fs_->DeleteSubvolume(fs_->Root(), name);
    ASSERT_TRUE(st.ok()) << "delete " << name << ": " << st.ToString();
    subvols_.erase(subvols_.begin() + static_cast<long>(i));
  }

  std::string host_, img_;
  std::mt19937_64 rng_;
  std::unique_ptr<ubtrfs::Filesystem> fs_;
  std::vector<Subvol> subvols_;
  int snap_seq_ = 0, snapshots_made_ = 0, clones_made_ = 0, ro_flips_ = 0, refused_ = 0;
};

void RunSnapshotModel(uint64_t seed, int steps, uint32_t nodesize) {
  if (std::string why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp("ubtrfs-snapmodel");
  const std::string img = tmp.Sub("img"), host = tmp.Sub("host");
  ASSERT_TRUE(stdfs::create_directory(host));
  ASSERT_EQ(RunMkfs(img, "", nodesize, "crc32c", 1ull << 30), "");
  SnapshotModel m(host, img, seed);
  m.Open();
  m.Start();
  for (int i = 1; i <= steps; ++i) {
    m.Step();
    if (::testing::Test::HasFatalFailure()) return;
    if (i % 60 == 0) {
      ASSERT_TRUE(m.fs().Commit().ok());
      m.CompareAll();
    }
    if (i % 240 == 0) {
      m.Close();
      ASSERT_EQ(BtrfsCheck(img), "") << "seed " << seed << " after step " << i;
      m.Open();
    }
    if (::testing::Test::HasFailure()) return;
  }
  ASSERT_TRUE(m.fs().Commit().ok());
  m.CompareAll();
  const auto subvols = m.subvols();
  EXPECT_GT(m.snapshots_made(), 3) << "too few snapshots for the test to mean much";
  EXPECT_GT(m.clones_made(), 10);
  EXPECT_GE(m.ro_flips(), steps / 400) << "too few read-only flips";
  EXPECT_GE(m.refused(), steps / 400) << "too few refused changes";
  std::printf("[ model    ] seed %llu: %d snapshots, %d clones, %d ro flips, %d refused changes, %zu subvolumes at the end\n",
              static_cast<unsigned long long>(seed), m.snapshots_made(), m.clones_made(), m.ro_flips(), m.refused(),
              m.subvols().size());
  m.Close();
  ASSERT_EQ(BtrfsCheck(img), "") << "seed " << seed;
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "kernel view not compared: loop mounts unavailable: " << why;
  const std::string mnt = tmp.Sub("mnt");
  ASSERT_TRUE(stdfs::create_directory(mnt));
  LoopMount lm;
  ASSERT_EQ(lm.Mount(img, mnt, "ro"), "");
  CompareOptions o;
  o.compare_mtime = o.compare_dir_mtime = o.compare_symlink_mtime = false;
  o.compare_top_attrs = false;
  for (const Subvol& s : subvols) {
    auto mm = CompareHostTrees(host + "/" + s.name, mnt + "/" + s.name, o);
    EXPECT_TRUE(mm.empty()) << s.name << " (kernel): " << FormatMismatches(mm);
  }
  EXPECT_EQ(lm.Unmount(), "");
}

TEST(SnapshotModel, RandomOpsSeed1Node4K) { RunSnapshotModel(1, 1200, 4096); }
TEST(SnapshotModel, RandomOpsSeed2Node16K) { RunSnapshotModel(2, 1200, 16384); }
TEST(SnapshotModel, RandomOpsSeed3Node4K) { RunSnapshotModel(3, 1200, 4096); }
// Soak: UBTRFS_SNAPSHOT_MODEL_SEEDS=N runs N more seeds of 600 steps each
// (from seed 100), alternating 4 KiB and 16 KiB nodes.
TEST(SnapshotModel, RandomOpsManySeeds) {
  const char* e = std::getenv("UBTRFS_SNAPSHOT_MODEL_SEEDS");
  const int n = e ? std::atoi(e) : 0;
  if (n <= 0) GTEST_SKIP() << "set UBTRFS_SNAPSHOT_MODEL_SEEDS=N to run N more seeds";
  for (int i = 0; i < n && !::testing::Test::HasFailure(); ++i) {
    RunSnapshotModel(100 + static_cast<uint64_t>(i), 600, i % 2 ? 16384 : 4096);
  }
}

}  // namespace
}  // namespace ubtrfs_test
