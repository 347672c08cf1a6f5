// A full device (issue 15), through the library on fresh `ubtrfs mkfs`
// images of 200 MiB: the operation that runs out gets ENOSPC and nothing
// else happens -- the view stays writable, what was written reads back, and
// `btrfs check --readonly` is clean after the last commit:
//   - zero-range fallocate and unaligned truncate on a data-full device;
//   - space freed by an unlink is used by the next write (the ENOSPC
//     commits the running transaction and tries again);
//   - on a metadata-full device every file can be deleted (the global
//     reserve), and the space comes back;
//   - statfs from the running transaction;
//   - after an abort, reads fail cleanly instead of crashing;
//   - a fill / delete half / refill loop.
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <sys/stat.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "fs/open_device.h"
#include "io/fault_device.h"
#include "io/recording_device.h"
#include "stats/stats.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "txn/mkfs.h"
#include "ubtrfs/filesystem.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif

namespace {

using namespace ubtrfs;
using ubtrfs_test::BtrfsCheck;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

NewInode Attrs(uint32_t perm) {
  NewInode a;
  a.mode = perm;
  return a;
}

// Bytes that depend on (seed, offset) only, so a file's content is known
// from its seed and size.
void Pattern(std::span<uint8_t> out, uint64_t off, uint64_t seed) {
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t p = off + i;
    out[i] = static_cast<uint8_t>((p >> 12) * 131 + (p & 4095) * 7 + seed * 977 + 1);
  }
}

std::vector<uint8_t> PatternBytes(uint64_t len, uint64_t seed, uint64_t off = 0) {
  std::vector<uint8_t> v(len);
  Pattern(v, off, seed);
  return v;
}

std::string MakeImage(const TempDir& dir, const std::string& name, const std::string& size = "200M") {
  const std::string img = dir.Sub(name);
  auto r = RunCommand({UBTRFS_CLI_PATH, "mkfs", "--size", size, img});
  EXPECT_TRUE(r.ok()) << r.Describe();
  return img;
}

std::unique_ptr<Filesystem> OpenRw(const std::string& img) { return ubtrfs_test::OpenWritable(img); }

std::vector<uint8_t> ReadAll(Filesystem& fs, InodeId id) {
  auto st = fs.GetStat(id);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  if (!st.ok()) return {};
  std::vector<uint8_t> buf(st->size);
  auto n = fs.Read(id, 0, buf);
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  if (n.ok()) buf.resize(*n);
  return buf;
}

// Writes `len` bytes of Pattern(seed) at `off` in pieces of `piece`; returns
// the bytes written before the first failure, which goes to *failure.
uint64_t WriteUntil(Filesystem& fs, InodeId id, uint64_t off, uint64_t len, uint64_t seed, uint64_t piece,
                    Status* failure) {
  uint64_t done = 0;
  std::vector<uint8_t> buf(piece);
  while (done < len) {
    const uint64_t n = std::min(piece, len - done);
    Pattern(std::span(buf).first(n), off + done, seed);
    auto w = fs.Write(id, off + done, std::span(buf).first(n));
    if (!w.ok()) {
      *failure = w.status();
      return done;
    }
    done += *w;
  }
  *failure = Status::Ok();
  return done;
}

// Fills the data space: 1 MiB writes to ENOSPC, a commit, then 4 KiB appends
// to ENOSPC, three times (as `dd` and the top-ups of the issue). Returns the
// file's size; the file holds Pattern(seed).
uint64_t FillData(Filesystem& fs, InodeId id, uint64_t seed) {
  uint64_t size = 0;
  Status failure;
  size += WriteUntil(fs, id, size, 1ull << 40, seed, kMiB, &failure);
  EXPECT_EQ(failure.code(), ENOSPC) << failure.ToString();
  for (int round = 0; round < 3; ++round) {
    Status c = fs.Commit();
    EXPECT_TRUE(c.ok()) << c.ToString();
    size += WriteUntil(fs, id, size, 1ull << 40, seed, 4 * kKiB, &failure);
    EXPECT_EQ(failure.code(), ENOSPC) << failure.ToString();
    if (getenv("FD_DEBUG")) std::cout << "fill: " << failure.ToString() << "\n";
  }
  Status c = fs.Commit();
  EXPECT_TRUE(c.ok()) << c.ToString();
  return size;
}

