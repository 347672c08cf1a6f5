// libFuzzer target: the read paths over an aborted transaction (issue 15).
// A small filesystem is built in memory once; each run opens it writable on
// a fault-injecting device, arms one fault the input chooses (the Nth read,
// write or flush fails with EIO, or every write after the Nth, or the
// device reports ENOSPC for every write), runs a script of changes
// (fuzz_script.h) and commits. Then, with the fault still armed:
//   - every ReadDir, LookupChild, stat, read, readlink and xattr of the
//     view, and statfs, either works or fails with an errno and a message;
//   - once a commit has failed, every change fails with EROFS and nothing
//     more is written or flushed to the device;
// and with the fault cleared, the image opened again holds a committed
// state that reads back without a single error.
//
// Input: byte 0 the fault kind (low 3 bits) and flags (0x10: a 0-byte node
// cache, so that tree reads hit the device; 0x20: delayed dir items queued
// after 1 create and inserted in pairs, so that a commit has queues to
// flush); bytes 1-2 N (little endian); the rest the script, whose first half
// runs before the commit and second half after it. Seeds:
// corpus/aborted_read_fuzz.
#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_image.h"
#include "fuzz_script.h"
#include "io/fault_device.h"
#include "io/recording_device.h"
#include "txn/mkfs.h"

namespace {

using ubtrfs::InodeId;
using ubtrfs::Status;
using ubtrfs::io::FaultDevice;
using ubtrfs::io::FaultOp;
using ubtrfs_fuzz::Pages;
using ubtrfs_fuzz::SparseDevice;
using ubtrfs_fuzz::State;

volatile uint64_t g_sink;

#define BASE_CHECK(cond)                                                    \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::fprintf(stderr, "aborted_read_fuzz: setup failed: %s\n", #cond); \
      std::abort();                                                         \
    }                                                                       \
  } while (0)

