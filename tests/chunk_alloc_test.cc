// New chunks when space runs out (txn/chunk_alloc): images made by
// mkfs.btrfs on small sparse files, filled through TxnManager until DATA,
// METADATA and SYSTEM need new chunks, then until the device is full. Every
// committed state must pass `btrfs check --readonly`, read back through
// ubtrfs and, where loop mounts work, through the kernel.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include <cstring>
#include <fstream>
#include <map>

#include "format/checksum.h"
#include "format/superblock.h"
#include "io/block_device.h"
#include "support/items.h"
#include "support/mkfs_util.h"
#include "support/open_txn.h"
#include "support/test_util.h"
#include "tree/cursor.h"
#include "txn/chunk_alloc.h"
#include "txn/transaction.h"
#include "ubtrfs/filesystem.h"

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using namespace ubtrfs::format;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

constexpr uint64_t kMiB = 1ull << 20;

// ---- PlaceStripes ---------------------------------------------------------------------------

using Holes = std::vector<std::pair<uint64_t, uint64_t>>;

TEST(PlaceStripes, SingleTakesTheFirstHoleThatFits) {
  uint64_t len = 0;
  auto r = txn::PlaceStripes(Holes{{1 * kMiB, 4 * kMiB}, {20 * kMiB, 50 * kMiB}}, 1, 8 * kMiB, kMiB, &len);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, std::vector<uint64_t>{20 * kMiB});
  EXPECT_EQ(len, 8 * kMiB);
}

TEST(PlaceStripes, SingleShrinksToTheLargestHole) {
  uint64_t len = 0;
  auto r = txn::PlaceStripes(Holes{{1 * kMiB, 4 * kMiB}, {20 * kMiB, 5 * kMiB + 4096}}, 1, 8 * kMiB, kMiB, &len);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, std::vector<uint64_t>{20 * kMiB});
  EXPECT_EQ(len, 5 * kMiB);  // whole 64 KiB units
  r = txn::PlaceStripes(Holes{{1 * kMiB, 4 * kMiB}}, 1, 8 * kMiB, 5 * kMiB, &len);
  EXPECT_EQ(r.status().code(), ENOSPC);
}

TEST(PlaceStripes, DupPrefersOneHoleThenTwoThenShrinks) {
  uint64_t len = 0;
  auto r = txn::PlaceStripes(Holes{{1 * kMiB, 10 * kMiB}, {40 * kMiB, 30 * kMiB}}, 2, 8 * kMiB, kMiB, &len);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<uint64_t>{40 * kMiB, 48 * kMiB}));
  EXPECT_EQ(len, 8 * kMiB);

  r = txn::PlaceStripes(Holes{{1 * kMiB, 10 * kMiB}, {40 * kMiB, 12 * kMiB}}, 2, 8 * kMiB, kMiB, &len);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<uint64_t>{1 * kMiB, 40 * kMiB}));
  EXPECT_EQ(len, 8 * kMiB);

  // 6 MiB + 3 MiB: 3 MiB in two holes beats 3 MiB (half of 6) in one; equal, one hole wins.
  r = txn::PlaceStripes(Holes{{1 * kMiB, 3 * kMiB}, {40 * kMiB, 6 * kMiB}}, 2, 8 * kMiB, kMiB, &len);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(len, 3 * kMiB);
  EXPECT_EQ(*r, (std::vector<uint64_t>{40 * kMiB, 43 * kMiB}));
  r = txn::PlaceStripes(Holes{{1 * kMiB, 5 * kMiB}, {40 * kMiB, 6 * kMiB}}, 2, 8 * kMiB, kMiB, &len);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(len, 5 * kMiB);
  EXPECT_EQ(*r, (std::vector<uint64_t>{1 * kMiB, 40 * kMiB}));

  r = txn::PlaceStripes(Holes{{1 * kMiB, kMiB}}, 2, 8 * kMiB, kMiB, &len);
  EXPECT_EQ(r.status().code(), ENOSPC);
  r = txn::PlaceStripes(Holes{}, 1, 8 * kMiB, kMiB, &len);
  EXPECT_EQ(r.status().code(), ENOSPC);
}

// ---- Helpers ------------------------------------------------------------------------------

using ubtrfs_test::BtrfsCheck;

using ubtrfs_test::Opened;
using ubtrfs_test::OpenForWrite;

// Chunks of the committed image by type (DATA/METADATA/SYSTEM | profile).
std::map<uint64_t, int> ChunkTypes(const std::string& img) {
  std::map<uint64_t, int> out;
  auto dev = io::OpenFileDevice(img);
  if (!dev.ok()) return out;
  auto vol = txn::Volume::Open(std::move(*dev), txn::VolumeOptions{});
  if (!vol.ok()) return out;
  for (const auto& [logical, c] : (*vol)->chunks().chunks()) ++out[c.type];
  return out;
}

int CountKind(const std::map<uint64_t, int>& types, uint64_t kind) {
  int n = 0;
  for (auto [t, c] : types) {
    if (t & kind) n += c;
  }
  return n;
}

std::string Describe(const std::map<uint64_t, int>& types) {
  std::string s;
  for (auto [t, c] : types) {
    s += alloc::SpaceManager::KindName(t) + "|" + alloc::ProfileName(t) + " x" + std::to_string(c) + "; ";
  }
  return s;
}

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// File content: a function of (seed, offset), 8 bytes at a time.
void Pattern(std::span<uint8_t> out, uint64_t file_off, uint64_t seed) {
  for (size_t i = 0; i < out.size(); i += 8) {
    const uint64_t v = Mix(seed * 0x100000001B3ull + (file_off + i) / 8);
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, out.size() - i));
  }
}