// The view is writable: a create, a write and a commit work.
void ExpectWritable(Filesystem& fs, const std::string& what) {
  auto id = fs.Create(fs.Root(), "writable-" + what, Attrs(0644));
  ASSERT_TRUE(id.ok()) << what << ": " << id.status().ToString();
  auto w = fs.Write(*id, 0, PatternBytes(100, 9));
  ASSERT_TRUE(w.ok()) << what << ": " << w.status().ToString();
  Status c = fs.Commit();
  ASSERT_TRUE(c.ok()) << what << ": " << c.ToString();
}

// Issue 15, case 1: fallocate -z -n -o 648655 -l 494490 on a 388,332-byte
// file of a data-full image.
TEST(FullDevice, ZeroRangeFallocateOnFullDataIsEnospcAndChangesNothing) {
  TempDir dir("ubtrfs-full");
  const std::string img = MakeImage(dir, "img");
  auto fs = OpenRw(img);
  ASSERT_TRUE(fs);
  auto f = fs->Create(fs->Root(), "file", Attrs(0644));
  ASSERT_TRUE(f.ok());
  const std::vector<uint8_t> content = PatternBytes(388332, 1);
  ASSERT_TRUE(fs->Write(*f, 0, content).ok());
  auto fill = fs->Create(fs->Root(), "fill", Attrs(0644));
  ASSERT_TRUE(fill.ok());
  const uint64_t filled = FillData(*fs, *fill, 2);
  std::cout << "data full after " << (filled >> 20) << " MiB\n";
  auto before = fs->GetStat(*f);
  ASSERT_TRUE(before.ok());

  Status st = fs->Fallocate(*f, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 648655, 494490);
  EXPECT_EQ(st.code(), ENOSPC) << st.ToString();
  // Zeroing inside the file rewrites partial sectors and preallocates the
  // rest: ENOSPC too, with the file untouched.
  Status inside = fs->Fallocate(*f, FALLOC_FL_ZERO_RANGE, 1000, 200000);
  EXPECT_EQ(inside.code(), ENOSPC) << inside.ToString();
  // Mode 0 over a range that already has extents needs no data: it works.
  Status covered = fs->Fallocate(*f, 0, 8192, 100000);
  EXPECT_TRUE(covered.ok()) << covered.ToString();
  auto after = fs->GetStat(*f);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->size, before->size);
  EXPECT_EQ(after->nbytes, before->nbytes);
  EXPECT_EQ(ReadAll(*fs, *f), content);
  ExpectWritable(*fs, "zero-range");
  fs.reset();
  EXPECT_EQ(BtrfsCheck(img), "");
  fs = OpenRw(img);
  ASSERT_TRUE(fs);
  auto f2 = fs->Lookup("/file");
  ASSERT_TRUE(f2.ok());
  EXPECT_EQ(ReadAll(*fs, *f2), content);
  // With the fill gone (one commit later) the same call succeeds.
  ASSERT_TRUE(fs->Unlink(fs->Root(), "fill").ok());
  ASSERT_TRUE(fs->Commit().ok());
  st = fs->Fallocate(*f2, FALLOC_FL_ZERO_RANGE, 1000, 200000);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::vector<uint8_t> want = content;
  std::fill(want.begin() + 1000, want.begin() + 201000, 0);
  EXPECT_EQ(ReadAll(*fs, *f2), want);
  fs.reset();
  EXPECT_EQ(BtrfsCheck(img), "");
}

