// `ubtrfs check` counting references on images the kernel made with shared
// copy-on-write: snapshots (rw and ro, of a subvolume and of the top level,
// changed afterwards), reflinks (enough of one extent that the kernel keeps
// keyed backref items), and balances (-d, -m, and a full balance of an image
// with a snapshot: FULL_BACKREF blocks, shared block and data refs). Every
// clean image is clean to both `ubtrfs check` and `btrfs check --readonly`;
// each damage to the reference counting (a refs count, a keyed backref
// item, an inline backref, the FULL_BACKREF flag) is an error to both, and
// ours names it. btrfs check is the oracle.
//
// Needs root and loop mounts; skipped otherwise.
#include <sys/stat.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/damage_util.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "io/block_device.h"
#include "txn/volume.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

const std::string kCli = UBTRFS_CLI_PATH;

// The kernel's part of each image, run in its mount point.
const std::map<std::string, std::string>& Scripts() {
  static const std::map<std::string, std::string> s = {
      {"snapshots",
       "set -e; fill() { mkdir -p $1/d; for i in $(seq 1 $2); do echo \"file $i\" > $1/d/f$i; done; "
       "for i in 1 2 3 4; do head -c 200000 /dev/urandom > $1/big$i; done; }; "
       "btrfs -q subvolume create sv; fill sv 600; sync; "
       "btrfs -q subvolume snapshot sv snap; btrfs -q subvolume snapshot -r sv snap_ro; "
       "btrfs -q subvolume snapshot . topsnap; "
       "echo changed > sv/d/f1; head -c 40000 /dev/urandom > sv/after; rm snap/d/f5; "
       "dd if=/dev/urandom of=snap/big2 bs=4K count=2 seek=3 conv=notrunc status=none; sync"},
      {"reflinks",
       "set -e; mkdir d; for i in $(seq 1 300); do echo \"file $i\" > d/f$i; done; "
       "head -c 300000 /dev/urandom > big; head -c 100000 /dev/urandom > other; "
       "for i in $(seq 1 12); do cp --reflink=always big clone$i; done; "
       "btrfs -q subvolume create sv; cp --reflink=always big sv/xclone; cp --reflink=always other sv/o; "
       "dd if=/dev/urandom of=big bs=4K count=2 seek=3 conv=notrunc status=none; sync"},
      {"balance-d",
       "set -e; mkdir d; for i in $(seq 1 800); do echo \"file $i\" > d/f$i; done; "
       "for i in 1 2 3 4 5 6; do head -c 150000 /dev/urandom > big$i; done; "
       "btrfs -q subvolume create sv; for i in $(seq 1 300); do echo s$i > sv/s$i; done; "
       "cp big1 sv/; sync; btrfs -q balance start -d ."},
      {"balance-m",
       "set -e; mkdir d; for i in $(seq 1 800); do echo \"file $i\" > d/f$i; done; "
       "for i in 1 2 3; do head -c 150000 /dev/urandom > big$i; done; "
       "btrfs -q subvolume create sv; for i in $(seq 1 300); do echo s$i > sv/s$i; done; "
       "sync; btrfs -q balance start -m ."},
      {"balance-snapshot",
       "set -e; btrfs -q subvolume create sv; mkdir sv/d; "
       "for i in $(seq 1 800); do echo \"file $i\" > sv/d/f$i; done; "
       "for i in 1 2 3 4; do head -c 150000 /dev/urandom > sv/big$i; done; sync; "
       "btrfs -q subvolume snapshot sv snap; echo x > snap/d/f3; cp --reflink=always sv/big1 snap/rl; sync; "
       "btrfs -q balance start --full-balance ."},
  };
  return s;
}

struct Item {
  uint64_t leaf = 0;
  int slot = -1;
  Key key;
  std::vector<uint8_t> data;
};

// One kernel-made image, opened through the library to find things in it.
struct Image {
  std::string path;
  std::unique_ptr<ubtrfs::txn::Volume> vol;
  uint16_t csum_type = 0;
  uint32_t nodesize = 0;

  tree::RootPtr ExtentRoot() const {
    auto r = vol->FindRoot(fmtd::kExtentTreeObjectid);
    EXPECT_TRUE(r.ok());
    return r.ok() ? r->ref : tree::RootPtr{};
  }
  // The first extent tree item (not in slot 0: removing that would change
  // its parent's key) for which `pred` holds.
  std::optional<Item> Find(const std::function<bool(const Key&, std::span<const uint8_t>)>& pred,
                           bool allow_slot0 = true) const {
    tree::Cursor c(vol->reader(), ExtentRoot());
    for (auto st = c.SeekFirst(); st.ok() && c.Valid(); st = c.Next()) {
      if (!allow_slot0 && c.slot() == 0) continue;
      if (pred(c.key(), c.data())) {
        return Item{c.leaf().bytenr(), c.slot(), c.key(), std::vector<uint8_t>(c.data().begin(), c.data().end())};
      }
    }
    return std::nullopt;
  }
  // Rewrites the leaf holding `it` in every copy, checksum recomputed.
  void Patch(Patcher& p, const Item& it, const std::function<void(Block&)>& m) const {
    auto copies = vol->chunks().MapPhysical(it.leaf, nodesize);
    ASSERT_TRUE(copies.ok()) << copies.status().ToString();
    for (uint64_t phys : *copies) {
      Block b = p.Read(phys, nodesize);
      m(b);
      FixTreeCsum(b, csum_type);
      p.Write(phys, b);
    }
  }
};

