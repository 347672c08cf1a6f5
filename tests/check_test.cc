// `ubtrfs check` against `btrfs check --readonly` (btrfs-progs): on clean
// images (mkfs.btrfs --rootdir of a generated tree at two node sizes, a plain
// mkfs, an image changed through ubtrfs's write API, and, where loop mounts
// work, an image the kernel wrote with snapshots, reflinks and compression)
// both must say clean; on damaged images both must report errors, and ours
// must name the problem.
//
// Damage is done with valid checksums so the structure stays readable: items
// are removed from or changed in leaves and the block checksum recomputed,
// on every copy (DUP metadata). One case flips a bit without fixing the
// checksum, to make a block unreadable. Each case works on its own copy of
// one base image.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "format/checksum.h"
#include "format/key.h"
#include "format/ondisk.h"
#include "io/block_device.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_gen.h"
#include "tree/cursor.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif

namespace UBTRFS_UNITY_ID {

namespace fmtd = ubtrfs::format;
namespace tree = ubtrfs::tree;
using fmtd::Key;
using ubtrfs_test::CommandResult;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

const std::string kCli = UBTRFS_CLI_PATH;
constexpr uint64_t kMiB = 1ull << 20;

CommandResult Ours(const std::string& img, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv{kCli, "check", img};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return RunCommand(argv);
}

CommandResult Theirs(const std::string& img) { return RunCommand({"btrfs", "check", "--readonly", img}); }

void ExpectBothClean(const std::string& img) {
  CommandResult o = Ours(img);
  EXPECT_EQ(o.exit_code, 0) << "ubtrfs check: " << o.Describe();
  EXPECT_NE(o.out.find("no errors found"), std::string::npos) << o.out;
  CommandResult t = Theirs(img);
  EXPECT_EQ(t.exit_code, 0) << "btrfs check: " << t.Describe();
  // Reading every checksummed sector finds nothing either.
  CommandResult od = Ours(img, {"--check-data-csum"});
  EXPECT_EQ(od.exit_code, 0) << "ubtrfs check --check-data-csum: " << od.Describe();
  CommandResult td = RunCommand({"btrfs", "check", "--readonly", "--check-data-csum", img});
  EXPECT_EQ(td.exit_code, 0) << "btrfs check --check-data-csum: " << td.Describe();
  CommandResult j = Ours(img, {"--json"});
  EXPECT_EQ(j.exit_code, 0);
  ASSERT_FALSE(j.out.empty());
  EXPECT_EQ(j.out[0], '{') << j.out;
  EXPECT_NE(j.out.find("\"clean\": true"), std::string::npos) << j.out;
}

// Both checkers find errors; ours names the problem with every one of `parts`.
void ExpectBothFind(const std::string& img, const std::vector<std::string>& parts) {
  CommandResult o = Ours(img);
  EXPECT_EQ(o.exit_code, 1) << "ubtrfs check: " << o.Describe();
  for (const auto& p : parts) {
    EXPECT_NE(o.out.find(p), std::string::npos) << "ubtrfs check does not say \"" << p << "\":\n" << o.out;
  }
  if (std::getenv("UBTRFS_TEST_VERBOSE") != nullptr) std::fprintf(stderr, "%s\n", o.out.c_str());
  CommandResult t = Theirs(img);
  EXPECT_NE(t.exit_code, 0) << "btrfs check found nothing: " << t.Describe();
  CommandResult j = Ours(img, {"--json"});
  EXPECT_EQ(j.exit_code, 1);
  ASSERT_FALSE(j.out.empty());
  EXPECT_EQ(j.out[0], '{') << j.out;
  EXPECT_NE(j.out.find("\"clean\": false"), std::string::npos) << j.out;
  EXPECT_NE(j.out.find("\"errors\": [\""), std::string::npos) << j.out;
}

// Ours finds it and names it with every one of `parts`; for damage that
// Debian's btrfs check (6.2) does not look for yet.
void ExpectOursFinds(const std::string& img, const std::vector<std::string>& parts) {
  CommandResult o = Ours(img);
  EXPECT_EQ(o.exit_code, 1) << "ubtrfs check: " << o.Describe();
  for (const auto& p : parts) {
    EXPECT_NE(o.out.find(p), std::string::npos) << "ubtrfs check does not say \"" << p << "\":\n" << o.out;
  }
}

// ---------------------------------------------------------------- patching

using Block = std::vector<uint8_t>;

fmtd::Header& Hdr(Block& b) { return *reinterpret_cast<fmtd::Header*>(b.data()); }
fmtd::Item& ItemAt(Block& b, int slot) { return reinterpret_cast<fmtd::Item*>(b.data() + sizeof(fmtd::Header))[slot]; }
uint8_t* ItemData(Block& b, int slot) { return b.data() + sizeof(fmtd::Header) + ItemAt(b, slot).offset.get(); }

// Removes one leaf item (or, given `data`, replaces its bytes), repacking
// the others as btrfs lays them out.
void RemoveItem(Block& b, int slot, const Block* data = nullptr) {
  struct Raw {
    fmtd::DiskKey key;
    Block data;
  };
  std::vector<Raw> items;
  const int n = static_cast<int>(Hdr(b).nritems.get());
  for (int i = 0; i < n; ++i) {
    if (i == slot && data == nullptr) continue;
    const uint8_t* d = ItemData(b, i);
    items.push_back(Raw{ItemAt(b, i).key, i == slot ? *data : Block(d, d + ItemAt(b, i).size.get())});
  }
  uint8_t* body = b.data() + sizeof(fmtd::Header);
  const size_t space = b.size() - sizeof(fmtd::Header);
  std::memset(body, 0, space);
  size_t end = space;
  for (size_t i = 0; i < items.size(); ++i) {
    end -= items[i].data.size();
    ItemAt(b, static_cast<int>(i)).key = items[i].key;
    ItemAt(b, static_cast<int>(i)).offset.set(static_cast<uint32_t>(end));
    ItemAt(b, static_cast<int>(i)).size.set(static_cast<uint32_t>(items[i].data.size()));
    std::memcpy(body + end, items[i].data.data(), items[i].data.size());
  }
  Hdr(b).nritems.set(static_cast<uint32_t>(items.size()));
}

struct Loc {
  uint64_t leaf = 0;
  int slot = -1;
  Key key;
  Block data;  // the item's bytes
};

// An image opened through the library to find things, and patched through a
// file descriptor of its own.
class Image {
 public:
  static std::unique_ptr<Image> Open(const std::string& path) {
    auto dev = ubtrfs::io::OpenFileDevice(path);
    if (!dev.ok()) {
      ADD_FAILURE() << dev.status().ToString();
      return nullptr;
    }
    auto vol = ubtrfs::txn::Volume::Open(std::move(*dev), ubtrfs::txn::VolumeOptions{});
    if (!vol.ok()) {
      ADD_FAILURE() << vol.status().ToString();
      return nullptr;
    }
    auto img = std::unique_ptr<Image>(new Image);
    img->path_ = path;
    img->vol_ = std::move(*vol);
    return img;
  }

