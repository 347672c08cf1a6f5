// The repairs of `ubtrfs rescue` besides zero-log (tests/rescue_test.cc):
// super-recover, fix-device-size, clear-uuid-tree. Each case damages a
// mkfs.btrfs image the way the field does (a torn or stale superblock copy,
// sizes older kernels left, a UUID tree that does not read), asserts what
// the kernel and `ubtrfs check` say of it, repairs it with ubtrfs, and then
// holds the result to btrfs-progs (its own rescue command finds nothing
// left to fix, or makes the same repair on a copy; btrfs check is clean)
// and to the kernel (it mounts, shows the files, and writes on).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "format/checksum.h"
#include "format/key.h"
#include "format/ondisk.h"
#include "support/damage_util.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "tree/cursor.h"
#include "txn/devices.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

namespace uf = ubtrfs::format;
using ubtrfs::Filesystem;

std::vector<uint8_t> ReadAt(const std::string& path, uint64_t off, size_t n) {
  std::vector<uint8_t> b(n);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  if (fd < 0) return {};
  EXPECT_EQ(::pread(fd, b.data(), n, static_cast<off_t>(off)), static_cast<ssize_t>(n)) << path << " at " << off;
  ::close(fd);
  return b;
}

void WriteAt(const std::string& path, uint64_t off, const std::vector<uint8_t>& b) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  EXPECT_EQ(::pwrite(fd, b.data(), b.size(), static_cast<off_t>(off)), static_cast<ssize_t>(b.size()));
  ::close(fd);
}

// Superblock copy `m` of `img` rewritten through `change`, its checksum
// recomputed (a valid copy that says something else).
void EditSuper(const std::string& img, int m, const std::function<void(uf::SuperBlock&)>& change) {
  const uint64_t off = uf::SuperblockOffset(m);
  std::vector<uint8_t> b = ReadAt(img, off, uf::kSuperInfoSize);
  ASSERT_EQ(b.size(), uf::kSuperInfoSize);
  auto& sb = *reinterpret_cast<uf::SuperBlock*>(b.data());
  change(sb);
  auto c = uf::ComputeCsum(sb.csum_type.get(), std::span<const uint8_t>(b).subspan(uf::kCsumSize));
  std::memcpy(sb.csum, c.data(), uf::kCsumSize);
  WriteAt(img, off, b);
}

// Every superblock copy the file has room for.
void EditSupers(const std::string& img, const std::function<void(uf::SuperBlock&)>& change) {
  for (int m = 0; m < uf::kSuperMirrorMax; ++m) {
    if (uf::SuperblockOffset(m) + uf::kSuperInfoSize > HostFileSize(img)) break;
    EditSuper(img, m, change);
  }
}

uint64_t SuperGeneration(const std::string& img, int m) {
  std::vector<uint8_t> b = ReadAt(img, uf::SuperblockOffset(m), uf::kSuperInfoSize);
  return b.size() == uf::kSuperInfoSize ? reinterpret_cast<const uf::SuperBlock*>(b.data())->generation.get() : 0;
}

// The volume of `img` opened read-only (one device).
std::unique_ptr<ubtrfs::txn::Volume> OpenVolume(const std::string& img) {
  auto devs = ubtrfs::txn::OpenDevices(ubtrfs::txn::DeviceSpec::Of(img, 0, 0, {}));
  EXPECT_TRUE(devs.ok()) << devs.status().ToString();
  if (!devs.ok()) return nullptr;
  auto vol = ubtrfs::txn::Volume::Open(std::move(*devs), ubtrfs::txn::VolumeOptions{});
  EXPECT_TRUE(vol.ok()) << vol.status().ToString();
  return vol.ok() ? std::move(*vol) : nullptr;
}