// A regular file (made by mkfs --rootdir, empty) that the test fills with
// extents through TxnManager, as the file system's write path would.
struct DataFile {
  uint64_t ino = 0;
  uint64_t seed = 0;
  uint64_t size = 0;  // in the running transaction
};

Status AppendExtent(txn::TxnManager& t, DataFile& f, uint64_t len) {
  UB_ASSIGN_OR_RETURN(uint64_t bytenr, t.AllocData(len));
  std::vector<uint8_t> buf(len);
  Pattern(buf, f.size, f.seed);
  UB_RETURN_IF_ERROR(t.WriteData(bytenr, buf, true));
  FileExtentItem fe{};
  fe.generation = t.transid();
  fe.ram_bytes = len;
  fe.compression = kCompressNone;
  fe.type = kFileExtentReg;
  fe.disk_bytenr = bytenr;
  fe.disk_num_bytes = len;
  fe.offset = 0;
  fe.num_bytes = len;
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, t.Writer(kFsTreeObjectid));
  const auto* p = reinterpret_cast<const uint8_t*>(&fe);
  UB_RETURN_IF_ERROR(w->Insert(Key{f.ino, kExtentDataKey, f.size}, std::vector<uint8_t>(p, p + sizeof fe)));
  UB_RETURN_IF_ERROR(t.AddDataRef(bytenr, len, kFsTreeObjectid, f.ino, f.size));
  f.size += len;
  return Status::Ok();
}

// The inode item follows the extents: size, nbytes, transid.
Status SyncInode(txn::TxnManager& t, const DataFile& f) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, t.Writer(kFsTreeObjectid));
  UB_ASSIGN_OR_RETURN(auto root, t.volume()->FindRoot(kFsTreeObjectid));
  const Key key{f.ino, kInodeItemKey, 0};
  UB_ASSIGN_OR_RETURN(auto item, tree::LookupItem(t.source(), root.ref, key));
  if (!item || item->size() < sizeof(InodeItem)) return Status::NotFound("inode item");
  auto* ii = reinterpret_cast<InodeItem*>(item->data());
  ii->size = f.size;
  ii->nbytes = f.size;
  ii->transid = t.transid();
  return w->Update(key, *item);
}

using ubtrfs_test::XattrItem;

std::string XattrValue(int i, size_t len) {
  std::string v(len, '\0');
  for (size_t k = 0; k < len; ++k) v[k] = static_cast<char>('a' + (Mix(i * 7919 + k / 64) + k) % 26);
  return v;
}

// Reads `size` bytes of `path` through ubtrfs and compares with Pattern.
std::string VerifyWithUbtrfs(const std::string& img, const std::string& path, uint64_t size, uint64_t seed) {
  auto fs = Filesystem::Open(img);
  if (!fs.ok()) return "open: " + fs.status().ToString();
  auto id = (*fs)->Lookup(path);
  if (!id.ok()) return "lookup: " + id.status().ToString();
  auto st = (*fs)->GetStat(*id);
  if (!st.ok()) return "stat: " + st.status().ToString();
  if (st->size != size) return "size " + std::to_string(st->size) + ", expected " + std::to_string(size);
  std::vector<uint8_t> got(4 * kMiB), want(4 * kMiB);
  for (uint64_t off = 0; off < size; off += got.size()) {
    const size_t n = std::min<uint64_t>(got.size(), size - off);
    auto r = (*fs)->Read(*id, off, std::span(got).first(n));
    if (!r.ok()) return "read at " + std::to_string(off) + ": " + r.status().ToString();
    if (*r != n) return "short read at " + std::to_string(off);
    Pattern(std::span(want).first(n), off, seed);
    if (std::memcmp(got.data(), want.data(), n) != 0) return "content differs in [" + std::to_string(off) + ", +4 MiB)";
  }
  return "";
}

std::string VerifyHostFile(const std::string& file, uint64_t size, uint64_t seed) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return "cannot open " + file;
  std::vector<uint8_t> got(4 * kMiB), want(4 * kMiB);
  uint64_t off = 0;
  for (;;) {
    in.read(reinterpret_cast<char*>(got.data()), static_cast<std::streamsize>(got.size()));
    const size_t n = static_cast<size_t>(in.gcount());
    if (n == 0) break;
    Pattern(std::span(want).first(n), off, seed);
    if (std::memcmp(got.data(), want.data(), n) != 0) return file + ": content differs at " + std::to_string(off);
    off += n;
  }
  if (off != size) return file + ": " + std::to_string(off) + " bytes, expected " + std::to_string(size);
  return "";
}

uint64_t LookupIno(const std::string& img, const std::string& path) {
  auto fs = Filesystem::Open(img);
  if (!fs.ok()) return 0;
  auto id = (*fs)->Lookup(path);
  return id.ok() ? id->ino : 0;
}

// mkfs.btrfs --rootdir with the given empty files.
std::string MakeImage(TempDir& dir, const std::string& img, uint64_t size, uint32_t nodesize,
                      const std::vector<std::string>& files, const std::vector<std::string>& extra = {}) {
  const std::string src = dir.Sub("src");
  mkdir(src.c_str(), 0755);
  for (const auto& f : files) std::ofstream(src + "/" + f).flush();
  return ubtrfs_test::RunMkfs(img, src, nodesize, "crc32c", size, extra);
}

// ---- DATA ---------------------------------------------------------------------------------