  tree::RootPtr Root(uint64_t id) {
    auto r = vol_->FindRoot(id);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->ref : tree::RootPtr{};
  }

  // The first item of the tree for which `pred` holds, in a leaf slot > 0
  // (removing slot 0 would change the key its parent holds).
  std::optional<Loc> Find(const tree::RootPtr& root, const std::function<bool(const Key&, const Block&)>& pred) {
    tree::Cursor c(vol_->reader(), root);
    for (auto st = c.SeekFirst(); st.ok() && c.Valid(); st = c.Next()) {
      if (c.slot() == 0) continue;
      Block d(c.data().begin(), c.data().end());
      if (pred(c.key(), d)) return Loc{c.leaf().bytenr(), c.slot(), c.key(), std::move(d)};
    }
    return std::nullopt;
  }

  // Applies `m` to every copy of tree block `bytenr`, then (if fix_csum)
  // recomputes its checksum.
  void Patch(uint64_t bytenr, const std::function<void(Block&)>& m, bool fix_csum = true) {
    auto copies = vol_->chunks().MapPhysical(bytenr, vol_->nodesize());
    ASSERT_TRUE(copies.ok()) << copies.status().ToString();
    const int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0) << path_ << ": " << std::strerror(errno);
    for (uint64_t phys : *copies) {
      Block b(vol_->nodesize());
      ASSERT_EQ(::pread(fd, b.data(), b.size(), static_cast<off_t>(phys)), static_cast<ssize_t>(b.size()));
      m(b);
      if (fix_csum) {
        auto c = fmtd::ComputeCsum(vol_->csum_type(), std::span<const uint8_t>(b).subspan(fmtd::kCsumSize));
        std::memcpy(b.data(), c.data(), fmtd::kCsumSize);
      }
      ASSERT_EQ(::pwrite(fd, b.data(), b.size(), static_cast<off_t>(phys)), static_cast<ssize_t>(b.size()));
    }
    ::close(fd);
  }
  void PatchItem(const Loc& l, const std::function<void(uint8_t*)>& m) {
    Patch(l.leaf, [&](Block& b) { m(ItemData(b, l.slot)); });
  }
  void Remove(const Loc& l) {
    Patch(l.leaf, [&](Block& b) { RemoveItem(b, l.slot); });
  }
  // Gives the item new bytes (its leaf must have the room).
  void Replace(const Loc& l, const Block& data) {
    Patch(l.leaf, [&](Block& b) { RemoveItem(b, l.slot, &data); });
  }