// Rewrites, in every copy, the leaf of tree `root` holding key `k`: `change`
// gets the leaf and the item's slot; the checksum is recomputed.
void EditItem(const std::string& img, bool chunk_tree, uint64_t tree_id, const uf::Key& k,
              const std::function<void(Block&, int)>& change) {
  auto vol = OpenVolume(img);
  ASSERT_NE(vol, nullptr);
  ubtrfs::tree::RootPtr root;
  if (chunk_tree) {
    root = vol->chunk_tree();
  } else {
    auto r = vol->FindRoot(tree_id);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    root = r->ref;
  }
  ubtrfs::tree::Cursor c(vol->reader(), root);
  ASSERT_TRUE(c.Seek(k).ok());
  ASSERT_TRUE(c.Valid() && c.key() == k) << "no item " << uf::KeyToString(k);
  const uint64_t leaf = c.leaf().bytenr();
  const int slot = c.slot();
  const uint32_t nodesize = vol->nodesize();
  const uint16_t csum_type = vol->csum_type();
  auto copies = vol->chunks().MapPhysical(leaf, nodesize);
  ASSERT_TRUE(copies.ok()) << copies.status().ToString();
  vol.reset();
  for (uint64_t phys : *copies) {
    Block b = ReadAt(img, phys, nodesize);
    change(b, slot);
    FixTreeCsum(b, csum_type);
    WriteAt(img, phys, b);
  }
}

// The DEV_ITEM of device 1 in the chunk tree and in every superblock copy
// says `dev_bytes`; the superblocks' total says `super_bytes`.
void SetSizes(const std::string& img, uint64_t dev_bytes, uint64_t super_bytes) {
  EditItem(img, true, 0, uf::Key{uf::kDevItemsObjectid, uf::kDevItemKey, 1},
           [&](Block& b, int slot) { ItemAs<uf::DevItem>(b, slot).total_bytes = dev_bytes; });
  EditSupers(img, [&](uf::SuperBlock& sb) {
    sb.dev_item.total_bytes = dev_bytes;
    sb.total_bytes = super_bytes;
  });
}

// A field of `btrfs inspect-internal dump-super` (the primary).
uint64_t DumpSuperField(const std::string& img, const std::string& name) {
  CommandResult r = RunCommand({"btrfs", "inspect-internal", "dump-super", img});
  EXPECT_TRUE(r.ok()) << r.Describe();
  size_t at = 0;
  while ((at = r.out.find(name, at)) != std::string::npos) {
    const bool line_start = at == 0 || r.out[at - 1] == '\n' || r.out[at - 1] == '\t';
    const size_t after = at + name.size();
    if (line_start && after < r.out.size() && (r.out[after] == ' ' || r.out[after] == '\t')) {
      return std::stoull(r.out.substr(r.out.find_first_not_of(" \t", after)));
    }
    at = after;
  }
  ADD_FAILURE() << "no " << name << " in dump-super of " << img;
  return 0;
}

class RescueRepairTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
    tmp_ = std::make_unique<TempDir>("ubtrfs-rescue-repair");
    src_ = tmp_->Sub("src");
    std::filesystem::create_directories(src_ + "/dir/sub");
    WriteRandomFile(src_ + "/big", 3u << 20, 1);
    WriteRandomFile(src_ + "/dir/text", 70000, 2, /*text=*/true);
    WriteHostFile(src_ + "/dir/sub/small", "small\n");
  }

  // A mkfs.btrfs image of `size` bytes with the source tree copied in by
  // ubtrfs, and `subvols` subvolumes (each with a snapshot) for the UUID tree.
  std::string MakeImage(const std::string& name, uint64_t size, const std::vector<std::string>& extra = {},
                        int subvols = 1) {
    const std::string img = tmp_->Sub(name);
    std::string e = RunMkfs(img, "", 0, "", size, extra);
    EXPECT_EQ(e, "");
    CommandResult r = RunUbtrfs({"cp", src_, img + ":/src"});
    EXPECT_TRUE(r.ok()) << r.Describe();
    auto fs = OpenWritable(img);
    if (fs == nullptr) return img;
    const ubtrfs::InodeId top = fs->Root();
    std::vector<ubtrfs::InodeId> svs;
    for (int i = 0; i < subvols; ++i) {
      auto sv = fs->CreateSubvolume(top, "sv" + std::to_string(i), ubtrfs::NewInode{.mode = 040755});
      EXPECT_TRUE(sv.ok()) << sv.status().ToString();
      if (sv.ok()) svs.push_back(*sv);
    }
    EXPECT_TRUE(fs->Commit().ok());
    for (size_t i = 0; i < svs.size(); ++i) {
      auto snap = fs->CreateSnapshot(svs[i], top, "snap" + std::to_string(i), /*read_only=*/true);
      EXPECT_TRUE(snap.ok()) << snap.status().ToString();
    }
    EXPECT_TRUE(fs->Commit().ok());
    return img;
  }

  // The kernel mounts `img` (or refuses it: want_mount false); mounted, it
  // shows the source tree at /src, takes a new file and unmounts cleanly.
  void KernelMounts(const std::string& img, bool want_mount = true) {
    std::string why;
    if (!LoopMountsAvailable(&why)) {
      std::fprintf(stderr, "[ skipped  ] the kernel's part: loop mounts unavailable: %s\n", why.c_str());
      return;
    }
    const std::string mnt = tmp_->Sub("mnt");
    std::filesystem::create_directories(mnt);
    LoopMount m;
    const std::string e = m.Mount(img, mnt);
    if (!want_mount) {
      EXPECT_FALSE(e.empty()) << "the kernel mounted " << img;
      return;
    }
    ASSERT_EQ(e, "") << "the kernel does not mount " << img;
    auto mismatches = CompareHostTrees(src_, mnt + "/src");
    EXPECT_TRUE(mismatches.empty()) << FormatMismatches(mismatches);
    WriteHostFile(mnt + "/written-by-the-kernel", "after the repair\n");
    EXPECT_EQ(m.Unmount(), "");
  }

  std::unique_ptr<TempDir> tmp_;
  std::string src_;
};