std::span<const uint8_t> Span(const std::string& s) {
  return std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// The committed base: a directory of 300 entries (several leaves with 4 KiB
// nodes), files inline and of several extents, xattrs, a symlink, a hard
// link and a nested directory.
std::shared_ptr<Pages> MakeBase() {
  constexpr uint32_t kNodeSize = 4096;
  auto pages = std::make_shared<Pages>();
  pages->size = ubtrfs::txn::MkfsMinBytes(kNodeSize);
  {
    SparseDevice dev(pages);
    ubtrfs::txn::MkfsOptions mo;
    mo.nodesize = kNodeSize;
    mo.time_sec = 1700000000;
    BASE_CHECK(ubtrfs::txn::MakeFilesystem(&dev, mo).ok());
  }
  ubtrfs::OpenOptions o;
  o.writable = true;
  auto fs = ubtrfs::OpenOnDevice(std::make_unique<SparseDevice>(pages), o);
  BASE_CHECK(fs.ok());
  auto& f = **fs;
  const InodeId root = f.Root();
  const ubtrfs::NewInode file{.mode = 0644}, dir{.mode = 0755};
  auto many = f.Mkdir(root, "many", dir);
  auto deep = f.Mkdir(root, "deep", dir);
  BASE_CHECK(many.ok() && deep.ok());
  auto sub = f.Mkdir(*deep, "sub", dir);
  BASE_CHECK(sub.ok());
  for (int i = 0; i < 300; ++i) {
    auto id = f.Create(*many, "entry-" + std::to_string(i), file);
    BASE_CHECK(id.ok());
    if (i % 10 == 0) BASE_CHECK(f.Write(*id, 0, Span(std::string(50 + i, 'e'))).ok());
  }
  const std::vector<std::pair<std::string, size_t>> files = {{"inline", 300}, {"one", 5000}, {"several", 300000}};
  for (const auto& [name, len] : files) {
    auto id = f.Create(*sub, name, file);
    BASE_CHECK(id.ok());
    std::string data(len, '\0');
    for (size_t i = 0; i < len; ++i) data[i] = static_cast<char>(i * 7 + len);
    BASE_CHECK(f.Write(*id, 0, Span(data)).ok());
    BASE_CHECK(f.SetXattr(*id, "user.a", "value of " + name, 0).ok());
    BASE_CHECK(f.SetXattr(*id, "user.big", std::string(2000, 'x'), 0).ok());
  }
  auto one = f.LookupChild(*sub, "one");
  BASE_CHECK(one.ok() && f.Link(*one, root, "one-link").ok());
  BASE_CHECK(f.Symlink(root, "link", "deep/sub/several", file).ok());
  BASE_CHECK(f.Commit().ok());
  return pages;
}

const Pages& TheBase() {
  static const std::shared_ptr<Pages> base = MakeBase();
  return *base;
}

void ArmFault(FaultDevice& dev, uint8_t kind, uint64_t n) {
  switch (kind % 6) {
    case 0: dev.FailNth(FaultOp::kWrite, n); break;
    case 1: dev.FailNth(FaultOp::kFlush, 1 + n % 8); break;
    case 2: dev.FailNth(FaultOp::kRead, n); break;
    case 3: dev.FailAfter(FaultOp::kWrite, n); break;
    case 4: dev.FailAfter(FaultOp::kRead, n); break;
    case 5: dev.SetFull(true); break;
  }
}

// A change the view must refuse once a commit failed.
void ExpectRefused(ubtrfs::Filesystem& fs, State& s) {
  auto c = fs.Create(fs.Root(), "after-the-abort", ubtrfs::NewInode{.mode = 0644});
  FUZZ_CHECK(!c.ok());
  ubtrfs_fuzz::CheckError(c.status());
  FUZZ_CHECK(c.status().code() == EROFS);
  auto w = fs.Write(s.nodes.back(), 0, Span("x"));
  FUZZ_CHECK(!w.ok());
  ubtrfs_fuzz::CheckError(w.status());
  Status m = fs.Commit();
  FUZZ_CHECK(!m.ok());
  ubtrfs_fuzz::CheckError(m);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t kind = data[0];
  const uint64_t n = 1 + (data[1] | uint64_t{data[2]} << 8) % 2048;
  const std::span<const uint8_t> script(data + 3, size - 3);
  const size_t half = script.size() / 2;

  auto pages = std::make_shared<Pages>(TheBase());
  auto fault = std::make_unique<FaultDevice>(std::make_unique<SparseDevice>(pages));
  uint64_t acc = 0;
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    o.node_cache_bytes = (kind & 0x10) ? 0 : 4ull << 20;
    if (kind & 0x20) {
      o.dir_item_index_after = 1;
      o.dir_item_batch = 2;
    }
    auto opened = ubtrfs::OpenOnDevice(ubtrfs::io::NewUnownedDevice(fault.get()), o);
    FUZZ_CHECK(opened.ok());  // the base image opens before any fault
    auto& fs = **opened;
    State s;
    s.dirs.push_back(fs.Root());
    s.nodes.push_back(fs.Root());
    const std::vector<std::pair<const char*, bool>> known = {
        {"/many", true},        {"/deep", true},  {"/deep/sub", true}, {"/deep/sub/several", false},
        {"/many/entry-10", false}, {"/one-link", false}};
    for (const auto& [path, is_dir] : known) {
      auto id = fs.Lookup(path);
      FUZZ_CHECK(id.ok());
      s.nodes.push_back(*id);
      if (is_dir) s.dirs.push_back(*id);
    }
    s.names.push_back("entry-5");
    s.names.push_back("several");

    ArmFault(*fault, kind & 7, n);
    ubtrfs_fuzz::Script first(script.first(half));
    ubtrfs_fuzz::RunScript(fs, first, &s);
    const Status commit = fs.Commit();
    if (!commit.ok()) ubtrfs_fuzz::CheckError(commit);

    // The view after the commit, fault still armed: reads work or fail cleanly.
    acc += ubtrfs_fuzz::WalkAll(fs).checksum;
    if (!commit.ok()) {
      const uint64_t writes = fault->writes(), flushes = fault->flushes();
      ExpectRefused(fs, s);
      ubtrfs_fuzz::Script second(script.subspan(half));
      ubtrfs_fuzz::RunScript(fs, second, &s);
      acc += ubtrfs_fuzz::WalkAll(fs).checksum;
      FUZZ_CHECK(fault->writes() == writes);
      FUZZ_CHECK(fault->flushes() == flushes);
    } else {
      ubtrfs_fuzz::Script second(script.subspan(half));
      ubtrfs_fuzz::RunScript(fs, second, &s);
    }
    fault->Clear();
  }  // closing commits what is left, unless the view was aborted

  // Whatever happened, the image holds a committed state, whole.
  ubtrfs::OpenOptions ro;
  ro.node_cache_bytes = 4ull << 20;
  auto again = ubtrfs::OpenOnDevice(std::make_unique<SparseDevice>(pages), ro);
  if (!again.ok()) ubtrfs_fuzz::CheckError(again.status());
  FUZZ_CHECK(again.ok());
  const ubtrfs_fuzz::WalkStats stats = ubtrfs_fuzz::WalkAll(**again);
  FUZZ_CHECK(stats.errors == 0);
  g_sink = acc + stats.checksum + stats.entries;
  return 0;
}