// Issue 15, case 2: truncate -s 50000123 on a data-full device.
TEST(FullDevice, UnalignedTruncateOnFullDataIsEnospcAndChangesNothing) {
  TempDir dir("ubtrfs-full");
  const std::string img = MakeImage(dir, "img");
  auto fs = OpenRw(img);
  ASSERT_TRUE(fs);
  auto f = fs->Create(fs->Root(), "file", Attrs(0644));
  ASSERT_TRUE(f.ok());
  Status failure;
  // Six extents of 10 MiB (one per commit; within a transaction the
  // sequential writes would grow one extent), so that a truncate to a
  // boundary frees one whole.
  for (uint64_t at = 0; at < 60 * kMiB; at += 10 * kMiB) {
    ASSERT_EQ(WriteUntil(*fs, *f, at, 10 * kMiB, 3, 4 * kMiB, &failure), 10 * kMiB) << failure.ToString();
    ASSERT_TRUE(fs->Commit().ok());
  }
  auto small = fs->Create(fs->Root(), "small", Attrs(0644));
  ASSERT_TRUE(small.ok());
  ASSERT_TRUE(fs->Write(*small, 0, PatternBytes(1500, 4)).ok());  // inline
  auto fill = fs->Create(fs->Root(), "fill", Attrs(0644));
  ASSERT_TRUE(fill.ok());
  FillData(*fs, *fill, 5);

  AttrChange shrink;
  shrink.size = 50000123;
  Status st = fs->SetAttr(*f, shrink);
  EXPECT_EQ(st.code(), ENOSPC) << st.ToString();
  auto s = fs->GetStat(*f);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->size, 60 * kMiB);
  // An inline file grown past the inline limit needs a data sector too.
  AttrChange grow;
  grow.size = 10000;
  st = fs->SetAttr(*small, grow);
  EXPECT_EQ(st.code(), ENOSPC) << st.ToString();
  // Aligned truncates and truncates to a sector of zeros need no data.
  AttrChange aligned;
  aligned.size = 50 * kMiB;
  st = fs->SetAttr(*f, aligned);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectWritable(*fs, "truncate");
  // Space freed by the aligned truncate is there after its commit: now the
  // unaligned one works.
  st = fs->SetAttr(*f, shrink);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(fs->Commit().ok());
  fs.reset();
  EXPECT_EQ(BtrfsCheck(img), "");
  fs = OpenRw(img);
  ASSERT_TRUE(fs);
  auto f2 = fs->Lookup("/file");
  ASSERT_TRUE(f2.ok());
  EXPECT_EQ(ReadAll(*fs, *f2), PatternBytes(50000123, 3));
  auto small2 = fs->Lookup("/small");
  ASSERT_TRUE(small2.ok());
  EXPECT_EQ(ReadAll(*fs, *small2), PatternBytes(1500, 4));
}

// Issue 15, case 5: a write right after deleting a large file finds the
// space the unlink freed (the ENOSPC commits and tries again).
TEST(FullDevice, SpaceFreedByUnlinkIsUsedWithoutAnExplicitCommit) {
  TempDir dir("ubtrfs-full");
  const std::string img = MakeImage(dir, "img");
  auto fs = OpenRw(img);
  ASSERT_TRUE(fs);
  auto big = fs->Create(fs->Root(), "big", Attrs(0644));
  ASSERT_TRUE(big.ok());
  Status failure;
  ASSERT_EQ(WriteUntil(*fs, *big, 0, 64 * kMiB, 6, 4 * kMiB, &failure), 64 * kMiB) << failure.ToString();
  auto fill = fs->Create(fs->Root(), "fill", Attrs(0644));
  ASSERT_TRUE(fill.ok());
  FillData(*fs, *fill, 7);
  ASSERT_TRUE(fs->Unlink(fs->Root(), "big").ok());
  stats::Counter& retries = stats::GetCounter("space.enospc_commits");
  const uint64_t retries_before = retries.Get();
  auto f = fs->Create(fs->Root(), "after", Attrs(0644));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const std::vector<uint8_t> mib = PatternBytes(kMiB, 8);
  auto w = fs->Write(*f, 0, mib);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(retries.Get(), retries_before + 1) << "the write's ENOSPC committed once";
  // And the rest of the freed space is there too.
  ASSERT_EQ(WriteUntil(*fs, *f, kMiB, 40 * kMiB, 8, kMiB, &failure), 40 * kMiB) << failure.ToString();
  ASSERT_TRUE(fs->Commit().ok());
  fs.reset();
  EXPECT_EQ(BtrfsCheck(img), "");
  fs = OpenRw(img);
  ASSERT_TRUE(fs);
  auto f2 = fs->Lookup("/after");
  ASSERT_TRUE(f2.ok());
  EXPECT_EQ(ReadAll(*fs, *f2), PatternBytes(41 * kMiB, 8));
}