// super-recover: a torn primary (bad checksum), a stale copy (an older
// generation) and a newer copy behind a valid older primary. The kernel
// reads only the primary: it refuses the torn one until the repair.
TEST_F(RescueRepairTest, SuperRecoverRewritesTornAndStaleCopies) {
  const std::string img = MakeImage("sr.img", 300ull << 20);
  ASSERT_FALSE(HasFailure());
  const std::vector<uint8_t> old_primary = ReadAt(img, uf::SuperblockOffset(0), uf::kSuperInfoSize);
  ASSERT_TRUE(RunUbtrfs({"mkdir", img + ":/later"}).ok());  // a commit: generation + 1
  const uint64_t gen = SuperGeneration(img, 0);
  ASSERT_EQ(SuperGeneration(img, 1), gen);

  CommandResult r = RunUbtrfs({"rescue", "super-recover", img});
  EXPECT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("All supers are valid, no need to recover"), std::string::npos) << r.out;

  // Copy 1 stale: the copy from before the commit, moved to its place.
  {
    std::vector<uint8_t> stale = old_primary;
    WriteAt(img, uf::SuperblockOffset(1), stale);
    EditSuper(img, 1, [](uf::SuperBlock& sb) { sb.bytenr = uf::SuperblockOffset(1); });
  }
  ASSERT_EQ(SuperGeneration(img, 1), gen - 1);
  // Without -y and no one to say yes: nothing is written.
  auto supers = [&] {
    std::vector<uint8_t> both = ReadAt(img, uf::SuperblockOffset(0), uf::kSuperInfoSize);
    std::vector<uint8_t> one = ReadAt(img, uf::SuperblockOffset(1), uf::kSuperInfoSize);
    both.insert(both.end(), one.begin(), one.end());
    return both;
  };
  const std::vector<uint8_t> before = supers();
  r = RunUbtrfs({"rescue", "super-recover", img});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.out.find("superblock copy 1 at 67108864: generation " + std::to_string(gen - 1) + ", expected " +
                       std::to_string(gen)),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Aborted"), std::string::npos) << r.out;
  EXPECT_TRUE(supers() == before);
  r = RunUbtrfs({"rescue", "super-recover", "-y", img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("Recovered bad superblocks successful"), std::string::npos) << r.out;
  EXPECT_EQ(SuperGeneration(img, 1), gen);
  r = RunCommand({"btrfs", "rescue", "super-recover", "-y", img});
  EXPECT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("All supers are valid"), std::string::npos) << "btrfs-progs: " << r.out;

  // The primary torn: a bit flipped in its body.
  {
    std::vector<uint8_t> b = ReadAt(img, uf::SuperblockOffset(0) + 300, 1);
    b[0] ^= 0x10;
    WriteAt(img, uf::SuperblockOffset(0) + 300, b);
  }
  KernelMounts(img, /*want_mount=*/false);
  r = RunUbtrfs({"rescue", "super-recover", "-y", img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("superblock copy 0 at 65536: checksum mismatch"), std::string::npos) << r.out;
  r = RunCommand({"btrfs", "rescue", "super-recover", "-y", img});
  EXPECT_NE(r.out.find("All supers are valid"), std::string::npos) << "btrfs-progs: " << r.Describe();
  EXPECT_EQ(BtrfsCheck(img), "");
  KernelMounts(img);

  // A valid primary older than copy 1 (a commit that reached only copy 1,
  // as a torn sequence of writes can leave it): the newer one wins.
  const uint64_t now = SuperGeneration(img, 0);
  const std::vector<uint8_t> current = ReadAt(img, uf::SuperblockOffset(0), uf::kSuperInfoSize);
  ASSERT_TRUE(RunUbtrfs({"mkdir", img + ":/newest"}).ok());
  ASSERT_EQ(SuperGeneration(img, 0), now + 1);
  WriteAt(img, uf::SuperblockOffset(0), current);
  r = RunUbtrfs({"rescue", "super-recover", "-y", "-v", img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("superblock copy 0 at 65536: generation " + std::to_string(now) + ", expected " +
                       std::to_string(now + 1)),
            std::string::npos)
      << r.out;
  EXPECT_EQ(SuperGeneration(img, 0), now + 1);
  EXPECT_EQ(DumpSuperField(img, "generation"), now + 1);
  EXPECT_TRUE(RunUbtrfs({"ls", img + ":/newest"}).ok());
  EXPECT_EQ(BtrfsCheck(img), "");
}

// Two devices (RAID1): each device's copies are rewritten with its own
// DEV_ITEM, and a device's copies from another generation count as bad.
TEST_F(RescueRepairTest, SuperRecoverOnEveryDeviceWithItsOwnDevItem) {
  const std::string a = tmp_->Sub("m1.img"), b = tmp_->Sub("m2.img");
  ASSERT_TRUE(MakeSparseFile(a, 300ull << 20, nullptr));
  ASSERT_TRUE(MakeSparseFile(b, 300ull << 20, nullptr));
  CommandResult r = RunUbtrfs({"mkfs", "-d", "raid1", "-m", "raid1", a, b});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ASSERT_TRUE(RunUbtrfs({"cp", src_, a + "," + b + ":/src"}).ok());
  // Device 2's primary torn, device 1's copy 1 zeroed (no magic).
  std::vector<uint8_t> bit = ReadAt(b, uf::SuperblockOffset(0) + 200, 1);
  bit[0] ^= 1;
  WriteAt(b, uf::SuperblockOffset(0) + 200, bit);
  WriteAt(a, uf::SuperblockOffset(1), std::vector<uint8_t>(uf::kSuperInfoSize, 0));
  r = RunUbtrfs({"rescue", "super-recover", "-y", a + "," + b});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("device 2 (" + b + ") superblock copy 0 at 65536: checksum mismatch"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("device 1 (" + a + ") superblock copy 1 at 67108864: bad magic"), std::string::npos) << r.out;
  for (const auto& dev : {a, b}) {
    CommandResult progs = RunCommand({"btrfs", "rescue", "super-recover", "-y", dev});
    EXPECT_NE(progs.out.find("All supers are valid"), std::string::npos) << dev << ": " << progs.Describe();
  }
  EXPECT_EQ(DumpSuperField(a, "dev_item.devid"), 1u);
  EXPECT_EQ(DumpSuperField(b, "dev_item.devid"), 2u);
  r = RunUbtrfs({"check", a + "," + b});
  EXPECT_TRUE(r.ok()) << r.Describe();

  // A commit that reached only device 1's copy 1: both primaries valid and
  // a generation older, device 2's copy 1 gone. The newest copy is copy 1
  // on one device but not on the other: each device is read from its own
  // newest valid copy (before, copy 1 of every device was asked for, and
  // device 2's failed the open).
  const uint64_t gen = SuperGeneration(a, 0);
  const std::vector<uint8_t> a0 = ReadAt(a, uf::SuperblockOffset(0), uf::kSuperInfoSize);
  const std::vector<uint8_t> b0 = ReadAt(b, uf::SuperblockOffset(0), uf::kSuperInfoSize);
  ASSERT_TRUE(RunUbtrfs({"mkdir", a + "," + b + ":/newest"}).ok());
  ASSERT_EQ(SuperGeneration(a, 1), gen + 1);
  WriteAt(a, uf::SuperblockOffset(0), a0);
  WriteAt(b, uf::SuperblockOffset(0), b0);
  WriteAt(b, uf::SuperblockOffset(1), std::vector<uint8_t>(uf::kSuperInfoSize, 0));
  r = RunUbtrfs({"rescue", "super-recover", "-y", a + "," + b});
  ASSERT_TRUE(r.ok()) << r.Describe();
  for (const auto& dev : {a, b}) {
    EXPECT_EQ(SuperGeneration(dev, 0), gen + 1) << dev;
    EXPECT_EQ(SuperGeneration(dev, 1), gen + 1) << dev;
    CommandResult progs = RunCommand({"btrfs", "rescue", "super-recover", "-y", dev});
    EXPECT_NE(progs.out.find("All supers are valid"), std::string::npos) << dev << ": " << progs.Describe();
  }
  EXPECT_EQ(DumpSuperField(b, "dev_item.devid"), 2u);
  EXPECT_TRUE(RunUbtrfs({"ls", a + "," + b + ":/newest"}).ok());
  r = RunUbtrfs({"check", a + "," + b});
  EXPECT_TRUE(r.ok()) << r.Describe();
}

// fix-device-size, unaligned: a device size that is no sector multiple (a
// partition of an odd size under an old kernel). btrfs check and ubtrfs
// check warn; the repair is the one btrfs-progs makes on a copy.
TEST_F(RescueRepairTest, FixDeviceSizeAlignsAsBtrfsProgsDoes) {
  const uint64_t size = 300ull << 20, odd = size + 1000;
  const std::string img = MakeImage("fds.img", size);
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(::truncate(img.c_str(), static_cast<off_t>(odd)), 0);
  SetSizes(img, odd, odd);
  CommandResult r = RunUbtrfs({"check", img});
  EXPECT_TRUE(r.ok()) << r.Describe();  // a warning, not an error
  EXPECT_NE((r.out + r.err).find("DEV_ITEM 1: total_bytes " + std::to_string(odd) + " is not a multiple of the sector size"),
            std::string::npos)
      << r.Describe();
  EXPECT_NE((r.out + r.err).find("rescue fix-device-size"), std::string::npos) << r.Describe();

  const std::string theirs = tmp_->Sub("fds-progs.img");
  std::filesystem::copy_file(img, theirs);
  r = RunCommand({"btrfs", "rescue", "fix-device-size", theirs});
  ASSERT_TRUE(r.ok()) << "btrfs-progs: " << r.Describe();
  r = RunUbtrfs({"rescue", "fix-device-size", img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("Fixed device size for devid 1, old size: " + std::to_string(odd) +
                       " new size: " + std::to_string(size)),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Fixed super total bytes, old size: " + std::to_string(odd) + " new size: " +
                       std::to_string(size)),
            std::string::npos)
      << r.out;
  for (const char* field : {"total_bytes", "dev_item.total_bytes"}) {
    EXPECT_EQ(DumpSuperField(img, field), DumpSuperField(theirs, field)) << field;
  }
  EXPECT_EQ(DumpSuperField(img, "total_bytes"), size);
  // The chunk tree's DEV_ITEM, as btrfs-progs prints it.
  auto dev_item_line = [](const std::string& image) {
    CommandResult d = RunCommand({"btrfs", "inspect-internal", "dump-tree", "-t", "chunk", image});
    const size_t at = d.out.find("DEV_ITEM 1)");
    const size_t total = d.out.find("total_bytes", at);
    return at == std::string::npos || total == std::string::npos ? d.Describe()
                                                                 : d.out.substr(total, d.out.find(' ', total + 12) - total);
  };
  EXPECT_EQ(dev_item_line(img), dev_item_line(theirs));
  EXPECT_EQ(dev_item_line(img), "total_bytes " + std::to_string(size));
  EXPECT_EQ(BtrfsCheck(img), "");
  r = RunUbtrfs({"check", img});
  EXPECT_TRUE(r.ok() && r.err.find("fix-device-size") == std::string::npos) << r.Describe();
  r = RunUbtrfs({"rescue", "fix-device-size", img});
  EXPECT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("No device size related problem found"), std::string::npos) << r.out;
  KernelMounts(img);
}