const fmtd::ExtentItem& Ei(std::span<const uint8_t> d) { return *reinterpret_cast<const fmtd::ExtentItem*>(d.data()); }

bool IsTreeBlock(const Key& k, std::span<const uint8_t> d) {
  return (k.type == fmtd::kMetadataItemKey || k.type == fmtd::kExtentItemKey) && d.size() >= sizeof(fmtd::ExtentItem) &&
         (Ei(d).flags.get() & fmtd::kExtentFlagTreeBlock);
}
bool IsData(const Key& k, std::span<const uint8_t> d) {
  return k.type == fmtd::kExtentItemKey && d.size() >= sizeof(fmtd::ExtentItem) &&
         (Ei(d).flags.get() & fmtd::kExtentFlagData);
}

// Sizes of the inline refs after the extent item header: (type, bytes).
std::vector<std::pair<uint8_t, size_t>> InlineRefs(const Key& k, std::span<const uint8_t> d) {
  std::vector<std::pair<uint8_t, size_t>> out;
  size_t p = sizeof(fmtd::ExtentItem);
  if (k.type == fmtd::kExtentItemKey && (Ei(d).flags.get() & fmtd::kExtentFlagTreeBlock)) p += sizeof(fmtd::TreeBlockInfo);
  while (p < d.size()) {
    const uint8_t t = d[p];
    size_t n = 0;
    if (t == fmtd::kTreeBlockRefKey || t == fmtd::kSharedBlockRefKey) n = sizeof(fmtd::ExtentInlineRef);
    if (t == fmtd::kExtentDataRefKey) n = 1 + sizeof(fmtd::ExtentDataRef);
    if (t == fmtd::kSharedDataRefKey) n = sizeof(fmtd::ExtentInlineRef) + sizeof(fmtd::SharedDataRef);
    if (n == 0 || p + n > d.size()) break;
    out.emplace_back(t, n);
    p += n;
  }
  return out;
}

// Removes one leaf item, repacking the rest.
void RemoveItem(Block& b, int slot) {
  const int n = static_cast<int>(Hdr(b).nritems.get());
  ResizeItem(b, slot, 0);
  for (int i = slot; i + 1 < n; ++i) ItemAt(b, i) = ItemAt(b, i + 1);
  std::memset(&ItemAt(b, n - 1), 0, sizeof(fmtd::Item));
  Hdr(b).nritems.set(static_cast<uint32_t>(n - 1));
}

class CheckRefsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    if (!MkfsMissingReason().empty() || FindProgram("btrfs").empty()) {
      skip_ = "mkfs.btrfs or btrfs (btrfs-progs) not installed";
      return;
    }
    if (!LoopMountsAvailable(&why)) {
      skip_ = "loop mounts unavailable: " + why;
      return;
    }
    dir_ = new TempDir("ubtrfs-checkrefs");
    const std::string mnt = dir_->Sub("mnt");
    ::mkdir(mnt.c_str(), 0755);
    for (const auto& [name, script] : Scripts()) {
      const std::string img = dir_->Sub(name + ".img");
      if (std::string e = RunMkfs(img, "", 4096, "crc32c", 512ull << 20); !e.empty()) {
        setup_error_ = name + ": " + e;
        return;
      }
      LoopMount m;
      if (std::string e = m.Mount(img, mnt); !e.empty()) {
        setup_error_ = name + ": mount: " + e;
        return;
      }
      CommandResult r = RunCommand({"sh", "-c", "cd '" + mnt + "' && " + script});
      if (!r.ok()) {
        setup_error_ = name + ": " + r.Describe();
        return;
      }
      if (std::string e = m.Unmount(); !e.empty()) {
        setup_error_ = name + ": unmount: " + e;
        return;
      }
      auto dev = ubtrfs::io::OpenFileDevice(img);
      auto vol = dev.ok() ? ubtrfs::txn::Volume::Open(std::move(*dev), ubtrfs::txn::VolumeOptions{})
                          : ubtrfs::Result<std::unique_ptr<ubtrfs::txn::Volume>>(dev.status());
      if (!vol.ok()) {
        setup_error_ = name + ": " + vol.status().ToString();
        return;
      }
      auto im = std::make_unique<Image>();
      im->path = img;
      im->csum_type = (*vol)->csum_type();
      im->nodesize = (*vol)->nodesize();
      im->vol = std::move(*vol);
      images_[name] = std::move(im);
    }
  }
  static void TearDownTestSuite() {
    images_.clear();
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_EQ(setup_error_, "");
  }

  static const Image& Img(const std::string& name) { return *images_.at(name); }

  // Both checkers see damage; ours says `what`.
  static void ExpectBothFind(const Image& im, const std::string& what) {
    CommandResult o = RunCommand({kCli, "check", im.path});
    EXPECT_EQ(o.exit_code, 1) << "ubtrfs check: " << o.Describe();
    EXPECT_NE(o.out.find(what), std::string::npos) << "ubtrfs check does not say \"" << what << "\":\n" << o.out;
    if (std::getenv("UBTRFS_TEST_VERBOSE") != nullptr) std::fprintf(stderr, "%s\n", o.out.c_str());
    CommandResult t = RunCommand({"btrfs", "check", "--readonly", im.path});
    EXPECT_NE(t.exit_code, 0) << "btrfs check found nothing: " << t.Describe();
  }

  static std::string skip_, setup_error_;
  static TempDir* dir_;
  static std::map<std::string, std::unique_ptr<Image>> images_;
};