  // The log tree of subvolume `subvol`, from the superblock's log root.
  tree::RootPtr LogRoot(uint64_t subvol) {
    const auto& sb = vol_->super();
    tree::Cursor c(vol_->reader(), tree::RootPtr{sb.log_root.get(), sb.log_root_level, sb.generation.get() + 1,
                                                 fmtd::kTreeLogObjectid});
    for (auto st = c.SeekFirst(); st.ok() && c.Valid(); st = c.Next()) {
      if (c.key().type != fmtd::kRootItemKey || c.key().offset != subvol) continue;
      fmtd::RootItem ri{};
      std::memcpy(&ri, c.data().data(), std::min(c.data().size(), sizeof ri));
      return tree::RootPtr{ri.bytenr.get(), ri.level, ri.generation.get(), fmtd::kTreeLogObjectid};
    }
    ADD_FAILURE() << "no log tree of subvolume " << subvol;
    return {};
  }

  // Flips one bit of every copy of the data at `logical` (no checksum fixed).
  void FlipDataBit(uint64_t logical) {
    auto copies = vol_->chunks().MapPhysical(logical, 1);
    ASSERT_TRUE(copies.ok()) << copies.status().ToString();
    const int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0) << path_ << ": " << std::strerror(errno);
    for (uint64_t phys : *copies) {
      uint8_t b = 0;
      ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(phys)), 1);
      b ^= 0x04;
      ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(phys)), 1);
    }
    ::close(fd);
  }

  ubtrfs::txn::Volume& vol() { return *vol_; }

 private:
  Image() = default;
  std::string path_;
  std::unique_ptr<ubtrfs::txn::Volume> vol_;
};

const fmtd::FileExtentItem& Fe(const Block& d) { return *reinterpret_cast<const fmtd::FileExtentItem*>(d.data()); }

// The image opened for writing through the library, to make what the
// damage is then done to.
std::unique_ptr<ubtrfs::Filesystem> Writable(const std::string& img) {
  ubtrfs::OpenOptions o;
  o.writable = true;
  auto fs = ubtrfs::Filesystem::Open(img, o);
  EXPECT_TRUE(fs.ok()) << fs.status().ToString();
  return fs.ok() ? std::move(*fs) : nullptr;
}

// A new file `name` in the top directory holding `data` (not committed).
std::optional<ubtrfs::InodeId> NewFile(ubtrfs::Filesystem& fs, const std::string& name, const std::string& data) {
  auto root = fs.Lookup("/");
  EXPECT_TRUE(root.ok()) << root.status().ToString();
  if (!root.ok()) return std::nullopt;
  auto f = fs.Create(*root, name, ubtrfs::NewInode{.mode = 0100644});
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return std::nullopt;
  auto w = fs.Write(*f, 0, std::span(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return w.ok() ? std::optional(*f) : std::nullopt;
}

// ---------------------------------------------------------------- fixture

class CheckTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!ubtrfs_test::MkfsMissingReason().empty() || ubtrfs_test::FindProgram("btrfs").empty()) {
      skip_ = "mkfs.btrfs or btrfs (btrfs-progs) not installed";
      return;
    }
    dir_ = new TempDir("ubtrfs-check");
    src_ = dir_->Sub("src");
    ::mkdir(src_.c_str(), 0755);
    try {
      ubtrfs_test::GenerateTree(src_, 7, ubtrfs_test::ScaledTreeOptions(1200));
    } catch (const std::exception& e) {
      setup_error_ = e.what();
      return;
    }
    base_ = dir_->Sub("base4k.img");
    setup_error_ = ubtrfs_test::RunMkfs(base_, src_, 4096, "crc32c", 512 * kMiB);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_EQ(setup_error_, "");
  }

  // A fresh copy of the damage base image.
  std::string Copy(const std::string& name) {
    const std::string img = dir_->Sub(name);
    auto r = RunCommand({"cp", "--sparse=always", base_, img});
    EXPECT_TRUE(r.ok()) << r.Describe();
    return img;
  }

  static std::string skip_, setup_error_, src_, base_;
  static TempDir* dir_;
};