// fix-device-size, the superblock's total below the devices' (the kernel
// refuses the mount), and a DEV_ITEM larger than its image file.
TEST_F(RescueRepairTest, FixDeviceSizeLetsTheKernelMountAgain) {
  const uint64_t size = 300ull << 20;
  const std::string img = MakeImage("small-total.img", size);
  ASSERT_FALSE(HasFailure());
  SetSizes(img, size, size - (1u << 20));
  KernelMounts(img, /*want_mount=*/false);
  CommandResult r = RunUbtrfs({"check", img});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.out.find("the kernel refuses to mount it (`ubtrfs rescue fix-device-size` fixes it)"),
            std::string::npos)
      << r.Describe();
  r = RunUbtrfs({"rescue", "fix-device-size", img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("Fixed super total bytes, old size: " + std::to_string(size - (1u << 20)) +
                       " new size: " + std::to_string(size)),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("Fixed device size"), std::string::npos) << r.out;
  EXPECT_EQ(BtrfsCheck(img), "");
  KernelMounts(img);

  // The DEV_ITEM says 100 MiB more than the file holds; no chunk is there.
  SetSizes(img, size + (100u << 20), size + (100u << 20));
  r = RunUbtrfs({"rescue", "fix-device-size", img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("Fixed device size for devid 1, old size: " + std::to_string(size + (100u << 20)) +
                       " new size: " + std::to_string(size)),
            std::string::npos)
      << r.out;
  EXPECT_EQ(DumpSuperField(img, "total_bytes"), size);
  EXPECT_EQ(BtrfsCheck(img), "");
  KernelMounts(img);

  // Cut to 100 MiB with chunks past that: refused, nothing written.
  const std::string cut = tmp_->Sub("cut.img");
  std::filesystem::copy_file(img, cut);
  ASSERT_EQ(::truncate(cut.c_str(), 100 << 20), 0);
  const std::string before = Sha256(cut);
  r = RunUbtrfs({"rescue", "fix-device-size", cut});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("beyond the end of the device"), std::string::npos) << r.Describe();
  EXPECT_EQ(Sha256(cut), before);
}

