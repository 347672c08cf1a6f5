// What the name checks of ReadDir cost on a huge directory (issue 23):
//
//   readdir_bench IMAGE [--files N] [--reps R]
//
// Makes IMAGE (an existing `ubtrfs mkfs` image, written to) hold one
// directory /big with N empty files (fs_mark-style 40-byte names; made once,
// kept when it is already there), then times, R times each, a whole ReadDir
// of it from a fresh open (the read path as `ubtrfs ls` and the mount see
// it), and FilterDirEntries alone over the same listing (the validation and
// duplicate check that ReadDir runs before it returns). Prints one JSON line
// with the medians.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fs/dir_names.h"
#include "ubtrfs/filesystem.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Fail(const std::string& what, const ubtrfs::Status& s) {
  std::fprintf(stderr, "readdir_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: readdir_bench IMAGE [--files N] [--reps R]\n");
    return 2;
  }
  const std::string image = argv[1];
  uint64_t files = 1000000;
  int reps = 5;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--files") == 0) files = std::strtoull(argv[i + 1], nullptr, 10);
    else if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  }
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::Filesystem::Open(image, o);
    if (!fs.ok()) Fail(image, fs.status());
    if (!(*fs)->Lookup("/big").ok()) {
      auto dir = (*fs)->Mkdir((*fs)->Root(), "big", ubtrfs::NewInode{.mode = 0755});
      if (!dir.ok()) Fail("mkdir", dir.status());
      char name[64];
      for (uint64_t i = 0; i < files; ++i) {
        std::snprintf(name, sizeof name, "%016llx%024llu", static_cast<unsigned long long>(i * 0x9E3779B97F4A7C15ull),
                      static_cast<unsigned long long>(i));
        auto f = (*fs)->Create(*dir, name, ubtrfs::NewInode{.mode = 0644});
        if (!f.ok()) Fail("create", f.status());
      }
      if (auto st = (*fs)->Commit(); !st.ok()) Fail("commit", st);
    }
  }
  std::vector<double> readdir_ms, filter_ms;
  size_t entries = 0;
  for (int r = 0; r < reps; ++r) {
    auto fs = ubtrfs::Filesystem::Open(image);
    if (!fs.ok()) Fail(image, fs.status());
    auto dir = (*fs)->Lookup("/big");
    if (!dir.ok()) Fail("/big", dir.status());
    const auto t0 = Clock::now();
    auto list = (*fs)->ReadDir(*dir);
    const auto t1 = Clock::now();
    if (!list.ok()) Fail("readdir", list.status());
    entries = list->size();
    std::vector<ubtrfs::SkippedEntry> skipped;
    const auto t2 = Clock::now();
    ubtrfs::fsimpl::FilterDirEntries(&*list, &skipped);
    const auto t3 = Clock::now();
    if (!skipped.empty() || list->size() != entries) {
      std::fprintf(stderr, "readdir_bench: a clean directory lost entries\n");
      return 1;
    }
    readdir_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    filter_ms.push_back(std::chrono::duration<double, std::milli>(t3 - t2).count());
  }
  const double rd = Median(readdir_ms), fl = Median(filter_ms);
  std::printf("{\"entries\": %zu, \"readdir_ms\": %.1f, \"filter_ms\": %.1f, \"filter_share\": %.3f}\n", entries, rd, fl,
              fl / rd);
  return 0;
}