std::string CheckTest::skip_, CheckTest::setup_error_, CheckTest::src_, CheckTest::base_;
TempDir* CheckTest::dir_ = nullptr;

// ---------------------------------------------------------------- clean images

TEST_F(CheckTest, CleanRootdirNode4k) { ExpectBothClean(base_); }

TEST_F(CheckTest, CleanRootdirNode16k) {
  const std::string img = dir_->Sub("root16k.img");
  ASSERT_EQ(ubtrfs_test::RunMkfs(img, src_, 16384, "crc32c", 512 * kMiB), "");
  ExpectBothClean(img);
}

TEST_F(CheckTest, CleanRootdirXxhashNoHoles) {
  const std::string img = dir_->Sub("rootxx.img");
  ASSERT_EQ(ubtrfs_test::RunMkfs(img, src_, 4096, "xxhash", 512 * kMiB, {"-O", "^no-holes", "-m", "single"}), "");
  ExpectBothClean(img);
}

TEST_F(CheckTest, CleanPlainMkfs) {
  const std::string img = dir_->Sub("plain.img");
  ASSERT_EQ(ubtrfs_test::RunMkfs(img, "", 0, "", 256 * kMiB), "");
  ExpectBothClean(img);
}

TEST_F(CheckTest, CleanAfterWriteApi) {
  const std::string img = dir_->Sub("written.img");
  ASSERT_EQ(ubtrfs_test::RunMkfs(img, "", 16384, "crc32c", 512 * kMiB), "");
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(img, o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ubtrfs::Filesystem& f = **fs;
    const ubtrfs::InodeId root = f.Root();
    ubtrfs::NewInode file{0644}, dir{0755};
    auto d = f.Mkdir(root, "dir", dir);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    std::vector<ubtrfs::InodeId> files;
    const size_t sizes[] = {0, 100, 2000, 3000, 5000, 70000, 200000, 3 * kMiB + 17};
    for (size_t i = 0; i < std::size(sizes); ++i) {
      auto id = f.Create(i % 2 ? *d : root, "f" + std::to_string(i), file);
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      std::vector<uint8_t> data(sizes[i]);
      for (size_t j = 0; j < data.size(); ++j) data[j] = static_cast<uint8_t>(j * 131 + i);
      if (!data.empty()) {
        ASSERT_TRUE(f.Write(*id, 0, data).ok());
      }
      files.push_back(*id);
    }
    ASSERT_TRUE(f.Commit().ok());
    ASSERT_TRUE(f.Link(files[5], root, "hardlink").ok());
    ASSERT_TRUE(f.Unlink(root, "f2").ok());
    ASSERT_TRUE(f.Unlink(*d, "f7").ok());
    ASSERT_TRUE(f.Rename(root, "f4", *d, "moved").ok());
    ASSERT_TRUE(f.Symlink(*d, "link", "../f0", file).ok());
    ASSERT_TRUE(f.SetXattr(files[6], "user.k", "value").ok());
    std::vector<uint8_t> more(50000, 7);
    ASSERT_TRUE(f.Write(files[6], 100000, more).ok());
    ubtrfs::AttrChange shrink;
    shrink.size = 12345;
    ASSERT_TRUE(f.SetAttr(files[6], shrink).ok());
    for (int i = 0; i < 300; ++i) {
      ASSERT_TRUE(f.Create(*d, "many" + std::to_string(i), file).ok());
    }
    for (int i = 0; i < 300; i += 3) {
      ASSERT_TRUE(f.Unlink(*d, "many" + std::to_string(i)).ok());
    }
    ASSERT_TRUE(f.Commit().ok());
  }
  ExpectBothClean(img);
}

