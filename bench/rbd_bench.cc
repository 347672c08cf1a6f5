// The library on one image, for bench/rbd_bench.sh (an RBD image against a
// local image file):
//
//   rbd_bench IMAGE [--files N] [--write-mib M]
//
// IMAGE is a fresh btrfs image (ubtrfs mkfs), a path or rbd:POOL/IMAGE...
//   create   fs_mark's pattern through the library: N files of 4 KiB in
//            directories of 1000, then Commit(); files/s including the commit
//   commit   20 small commits (one 4 KiB file each): the median time, and
//            what each sent to the device: write calls, bytes, flushes
//   write    one M MiB file in 1 MiB writes, then Commit(): MiB/s
//   read     the file back after a reopen (cold node cache; the device has no
//            cache of its own): MiB/s
// The device is wrapped in a counter, so the numbers say how many requests
// a commit costs; on RBD each Flush waits for every write in flight, so a
// commit with asynchronous writes costs about one round trip per flush
// (plus the superblock writes) rather than one per write.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fs/open_device.h"
#include "io/block_device.h"
#include "ubtrfs/filesystem.h"

namespace {

using Clock = std::chrono::steady_clock;
using ubtrfs::Status;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Counts {
  std::atomic<uint64_t> writes{0}, bytes{0}, flushes{0}, reads{0};
  void Reset() { writes = bytes = flushes = reads = 0; }
};

class CountingDevice final : public ubtrfs::io::BlockDevice {
 public:
  CountingDevice(std::unique_ptr<ubtrfs::io::BlockDevice> d, Counts* c) : d_(std::move(d)), c_(c) {}
  Status ReadAt(uint64_t o, std::span<uint8_t> b) override {
    ++c_->reads;
    return d_->ReadAt(o, b);
  }
  Status WriteAt(uint64_t o, std::span<const uint8_t> b) override {
    ++c_->writes;
    c_->bytes += b.size();
    return d_->WriteAt(o, b);
  }
  Status WriteGather(uint64_t o, std::span<const std::span<const uint8_t>> pieces) override {
    ++c_->writes;
    for (const auto& p : pieces) c_->bytes += p.size();
    return d_->WriteGather(o, pieces);
  }
  Status Flush() override {
    ++c_->flushes;
    return d_->Flush();
  }
  void StartWriteback() override { d_->StartWriteback(); }
  uint64_t Size() const override { return d_->Size(); }
  std::string Name() const override { return d_->Name(); }