std::string CheckRefsTest::skip_, CheckRefsTest::setup_error_;
TempDir* CheckRefsTest::dir_ = nullptr;
std::map<std::string, std::unique_ptr<Image>> CheckRefsTest::images_;

TEST_F(CheckRefsTest, KernelImagesAreCleanToBoth) {
  for (const auto& [name, im] : images_) {
    SCOPED_TRACE(name);
    CommandResult o = RunCommand({kCli, "check", im->path});
    EXPECT_EQ(o.exit_code, 0) << o.Describe();
    EXPECT_EQ(BtrfsCheck(im->path), "");
  }
  // What the images were made for is there.
  EXPECT_TRUE(Img("snapshots").Find([](const Key& k, auto d) { return IsTreeBlock(k, d) && Ei(d).refs.get() >= 2; }))
      << "no shared tree block";
  EXPECT_TRUE(Img("reflinks").Find([](const Key& k, auto) { return k.type == fmtd::kExtentDataRefKey; }))
      << "no keyed EXTENT_DATA_REF";
  EXPECT_TRUE(Img("balance-snapshot").Find([](const Key& k, auto d) {
    return IsTreeBlock(k, d) && (Ei(d).flags.get() & fmtd::kBlockFlagFullBackref);
  })) << "no FULL_BACKREF block";
}

// refs of a shared tree block one too many.
TEST_F(CheckRefsTest, SharedBlockRefsCount) {
  const Image& im = Img("snapshots");
  auto it = im.Find([](const Key& k, auto d) { return IsTreeBlock(k, d) && Ei(d).refs.get() >= 2; });
  ASSERT_TRUE(it);
  Patcher p(im.path);
  im.Patch(p, *it, [&](Block& b) {
    auto& ei = ItemAs<fmtd::ExtentItem>(b, it->slot);
    ei.refs.set(ei.refs.get() + 1);
  });
  ExpectBothFind(im, "reference(s) found");
}

// refs of a reflinked data extent one too few.
TEST_F(CheckRefsTest, ReflinkedExtentRefsCount) {
  const Image& im = Img("reflinks");
  auto it = im.Find([](const Key& k, auto d) { return IsData(k, d) && Ei(d).refs.get() >= 2; });
  ASSERT_TRUE(it);
  Patcher p(im.path);
  im.Patch(p, *it, [&](Block& b) {
    auto& ei = ItemAs<fmtd::ExtentItem>(b, it->slot);
    ei.refs.set(ei.refs.get() - 1);
  });
  ExpectBothFind(im, "file extent item(s) point to it");
}

// The count of a data backref, changed while refs stays.
TEST_F(CheckRefsTest, DataRefCount) {
  const Image& im = Img("reflinks");
  auto it = im.Find([](const Key& k, auto) { return k.type == fmtd::kExtentDataRefKey; });
  ASSERT_TRUE(it);
  Patcher p(im.path);
  im.Patch(p, *it, [&](Block& b) {
    auto& r = ItemAs<fmtd::ExtentDataRef>(b, it->slot);
    r.count.set(r.count.get() + 1);
  });
  ExpectBothFind(im, "count 2, but 1 file extent item(s) found");
}

