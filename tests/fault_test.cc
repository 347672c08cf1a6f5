// Injected device faults (io/fault_device.h) under libubtrfs:
//   - EIO on a read reaches the caller as EIO and nothing else breaks: the
//     next reads work, a writable view stays writable;
//   - EIO on any write or flush of a commit aborts the transaction: Commit
//     fails with EIO, later changes fail with EROFS naming the abort, nothing
//     more is written (not even by the destructor), and the image reopens
//     check-clean at the last commit (or, when the fault hit only after the
//     new superblock was written, at the new one -- never anything else);
//   - ENOSPC from a full device aborts the same way; ENOSPC of a small image
//     in the middle of a large write or import leaves a consistent image.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <functional>
#include <map>
#include <random>

#include "check/checker.h"
#include "format/superblock.h"
#include "fs/import.h"
#include "fs/open_device.h"
#include "io/fault_device.h"
#include "io/recording_device.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_gen.h"
#include "txn/mkfs.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using io::FaultDevice;
using io::FaultOp;
using io::RecordingDevice;
using ubtrfs_test::TempDir;

// path -> "type perm size:bytes" (enough to tell two states apart byte for byte).
using State = std::map<std::string, std::string>;

Result<State> Snapshot(Filesystem& fs) {
  State st;
  std::function<Status(InodeId, const std::string&)> walk = [&](InodeId dir, const std::string& prefix) -> Status {
    UB_ASSIGN_OR_RETURN(auto entries, fs.ReadDir(dir));
    for (const DirEntry& e : entries) {
      const std::string path = prefix + "/" + e.name;
      UB_ASSIGN_OR_RETURN(Stat s, fs.GetStat(e.id));
      std::string v = std::to_string(s.mode) + " " + std::to_string(s.size) + ":";
      if (S_ISREG(s.mode)) {
        std::string data(s.size, '\0');
        UB_ASSIGN_OR_RETURN(size_t n, fs.Read(e.id, 0, std::span(reinterpret_cast<uint8_t*>(data.data()), data.size())));
        if (n != data.size()) return Status::Corrupt(path + ": short read");
        v += data;
      } else if (S_ISLNK(s.mode)) {
        UB_ASSIGN_OR_RETURN(std::string t, fs.ReadLink(e.id));
        v += t;
      }
      st[path] = std::move(v);
      if (S_ISDIR(s.mode)) UB_RETURN_IF_ERROR(walk(e.id, path));
    }
    return Status::Ok();
  };
  UB_RETURN_IF_ERROR(walk(fs.Root(), ""));
  return st;
}

std::string Bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