 private:
  std::unique_ptr<ubtrfs::io::BlockDevice> d_;
  Counts* c_;
};

[[noreturn]] void Die(const char* what, const Status& st) {
  std::fprintf(stderr, "rbd_bench: %s: %s\n", what, st.ToString().c_str());
  std::exit(1);
}

std::unique_ptr<ubtrfs::Filesystem> Open(const std::string& image, bool writable, Counts* c) {
  auto dev = ubtrfs::io::OpenDevice(image, {.writable = writable});
  if (!dev.ok()) Die("open", dev.status());
  ubtrfs::OpenOptions o;
  o.writable = writable;
  auto fs = ubtrfs::OpenOnDevice(std::make_unique<CountingDevice>(std::move(*dev), c), o);
  if (!fs.ok()) Die("open", fs.status());
  return std::move(*fs);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: rbd_bench IMAGE [--files N] [--write-mib M]\n");
    return 2;
  }
  const std::string image = argv[1];
  uint64_t files = 20000, write_mib = 1024;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--files")) files = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--write-mib")) write_mib = std::strtoull(argv[i + 1], nullptr, 10);
  }
  Counts c;
  const std::vector<uint8_t> small(4096, 0x5a);
  {
    auto fs = Open(image, true, &c);
    // create
    c.Reset();
    auto t0 = Clock::now();
    ubtrfs::InodeId dir{};
    for (uint64_t i = 0; i < files; ++i) {
      if (i % 1000 == 0) {
        auto d = fs->Mkdir(fs->Root(), "d" + std::to_string(i / 1000), {.mode = 0755});
        if (!d.ok()) Die("mkdir", d.status());
        dir = *d;
      }
      char name[64];
      std::snprintf(name, sizeof name, "%08llx%032llx", static_cast<unsigned long long>(i),
                    static_cast<unsigned long long>(i * 0x9E3779B97F4A7C15ull));
      auto f = fs->Create(dir, name, {.mode = 0644});
      if (!f.ok()) Die("create", f.status());
      auto n = fs->Write(*f, 0, small);
      if (!n.ok()) Die("write", n.status());
    }
    const double t_ops = Since(t0);
    auto tc = Clock::now();
    if (Status st = fs->Commit(); !st.ok()) Die("commit", st);
    const double t_commit = Since(tc), t_all = Since(t0);
    std::printf("create: %llu files of 4 KiB: %.2f s (%.0f files/s), of which the final commit %.2f s; "
                "the whole phase sent %llu writes, %.1f MiB, %llu flushes\n",
                static_cast<unsigned long long>(files), t_all, files / t_all, t_commit,
                static_cast<unsigned long long>(c.writes.load()), c.bytes.load() / 1048576.0,
                static_cast<unsigned long long>(c.flushes.load()));
    (void)t_ops;

    // commit
    std::vector<double> times;
    uint64_t w = 0, b = 0, fl = 0;
    for (int i = 0; i < 20; ++i) {
      auto f = fs->Create(fs->Root(), "small" + std::to_string(i), {.mode = 0644});
      if (!f.ok()) Die("create", f.status());
      if (auto n = fs->Write(*f, 0, small); !n.ok()) Die("write", n.status());
      c.Reset();
      auto t = Clock::now();
      if (Status st = fs->Commit(); !st.ok()) Die("commit", st);
      times.push_back(Since(t) * 1000);
      w += c.writes;
      b += c.bytes;
      fl += c.flushes;
    }
    std::sort(times.begin(), times.end());
    std::printf("commit: one 4 KiB file: median %.2f ms (min %.2f, max %.2f); per commit %.1f writes, %.0f KiB, "
                "%.1f flushes\n",
                times[times.size() / 2], times.front(), times.back(), w / 20.0, b / 20.0 / 1024, fl / 20.0);

    // write
    std::vector<uint8_t> mib(1 << 20);
    for (size_t i = 0; i < mib.size(); ++i) mib[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
    auto f = fs->Create(fs->Root(), "big", {.mode = 0644});
    if (!f.ok()) Die("create", f.status());
    c.Reset();
    t0 = Clock::now();
    for (uint64_t i = 0; i < write_mib; ++i) {
      mib[0] = static_cast<uint8_t>(i);  // no two MiB alike
      auto n = fs->Write(*f, i << 20, mib);
      if (!n.ok()) Die("write", n.status());
    }
    tc = Clock::now();
    if (Status st = fs->Commit(); !st.ok()) Die("commit", st);
    const double t_w = Since(t0);
    std::printf("write: %llu MiB file: %.2f s (%.0f MiB/s), commit %.2f s; %llu writes, %llu flushes\n",
                static_cast<unsigned long long>(write_mib), t_w, write_mib / t_w, Since(tc),
                static_cast<unsigned long long>(c.writes.load()), static_cast<unsigned long long>(c.flushes.load()));
  }
  {
    auto fs = Open(image, false, &c);
    auto f = fs->Lookup("/big");
    if (!f.ok()) Die("lookup", f.status());
    std::vector<uint8_t> mib(1 << 20);
    c.Reset();
    auto t0 = Clock::now();
    for (uint64_t i = 0; i < write_mib; ++i) {
      auto n = fs->Read(*f, i << 20, mib);
      if (!n.ok()) Die("read", n.status());
      if (*n != mib.size() || mib[0] != static_cast<uint8_t>(i)) {
        std::fprintf(stderr, "rbd_bench: read back other bytes at MiB %llu\n", static_cast<unsigned long long>(i));
        return 1;
      }
    }
    const double t_r = Since(t0);
    std::printf("read: %llu MiB file after a reopen: %.2f s (%.0f MiB/s); %llu device reads\n",
                static_cast<unsigned long long>(write_mib), t_r, write_mib / t_r,
                static_cast<unsigned long long>(c.reads.load()));
  }
  return 0;
}