TEST(ChunkAlloc, DataChunksUntilTwoMoreThenKernelReadsThem) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-chunk");
  const std::string img = dir.Sub("img");
  ASSERT_EQ(MakeImage(dir, img, 1024 * kMiB, 16384, {"big", "other"}), "");
  const auto before = ChunkTypes(img);
  ASSERT_EQ(CountKind(before, kBlockGroupData), 1) << Describe(before);

  DataFile f{LookupIno(img, "/big"), 42, 0};
  ASSERT_NE(f.ino, 0u);
  uint64_t target = 0, total = 0;
  {
    auto o = OpenForWrite(img);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    target = o->txn->chunk_alloc().TargetSize(kBlockGroupData);
    EXPECT_EQ(target, 102 * kMiB);  // 10% of 1 GiB, whole MiB
    EXPECT_EQ(o->txn->chunk_alloc().Profile(kBlockGroupData), 0u);
    EXPECT_EQ(o->txn->chunk_alloc().Profile(kBlockGroupMetadata), kBlockGroupDup);
    // The initial 8 MiB chunk, two new ones, and a bit of a third.
    total = 8 * kMiB + 2 * target + 6 * kMiB;
  }
  // Three sessions (TxnManager reopened: loading new chunks, dev extents and
  // their free space tree entries), commits every 48 MiB.
  for (int session = 0; session < 3 && f.size < total; ++session) {
    auto o = OpenForWrite(img);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    txn::TxnManager& t = *o->txn;
    const uint64_t session_end = std::min(total, (session + 1) * (total / 3 / kMiB + 1) * kMiB);
    while (f.size < session_end) {
      const uint64_t len = std::min<uint64_t>(4 * kMiB, session_end - f.size);
      Status st = AppendExtent(t, f, len);
      ASSERT_TRUE(st.ok()) << "at " << f.size << ": " << st.ToString();
      if (f.size % (48 * kMiB) == 0 || f.size == session_end) {
        ASSERT_TRUE(SyncInode(t, f).ok());
        st = t.Commit();
        ASSERT_TRUE(st.ok()) << st.ToString();
      }
    }
    o = Opened{};
    ASSERT_EQ(BtrfsCheck(img), "") << "after session " << session;
  }
  ASSERT_EQ(f.size, total);
  const auto after = ChunkTypes(img);
  EXPECT_GE(CountKind(after, kBlockGroupData), 3) << Describe(after);
  EXPECT_EQ(after.count(kBlockGroupData | kBlockGroupDup), 0u) << Describe(after);
  EXPECT_EQ(VerifyWithUbtrfs(img, "/big", total, f.seed), "");

  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) {
    GTEST_LOG_(INFO) << "kernel part skipped: loop mounts unavailable: " << why;
    return;
  }
  const std::string mnt = dir.Sub("mnt");
  mkdir(mnt.c_str(), 0755);
  {
    ubtrfs_test::LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
    EXPECT_EQ(VerifyHostFile(mnt + "/big", total, f.seed), "");
    ASSERT_EQ(m.Unmount(), "");
  }
  // The kernel writes on top of our chunks, free space tree and dev extents.
  {
    ubtrfs_test::LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    {
      std::vector<uint8_t> buf(24 * kMiB);
      Pattern(buf, 0, 7);
      std::ofstream out(mnt + "/kernel", std::ios::binary);
      out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    }
    ASSERT_EQ(m.Unmount(), "");
  }
  EXPECT_EQ(BtrfsCheck(img), "") << "after the kernel wrote";
  EXPECT_EQ(VerifyWithUbtrfs(img, "/kernel", 24 * kMiB, 7), "");
  // And we can still write after the kernel did.
  auto o = OpenForWrite(img);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  ASSERT_TRUE(AppendExtent(*o->txn, f, 4 * kMiB).ok());
  ASSERT_TRUE(SyncInode(*o->txn, f).ok());
  ASSERT_TRUE(o->txn->Commit().ok());
  o = Opened{};
  EXPECT_EQ(BtrfsCheck(img), "");
  EXPECT_EQ(VerifyWithUbtrfs(img, "/big", f.size, f.seed), "");
}

// An extent grows only inside its own group: two data groups can be
// neighbours in logical space, and an extent running from one into the next
// is an error to btrfs check and the kernel (found with mixed groups, whose
// chunks are added before the last one is full).
TEST(ChunkAlloc, GrowingAnExtentStopsAtTheEndOfItsGroup) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-chunk");
  const std::string img = dir.Sub("img");
  ASSERT_EQ(MakeImage(dir, img, 1024 * kMiB, 16384, {"big"}), "");
  auto o = OpenForWrite(img);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  txn::TxnManager& t = *o->txn;
  ASSERT_TRUE(t.chunk_alloc().NewChunk(kBlockGroupData, 4096).ok());
  ASSERT_TRUE(t.chunk_alloc().NewChunk(kBlockGroupData, 4096).ok());
  const auto& chunks = o->vol->chunks().chunks();
  ASSERT_GE(chunks.size(), 2u);
  const alloc::ChunkInfo& second = std::prev(chunks.end())->second;
  const alloc::ChunkInfo& first = std::prev(chunks.end(), 2)->second;
  ASSERT_EQ(first.logical + first.length, second.logical) << "the two new chunks are neighbours";
  ASSERT_TRUE(first.type & kBlockGroupData);
  ASSERT_TRUE(second.type & kBlockGroupData);
  auto at_start = t.AllocDataAt(second.logical, 4096);
  ASSERT_TRUE(at_start.ok()) << at_start.status().ToString();
  EXPECT_FALSE(*at_start) << "an extent ending at the first group's end would grow into the second";
  auto inside = t.AllocDataAt(second.logical + 4096, 4096);
  ASSERT_TRUE(inside.ok()) << inside.status().ToString();
  EXPECT_TRUE(*inside);
  auto across = t.AllocDataAt(first.logical + first.length - 4096, 8192);
  ASSERT_TRUE(across.ok()) << across.status().ToString();
  EXPECT_FALSE(*across);
  ASSERT_TRUE(t.Commit().ok());
  o = Opened{};
  EXPECT_EQ(BtrfsCheck(img), "");
}

// ---- METADATA ---------------------------------------------------------------------------------

