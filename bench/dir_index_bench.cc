// Delayed dir-index batching, measured: N empty files created in one
// directory (16 KiB nodes by default) through the library, one commit, then
// the batches the flush inserted: how many, how many filled a leaf, and the
// log2 histogram of their sizes. The same run is repeated with the old
// kernel behaviour (a batch stops at the free space of the leaf it lands in;
// OpenOptions::legacy_dir_index_batching) for comparison. Both images are
// checked with `btrfs check --readonly` when it is installed.
//
//   dir_index_bench [N=100000] [--nodesize=16384] [--keep]
//
// Reference point (the kernel patch that made batches leaf-sized): 100,000
// files, 16 KiB leaves: 1,658 uneven batches before, 839 after, most of 120
// items.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "io/block_device.h"
#include "stats/stats.h"
#include "txn/mkfs.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/stats.h"

namespace {

struct RunResult {
  uint64_t batches = 0, full = 0, items = 0, early = 0;
  double create_s = 0, commit_s = 0;
  ubtrfs::HistogramSnapshot hist;
  bool ok = false;
};

bool MakeImage(const std::string& path, uint32_t nodesize) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || ::ftruncate(fd, 1ull << 30) != 0) {
    std::perror(path.c_str());
    return false;
  }
  ::close(fd);
  auto dev = ubtrfs::io::OpenFileDevice(path, {.writable = true});
  if (!dev.ok()) {
    std::fprintf(stderr, "%s\n", dev.status().ToString().c_str());
    return false;
  }
  ubtrfs::txn::MkfsOptions o;
  o.nodesize = nodesize;
  ubtrfs::Status st = ubtrfs::txn::MakeFilesystem(dev->get(), o);
  if (!st.ok()) {
    std::fprintf(stderr, "mkfs: %s\n", st.ToString().c_str());
    return false;
  }
  return true;
}

RunResult Run(const std::string& image, uint64_t n, uint32_t nodesize, bool legacy) {
  RunResult r;
  if (!MakeImage(image, nodesize)) return r;
  ubtrfs::ResetStats();
  ubtrfs::OpenOptions oo;
  oo.writable = true;
  oo.legacy_dir_index_batching = legacy;
  auto fs = ubtrfs::Filesystem::Open(image, oo);
  if (!fs.ok()) {
    std::fprintf(stderr, "open: %s\n", fs.status().ToString().c_str());
    return r;
  }
  auto dir = (*fs)->Mkdir((*fs)->Root(), "d", ubtrfs::NewInode{.mode = 0755});
  if (!dir.ok()) return r;
  auto t0 = std::chrono::steady_clock::now();
  char name[64];
  for (uint64_t i = 0; i < n; ++i) {
    std::snprintf(name, sizeof name, "file-%08llu", static_cast<unsigned long long>(i));
    auto f = (*fs)->Create(*dir, name, ubtrfs::NewInode{.mode = 0644});
    if (!f.ok()) {
      std::fprintf(stderr, "create %s: %s\n", name, f.status().ToString().c_str());
      return r;
    }
  }
  auto t1 = std::chrono::steady_clock::now();
  ubtrfs::Status st = (*fs)->Commit();
  auto t2 = std::chrono::steady_clock::now();
  if (!st.ok()) {
    std::fprintf(stderr, "commit: %s\n", st.ToString().c_str());
    return r;
  }
  fs->reset();
  ubtrfs::StatsSnapshot s = ubtrfs::CollectStats();
  r.batches = s.Counter("delayed_index.batches");
  r.full = s.Counter("delayed_index.full_leaf_batches");
  r.items = s.Counter("delayed_index.items_inserted");
  r.early = s.Counter("delayed_index.early_dir_flushes");
  if (const auto* h = s.FindHistogram("delayed_index.batch_items")) r.hist = *h;
  r.create_s = std::chrono::duration<double>(t1 - t0).count();
  r.commit_s = std::chrono::duration<double>(t2 - t1).count();
  r.ok = true;
  return r;
}

void Print(const char* title, const RunResult& r, uint64_t n) {
  std::printf("== %s\n", title);
  std::printf("items inserted %llu of %llu, batches %llu, full-leaf batches %llu (%.1f%%), early dir flushes %llu\n",
              (unsigned long long)r.items, (unsigned long long)n, (unsigned long long)r.batches,
              (unsigned long long)r.full, r.batches ? 100.0 * double(r.full) / double(r.batches) : 0.0,
              (unsigned long long)r.early);
  std::printf("mean batch %.1f items, largest %llu; create %.3f s (%.0f files/s), commit %.3f s\n", r.hist.Mean(),
              (unsigned long long)r.hist.max, r.create_s, double(n) / r.create_s, r.commit_s);
  ubtrfs::StatsSnapshot one;
  one.histograms.push_back(r.hist);
  std::string text = one.ToText();
  // Only the histogram part (the counters block is empty here).
  auto pos = text.find('\n', text.find("counters:"));
  std::printf("%s\n", text.substr(pos + 1).c_str());
}

bool BtrfsCheckClean(const std::string& image) {
  if (std::system("command -v btrfs >/dev/null 2>&1") != 0) {
    std::printf("btrfs check: not installed, skipped\n");
    return true;
  }
  std::string cmd = "btrfs check --readonly '" + image + "' >/dev/null 2>&1";
  bool clean = std::system(cmd.c_str()) == 0;
  std::printf("btrfs check --readonly %s: %s\n", image.c_str(), clean ? "clean" : "ERRORS");
  return clean;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 100000;
  uint32_t nodesize = 16384;
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--nodesize=", 11) == 0) {
      nodesize = static_cast<uint32_t>(std::strtoul(argv[i] + 11, nullptr, 10));
    } else if (std::strcmp(argv[i], "--keep") == 0) {
      keep = true;
    } else {
      n = std::strtoull(argv[i], nullptr, 10);
    }
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string base = std::string(tmp ? tmp : "/tmp") + "/dir_index_bench." + std::to_string(::getpid());
  std::printf("dir_index_bench: %llu files in one directory, nodesize %u\n\n", (unsigned long long)n, nodesize);
  RunResult full = Run(base + ".full.img", n, nodesize, false);
  RunResult legacy = Run(base + ".legacy.img", n, nodesize, true);
  if (!full.ok || !legacy.ok) return 1;
  Print("leaf-sized batches (ubtrfs)", full, n);
  Print("batches limited to the leaf's free space (old kernel behaviour)", legacy, n);
  const bool full_clean = BtrfsCheckClean(base + ".full.img");  // (both checked, whatever the first says)
  const bool clean = BtrfsCheckClean(base + ".legacy.img") && full_clean;
  if (!keep) {
    ::unlink((base + ".full.img").c_str());
    ::unlink((base + ".legacy.img").c_str());
  }
  return clean && full.items == n && legacy.items == n ? 0 : 1;
}