// Issue 15, cases 3 and 4: data full, then 1000-byte files (a commit every
// 500) until metadata is full; then every file is deleted, and the space
// comes back.
TEST(FullDevice, EveryFileCanBeDeletedOnAMetadataFullDevice) {
  TempDir dir("ubtrfs-full");
  const std::string img = MakeImage(dir, "img");
  auto fs = OpenRw(img);
  ASSERT_TRUE(fs);
  auto fill = fs->Create(fs->Root(), "fill", Attrs(0644));
  ASSERT_TRUE(fill.ok());
  const uint64_t filled = FillData(*fs, *fill, 10);
  auto d = fs->Mkdir(fs->Root(), "d", Attrs(0755));
  ASSERT_TRUE(d.ok());
  // Removing xattrs is a deletion too (fsstress on 512 MiB).
  auto tagged = fs->Create(fs->Root(), "tagged", Attrs(0644));
  ASSERT_TRUE(tagged.ok());
  constexpr int kXattrs = 60;
  for (int i = 0; i < kXattrs; ++i) {
    ASSERT_TRUE(fs->SetXattr(*tagged, "user.x" + std::to_string(i), std::string(200, 'v')).ok());
  }
  const std::vector<uint8_t> small = PatternBytes(1000, 11);
  Status failure;
  int made = 0;
  for (; made < 1000000; ++made) {
    auto id = fs->Create(*d, "f" + std::to_string(made), Attrs(0644));
    if (!id.ok()) {
      failure = id.status();
      break;
    }
    auto w = fs->Write(*id, 0, small);
    if (!w.ok()) {
      failure = w.status();
      ASSERT_TRUE(fs->Unlink(*d, "f" + std::to_string(made)).ok());
      break;
    }
    if (made % 500 == 499) {
      Status c = fs->Commit();
      ASSERT_TRUE(c.ok()) << "after " << made << " files: " << c.ToString();
    }
  }
  ASSERT_EQ(failure.code(), ENOSPC) << failure.ToString();
  std::cout << "metadata full after " << made << " 1000-byte files: " << failure.ToString() << "\n";
  ASSERT_GT(made, 1000);
  ASSERT_TRUE(fs->Commit().ok());
  auto full_stat = fs->StatFs();
  ASSERT_TRUE(full_stat.ok());
  EXPECT_LT(full_stat->avail_bytes, kMiB) << "statfs of a full device";
  // Reading the directory works (the crash of case 3 was here).
  auto entries = fs->ReadDir(*d);
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  EXPECT_EQ(entries->size(), static_cast<size_t>(made));

  for (int i = 0; i < kXattrs; ++i) {
    Status st = fs->RemoveXattr(*tagged, "user.x" + std::to_string(i));
    ASSERT_TRUE(st.ok()) << "removexattr " << i << ": " << st.ToString();
  }
  ASSERT_TRUE(fs->Unlink(fs->Root(), "tagged").ok());

  // Delete everything, as rm -rf does.
  stats::Counter& retries = stats::GetCounter("space.enospc_commits");
  const uint64_t retries_before = retries.Get();
  int deleted = 0;
  for (const DirEntry& e : *entries) {
    Status st = fs->Unlink(*d, e.name);
    ASSERT_TRUE(st.ok()) << "unlink " << e.name << " after " << deleted << " deletions: " << st.ToString();
    ++deleted;
  }
  ASSERT_TRUE(fs->Rmdir(fs->Root(), "d").ok());
  ASSERT_TRUE(fs->Unlink(fs->Root(), "fill").ok());
  std::cout << "deleted " << deleted << " files; " << retries.Get() - retries_before
            << " of the deletions committed to free space first\n";
  ASSERT_TRUE(fs->Commit().ok());
  auto empty_stat = fs->StatFs();
  ASSERT_TRUE(empty_stat.ok());
  EXPECT_GE(empty_stat->avail_bytes, filled) << "the data space came back";
  // And the metadata space: as many files fit again.
  auto d2 = fs->Mkdir(fs->Root(), "d2", Attrs(0755));
  ASSERT_TRUE(d2.ok());
  for (int i = 0; i < made; ++i) {
    auto id = fs->Create(*d2, "g" + std::to_string(i), Attrs(0644));
    ASSERT_TRUE(id.ok()) << i << ": " << id.status().ToString();
    ASSERT_TRUE(fs->Write(*id, 0, small).ok()) << i;
  }
  ASSERT_TRUE(fs->Commit().ok());
  fs.reset();
  EXPECT_EQ(BtrfsCheck(img), "");
}