class ChunkAllocMeta : public ::testing::TestWithParam<uint32_t> {};

TEST_P(ChunkAllocMeta, XattrsOnManyInodesNeedAMetadataChunk) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  const uint32_t nodesize = GetParam();
  TempDir dir("ubtrfs-chunk");
  const std::string img = dir.Sub("img");
  std::vector<std::string> files;
  for (int i = 0; i < 64; ++i) files.push_back("f" + std::to_string(i));
  ASSERT_EQ(MakeImage(dir, img, 256 * kMiB, nodesize, files), "");
  const auto before = ChunkTypes(img);
  const int meta_before = CountKind(before, kBlockGroupMetadata);
  std::vector<uint64_t> inos;
  for (const auto& f : files) inos.push_back(LookupIno(img, "/" + f));
  ASSERT_EQ(std::count(inos.begin(), inos.end(), 0u), 0);

  const size_t value_len = nodesize == 4096 ? 1500 : 1800;
  int n = 0, extra = -1;
  {
    auto o = OpenForWrite(img);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    txn::TxnManager& t = *o->txn;
    auto w = t.Writer(kFsTreeObjectid);
    ASSERT_TRUE(w.ok());
    for (; n < 60000 && extra != 0; ++n) {
      const std::string name = "user.m" + std::to_string(n);
      Status st = (*w)->Insert(Key{inos[n % inos.size()], kXattrItemKey, NameHash(name)},
                               XattrItem(name, XattrValue(n, value_len), t.transid()));
      ASSERT_TRUE(st.ok()) << n << ": " << st.ToString();
      if (n % 2500 == 2499) {
        ASSERT_TRUE(t.Commit().ok());
      }
      if (extra < 0 && t.space().TotalsFor(kBlockGroupMetadata).groups > static_cast<size_t>(meta_before)) {
        extra = 300;  // a new chunk exists: use it a little
      } else if (extra > 0) {
        --extra;
      }
    }
    ASSERT_EQ(extra, 0) << "no metadata chunk after " << n << " xattrs";
    EXPECT_GE(t.chunk_alloc().stats().chunks[2], 1u);
    Status st = t.Commit();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  const auto after = ChunkTypes(img);
  EXPECT_GT(CountKind(after, kBlockGroupMetadata), meta_before) << Describe(after);
  EXPECT_EQ(after.count(kBlockGroupMetadata), 0u) << "new metadata chunks are DUP like mkfs's: " << Describe(after);
  ASSERT_EQ(BtrfsCheck(img), "");

  auto fs = Filesystem::Open(img);
  ASSERT_TRUE(fs.ok());
  for (int i = 0; i < n; i += 37) {
    const std::string name = "user.m" + std::to_string(i);
    auto v = (*fs)->GetXattr(InodeId{kFsTreeObjectid, inos[i % inos.size()]}, name);
    ASSERT_TRUE(v.ok()) << name << ": " << v.status().ToString();
    ASSERT_EQ(*v, XattrValue(i, value_len)) << name;
  }
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) {
    GTEST_LOG_(INFO) << "kernel part skipped: loop mounts unavailable: " << why;
    return;
  }
  const std::string mnt = dir.Sub("mnt");
  mkdir(mnt.c_str(), 0755);
  ubtrfs_test::LoopMount m;
  ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
  for (int i = 0; i < n; i += 211) {
    const std::string name = "user.m" + std::to_string(i);
    std::string buf(value_len + 16, '\0');
    const std::string path = mnt + "/" + files[i % files.size()];
    ssize_t got = lgetxattr(path.c_str(), name.c_str(), buf.data(), buf.size());
    ASSERT_EQ(got, static_cast<ssize_t>(value_len)) << path << " " << name << ": " << strerror(errno);
    buf.resize(got);
    ASSERT_EQ(buf, XattrValue(i, value_len)) << name;
  }
  ASSERT_EQ(m.Unmount(), "");
}

INSTANTIATE_TEST_SUITE_P(NodeSizes, ChunkAllocMeta, ::testing::Values(4096u, 16384u),
                         [](const auto& info) { return "node" + std::to_string(info.param); });

// ---- SYSTEM -----------------------------------------------------------------------------------