// Written by the kernel: compression, reflinks, prealloc, nodatasum, a
// subvolume with a nested one, snapshots changed afterwards (shared tree
// blocks with FULL_BACKREF, shared data refs).
TEST_F(CheckTest, CleanKernelImage) {
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) GTEST_SKIP() << why;
  const std::string img = dir_->Sub("kernel.img"), mnt = dir_->Sub("mnt");
  ASSERT_EQ(ubtrfs_test::RunMkfs(img, "", 4096, "crc32c", 1024 * kMiB, {"-O", "^no-holes"}), "");
  ::mkdir(mnt.c_str(), 0755);
  {
    ubtrfs_test::LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, "compress=zstd"), "");
    auto sh = [](const std::string& cmd) {
      auto r = RunCommand({"sh", "-c", cmd});
      EXPECT_TRUE(r.ok()) << cmd << ": " << r.Describe();
    };
    sh("cp -a " + src_ + " " + mnt + "/tree");
    sh("btrfs -q subvolume create " + mnt + "/sub && cp -a " + src_ + " " + mnt + "/sub/t");
    sh("btrfs -q subvolume create " + mnt + "/sub/nested && echo x > " + mnt + "/sub/nested/x");
    sh("btrfs -q subvolume snapshot " + mnt + "/sub " + mnt + "/snap");
    sh("btrfs -q subvolume snapshot -r " + mnt + " " + mnt + "/rootsnap");
    sh("rm -rf " + mnt + "/snap/t/wide " + mnt + "/tree/wide && echo new > " + mnt + "/sub/new");
    sh("dd if=/dev/urandom of=" + mnt + "/big bs=64K count=40 status=none && cp --reflink=always " + mnt +
       "/big " + mnt + "/sub/big.clone && dd if=/dev/urandom of=" + mnt +
       "/big bs=4K count=3 seek=5 conv=notrunc status=none");
    sh("fallocate -l 1M " + mnt + "/prealloc && dd if=/dev/urandom of=" + mnt +
       "/prealloc bs=4K count=2 seek=8 conv=notrunc status=none");
    sh("touch " + mnt + "/nocow && chattr +C " + mnt + "/nocow && dd if=/dev/urandom of=" + mnt +
       "/nocow bs=64K count=4 status=none");
    sh("dd if=/dev/urandom of=" + mnt + "/holey bs=4K seek=100 count=1 status=none && truncate -s 10M " + mnt +
       "/holey");
    ASSERT_EQ(m.Unmount(), "");
  }
  ExpectBothClean(img);
}

// ---------------------------------------------------------------- damage

TEST_F(CheckTest, MissingMetadataItem) {
  const std::string img = Copy("no_metadata_item.img");
  auto im = Image::Open(img);
  ASSERT_TRUE(im);
  auto l = im->Find(im->Root(fmtd::kExtentTreeObjectid),
                    [](const Key& k, const Block&) { return k.type == fmtd::kMetadataItemKey; });
  ASSERT_TRUE(l);
  im->Remove(*l);
  ExpectBothFind(img, {"tree block " + std::to_string(l->key.objectid), "has no METADATA_ITEM or EXTENT_ITEM"});
}

TEST_F(CheckTest, MissingDataExtentItem) {
  const std::string img = Copy("no_extent_item.img");
  auto im = Image::Open(img);
  ASSERT_TRUE(im);
  auto l = im->Find(im->Root(fmtd::kExtentTreeObjectid), [](const Key& k, const Block& d) {
    return k.type == fmtd::kExtentItemKey && d.size() >= sizeof(fmtd::ExtentItem) &&
           (reinterpret_cast<const fmtd::ExtentItem*>(d.data())->flags.get() & fmtd::kExtentFlagData);
  });
  ASSERT_TRUE(l);
  im->Remove(*l);
  ExpectBothFind(img, {"data extent " + std::to_string(l->key.objectid), "has no EXTENT_ITEM"});
}

TEST_F(CheckTest, BlockGroupUsedWrong) {
  const std::string img = Copy("bg_used.img");
  auto im = Image::Open(img);
  ASSERT_TRUE(im);
  tree::Cursor c(im->vol().reader(), im->Root(fmtd::kExtentTreeObjectid));
  std::optional<Loc> l;
  for (auto st = c.SeekFirst(); st.ok() && c.Valid() && !l; st = c.Next()) {
    if (c.key().type == fmtd::kBlockGroupItemKey) l = Loc{c.leaf().bytenr(), c.slot(), c.key(), {}};
  }
  ASSERT_TRUE(l);
  im->PatchItem(*l, [](uint8_t* d) {
    auto* bg = reinterpret_cast<fmtd::BlockGroupItem*>(d);
    bg->used = bg->used.get() + 4096;
  });
  ExpectBothFind(img, {"block group [" + std::to_string(l->key.objectid), "BLOCK_GROUP_ITEM used"});
}