// Issue 15, case 6: statfs follows the running transaction; metadata space
// is not counted as available for data.
TEST(FullDevice, StatfsComesFromTheRunningTransaction) {
  TempDir dir("ubtrfs-full");
  const std::string img = MakeImage(dir, "img");
  auto fs = OpenRw(img);
  ASSERT_TRUE(fs);
  auto s0 = fs->StatFs();
  ASSERT_TRUE(s0.ok());
  EXPECT_EQ(s0->total_bytes, 200 * kMiB);
  EXPECT_LT(s0->avail_bytes, 200 * kMiB);
  EXPECT_GT(s0->avail_bytes, 130 * kMiB);  // less the metadata and system chunks
  EXPECT_LE(s0->free_bytes + s0->used_bytes, s0->total_bytes);
  auto f = fs->Create(fs->Root(), "f", Attrs(0644));
  ASSERT_TRUE(f.ok());
  Status failure;
  ASSERT_EQ(WriteUntil(*fs, *f, 0, 50 * kMiB, 12, 4 * kMiB, &failure), 50 * kMiB);
  auto s1 = fs->StatFs();  // no commit in between
  ASSERT_TRUE(s1.ok());
  EXPECT_GE(s1->used_bytes, s0->used_bytes + 50 * kMiB);
  EXPECT_LE(s1->avail_bytes, s0->avail_bytes - 50 * kMiB);
  EXPECT_GE(s1->avail_bytes + 2 * kMiB, s0->avail_bytes - 50 * kMiB);
  auto fill = fs->Create(fs->Root(), "fill", Attrs(0644));
  ASSERT_TRUE(fill.ok());
  FillData(*fs, *fill, 13);
  auto s2 = fs->StatFs();
  ASSERT_TRUE(s2.ok());
  // Nothing but, as the kernel counts it, the 64 KiB superblock stripe of
  // a data chunk (its block group item leaves it out of used).
  EXPECT_LE(s2->avail_bytes, 64 * kKiB) << "a data-full device has nothing available";
  std::cout << "statfs: fresh avail " << (s0->avail_bytes >> 10) << " KiB, after 50 MiB "
            << (s1->avail_bytes >> 10) << " KiB, data full " << (s2->avail_bytes >> 10) << " KiB (free "
            << (s2->free_bytes >> 10) << " KiB)\n";
}

// The same where the data goes into chunks made in the running transaction
// (mixed groups: mkfs leaves one small chunk): their space was counted as
// unallocated until the commit, so the 20 MiB written left avail as it was
// and used + avail exceeded the size (found with df through the mount).
TEST(FullDevice, StatfsCountsChunksMadeInTheRunningTransaction) {
  TempDir dir("ubtrfs-full-statfs-mixed");
  if (std::string why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  const std::string img = dir.Sub("mixed.img");
  ASSERT_EQ(ubtrfs_test::RunMkfs(img, "", 0, "", 100 * kMiB, {"-M"}), "");
  auto fs = OpenRw(img);
  ASSERT_TRUE(fs);
  auto s0 = fs->StatFs();
  ASSERT_TRUE(s0.ok());
  auto f = fs->Create(fs->Root(), "f", Attrs(0644));
  ASSERT_TRUE(f.ok());
  Status failure;
  ASSERT_EQ(WriteUntil(*fs, *f, 0, 20 * kMiB, 14, kMiB, &failure), 20 * kMiB) << failure.ToString();
  auto s1 = fs->StatFs();  // no commit in between
  ASSERT_TRUE(s1.ok());
  EXPECT_GE(s1->used_bytes, s0->used_bytes + 20 * kMiB);
  EXPECT_LE(s1->avail_bytes + 20 * kMiB, s0->avail_bytes);
  EXPECT_LE(s1->used_bytes + s1->avail_bytes, s1->total_bytes);
  ASSERT_TRUE(fs->Commit().ok());
  auto s2 = fs->StatFs();
  ASSERT_TRUE(s2.ok());
  EXPECT_LE(s2->avail_bytes, s1->avail_bytes + kMiB) << "the commit changed what statfs says by more than a MiB";
  EXPECT_GE(s2->avail_bytes + kMiB, s1->avail_bytes);
}

// Issue 15, case 3's crash: a delayed dir-index flush that fails part way
// (here a read error under the commit) aborts the transaction; afterwards
// every call fails cleanly -- changes with EROFS naming the abort, a listing
// of the directory whose queue the flush left behind with an error -- and
// nothing crashes.
TEST(FullDevice, CallsAfterAnAbortInADelayedIndexFlushFailCleanly) {
  auto rec = std::make_unique<io::RecordingDevice>("abort-image", 128 * kMiB);
  ASSERT_TRUE(txn::MakeFilesystem(rec.get(), txn::MkfsOptions{}).ok());
  io::FaultDevice fault(rec.get());
  auto open = [&](size_t cache) {
    OpenOptions o;
    o.writable = true;
    o.node_cache_bytes = cache;
    auto fs = OpenOnDevice(io::NewUnownedDevice(&fault), o);
    EXPECT_TRUE(fs.ok()) << fs.status().ToString();
    return fs.ok() ? std::move(*fs) : nullptr;
  };
  {
    auto fs = open(64 * kMiB);
    ASSERT_TRUE(fs);
    auto d = fs->Mkdir(fs->Root(), "d", Attrs(0755));
    ASSERT_TRUE(d.ok());
    for (int i = 0; i < 3000; ++i) ASSERT_TRUE(fs->Create(*d, "f" + std::to_string(i), Attrs(0644)).ok());
    ASSERT_TRUE(fs->Commit().ok());
  }
  auto fs = open(0);  // every committed block read from the device
  ASSERT_TRUE(fs);
  auto d = fs->Lookup("/d");
  ASSERT_TRUE(d.ok());
  for (int i = 3000; i < 3100; ++i) ASSERT_TRUE(fs->Create(*d, "f" + std::to_string(i), Attrs(0644)).ok());
  fault.FailAfter(io::FaultOp::kRead, 0);
  Status c = fs->Commit();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.code(), EIO) << c.ToString();
  fault.Clear();
  auto l = fs->ReadDir(*d);
  // The flush moved the queued items into its first batch, which never
  // reached the tree: the listing says so instead of reading past them.
  ASSERT_FALSE(l.ok()) << l->size() << " entries";
  EXPECT_EQ(l.status().code(), EIO) << l.status().ToString();
  EXPECT_NE(l.status().message().find("queued dir index"), std::string::npos) << l.status().ToString();
  auto root = fs->ReadDir(fs->Root());
  EXPECT_TRUE(root.ok()) << root.status().ToString();
  EXPECT_TRUE(fs->GetStat(*d).ok());
  auto cr = fs->Create(*d, "x", Attrs(0644));
  ASSERT_FALSE(cr.ok());
  EXPECT_EQ(cr.status().code(), EROFS);
  EXPECT_NE(cr.status().message().find("aborted"), std::string::npos) << cr.status().ToString();
  EXPECT_EQ(fs->Unlink(*d, "f1").code(), EROFS);
  EXPECT_EQ(fs->Commit().code(), EROFS);
  auto sf = fs->StatFs();
  EXPECT_TRUE(sf.ok()) << sf.status().ToString();
}