// With every byte of system space taken, a change to the chunk tree puts its
// root into a new SYSTEM chunk, which must then be in the superblock's
// system chunk array for anyone to find the chunk tree.
TEST(ChunkAlloc, ChunkTreeMovesIntoANewSystemChunk) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-chunk");
  const std::string img = dir.Sub("img");
  ASSERT_EQ(MakeImage(dir, img, 1024 * kMiB, 16384, {"big"}), "");
  DataFile f{LookupIno(img, "/big"), 9, 0};
  uint64_t sys_array_before = 0, new_sys = 0;
  {
    auto o = OpenForWrite(img);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    txn::TxnManager& t = *o->txn;
    txn::Volume& vol = *o->vol;
    sys_array_before = vol.super().sys_chunk_array_size.get();
    const uint32_t ns = vol.nodesize();
    std::vector<uint64_t> grabbed;
    const uint64_t free_sys = t.space().TotalsFor(kBlockGroupSystem).free_bytes;
    for (uint64_t i = 0; i < free_sys / ns; ++i) {
      auto a = t.space().Allocate(kBlockGroupSystem, ns, ns);
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      grabbed.push_back(*a);
    }
    ASSERT_EQ(t.space().TotalsFor(kBlockGroupSystem).free_bytes, 0u);
    ASSERT_EQ(t.space().TotalsFor(kBlockGroupSystem).groups, 1u);
    // Rewriting the DEV_ITEM as it is copies the chunk tree's root.
    auto w = t.Writer(kChunkTreeObjectid);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const Key dev_key{kDevItemsObjectid, kDevItemKey, vol.super().dev_item.devid.get()};
    auto item = tree::LookupItem(t.source(), vol.chunk_tree(), dev_key);
    ASSERT_TRUE(item.ok() && item->has_value());
    Status st = (*w)->Update(dev_key, **item);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(t.space().TotalsFor(kBlockGroupSystem).groups, 2u);
    auto g = t.space().FindGroup(vol.chunk_tree().bytenr);
    ASSERT_TRUE(g);
    new_sys = g->start;
    for (uint64_t a : grabbed) ASSERT_TRUE(t.space().Free(a, ns).ok());
    // Some data too, so that the new chunk's items share the commit.
    ASSERT_TRUE(AppendExtent(t, f, 4 * kMiB).ok());
    ASSERT_TRUE(SyncInode(t, f).ok());
    st = t.Commit();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  ASSERT_EQ(BtrfsCheck(img), "");
  {
    auto dev = io::OpenFileDevice(img);
    ASSERT_TRUE(dev.ok());
    auto vol = txn::Volume::Open(std::move(*dev), txn::VolumeOptions{});
    ASSERT_TRUE(vol.ok()) << vol.status().ToString();
    const SuperBlock& sb = (*vol)->super();
    EXPECT_GT(sb.sys_chunk_array_size.get(), sys_array_before);
    auto sys = ParseSysChunkArray(sb);
    ASSERT_TRUE(sys.ok());
    ASSERT_EQ(sys->size(), 2u);
    EXPECT_EQ(sys->back().key.offset, new_sys);
    const alloc::ChunkInfo* c = (*vol)->chunks().Find(sb.chunk_root.get());
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->logical, new_sys);
    EXPECT_EQ(c->type, kBlockGroupSystem | kBlockGroupDup);
  }
  EXPECT_EQ(VerifyWithUbtrfs(img, "/big", f.size, f.seed), "");
  // A second session loads it all back and changes the chunk tree again.
  {
    auto o = OpenForWrite(img);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    ASSERT_TRUE(o->txn->chunk_alloc().NewChunk(kBlockGroupData, kMiB).ok());
    ASSERT_TRUE(AppendExtent(*o->txn, f, 4 * kMiB).ok());
    ASSERT_TRUE(SyncInode(*o->txn, f).ok());
    ASSERT_TRUE(o->txn->Commit().ok());
  }
  ASSERT_EQ(BtrfsCheck(img), "");
  EXPECT_EQ(VerifyWithUbtrfs(img, "/big", f.size, f.seed), "");
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) {
    GTEST_LOG_(INFO) << "kernel part skipped: loop mounts unavailable: " << why;
    return;
  }
  const std::string mnt = dir.Sub("mnt");
  mkdir(mnt.c_str(), 0755);
  ubtrfs_test::LoopMount m;
  ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
  EXPECT_EQ(VerifyHostFile(mnt + "/big", f.size, f.seed), "");
  ASSERT_EQ(m.Unmount(), "");
}

// ---- ENOSPC -----------------------------------------------------------------------------------

// Appends 1 MiB extents, committing every 8 MiB, until AllocData fails.
// Returns the failure; *committed is the file size on disk.
Status FillData(txn::TxnManager& t, DataFile& f, uint64_t* committed) {
  for (int i = 0; i < 4096; ++i) {
    Status st = AppendExtent(t, f, kMiB);
    if (!st.ok()) return st;
    if (f.size % (8 * kMiB) == 0) {
      UB_RETURN_IF_ERROR(SyncInode(t, f));
      UB_RETURN_IF_ERROR(t.Commit());
      *committed = f.size;
    }
  }
  return Status::Error(EIO, "the device never filled up");
}

TEST(ChunkAllocEnospc, DataFillsTheDeviceThenEnospcAndBothStatesAreClean) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-chunk");
  const std::string img = dir.Sub("img");
  ASSERT_EQ(MakeImage(dir, img, 128 * kMiB, 16384, {"big"}), "");
  DataFile f{LookupIno(img, "/big"), 5, 0};
  uint64_t committed = 0;
  auto o = OpenForWrite(img);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  txn::TxnManager& t = *o->txn;
  Status st = FillData(t, f, &committed);
  ASSERT_EQ(st.code(), ENOSPC) << st.ToString();
  EXPECT_NE(st.message().find("no free data space"), std::string::npos) << st.message();
  // Nothing could take another 1 MiB stripe.
  uint64_t free_dev = 0;
  for (auto [s, l] : t.chunk_alloc().FreeDeviceRanges()) {
    EXPECT_LT(l, kMiB) << "a hole at " << s;
    free_dev += l;
  }
  // mkfs leaves 8 MiB of data chunk and 39 MiB unallocated on 128 MiB (the
  // rest: 8 MiB system and 32 MiB metadata, both DUP, and the first MiB);
  // with 30 MiB of metadata free no metadata chunk is due, so it all goes to data.
  EXPECT_GE(f.size, 46 * kMiB) << "only " << f.size << " bytes of data on a 128 MiB device";
  EXPECT_GT(t.chunk_alloc().stats().chunks[0], 1u);
  EXPECT_GE(t.chunk_alloc().stats().enospc, 1u);

  // The last commit, under the running transaction: intact.
  ASSERT_EQ(BtrfsCheck(img), "") << "last committed state";
  EXPECT_EQ(VerifyWithUbtrfs(img, "/big", committed, f.seed), "");

  // The running transaction still commits (the failed AllocData changed nothing).
  ASSERT_TRUE(SyncInode(t, f).ok());
  st = t.Commit();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(t.AllocData(kMiB).status().code(), ENOSPC);
  o = Opened{};
  ASSERT_EQ(BtrfsCheck(img), "") << "after committing past ENOSPC";
  EXPECT_EQ(VerifyWithUbtrfs(img, "/big", f.size, f.seed), "");
  GTEST_LOG_(INFO) << f.size / kMiB << " MiB of data; " << free_dev << " bytes of the device unallocated; chunks "
                   << Describe(ChunkTypes(img));

  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) {
    GTEST_LOG_(INFO) << "kernel part skipped: loop mounts unavailable: " << why;
    return;
  }
  const std::string mnt = dir.Sub("mnt");
  mkdir(mnt.c_str(), 0755);
  ubtrfs_test::LoopMount m;
  ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
  EXPECT_EQ(VerifyHostFile(mnt + "/big", f.size, f.seed), "");
  ASSERT_EQ(m.Unmount(), "");
}