std::span<const uint8_t> Span(const std::string& s) {
  return std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

constexpr uint64_t kImageBytes = 128ull << 20;

NewInode Attrs(uint32_t perm) {
  NewInode a;
  a.mode = perm;
  return a;
}

// A fresh filesystem on a recording device (which serves as plain memory
// here), a fault device over it, and a Filesystem over that.
class FaultTest : public ::testing::Test {
 protected:
  void MakeFs(uint64_t bytes = kImageBytes, uint64_t data_bytes = 0) {
    rec_ = std::make_unique<RecordingDevice>("fault-image", bytes);
    txn::MkfsOptions o;
    o.data_bytes = data_bytes;
    Status st = txn::MakeFilesystem(rec_.get(), o);
    ASSERT_TRUE(st.ok()) << st.ToString();
    fault_ = std::make_unique<FaultDevice>(rec_.get());
  }
  void Open(bool writable, size_t node_cache_bytes = 64ull << 20) {
    OpenOptions o;
    o.writable = writable;
    o.node_cache_bytes = node_cache_bytes;
    auto fs = OpenOnDevice(io::NewUnownedDevice(fault_.get()), o);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    fs_ = std::move(*fs);
  }
  InodeId CreateFile(const std::string& name, const std::string& data) {
    auto id = fs_->Create(fs_->Root(), name, Attrs(0644));
    EXPECT_TRUE(id.ok()) << name << ": " << id.status().ToString();
    if (!id.ok()) return {};
    auto w = fs_->Write(*id, 0, Span(data));
    EXPECT_TRUE(w.ok()) << name << ": " << w.status().ToString();
    return *id;
  }
  // A committed base state: a few files, a directory and a symlink.
  void BaseState() {
    CreateFile("small", "hello, world\n");
    CreateFile("big", Bytes(300000, 1));
    auto d = fs_->Mkdir(fs_->Root(), "dir", Attrs(0755));
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE(fs_->Symlink(*d, "link", "../small", Attrs(0777)).ok());
    Status st = fs_->Commit();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  // Changes on top of the base state (not committed).
  void MoreChanges() {
    CreateFile("new", Bytes(50000, 2));
    auto big = fs_->Lookup("/big");
    ASSERT_TRUE(big.ok());
    ASSERT_TRUE(fs_->Write(*big, 1000, Span(Bytes(20000, 3))).ok());
    ASSERT_TRUE(fs_->Unlink(fs_->Root(), "small").ok());
    auto d = fs_->Lookup("/dir");
    ASSERT_TRUE(d.ok());
    for (int i = 0; i < 40; ++i) ASSERT_TRUE(fs_->Mkdir(*d, "sub" + std::to_string(i), Attrs(0700)).ok());
  }
  State Live() {
    auto s = Snapshot(*fs_);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? *s : State{};
  }
  // Reopens what is on the device now (a copy; the original is untouched):
  // it must open without warnings and pass our checker and btrfs check.
  State Reopen(const std::string& what) {
    RecordingDevice copy("reopened", rec_->current());
    {
      auto vol = txn::Volume::Open(io::NewUnownedDevice(&copy), txn::VolumeOptions{});
      EXPECT_TRUE(vol.ok()) << what << ": " << vol.status().ToString();
      if (vol.ok()) {
        auto cr = check::CheckVolume(**vol);
        EXPECT_TRUE(cr.clean()) << what << ": ubtrfs check: " << (cr.errors.empty() ? "" : cr.errors[0]);
      }
    }
    if (check_with_btrfs_ && !ubtrfs_test::FindProgram("btrfs").empty()) {
      const std::string path = tmp_.Sub("image");
      Status st = copy.current().SaveToFile(path);
      EXPECT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(ubtrfs_test::BtrfsCheck(path), "") << what;
    }
    auto fs = OpenOnDevice(io::NewUnownedDevice(&copy), OpenOptions{});
    EXPECT_TRUE(fs.ok()) << what << ": " << fs.status().ToString();
    if (!fs.ok()) return {};
    EXPECT_TRUE((*fs)->Warnings().empty()) << what << ": " << (*fs)->Warnings()[0];
    auto s = Snapshot(**fs);
    EXPECT_TRUE(s.ok()) << what << ": " << s.status().ToString();
    return s.ok() ? *s : State{};
  }
  void ExpectReadOnlyAfterAbort(const std::string& what) {
    auto c = fs_->Create(fs_->Root(), "after-abort", Attrs(0644));
    ASSERT_FALSE(c.ok()) << what;
    EXPECT_EQ(c.status().code(), EROFS) << what << ": " << c.status().ToString();
    EXPECT_NE(c.status().message().find("aborted"), std::string::npos) << c.status().ToString();
    Status st = fs_->Commit();
    EXPECT_EQ(st.code(), EROFS) << what << ": " << st.ToString();
    EXPECT_EQ(fs_->Mkdir(fs_->Root(), "x", Attrs(0755)).status().code(), EROFS);
    // Reading still works.
    EXPECT_TRUE(fs_->GetStat(fs_->Root()).ok());
    EXPECT_TRUE(fs_->ReadDir(fs_->Root()).ok());
    // Nothing more reaches the device, not even when the view is closed.
    const uint64_t writes = fault_->writes(), flushes = fault_->flushes();
    fs_.reset();
    EXPECT_EQ(fault_->writes(), writes) << what << ": writes after the abort";
    EXPECT_EQ(fault_->flushes(), flushes) << what;
  }

  std::unique_ptr<RecordingDevice> rec_;
  std::unique_ptr<FaultDevice> fault_;
  std::unique_ptr<Filesystem> fs_;
  TempDir tmp_{"ubtrfs-fault"};
  bool check_with_btrfs_ = true;
};

TEST_F(FaultTest, ReadEioReachesTheCallerAndTheNextReadsWork) {
  MakeFs();
  Open(true);
  BaseState();
  const State want = Live();
  fs_.reset();
  for (bool writable : {false, true}) {
    SCOPED_TRACE(writable ? "writable" : "read-only");
    Open(writable);
    auto big = fs_->Lookup("/big");
    ASSERT_TRUE(big.ok()) << big.status().ToString();
    std::vector<uint8_t> buf(300000);
    // Data: the next device read fails. A first read brings the metadata it
    // needs into the node cache, so the faulty read is the data's (a fault
    // on a metadata read is masked by the DUP copy, see below).
    ASSERT_TRUE(fs_->Read(*big, 0, buf).ok());
    const uint64_t reads = fault_->reads();
    ASSERT_TRUE(fs_->Read(*big, 0, buf).ok());
    ASSERT_GT(fault_->reads(), reads) << "file data is read from the device every time";
    fault_->FailNth(FaultOp::kRead, 1);
    auto r = fs_->Read(*big, 0, buf);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), EIO) << r.status().ToString();
    EXPECT_NE(r.status().message().find("injected"), std::string::npos) << r.status().ToString();
    r = fs_->Read(*big, 0, buf);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(std::string(buf.begin(), buf.end()), Bytes(300000, 1));
    // Metadata, with a node cache of one block so that a lookup must read
    // the fs tree leaf again after a file read cached the csum tree's: one
    // failed read is repaired from the other DUP copy...
    fs_.reset();
    Open(writable, 1);
    ASSERT_TRUE(fs_->Read(*big, 0, buf).ok());
    uint64_t faults = fault_->faults();
    fault_->FailNth(FaultOp::kRead, 1);
    auto one = fs_->Lookup("/dir/link");
    EXPECT_TRUE(one.ok()) << one.status().ToString();
    EXPECT_EQ(fault_->faults(), faults + 1) << "the lookup did not read the device";
    // ... but not when every read fails for a while.
    ASSERT_TRUE(fs_->Read(*big, 0, buf).ok());
    faults = fault_->faults();
    fault_->FailAfter(FaultOp::kRead, 0);
    auto l = fs_->Lookup("/dir/link");
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.status().code(), EIO) << l.status().ToString();
    auto s = fs_->ReadDir(fs_->Root());
    EXPECT_FALSE(s.ok());
    fault_->Clear();
    l = fs_->Lookup("/dir/link");
    ASSERT_TRUE(l.ok()) << "a failed read must not poison the cache: " << l.status().ToString();
    auto t = fs_->ReadLink(*l);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(*t, "../small");
    EXPECT_EQ(Live(), want);
    if (writable) {
      // The view is still writable: a read error is not a failed change.
      auto c = fs_->Create(fs_->Root(), "after-eio", Attrs(0644));
      EXPECT_TRUE(c.ok()) << c.status().ToString();
      EXPECT_TRUE(fs_->Unlink(fs_->Root(), "after-eio").ok());
      EXPECT_TRUE(fs_->Commit().ok());
    }
    fs_.reset();
  }
  EXPECT_EQ(Reopen("after read faults"), want);
}