// A fill / delete half / refill loop: files of mixed sizes until ENOSPC,
// a random half deleted, 20 rounds, a commit every third round. Every file
// whose write was reported complete reads back exactly, and the image ends
// check-clean.
TEST(FullDevice, FillDeleteRefillLoopEndsCleanWithEveryFileIntact) {
  TempDir dir("ubtrfs-full");
  const std::string img = MakeImage(dir, "img");
  auto fs = OpenRw(img);
  ASSERT_TRUE(fs);
  std::mt19937_64 rng(15);
  struct File {
    uint64_t size, seed;
  };
  std::map<std::string, File> files;
  uint64_t next = 0, enospc = 0, retries_before = stats::GetCounter("space.enospc_commits").Get();
  const uint64_t sizes[] = {700, 3000, 64 * kKiB, 300 * kKiB, 2 * kMiB, 9 * kMiB};
  for (int round = 0; round < 20; ++round) {
    int failures_this_round = 0;
    while (failures_this_round < 3) {
      const std::string name = "f" + std::to_string(next);
      const uint64_t size = sizes[rng() % std::size(sizes)] + rng() % 5000;
      const uint64_t seed = next++;
      auto id = fs->Create(fs->Root(), name, Attrs(0644));
      if (!id.ok()) {
        ASSERT_EQ(id.status().code(), ENOSPC) << id.status().ToString();
        ++enospc;
        ++failures_this_round;
        continue;
      }
      Status failure;
      const uint64_t done = WriteUntil(*fs, *id, 0, size, seed, kMiB, &failure);
      if (!failure.ok()) {
        ASSERT_EQ(failure.code(), ENOSPC) << failure.ToString();
        ++enospc;
        ++failures_this_round;
      }
      files[name] = File{done, seed};  // what was reported written
    }
    std::vector<std::string> names;
    for (const auto& [n, f] : files) names.push_back(n);
    std::shuffle(names.begin(), names.end(), rng);
    for (size_t i = 0; i < names.size() / 2; ++i) {
      Status st = fs->Unlink(fs->Root(), names[i]);
      ASSERT_TRUE(st.ok()) << "round " << round << ": " << st.ToString();
      files.erase(names[i]);
    }
    if (round % 3 == 2) {
      ASSERT_TRUE(fs->Commit().ok());
    }
  }
  const uint64_t retries = stats::GetCounter("space.enospc_commits").Get() - retries_before;
  std::cout << "fill-delete-refill: 20 rounds, " << next << " files made, " << enospc << " ENOSPC, " << retries
            << " commits for space, " << files.size() << " files left\n";
  for (const auto& [name, f] : files) {
    auto id = fs->Lookup("/" + name);
    ASSERT_TRUE(id.ok()) << name;
    ASSERT_EQ(ReadAll(*fs, *id), PatternBytes(f.size, f.seed)) << name;
  }
  ASSERT_TRUE(fs->Commit().ok());
  fs.reset();
  EXPECT_EQ(BtrfsCheck(img), "");
  fs = OpenRw(img);
  ASSERT_TRUE(fs);
  for (const auto& [name, f] : files) {
    auto id = fs->Lookup("/" + name);
    ASSERT_TRUE(id.ok()) << name;
    ASSERT_EQ(ReadAll(*fs, *id), PatternBytes(f.size, f.seed)) << name << " after reopening";
  }
}

}  // namespace