// With single metadata mkfs leaves 64 MiB unallocated, so a new data chunk
// gets the superblock copy there: its 64 KiB stripe must stay unused, count
// as neither used nor free in the block group item, be listed as free in the
// free space tree (as the kernel does), and the copy must stay valid.
TEST(ChunkAllocEnospc, SuperblockCopyInsideANewChunkIsLeftAlone) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-chunk");
  const std::string img = dir.Sub("img");
  ASSERT_EQ(MakeImage(dir, img, 128 * kMiB, 16384, {"big"}, {"-m", "single"}), "");
  DataFile f{LookupIno(img, "/big"), 17, 0};
  uint64_t committed = 0;
  {
    auto o = OpenForWrite(img);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    txn::TxnManager& t = *o->txn;
    EXPECT_EQ(t.chunk_alloc().Profile(kBlockGroupMetadata), 0u);
    Status st = FillData(t, f, &committed);
    ASSERT_EQ(st.code(), ENOSPC) << st.ToString();
    bool found = false;
    for (const auto& [logical, c] : o->vol->chunks().chunks()) {
      if (c.stripes[0].physical <= SuperblockOffset(1) && SuperblockOffset(1) < c.stripes[0].physical + c.length) {
        found = true;
        EXPECT_TRUE(c.type & kBlockGroupData) << "chunk at " << logical;
        const uint64_t sb_logical = logical + (SuperblockOffset(1) - c.stripes[0].physical);
        auto g = t.space().FindGroup(sb_logical);
        ASSERT_TRUE(g);
        // Filled with 1 MiB extents around the 64 KiB stripe: less than 1 MiB is left.
        EXPECT_LT(g->free_bytes, kMiB);
        EXPECT_GE(g->used_bytes, g->length - kMiB);
      }
    }
    EXPECT_TRUE(found) << "no chunk holds the superblock copy at 64 MiB: " << Describe(ChunkTypes(img));
    ASSERT_TRUE(SyncInode(t, f).ok());
    st = t.Commit();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  ASSERT_EQ(BtrfsCheck(img), "");
  EXPECT_EQ(VerifyWithUbtrfs(img, "/big", f.size, f.seed), "");
  auto sup = RunCommand({"btrfs", "inspect-internal", "dump-super", "-s", "1", img});
  ASSERT_TRUE(sup.ok()) << sup.Describe();
  EXPECT_NE(sup.out.find("[match]"), std::string::npos) << sup.out;
  EXPECT_EQ(sup.out.find("DON'T MATCH"), std::string::npos) << sup.out;
  auto primary = RunCommand({"btrfs", "inspect-internal", "dump-super", "-s", "0", img});
  auto gen = [](const std::string& out) {
    auto p = out.find("\ngeneration");
    return p == std::string::npos ? std::string() : out.substr(p, out.find('\n', p + 1) - p);
  };
  EXPECT_EQ(gen(sup.out), gen(primary.out));
  EXPECT_NE(gen(sup.out), "");
}

TEST(ChunkAllocEnospc, MetadataEnospcFromInsertKeepsTheTransactionCommittable) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-chunk");
  const std::string img = dir.Sub("img");
  std::vector<std::string> files;
  for (int i = 0; i < 16; ++i) files.push_back("f" + std::to_string(i));
  files.push_back("big");
  ASSERT_EQ(MakeImage(dir, img, 128 * kMiB, 4096, files), "");
  DataFile f{LookupIno(img, "/big"), 11, 0};
  std::vector<uint64_t> inos;
  for (int i = 0; i < 16; ++i) inos.push_back(LookupIno(img, "/" + files[i]));

  auto o = OpenForWrite(img);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  txn::TxnManager& t = *o->txn;
  uint64_t committed = 0;
  Status st = FillData(t, f, &committed);
  ASSERT_EQ(st.code(), ENOSPC) << st.ToString();
  ASSERT_TRUE(SyncInode(t, f).ok());
  ASSERT_TRUE(t.Commit().ok());

  // Now metadata: xattrs until an Insert fails.
  auto w = t.Writer(kFsTreeObjectid);
  ASSERT_TRUE(w.ok());
  int n = 0, committed_n = 0;
  for (; n < 100000; ++n) {
    const std::string name = "user.e" + std::to_string(n);
    st = (*w)->Insert(Key{inos[n % inos.size()], kXattrItemKey, NameHash(name)},
                      XattrItem(name, XattrValue(n, 1200), t.transid()));
    if (!st.ok()) break;
    if (n % 1000 == 999) {
      Status c = t.Commit();
      ASSERT_TRUE(c.ok()) << c.ToString();
      committed_n = n + 1;
    }
  }
  ASSERT_EQ(st.code(), ENOSPC) << "after " << n << " xattrs: " << st.ToString();
  GTEST_LOG_(INFO) << "ENOSPC after " << n << " xattrs: " << st.message();
  ASSERT_EQ(BtrfsCheck(img), "") << "last committed state";
  {
    auto fs = Filesystem::Open(img);
    ASSERT_TRUE(fs.ok());
    for (int i = 0; i < committed_n; i += 97) {
      const std::string name = "user.e" + std::to_string(i);
      auto v = (*fs)->GetXattr(InodeId{kFsTreeObjectid, inos[i % inos.size()]}, name);
      ASSERT_TRUE(v.ok()) << name;
      ASSERT_EQ(*v, XattrValue(i, 1200));
    }
  }
  // The reserve is there for the commit of everything before the failure.
  st = t.Commit();
  ASSERT_TRUE(st.ok()) << st.ToString();
  o = Opened{};
  ASSERT_EQ(BtrfsCheck(img), "") << "after committing past ENOSPC";
  auto fs = Filesystem::Open(img);
  ASSERT_TRUE(fs.ok());
  for (int i = 0; i < n; i += 89) {
    const std::string name = "user.e" + std::to_string(i);
    auto v = (*fs)->GetXattr(InodeId{kFsTreeObjectid, inos[i % inos.size()]}, name);
    ASSERT_TRUE(v.ok()) << name;
    ASSERT_EQ(*v, XattrValue(i, 1200));
  }
  EXPECT_EQ(VerifyWithUbtrfs(img, "/big", f.size, f.seed), "");
}