TEST_F(CheckTest, InodeNlinkWrong) {
  const std::string img = Copy("nlink.img");
  auto im = Image::Open(img);
  ASSERT_TRUE(im);
  auto l = im->Find(im->Root(fmtd::kFsTreeObjectid), [](const Key& k, const Block& d) {
    if (k.type != fmtd::kInodeItemKey || d.size() < sizeof(fmtd::InodeItem)) return false;
    const auto* ii = reinterpret_cast<const fmtd::InodeItem*>(d.data());
    return (ii->mode.get() & 0170000) == 0100000 && ii->nlink.get() == 1;
  });
  ASSERT_TRUE(l);
  im->PatchItem(*l, [](uint8_t* d) { reinterpret_cast<fmtd::InodeItem*>(d)->nlink = 2; });
  ExpectBothFind(img, {"inode " + std::to_string(l->key.objectid) + ": nlink 2, but 1 DIR_ITEM"});
}

TEST_F(CheckTest, DirIndexMissing) {
  const std::string img = Copy("no_dir_index.img");
  auto im = Image::Open(img);
  ASSERT_TRUE(im);
  auto l = im->Find(im->Root(fmtd::kFsTreeObjectid),
                    [](const Key& k, const Block& d) { return k.type == fmtd::kDirIndexKey && d.size() > 30; });
  ASSERT_TRUE(l);
  const auto* di = reinterpret_cast<const fmtd::DirItem*>(l->data.data());
  const uint64_t child = di->location.objectid.get();
  im->Remove(*l);
  ExpectBothFind(img, {"inode " + std::to_string(child) + ": name", "no DIR_INDEX",
                       "inode " + std::to_string(l->key.objectid) + ": directory size"});
}

TEST_F(CheckTest, FileExtentDiskBytenrChanged) {
  const std::string img = Copy("disk_bytenr.img");
  auto im = Image::Open(img);
  ASSERT_TRUE(im);
  auto l = im->Find(im->Root(fmtd::kFsTreeObjectid), [](const Key& k, const Block& d) {
    return k.type == fmtd::kExtentDataKey && d.size() == sizeof(fmtd::FileExtentItem) &&
           Fe(d).type == fmtd::kFileExtentReg && Fe(d).compression == 0 && Fe(d).disk_bytenr.get() != 0 &&
           Fe(d).disk_num_bytes.get() >= 2 * 4096;
  });
  ASSERT_TRUE(l);
  const uint64_t old = Fe(l->data).disk_bytenr.get();
  im->PatchItem(*l, [](uint8_t* d) {
    auto* fe = reinterpret_cast<fmtd::FileExtentItem*>(d);
    fe->disk_bytenr = fe->disk_bytenr.get() + 4096;
  });
  ExpectBothFind(img, {"data extent " + std::to_string(old + 4096), "has no EXTENT_ITEM",
                       "(" + std::to_string(old) + " EXTENT_ITEM", "no file extent item points to it"});
}

TEST_F(CheckTest, CsumItemMissing) {
  const std::string img = Copy("no_csum.img");
  auto im = Image::Open(img);
  ASSERT_TRUE(im);
  auto l = im->Find(im->Root(fmtd::kCsumTreeObjectid),
                    [](const Key& k, const Block&) { return k.type == fmtd::kExtentCsumKey; });
  ASSERT_TRUE(l);
  im->Remove(*l);
  ExpectBothFind(img, {"some data sectors have no csum"});
}

TEST_F(CheckTest, FlippedBitMakesBlockUnreadable) {
  const std::string img = Copy("flipped.img");
  auto im = Image::Open(img);
  ASSERT_TRUE(im);
  auto l = im->Find(im->Root(fmtd::kFsTreeObjectid),
                    [](const Key& k, const Block&) { return k.type == fmtd::kInodeItemKey && k.objectid > 300; });
  ASSERT_TRUE(l);
  // Every copy, checksum left as it was.
  im->Patch(l->leaf, [](Block& b) { b[b.size() / 2] ^= 0x10; }, false);
  ExpectBothFind(img, {"tree block " + std::to_string(l->leaf), "is unreadable", "checksum mismatch"});
}

// The data is only read with --check-data-csum, by both checkers.
TEST_F(CheckTest, DataChecksumMismatchWithCheckDataCsum) {
  const std::string img = Copy("data_csum.img");
  auto im = Image::Open(img);
  ASSERT_TRUE(im);
  auto l = im->Find(im->Root(fmtd::kFsTreeObjectid), [](const Key& k, const Block& d) {
    return k.type == fmtd::kExtentDataKey && d.size() == sizeof(fmtd::FileExtentItem) &&
           Fe(d).type == fmtd::kFileExtentReg && Fe(d).compression == 0 && Fe(d).disk_bytenr.get() != 0 &&
           Fe(d).offset.get() == 0;
  });
  ASSERT_TRUE(l);
  const uint64_t sector = Fe(l->data).disk_bytenr.get();
  im->FlipDataBit(sector + 100);
  EXPECT_EQ(Ours(img).exit_code, 0);
  EXPECT_EQ(Theirs(img).exit_code, 0);
  CommandResult o = Ours(img, {"--check-data-csum"});
  EXPECT_EQ(o.exit_code, 1) << o.Describe();
  EXPECT_NE(o.out.find("data checksum mismatch at logical " + std::to_string(sector)), std::string::npos) << o.out;
  CommandResult t = RunCommand({"btrfs", "check", "--readonly", "--check-data-csum", img});
  EXPECT_NE(t.exit_code, 0) << t.Describe();
}