// A keyed backref item dropped: of a reflinked extent, and of a block after
// the balance (whichever kinds the kernel keyed there).
TEST_F(CheckRefsTest, KeyedRefDropped) {
  for (const char* name : {"reflinks", "balance-snapshot"}) {
    SCOPED_TRACE(name);
    const Image& im = Img(name);
    auto it = im.Find(
        [](const Key& k, auto) {
          return k.type == fmtd::kExtentDataRefKey || k.type == fmtd::kSharedDataRefKey ||
                 k.type == fmtd::kSharedBlockRefKey || k.type == fmtd::kTreeBlockRefKey;
        },
        /*allow_slot0=*/false);
    if (!it) {
      EXPECT_STREQ(name, "balance-snapshot") << "no keyed backref to drop";
      continue;
    }
    Patcher p(im.path);
    im.Patch(p, *it, [&](Block& b) { RemoveItem(b, it->slot); });
    ExpectBothFind(im, ", though ");
  }
}

// The last inline backref cut from an extent item (refs unchanged): a
// shared tree block of a snapshot, a reflinked data extent, a block of the
// balanced image.
TEST_F(CheckRefsTest, InlineRefRemoved) {
  for (const auto& [name, data] : std::vector<std::pair<std::string, bool>>{
           {"snapshots", false}, {"reflinks", true}, {"balance-snapshot", false}}) {
    SCOPED_TRACE(name);
    const Image& im = Img(name);
    auto it = im.Find([data = data](const Key& k, auto d) {
      return (data ? IsData(k, d) : IsTreeBlock(k, d)) && InlineRefs(k, d).size() >= 2;
    });
    ASSERT_TRUE(it);
    const size_t cut = InlineRefs(it->key, it->data).back().second;
    Patcher p(im.path);
    im.Patch(p, *it, [&](Block& b) { ResizeItem(b, it->slot, it->data.size() - cut); });
    ExpectBothFind(im, ", though ");
  }
}

// FULL_BACKREF cleared on a block of the balanced image that is a parent by
// address (of a shared block or shared data ref): those refs then name a
// parent that refers by tree, or (a block relocation rewrote, RELOC in its
// header) the block lacks the flag relocation gives it; btrfs check calls
// either a bad full backref.
TEST_F(CheckRefsTest, FullBackrefCleared) {
  const Image& im = Img("balance-snapshot");
  std::set<uint64_t> parents;
  im.Find([&](const Key& k, std::span<const uint8_t> d) {
    if (k.type == fmtd::kSharedBlockRefKey || k.type == fmtd::kSharedDataRefKey) parents.insert(k.offset);
    if (k.type != fmtd::kExtentItemKey && k.type != fmtd::kMetadataItemKey) return false;
    size_t p = sizeof(fmtd::ExtentItem);
    if (k.type == fmtd::kExtentItemKey && (Ei(d).flags.get() & fmtd::kExtentFlagTreeBlock)) p += sizeof(fmtd::TreeBlockInfo);
    for (const auto& [type, n] : InlineRefs(k, d)) {
      if (type == fmtd::kSharedBlockRefKey || type == fmtd::kSharedDataRefKey) {
        parents.insert(fmtd::LoadLe<uint64_t>(d.data() + p + 1));
      }
      p += n;
    }
    return false;
  });
  auto it = im.Find([&](const Key& k, auto d) {
    return IsTreeBlock(k, d) && (Ei(d).flags.get() & fmtd::kBlockFlagFullBackref) && parents.count(k.objectid);
  });
  ASSERT_TRUE(it) << "no FULL_BACKREF block is a parent of a shared ref";
  Patcher p(im.path);
  im.Patch(p, *it, [&](Block& b) {
    auto& ei = ItemAs<fmtd::ExtentItem>(b, it->slot);
    ei.flags.set(ei.flags.get() & ~fmtd::kBlockFlagFullBackref);
  });
  ExpectBothFind(im, "FULL_BACKREF");
}

// FULL_BACKREF set on a leaf of the top-level fs tree, which was never
// snapshotted in that image: newer than its tree's last snapshot.
TEST_F(CheckRefsTest, FullBackrefSetOnUnsharedBlock) {
  const Image& im = Img("reflinks");
  auto it = im.Find([](const Key& k, auto d) {
    if (!IsTreeBlock(k, d) || k.type != fmtd::kMetadataItemKey || k.offset != 0) return false;
    auto refs = InlineRefs(k, d);
    return refs.size() == 1 && refs[0].first == fmtd::kTreeBlockRefKey &&
           fmtd::LoadLe<uint64_t>(d.data() + sizeof(fmtd::ExtentItem) + 1) == fmtd::kFsTreeObjectid;
  });
  ASSERT_TRUE(it);
  Patcher p(im.path);
  im.Patch(p, *it, [&](Block& b) {
    auto& ei = ItemAs<fmtd::ExtentItem>(b, it->slot);
    ei.flags.set(ei.flags.get() | fmtd::kBlockFlagFullBackref);
  });
  ExpectBothFind(im, "has FULL_BACKREF, but it is newer");
}

}  // namespace
}  // namespace ubtrfs_test