// ReserveMetadata: ENOSPC up front, before anything changes.
TEST(ChunkAllocEnospc, ReserveMetadataFailsBeforeTheOperation) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-chunk");
  const std::string img = dir.Sub("img");
  ASSERT_EQ(MakeImage(dir, img, 128 * kMiB, 16384, {"big"}), "");
  DataFile f{LookupIno(img, "/big"), 3, 0};
  auto o = OpenForWrite(img);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  txn::TxnManager& t = *o->txn;
  ASSERT_TRUE(t.chunk_alloc().ReserveMetadata(10).ok());
  uint64_t committed = 0;
  ASSERT_EQ(FillData(t, f, &committed).code(), ENOSPC);
  // More than all metadata there is: refused, and nothing was touched.
  const uint64_t meta_total = t.space().TotalsFor(kBlockGroupMetadata).total_bytes;
  const uint64_t blocks_before = t.stats().blocks_written;
  Status st = t.chunk_alloc().ReserveMetadata(meta_total / (16 * 16384) + 1);
  EXPECT_EQ(st.code(), ENOSPC) << st.ToString();
  EXPECT_EQ(t.stats().blocks_written, blocks_before);
  ASSERT_TRUE(SyncInode(t, f).ok());
  ASSERT_TRUE(t.Commit().ok());
  o = Opened{};
  EXPECT_EQ(BtrfsCheck(img), "");
}

// The lock-free reservation check (used by parallel creates and writes)
// never promises more than a full check would find: whenever it says yes,
// the metadata space really free covers the request, all the way until the
// allocations run the device out of room, where it says no.
TEST(ChunkAllocEnospc, QuickReservationCheckNeverPromisesMoreThanThereIs) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-chunk");
  const std::string img = dir.Sub("img");
  ASSERT_EQ(MakeImage(dir, img, 128 * kMiB, 16384, {}), "");
  auto o = OpenForWrite(img);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  txn::TxnManager& t = *o->txn;
  txn::ChunkAllocator& ca = t.chunk_alloc();
  EXPECT_FALSE(ca.MetadataSurelyFree(1));  // nothing checked yet
  ASSERT_TRUE(ca.ReserveMetadata(1).ok());
  const uint64_t node = 16384;
  auto need = [&](uint64_t items) { return ca.CommitReserve() + items * txn::ChunkAllocator::kBlocksPerItem * node; };
  int said_yes = 0;
  bool ran_out = false;
  for (int i = 0; i < 100000 && !ran_out; ++i) {
    for (uint64_t items : {1, 10, 100}) {
      if (ca.MetadataSurelyFree(items)) {
        ++said_yes;
        ASSERT_GE(t.space().TotalsFor(kBlockGroupMetadata).free_bytes, need(items)) << "after " << i << " blocks";
      }
    }
    auto b = t.AllocTreeBlock(kFsTreeObjectid, 0);
    if (!b.ok()) {
      EXPECT_EQ(b.status().code(), ENOSPC) << b.status().ToString();
      ran_out = true;
    }
    if (i % 500 == 0) (void)ca.ReserveMetadata(1);  // full checks now and then refresh the figures
  }
  EXPECT_TRUE(ran_out);
  EXPECT_GT(said_yes, 100);
  EXPECT_FALSE(ca.MetadataSurelyFree(1));
}

// The file system's own write path (include/ubtrfs/filesystem.h) over new
// chunks, to ENOSPC. Write sizes are whole extents' worth (8 MiB), so the
// write that fails is the first to find no room.
struct FsFill {
  std::vector<std::pair<std::string, uint64_t>> written;  // name, size: complete writes
  Status failure;
};

void FillThroughFilesystem(Filesystem& fs, FsFill* out) {
  std::vector<uint8_t> buf(8 * kMiB);
  for (int i = 0; i < 100; ++i) {
    const std::string name = "file" + std::to_string(i);
    auto id = fs.Create(fs.Root(), name, NewInode{0644});
    if (!id.ok()) {
      out->failure = id.status();
      return;
    }
    Pattern(buf, 0, 100 + i);
    auto n = fs.Write(*id, 0, buf);
    if (!n.ok()) {
      out->failure = n.status();
      return;
    }
    ASSERT_EQ(*n, buf.size());
    out->written.push_back({name, buf.size()});
    if (i % 4 == 3) {
      Status c = fs.Commit();
      ASSERT_TRUE(c.ok()) << c.ToString();
    }
  }
}