// A read that fails inside a change (the leaf a create must search) gives
// the caller EIO. Whether the change had modified anything yet is not
// tracked, so the library aborts the transaction as for any half-done
// change: the view turns read-only (reads still work) and the image keeps
// its last commit.
TEST_F(FaultTest, ReadEioInsideAChangeAbortsSafely) {
  MakeFs();
  Open(true);
  BaseState();
  const State before = Live();
  fs_.reset();
  Open(true, 1);
  auto big = fs_->Lookup("/big");
  ASSERT_TRUE(big.ok());
  std::vector<uint8_t> buf(4096);
  ASSERT_TRUE(fs_->Read(*big, 0, buf).ok());  // the csum leaf is now the one cached block
  fault_->FailAfter(FaultOp::kRead, 0);
  auto c = fs_->Create(fs_->Root(), "new", Attrs(0644));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), EIO) << c.status().ToString();
  fault_->Clear();
  EXPECT_EQ(Live(), before);
  ExpectReadOnlyAfterAbort("read EIO in a create");
  EXPECT_EQ(Reopen("read EIO in a create"), before);
}

// Counts the writes and flushes one commit of MoreChanges() issues, on a
// device without faults.
struct CommitIo {
  uint64_t writes = 0, flushes = 0, first_super_write = 0;  // 1-based index of the primary superblock write
};