// clear-uuid-tree, on a UUID tree of several blocks (100 subvolumes and
// their snapshots in 4 KiB nodes): once when it reads, once when its root
// node does not (its blocks found through the extent tree then). The kernel refuses the
// damaged one, mounts either after the repair and builds a new tree, which
// btrfs check finds whole.
TEST_F(RescueRepairTest, ClearUuidTreeFreesEveryBlockEvenUnreadableOnes) {
  const std::string img = MakeImage("uuid.img", 512ull << 20, {"-n", "4096"}, 100);
  ASSERT_FALSE(HasFailure());
  const std::string damaged = tmp_->Sub("uuid-damaged.img");
  std::filesystem::copy_file(img, damaged);
  uint64_t blocks = 0;
  {
    auto vol = OpenVolume(img);
    ASSERT_NE(vol, nullptr);
    auto root = vol->FindRoot(uf::kUuidTreeObjectid);
    ASSERT_TRUE(root.ok()) << root.status().ToString();
    ASSERT_GE(root->ref.level, 1) << "the UUID tree is one leaf: the case needs a node";
    auto top = vol->reader()->Read(ubtrfs::tree::BlockCheck{root->ref.bytenr, root->ref.level, 0, {}});
    ASSERT_TRUE(top.ok());
    blocks = 1 + (*top)->nritems();
    // A bit flipped in the middle of the root node's every copy: the
    // kernel reads that one at mount.
    auto copies = vol->chunks().MapPhysical(root->ref.bytenr, vol->nodesize());
    ASSERT_TRUE(copies.ok());
    for (uint64_t phys : *copies) {
      std::vector<uint8_t> b = ReadAt(damaged, phys + vol->nodesize() / 2, 1);
      b[0] ^= 4;
      WriteAt(damaged, phys + vol->nodesize() / 2, b);
    }
  }
  KernelMounts(damaged, /*want_mount=*/false);

  for (const std::string& image : {img, damaged}) {
    SCOPED_TRACE(image);
    CommandResult r = RunUbtrfs({"rescue", "clear-uuid-tree", image});
    ASSERT_TRUE(r.ok()) << r.Describe();
    EXPECT_NE(r.out.find("(" + std::to_string(blocks) + " tree blocks freed)"), std::string::npos) << r.out;
    EXPECT_EQ(BtrfsCheck(image), "") << "every block of the tree went back to free space";
    r = RunUbtrfs({"check", image});
    EXPECT_TRUE(r.ok()) << r.Describe();
    EXPECT_NE(DumpSuperField(image, "uuid_tree_generation"), DumpSuperField(image, "generation"))
        << "a UUID tree that is gone is not current";
    r = RunUbtrfs({"rescue", "clear-uuid-tree", image});
    EXPECT_TRUE(r.ok()) << r.Describe();
    EXPECT_NE(r.out.find("nothing to clear"), std::string::npos) << r.out;
    // ubtrfs writes on without it: a snapshot, a file.
    r = RunUbtrfs({"subvolume", "snapshot", image + ":/sv0", image + ":/later-snap"});
    EXPECT_TRUE(r.ok()) << r.Describe();
    EXPECT_EQ(BtrfsCheck(image), "");
    KernelMounts(image);
    EXPECT_EQ(BtrfsCheck(image), "") << "after the kernel built the UUID tree again";
    CommandResult tree = RunCommand({"btrfs", "inspect-internal", "dump-tree", "-t", "uuid", image});
    EXPECT_NE(tree.out.find("UUID_KEY_SUBVOL"), std::string::npos) << tree.Describe();
  }
}

}  // namespace UBTRFS_UNITY_ID
}  // namespace ubtrfs_test