// Opens img for writing, fills it to ENOSPC and commits what is there.
void FillToEnospcAndCommit(const std::string& img, FsFill* fill) {
  OpenOptions oo;
  oo.writable = true;
  auto fs = Filesystem::Open(img, oo);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  FillThroughFilesystem(**fs, fill);
  ASSERT_EQ(fill->failure.code(), ENOSPC) << fill->failure.ToString();
  Status c = (*fs)->Commit();
  ASSERT_TRUE(c.ok()) << c.ToString();
}

TEST(ChunkAllocEnospc, FilesystemWritesUntilFull) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-chunk");
  const std::string img = dir.Sub("img");
  ASSERT_EQ(MakeImage(dir, img, 256 * kMiB, 16384, {}), "");
  OpenOptions oo;
  oo.writable = true;
  auto fs = Filesystem::Open(img, oo);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  FsFill fill;
  FillThroughFilesystem(**fs, &fill);
  ASSERT_EQ(fill.failure.code(), ENOSPC) << fill.failure.ToString();
  ASSERT_GT(fill.written.size(), 15u);
  // The last commit, with the failed write still in the running transaction.
  ASSERT_EQ(BtrfsCheck(img), "");
  const size_t committed = fill.written.size() / 4 * 4;
  for (size_t i = 0; i < committed; ++i) {
    EXPECT_EQ(VerifyWithUbtrfs(img, "/" + fill.written[i].first, fill.written[i].second, 100 + i), "");
  }
  // The running transaction is left to the destructor: see the next test.
}

// Committing after a Write that got ENOSPC part way. Disabled: the write path
// (src/fs/write_ops.cc, FilesystemImpl::Write) returns the error after
// WriteRegular inserted some extents but before the inode's nbytes/size are
// updated, so btrfs check finds "nbytes wrong" once that is committed.
// Enable when Write either keeps the part written (a short write) or undoes it.
TEST(ChunkAllocEnospc, FilesystemCommitAfterEnospcIsClean) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-chunk");
  const std::string img = dir.Sub("img");
  ASSERT_EQ(MakeImage(dir, img, 256 * kMiB, 16384, {}), "");
  FsFill fill;
  FillToEnospcAndCommit(img, &fill);
  if (HasFatalFailure()) return;
  ASSERT_EQ(BtrfsCheck(img), "");
  for (size_t i = 0; i < fill.written.size(); ++i) {
    EXPECT_EQ(VerifyWithUbtrfs(img, "/" + fill.written[i].first, fill.written[i].second, 100 + i), "");
  }
}

// ---- MIXED GROUPS ------------------------------------------------------------------------------

// mkfs.btrfs -M: data and metadata share DATA|METADATA chunks. Filled to
// ENOSPC through the file system: new chunks are mixed ones too (never a
// pure data or metadata chunk, which the kernel would count apart), the
// commit after the failed write still has the metadata it needs, and the
// full image opens for writing again so that deleting makes room.
TEST(ChunkAllocMixed, FilledToEnospcThenDeletesMakeRoomAndTheKernelAgrees) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-chunk");
  const std::string img = dir.Sub("img");
  ASSERT_EQ(MakeImage(dir, img, 256 * kMiB, 4096, {}, {"-M"}), "");
  const auto before = ChunkTypes(img);
  ASSERT_EQ(before.count(kBlockGroupData | kBlockGroupMetadata), 1u) << Describe(before);
  FsFill fill;
  FillToEnospcAndCommit(img, &fill);
  if (HasFatalFailure()) return;
  ASSERT_GT(fill.written.size(), 15u);
  ASSERT_EQ(BtrfsCheck(img), "");
  const auto after = ChunkTypes(img);
  EXPECT_GT(CountKind(after, kBlockGroupData), 1) << Describe(after);
  for (auto [type, n] : after) {
    if (type & (kBlockGroupData | kBlockGroupMetadata)) {
      EXPECT_EQ(type & (kBlockGroupData | kBlockGroupMetadata), kBlockGroupData | kBlockGroupMetadata)
          << Describe(after);
    }
  }
  for (size_t i = 0; i < fill.written.size(); ++i) {
    EXPECT_EQ(VerifyWithUbtrfs(img, "/" + fill.written[i].first, fill.written[i].second, 100 + i), "");
  }
  {
    OpenOptions oo;
    oo.writable = true;
    auto fs = Filesystem::Open(img, oo);
    ASSERT_TRUE(fs.ok()) << "a full image must open for writing: " << fs.status().ToString();
    for (size_t i = 0; i < 3; ++i) {
      Status u = (*fs)->Unlink((*fs)->Root(), fill.written[i].first);
      ASSERT_TRUE(u.ok()) << u.ToString();
    }
    ASSERT_TRUE((*fs)->Commit().ok());
    auto id = (*fs)->Create((*fs)->Root(), "again", NewInode{0644});
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    std::vector<uint8_t> buf(8 * kMiB);
    Pattern(buf, 0, 7);
    auto n = (*fs)->Write(*id, 0, buf);
    ASSERT_TRUE(n.ok()) << "room made by the deletes: " << n.status().ToString();
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  ASSERT_EQ(BtrfsCheck(img), "");
  EXPECT_EQ(VerifyWithUbtrfs(img, "/again", 8 * kMiB, 7), "");

  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) {
    GTEST_LOG_(INFO) << "kernel part skipped: loop mounts unavailable: " << why;
    return;
  }
  const std::string mnt = dir.Sub("mnt");
  mkdir(mnt.c_str(), 0755);
  ubtrfs_test::LoopMount m;
  ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
  EXPECT_EQ(VerifyHostFile(mnt + "/again", 8 * kMiB, 7), "");
  const auto& last = fill.written.back();
  EXPECT_EQ(VerifyHostFile(mnt + "/" + last.first, last.second, 100 + fill.written.size() - 1), "");
  ASSERT_EQ(m.Unmount(), "");
}

}  // namespace