TEST_F(FaultTest, EioOnEveryWriteAndFlushOfACommitAborts) {
  // A dry run to learn the commit's I/O.
  MakeFs();
  Open(true);
  BaseState();
  MoreChanges();
  const uint64_t w0 = fault_->writes(), f0 = fault_->flushes();
  const size_t log0 = rec_->position();
  ASSERT_TRUE(fs_->Commit().ok());
  CommitIo io{fault_->writes() - w0, fault_->flushes() - f0, 0};
  for (size_t i = log0, n = 0; i < rec_->log().size(); ++i) {
    const auto& e = rec_->log()[i];
    if (e.kind != io::LogEntry::Kind::kWrite) continue;
    ++n;
    if (e.offset == format::SuperblockOffset(0) && io.first_super_write == 0) io.first_super_write = n;
  }
  ASSERT_GT(io.writes, 4u);
  ASSERT_EQ(io.flushes, 2u) << "commit order: blocks, flush, superblocks, flush";
  ASSERT_GT(io.first_super_write, 0u);
  fs_.reset();
  std::cout << "commit under test: " << io.writes << " writes (superblock from write " << io.first_super_write
            << "), " << io.flushes << " flushes\n";

  // Then a fault at each of them.
  int runs = 0, at_old = 0, at_new = 0;
  auto one = [&](FaultOp op, uint64_t nth) {
    const std::string what = std::string(io::FaultOpName(op)) + " " + std::to_string(nth) + " of the commit";
    SCOPED_TRACE(what);
    MakeFs();
    Open(true);
    BaseState();
    const State before = Live();
    MoreChanges();
    const State after = Live();
    ASSERT_NE(before, after);
    fault_->FailNth(op, nth);
    Status st = fs_->Commit();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), EIO) << st.ToString();
    EXPECT_NE(st.message().find("injected"), std::string::npos) << st.ToString();
    ASSERT_EQ(fault_->faults(), 1u);
    if (nth == 1 && op == FaultOp::kWrite) {
      std::cout << "commit: " << st.ToString() << "\n";
      auto c = fs_->Create(fs_->Root(), "x", Attrs(0644));
      std::cout << "then create: " << c.status().ToString() << "\n";
    }
    ExpectReadOnlyAfterAbort(what);
    fault_->Clear();
    // btrfs check on the faults around the superblock and a sample of the rest.
    check_with_btrfs_ = op == FaultOp::kFlush || nth + 2 >= io.first_super_write || nth % 7 == 1;
    const State now = Reopen(what);
    // Before the superblock write the old commit must be intact; once the
    // primary superblock is written the new commit is complete on the device.
    const bool super_written = op == FaultOp::kWrite ? nth > io.first_super_write : nth >= 2;
    if (super_written) {
      EXPECT_TRUE(now == before || now == after) << "neither the old nor the new commit";
    } else {
      EXPECT_TRUE(now == before) << "the last commit is not intact";
    }
    at_old += now == before;
    at_new += now == after;
    ++runs;
  };
  for (uint64_t n = 1; n <= io.writes && !HasFatalFailure(); ++n) {
    one(FaultOp::kWrite, n);
  }
  for (uint64_t n = 1; n <= io.flushes && !HasFatalFailure(); ++n) {
    one(FaultOp::kFlush, n);
  }
  std::cout << runs << " commits failed by an injected EIO: " << at_old << " reopened at the last commit, " << at_new
            << " at the new one (fault after its superblock write)\n";
}

TEST_F(FaultTest, EioOnADataWriteAbortsTheChange) {
  MakeFs();
  Open(true);
  BaseState();
  const State before = Live();
  auto id = fs_->Create(fs_->Root(), "data", Attrs(0644));
  ASSERT_TRUE(id.ok());
  fault_->FailNth(FaultOp::kWrite, 1);
  auto w = fs_->Write(*id, 0, Span(Bytes(1 << 20, 4)));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), EIO) << w.status().ToString();
  ExpectReadOnlyAfterAbort("data write");
  EXPECT_EQ(Reopen("data write"), before);
}

TEST_F(FaultTest, FullDeviceDuringCommitAborts) {
  MakeFs();
  Open(true);
  BaseState();
  const State before = Live();
  MoreChanges();
  fault_->SetFull(true);
  Status st = fs_->Commit();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ENOSPC) << st.ToString();
  ExpectReadOnlyAfterAbort("full device");
  fault_->Clear();
  EXPECT_EQ(Reopen("full device"), before);
}

