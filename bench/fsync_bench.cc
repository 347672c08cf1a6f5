// fsync cost through the library, no mount:
//
//   fsync_bench IMAGE --mode commit|fsync|fdatasync [--count N] [--size BYTES]
//       Creates /fsync-bench-<pid> in IMAGE, then N times appends BYTES
//       (default 4096) and makes it durable: `commit` with Commit() (a full
//       transaction commit, what fsync was before the tree log), `fsync` and
//       `fdatasync` with Fsync(file, datasync). Prints one JSON object: the
//       mean and the percentiles of one append + durability step, in
//       microseconds, and the CPU time (user + system) per step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/resource.h>
#include <unistd.h>
#include <vector>

#include "ubtrfs/filesystem.h"
#include "ubtrfs/stats.h"

namespace {

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr, "fsync_bench: %s\nusage: fsync_bench IMAGE --mode commit|fsync|fdatasync [--count N] [--size BYTES]\n",
               why);
  std::exit(2);
}

[[noreturn]] void Die(const char* what, const ubtrfs::Status& s) {
  std::fprintf(stderr, "fsync_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Usage("no image");
  std::string image = argv[1], mode = "commit";
  long count = 1000, size = 4096;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) Usage("option without a value");
    if (a == "--mode") mode = argv[++i];
    else if (a == "--count") count = std::atol(argv[++i]);
    else if (a == "--size") size = std::atol(argv[++i]);
    else Usage("unknown option");
  }
  if (mode != "commit" && mode != "fsync" && mode != "fdatasync") Usage("unknown mode");
  if (count <= 0 || size <= 0) Usage("count and size must be positive");

  ubtrfs::OpenOptions o;
  o.writable = true;
  auto fs = ubtrfs::Filesystem::Open(image, o);
  if (!fs.ok()) Die("open", fs.status());
  ubtrfs::NewInode attrs;
  attrs.mode = 0100644;
  std::string name = "fsync-bench-" + std::to_string(getpid());
  auto file = (*fs)->Create((*fs)->Root(), name, attrs);
  if (!file.ok()) Die("create", file.status());
  if (auto s = (*fs)->Commit(); !s.ok()) Die("commit", s);

  std::vector<uint8_t> buf(size);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 7 + 1);
  std::vector<double> us;
  us.reserve(count);
  ubtrfs::ResetStats();
  auto cpu = [] {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  };
  const double cpu0 = cpu();
  auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < count; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    buf[0] = static_cast<uint8_t>(i);
    auto n = (*fs)->Write(*file, static_cast<uint64_t>(i) * size, buf);
    if (!n.ok()) Die("write", n.status());
    ubtrfs::Status s = mode == "commit" ? (*fs)->Commit() : (*fs)->Fsync(*file, mode == "fdatasync");
    if (!s.ok()) Die(mode.c_str(), s);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu_us = (cpu() - cpu0) * 1e6 / count;
  std::sort(us.begin(), us.end());
  auto pct = [&](double p) { return us[std::min(us.size() - 1, static_cast<size_t>(p * us.size()))]; };
  std::printf("{\"mode\": \"%s\", \"count\": %ld, \"size\": %ld, \"seconds\": %.3f, \"per_second\": %.1f, "
              "\"mean_us\": %.1f, \"p50_us\": %.1f, \"p90_us\": %.1f, \"p99_us\": %.1f, \"cpu_us\": %.1f}\n",
              mode.c_str(), count, size, total, count / total, total * 1e6 / count, pct(0.5), pct(0.9), pct(0.99), cpu_us);
  return 0;
}