// A --shrink image leaves the metadata free that the kernel's global
// reserve needs, and little more. Deleting a subvolume is a deletion, as
// deleting files is: it may use the global reserve (the kernel's falls back
// on its own for it), or nothing could make room there.
TEST(FullDevice, SubvolumesCanBeDeletedOnAShrunkImage) {
  TempDir dir("ubtrfs-full");
  const std::string src = dir.Sub("src"), img = dir.Sub("img");
  ASSERT_EQ(ubtrfs_test::MustRun({"mkdir", "-p", src + "/sv/d"}), "");
  for (int i = 0; i < 50; ++i) ubtrfs_test::WriteRandomFile(src + "/sv/d/f" + std::to_string(i), 20000, i);
  ubtrfs_test::WriteRandomFile(src + "/top", 300000, 99);
  auto r = ubtrfs_test::RunUbtrfs({"mkfs", "-q", "--shrink", "--subvol", "sv", "--rootdir", src, img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  for (const std::vector<std::string>& cmd :
       std::vector<std::vector<std::string>>{{"subvolume", "create", img + ":/new"},
                                             {"subvolume", "delete", img + ":/new"},
                                             {"subvolume", "delete", img + ":/sv"},
                                             {"check", img}}) {
    r = ubtrfs_test::RunUbtrfs(cmd);
    ASSERT_TRUE(r.ok()) << ubtrfs_test::ShellJoin(cmd) << ": " << r.Describe();
  }
  EXPECT_EQ(BtrfsCheck(img), "");
}

namespace {

// An image filled by creates in many directories, each with a long name, a
// little data and a chmod of an older file, in one transaction: the
// commit's own work (the queued dir items and dir-index batches, the
// delayed inode updates) is only done when the commit runs, so the room it
// needs must be kept back while the queues grow, and the commit may use it.
// Every call is done or gets ENOSPC; the commits that an ENOSPC triggers,
// and the last one, succeed (an abort loses the transaction: the first
// ENOSPC here did, in the commit's dir-index flush, before the reserve
// counted the queues). Returns the files made.
size_t FillWithQueuedWork(const std::string& img) {
  auto fs = OpenRw(img);
  EXPECT_TRUE(fs);
  if (!fs) return 0;
  std::vector<InodeId> dirs;
  for (int d = 0; d < 64; ++d) {
    auto id = fs->Mkdir(fs->Root(), "d" + std::to_string(d), Attrs(0755));
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    if (!id.ok()) return 0;
    dirs.push_back(*id);
  }
  std::vector<InodeId> files;
  int enospc = 0;
  const std::string pad(180, 'x');
  auto ok_or_enospc = [&](const Status& s, const char* what, int i) {
    if (s.ok()) return true;
    EXPECT_EQ(s.code(), ENOSPC) << what << " " << i << ": " << s.ToString();
    ++enospc;
    return false;
  };
  for (int i = 0; enospc < 200 && i < 1000000 && !::testing::Test::HasFailure(); ++i) {
    auto id = fs->Create(dirs[i % dirs.size()], pad + std::to_string(i), Attrs(0644));
    if (!ok_or_enospc(id.status(), "create", i)) continue;
    files.push_back(*id);
    auto w = fs->Write(*id, 0, PatternBytes(3000 + i % 5000, i));
    ok_or_enospc(w.status(), "write", i);
    AttrChange c;
    c.mode = 0600;
    ok_or_enospc(fs->SetAttr(files[(i * 7919ull) % files.size()], c), "chmod", i);
  }
  Status c = fs->Commit();
  EXPECT_TRUE(c.ok()) << c.ToString() << " (" << files.size() << " files)";
  return files.size();
}

}  // namespace

TEST(FullDevice, QueuedDirectoryAndInodeWorkIsKeptRoomForOnAMixedImage) {
  TempDir dir("ubtrfs-full-queued");
  if (std::string why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  const std::string img = dir.Sub("mixed.img");
  ASSERT_EQ(ubtrfs_test::RunMkfs(img, "", 4096, "", 64 * kMiB, {"-M"}), "");
  const size_t files = FillWithQueuedWork(img);
  EXPECT_GT(files, 1000u);
  EXPECT_EQ(BtrfsCheck(img), "");
  std::cout << files << " files before the mixed image was full\n";
}

TEST(FullDevice, QueuedDirectoryAndInodeWorkIsKeptRoomForInMetadataChunks) {
  TempDir dir("ubtrfs-full-queued-meta");
  const std::string img = MakeImage(dir, "meta.img", "128M");
  const size_t files = FillWithQueuedWork(img);
  EXPECT_GT(files, 1000u);
  EXPECT_EQ(BtrfsCheck(img), "");
  std::cout << files << " files before the image was full\n";
}

namespace {

// A file of thousands of small extents on a full mixed image, deleted: the
// kernel truncates an evicted inode in steps across transactions, and so
// must the library; one change freeing every extent made a commit larger
// than what was left (found in a kernel/ubtrfs ping-pong with a file that
// compress-force had cut into 128 KiB extents: `rm` through the mount
// returned 0, the final commit failed, the file came back). The unlink and
// every commit succeed, the space comes back, btrfs check is clean.
TEST(FullDevice, AFileOfThousandsOfExtentsIsDeletedOnAFullMixedImage) {
  TempDir dir("ubtrfs-full-frag");
  if (std::string why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  const std::string img = dir.Sub("mixed.img");
  ASSERT_EQ(ubtrfs_test::RunMkfs(img, "", 4096, "", 128 * kMiB, {"-M"}), "");
  uint64_t fill_size = 0, pieces = 0;
  {
    auto fs = OpenRw(img);
    ASSERT_TRUE(fs);
    auto frag = fs->Create(fs->Root(), "frag", Attrs(0644));
    ASSERT_TRUE(frag.ok());
    // Every other 4 KiB: no two pieces merge into one extent.
    const std::vector<uint8_t> piece = PatternBytes(4 * kKiB, 3);
    for (; pieces < 16000; ++pieces) {
      auto w = fs->Write(*frag, pieces * 8 * kKiB, piece);
      if (!w.ok()) {
        ASSERT_EQ(w.status().code(), ENOSPC) << w.status().ToString();
        break;
      }
      if (pieces % 2000 == 1999) {
        ASSERT_TRUE(fs->Commit().ok());
      }
    }
    auto fill = fs->Create(fs->Root(), "fill", Attrs(0644));
    ASSERT_TRUE(fill.ok());
    fill_size = FillData(*fs, *fill, 5);
    const Status rm = fs->Unlink(fs->Root(), "frag");
    ASSERT_TRUE(rm.ok()) << rm.ToString();
    const Status c = fs->Commit();
    ASSERT_TRUE(c.ok()) << c.ToString() << " (" << pieces << " extents)";
    auto st = fs->StatFs();
    ASSERT_TRUE(st.ok());
    EXPECT_GE(st->avail_bytes, pieces * 4 * kKiB / 2) << "the deleted file's space is not back";
    ExpectWritable(*fs, "after the delete");
  }
  EXPECT_EQ(BtrfsCheck(img), "");
  auto fs = OpenRw(img);
  ASSERT_TRUE(fs);
  EXPECT_EQ(fs->Lookup("/frag").status().code(), ENOENT);
  auto fill = fs->Lookup("/fill");
  ASSERT_TRUE(fill.ok());
  EXPECT_EQ(ReadAll(*fs, *fill), PatternBytes(fill_size, 5));
  std::cout << pieces << " extents deleted, " << (fill_size >> 20) << " MiB of fill\n";
}

}  // namespace