TEST_F(FaultTest, EnospcInTheMiddleOfALargeWriteLeavesAConsistentImage) {
  MakeFs(txn::MkfsMinBytes(16384), 0);
  Open(true);
  BaseState();
  const State base = Live();
  State committed = base;  // the state of the last successful commit
  auto id = fs_->Create(fs_->Root(), "huge", Attrs(0644));
  ASSERT_TRUE(id.ok());
  const std::string chunk = Bytes(1 << 20, 5);
  Status failure;
  uint64_t written = 0;
  for (int i = 0; i < 200; ++i) {
    auto w = fs_->Write(*id, written, Span(chunk));
    if (!w.ok()) {
      failure = w.status();
      break;
    }
    written += *w;
    if (i % 8 == 7) {
      ASSERT_TRUE(fs_->Commit().ok());
      committed = Live();
    }
  }
  ASSERT_FALSE(failure.ok()) << "a 64 MiB image took 200 MiB";
  EXPECT_EQ(failure.code(), ENOSPC) << failure.ToString();
  std::cout << "ENOSPC after " << (written >> 20) << " MiB: " << failure.ToString() << "\n";
  // A clean ENOSPC changes nothing: the view stays writable and consistent.
  const State live = Live();
  auto st = fs_->GetStat(*id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->size, written);
  Status c = fs_->Commit();
  std::cout << "commit after the ENOSPC: " << (c.ok() ? "ok" : c.ToString()) << "\n";
  if (c.ok()) {
    fs_.reset();
    EXPECT_EQ(Reopen("after ENOSPC and commit"), live);
  } else {
    // If the commit itself cannot find space it must abort cleanly.
    EXPECT_EQ(c.code(), ENOSPC) << c.ToString();
    fs_.reset();
    State now = Reopen("after ENOSPC, failed commit");
    // The image is the last commit, whole: the base state and /huge as it
    // was committed (or absent, if no commit came after its create).
    EXPECT_EQ(now, committed);
  }
  // Either way the base state is there, path by path, byte by byte.
  State reopened = Reopen("the base state after ENOSPC");
  for (const auto& [path, v] : base) {
    auto it = reopened.find(path);
    ASSERT_NE(it, reopened.end()) << path << " of the base state is gone";
    EXPECT_TRUE(it->second == v) << path << " of the base state changed";
  }
}

TEST_F(FaultTest, EnospcInTheMiddleOfAnImportLeavesAConsistentImage) {
  MakeFs(txn::MkfsMinBytes(16384), 0);
  Open(true);
  BaseState();
  const State base = Live();
  TempDir host("ubtrfs-fault-src");
  ubtrfs_test::TreeGenOptions o = ubtrfs_test::ScaledTreeOptions(400);
  o.large_files = 20;
  o.large_file_max = 4ull << 20;
  ubtrfs_test::GenerateTree(host.path(), 77, o);
  fs::ImportOptions io;
  io.commit_every_bytes = 8ull << 20;
  Status st = fs::ImportTree(*fs_, host.path(), fs_->Root(), "imported", io);
  ASSERT_FALSE(st.ok()) << "the tree fit; make it bigger";
  EXPECT_EQ(st.code(), ENOSPC) << st.ToString();
  std::cout << "import stopped: " << st.ToString() << "\n";
  const State live = Live();
  Status c = fs_->Commit();
  std::cout << "commit after the import's ENOSPC: " << (c.ok() ? "ok" : c.ToString()) << "\n";
  if (c.ok()) {
    fs_.reset();
    EXPECT_EQ(Reopen("import after ENOSPC"), live);
  } else {
    EXPECT_EQ(c.code(), EROFS) << c.ToString();  // the import's failure aborted the transaction
    fs_.reset();
    State now = Reopen("import after ENOSPC (aborted)");
    // The image is a commit of the import (every 8 MiB): the base state
    // whole, plus part of /imported.
    for (const auto& [path, v] : base) {
      auto it = now.find(path);
      ASSERT_NE(it, now.end()) << path << " of the base state is gone";
      EXPECT_TRUE(it->second == v) << path << " of the base state changed";
    }
    for (const auto& [path, v] : now) {
      EXPECT_TRUE(base.count(path) || path.rfind("/imported", 0) == 0) << "unexpected " << path;
    }
  }
}

}  // namespace