// ---------------------------------------------------------------- btrfs-progs' fsck-tests cases
// Damage btrfs-progs keeps images of in tests/fsck-tests (newer btrfs check
// finds it), made here on our own images.

// A DIR_ITEM holding the same name twice (fsck-tests 067).
TEST_F(CheckTest, NameTwiceInADirectory) {
  const std::string img = Copy("dup_name.img");
  auto im = Image::Open(img);
  ASSERT_TRUE(im);
  auto l = im->Find(im->Root(fmtd::kFsTreeObjectid), [](const Key& k, const Block& d) {
    if (k.type != fmtd::kDirItemKey || d.size() < sizeof(fmtd::DirItem)) return false;
    const auto* di = reinterpret_cast<const fmtd::DirItem*>(d.data());
    return d.size() == sizeof(fmtd::DirItem) + di->name_len.get() + di->data_len.get();
  });
  ASSERT_TRUE(l);
  const auto* di = reinterpret_cast<const fmtd::DirItem*>(l->data.data());
  const std::string name(reinterpret_cast<const char*>(l->data.data()) + sizeof(fmtd::DirItem), di->name_len.get());
  Block twice = l->data;
  twice.insert(twice.end(), l->data.begin(), l->data.end());
  im->Replace(*l, twice);
  ExpectBothFind(img, {"the directory holds the name '" + name + "' twice"});
}

// An item of a kind no fs tree holds (fsck-tests 069): an INODE_REF whose
// type byte became 8, which keeps the leaf in key order.
TEST_F(CheckTest, ItemTypeNoFsTreeHolds) {
  const std::string img = Copy("unknown_type.img");
  auto im = Image::Open(img);
  ASSERT_TRUE(im);
  auto l = im->Find(im->Root(fmtd::kFsTreeObjectid),
                    [](const Key& k, const Block&) { return k.type == fmtd::kInodeRefKey && k.objectid > 256; });
  ASSERT_TRUE(l);
  im->Patch(l->leaf, [&](Block& b) { ItemAt(b, l->slot).key.type = 8; });
  ExpectBothFind(img, {"item (" + std::to_string(l->key.objectid) + " UNKNOWN.8 ", "an item type (8) that no fs tree holds"});
}

// Two inline EXTENT_DATA_REFs of one extent swapped (fsck-tests 061): the
// kernel keeps them by falling hash, and its tree checker refuses the leaf.
TEST_F(CheckTest, InlineRefsOutOfOrder) {
  const std::string img = Copy("ref_order.img");
  {
    auto fs = Writable(img);
    ASSERT_TRUE(fs);
    auto f = NewFile(*fs, "cloned", ubtrfs_test::SeededBytes(65536, 61));
    ASSERT_TRUE(f);
    ASSERT_TRUE(fs->Commit().ok());
    // The same extent at a second offset of the file: a second reference.
    ASSERT_TRUE(fs->Clone(*f, 0, *f, 65536, 65536).ok());
    ASSERT_TRUE(fs->Commit().ok());
  }
  ExpectBothClean(img);
  constexpr size_t kRef = 1 + sizeof(fmtd::ExtentDataRef);
  auto im = Image::Open(img);
  ASSERT_TRUE(im);
  auto l = im->Find(im->Root(fmtd::kExtentTreeObjectid), [](const Key& k, const Block& d) {
    return k.type == fmtd::kExtentItemKey && d.size() == sizeof(fmtd::ExtentItem) + 2 * kRef &&
           d[sizeof(fmtd::ExtentItem)] == fmtd::kExtentDataRefKey &&
           d[sizeof(fmtd::ExtentItem) + kRef] == fmtd::kExtentDataRefKey;
  });
  ASSERT_TRUE(l) << "no extent with two inline data refs";
  im->PatchItem(*l, [](uint8_t* d) {
    uint8_t* a = d + sizeof(fmtd::ExtentItem);
    std::swap_ranges(a, a + kRef, a + kRef);
  });
  // btrfs check 6.19 reports it ("inline extent refs out of order"), 6.2 not.
  ExpectOursFinds(img, {fmtd::KeyToString(l->key) + ": inline refs out of order"});
  std::string why;
  if (ubtrfs_test::LoopMountsAvailable(&why)) {
    const std::string mnt = dir_->Sub("ref_order.mnt");
    ::mkdir(mnt.c_str(), 0755);
    ubtrfs_test::LoopMount m;
    EXPECT_NE(m.Mount(img, mnt, "ro"), "") << "the kernel mounted an image with refs out of order";
  }
}

// A deleted subvolume (refs 0) that no orphan item lists (fsck-tests 066):
// the kernel's cleaner never finds it to drop.
TEST_F(CheckTest, DeletedSubvolumeWithoutOrphanItem) {
  const std::string img = Copy("no_root_orphan.img");
  uint64_t id = 0;
  {
    auto fs = Writable(img);
    ASSERT_TRUE(fs);
    auto root = fs->Lookup("/");
    ASSERT_TRUE(root.ok());
    auto sv = fs->CreateSubvolume(*root, "sv", ubtrfs::NewInode{.mode = 040755});
    ASSERT_TRUE(sv.ok()) << sv.status().ToString();
    id = sv->root;
    ASSERT_TRUE(fs->Commit().ok());
  }
  auto im = Image::Open(img);
  ASSERT_TRUE(im);
  auto l = im->Find(im->vol().root_tree(),
                    [&](const Key& k, const Block&) { return k.objectid == id && k.type == fmtd::kRootItemKey; });
  ASSERT_TRUE(l);
  im->PatchItem(*l, [](uint8_t* d) { reinterpret_cast<fmtd::RootItem*>(d)->refs = 0; });
  ExpectBothFind(img, {"subvolume " + std::to_string(id) + " is deleted (refs 0), but has no ORPHAN_ITEM"});
}

// A tree log whose file extent lost its checksums (fsck-tests 063): the
// replay would make an extent whose every read fails. btrfs check learned
// this after 6.2, so only ours is asked.
TEST_F(CheckTest, LogExtentWithoutChecksums) {
  const std::string img = Copy("log_csum.img");
  const std::string cut = dir_->Sub("log_csum_cut.img");
  {
    auto fs = Writable(img);
    ASSERT_TRUE(fs);
    ASSERT_TRUE(fs->Commit().ok());
    // Data not committed, only fsynced: in the log alone.
    auto f = NewFile(*fs, "fsynced", ubtrfs_test::SeededBytes(65536, 63));
    ASSERT_TRUE(f);
    ASSERT_TRUE(fs->Fsync(*f, false).ok());
    // The power cut: what the device holds now, the log and all.
    auto r = RunCommand({"cp", "--sparse=always", img, cut});
    ASSERT_TRUE(r.ok()) << r.Describe();
  }
  CommandResult clean = Ours(cut);
  EXPECT_EQ(clean.exit_code, 0) << clean.Describe();
  EXPECT_NE(clean.out.find("tree log: 1 log trees"), std::string::npos) << clean.out;
  auto im = Image::Open(cut);
  ASSERT_TRUE(im);
  auto l = im->Find(im->LogRoot(fmtd::kFsTreeObjectid),
                    [](const Key& k, const Block&) { return k.type == fmtd::kExtentCsumKey; });
  ASSERT_TRUE(l) << "the log holds no checksums";
  im->Remove(*l);
  ExpectOursFinds(cut, {"tree log: log tree of fs tree 5: inode ", "no checksums for its data"});
}

// ---------------------------------------------------------------- exit codes

TEST_F(CheckTest, OperationalErrors) {
  EXPECT_EQ(Ours(dir_->Sub("does-not-exist.img")).exit_code, 8);
  const std::string junk = dir_->Sub("junk.img");
  std::string err;
  ASSERT_TRUE(ubtrfs_test::MakeSparseFile(junk, 4 * kMiB, &err)) << err;
  CommandResult r = Ours(junk);
  EXPECT_EQ(r.exit_code, 8) << r.Describe();
  EXPECT_NE(r.err.find("not a btrfs image"), std::string::npos) << r.Describe();
  EXPECT_EQ(RunCommand({kCli, "check"}).exit_code, 8);
  EXPECT_EQ(Ours(base_, {"--no-such-option"}).exit_code, 8);
  EXPECT_EQ(Ours(base_, {"second-image"}).exit_code, 8);
}

}  // namespace
