// In-process workloads of bench/run.py through the library API, no mount:
//
//   lib_bench create IMAGE --threads T --files N --loops L [--size BYTES] [--max-dirty-mib M]
//                    [--commit inline|behind]
//       fs_mark's pattern (-S 0 -n N*T -t T -L L -k): thread i creates N new
//       files in its own directory t<i> per loop (fs_mark-style 40-byte
//       names; BYTES written to each), and each loop ends with Commit(), which
//       is timed with it. Prints one JSON object: files/s per loop.
//       --commit behind: each loop's Commit() runs on a thread of its own
//       while the next loop's workers start (an application with a committer
//       thread); a loop is timed until its workers are done and the commit
//       before it returned, the last one until its own commit returned. Every
//       file is still in a durable commit when the run ends.
//   lib_bench delete IMAGE --threads T [--list-first|--interleave] DIR...
//       Removes each DIR (a path in the image) recursively, one worker per
//       directory, at most T at a time, then Commit(); timed from after the
//       open to after the commit. Each worker lists its directory and then
//       removes what it found; with --list-first every directory is listed
//       (in the timed part) before the workers start, so no listing runs
//       while another worker removes. --interleave: one thread removes one
//       entry of each directory in turn (the workers' order, no concurrency).
//
//   lib_bench snapshot IMAGE SUBVOL FILE
//       Times CreateSnapshot of the subvolume whose top is SUBVOL (read-only,
//       as SUBVOL-bench-snap next to it; the call commits before and after),
//       then the first write into the new snapshot (4 KiB over the start of
//       FILE, a path inside SUBVOL, and Commit()), with the tree blocks each
//       commit wrote (commit.blocks_written).
//
// Both print the library's statistics snapshot (CollectStats(), reset just
// before the timed part) in the JSON under "stats"; with LIB_BENCH_STATS_TEXT
// set in the environment also as text (funclatency-style histograms) on
// stderr. IMAGE must be a btrfs
// image (ubtrfs mkfs makes one).
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <thread>
#include <vector>

#include "ubtrfs/filesystem.h"
#include "ubtrfs/stats.h"

namespace {

using Clock = std::chrono::steady_clock;
using ubtrfs::Filesystem;
using ubtrfs::InodeId;
using ubtrfs::Status;

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "lib_bench: %s\n"
               "usage: lib_bench create IMAGE --threads T --files N --loops L [--size BYTES] [--max-dirty-mib M]\n"
               "                        [--commit inline|behind]\n"
               "       lib_bench delete IMAGE --threads T [--list-first|--interleave] DIR...\n"
               "       lib_bench snapshot IMAGE SUBVOL FILE\n",
               why);
  std::exit(2);
}

[[noreturn]] void Fail(const std::string& what, const Status& s) {
  std::fprintf(stderr, "lib_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

uint64_t ParseCount(const char* flag, const char* text, uint64_t min, uint64_t max) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (errno || end == text || *end || text[0] == '-' || v < min || v > max) {
    std::string why = std::string("bad value for ") + flag + ": '" + text + "' (want " + std::to_string(min) +
                      ".." + std::to_string(max) + ")";
    Usage(why.c_str());
  }
  return v;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::unique_ptr<Filesystem> OpenWritable(const std::string& image, uint64_t max_dirty_mib = 0) {
  ubtrfs::OpenOptions oo;
  oo.writable = true;
  if (max_dirty_mib) oo.max_dirty_bytes = max_dirty_mib << 20;
  auto fs = Filesystem::Open(image, oo);
  if (!fs.ok()) Fail("open " + image, fs.status());
  return std::move(*fs);
}

// fs_mark's names: 8 hex digits of the time, 8 '~', 24 random characters.
struct NameGen {
  uint64_t s;
  char prefix[17];
  explicit NameGen(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ULL + 1) {
    std::snprintf(prefix, sizeof(prefix), "%08lx~~~~~~~~", static_cast<unsigned long>(std::time(nullptr)));
  }
  std::string Next() {
    static const char kAlnum[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    std::string name(prefix, 16);
    for (int i = 0; i < 24; ++i) {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      name.push_back(kAlnum[s % 36]);
    }
    return name;
  }
};

int Create(const std::string& image, int argc, char** argv) {
  uint64_t threads = 1, files = 0, loops = 1, size = 0, max_dirty_mib = 0;
  bool commit_behind = false;
  for (int i = 0; i < argc; ++i) {
    std::string_view a = argv[i];
    if (i + 1 >= argc) Usage(("missing value for " + std::string(a)).c_str());
    if (a == "--threads") {
      threads = ParseCount("--threads", argv[++i], 1, 256);
    } else if (a == "--files") {
      files = ParseCount("--files", argv[++i], 1, 100000000);
    } else if (a == "--loops") {
      loops = ParseCount("--loops", argv[++i], 1, 1000);
    } else if (a == "--size") {
      size = ParseCount("--size", argv[++i], 0, 1 << 30);
    } else if (a == "--max-dirty-mib") {
      max_dirty_mib = ParseCount("--max-dirty-mib", argv[++i], 1, 1 << 20);
    } else if (a == "--commit") {
      std::string_view v = argv[++i];
      if (v != "inline" && v != "behind") Usage("--commit takes inline or behind");
      commit_behind = v == "behind";
    } else {
      Usage(("unknown argument '" + std::string(a) + "'").c_str());
    }
  }
  if (!files) Usage("create needs --files");
  auto fs = OpenWritable(image, max_dirty_mib);
  std::vector<InodeId> dirs;
  for (uint64_t t = 0; t < threads; ++t) {
    std::string name = "t" + std::to_string(t);
    auto d = fs->LookupChild(fs->Root(), name);
    if (!d.ok()) d = fs->Mkdir(fs->Root(), name, ubtrfs::NewInode{.mode = 0755});
    if (!d.ok()) Fail("mkdir /" + name, d.status());
    dirs.push_back(*d);
  }
  if (Status s = fs->Commit(); !s.ok()) Fail("commit", s);
  const std::vector<uint8_t> data(size, 0x5a);
  std::vector<NameGen> names;
  for (uint64_t t = 0; t < threads; ++t) names.emplace_back(t + 1);

  ubtrfs::ResetStats();
  std::string loops_json;
  double total_s = 0;
  std::thread committer;  // --commit behind: the commit of the loop before
  Status committed;
  auto wait_commit = [&] {
    if (!committer.joinable()) return;
    committer.join();
    if (!committed.ok()) Fail("commit", committed);
  };
  for (uint64_t loop = 0; loop < loops; ++loop) {
    std::atomic<bool> failed{false};
    std::mutex err_mu;
    std::string err;
    const auto t0 = Clock::now();
    std::vector<std::thread> workers;
    for (uint64_t t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        for (uint64_t i = 0; i < files && !failed.load(std::memory_order_relaxed); ++i) {
          std::string name = names[t].Next();
          auto ino = fs->Create(dirs[t], name, ubtrfs::NewInode{.mode = S_IFREG | 0644});
          Status s = ino.ok() ? Status() : ino.status();
          if (s.ok() && size) {
            auto n = fs->Write(*ino, 0, data);
            if (!n.ok()) s = n.status();
            else if (*n != size) s = Status::IoError("short write");
          }
          if (!s.ok()) {
            std::lock_guard<std::mutex> l(err_mu);
            err = "create t" + std::to_string(t) + "/" + name + ": " + s.ToString();
            failed = true;
          }
        }
      });
    }
    for (auto& w : workers) w.join();
    if (failed) {
      std::fprintf(stderr, "lib_bench: %s\n", err.c_str());
      return 1;
    }
    wait_commit();
    if (commit_behind) {
      committer = std::thread([&] { committed = fs->Commit(); });
      if (loop + 1 == loops) wait_commit();
    } else if (Status s = fs->Commit(); !s.ok()) {
      Fail("commit", s);
    }
    const double sec = Seconds(Clock::now() - t0);
    total_s += sec;
    char row[160];
    std::snprintf(row, sizeof(row), "%s{\"files\": %llu, \"seconds\": %.6f, \"files_per_sec\": %.1f}",
                  loop ? ", " : "", static_cast<unsigned long long>(files * threads), sec,
                  static_cast<double>(files * threads) / sec);
    loops_json += row;
  }
  const ubtrfs::StatsSnapshot snap = ubtrfs::CollectStats();
  if (std::getenv("LIB_BENCH_STATS_TEXT") != nullptr) std::fputs(snap.ToText().c_str(), stderr);
  const std::string stats = snap.ToJson();
  fs.reset();  // closes (nothing left to commit)
  std::printf(
      "{\"workload\": \"create\", \"threads\": %llu, \"files_per_thread_per_loop\": %llu, \"size\": %llu, "
      "\"commit\": \"%s\", \"loops\": [%s], \"files_per_sec\": %.1f, \"stats\": %s}\n",
      static_cast<unsigned long long>(threads), static_cast<unsigned long long>(files),
      static_cast<unsigned long long>(size), commit_behind ? "behind" : "inline", loops_json.c_str(),
      static_cast<double>(files * threads * loops) / total_s, stats.c_str());
  return 0;
}

struct Removal {
  InodeId dir;
  std::string name;
  bool is_dir;
};

// Appends the removals that empty `dir`, children before their parents.
Status Plan(Filesystem& fs, InodeId dir, std::vector<Removal>* plan) {
  auto entries = fs.ReadDir(dir);
  if (!entries.ok()) return entries.status();
  for (const auto& e : *entries) {
    const bool is_dir = e.type == 4;  // DT_DIR
    if (is_dir) {
      if (Status s = Plan(fs, e.id, plan); !s.ok()) return s;
    }
    plan->push_back({dir, e.name, is_dir});
  }
  return Status();
}

Status Execute(Filesystem& fs, const std::vector<Removal>& plan) {
  for (const auto& r : plan) {
    Status s = r.is_dir ? fs.Rmdir(r.dir, r.name) : fs.Unlink(r.dir, r.name);
    if (!s.ok()) return s;
  }
  return Status();
}

int Delete(const std::string& image, int argc, char** argv) {
  uint64_t threads = 1;
  bool list_first = false, interleave = false;
  std::vector<std::string> paths;
  for (int i = 0; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--threads") {
      if (i + 1 >= argc) Usage("missing value for --threads");
      threads = ParseCount("--threads", argv[++i], 1, 256);
    } else if (a == "--list-first") {
      list_first = true;
    } else if (a == "--interleave") {
      list_first = interleave = true;
    } else if (a.starts_with("-")) {
      Usage(("unknown argument '" + std::string(a) + "'").c_str());
    } else if (!a.starts_with("/") || a == "/") {
      Usage(("directory '" + std::string(a) + "' must be an absolute path below / in the image").c_str());
    } else {
      paths.emplace_back(a);
    }
  }
  if (paths.empty()) Usage("delete needs at least one directory");
  auto fs = OpenWritable(image);
  struct Job {
    InodeId parent;
    std::string name;
    InodeId dir;
  };
  std::vector<Job> jobs;
  for (const auto& p : paths) {
    const size_t slash = p.find_last_of('/');
    auto parent = fs->Lookup(slash == 0 ? "/" : p.substr(0, slash));
    if (!parent.ok()) Fail("lookup " + p, parent.status());
    auto dir = fs->LookupChild(*parent, p.substr(slash + 1));
    if (!dir.ok()) Fail("lookup " + p, dir.status());
    jobs.push_back({*parent, p.substr(slash + 1), *dir});
  }
  ubtrfs::ResetStats();
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> removed{0};
  std::mutex err_mu;
  std::string err;
  const auto t0 = Clock::now();
  // Each job's removals, children first, ending with the directory itself.
  std::vector<std::vector<Removal>> plans(jobs.size());
  auto plan_job = [&](size_t j) {
    Status s = Plan(*fs, jobs[j].dir, &plans[j]);
    plans[j].push_back({jobs[j].parent, jobs[j].name, true});
    return s;
  };
  if (list_first) {
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (Status s = plan_job(j); !s.ok()) Fail("list " + paths[j], s);
    }
  }
  if (interleave) {
    // One thread, one removal from each directory in turn: the order several
    // workers produce, without any concurrency.
    for (size_t i = 0, left = jobs.size(); left;) {
      left = 0;
      for (size_t j = 0; j < jobs.size(); ++j) {
        if (i >= plans[j].size()) continue;
        ++left;
        const Removal& r = plans[j][i];
        Status s = r.is_dir ? fs->Rmdir(r.dir, r.name) : fs->Unlink(r.dir, r.name);
        if (!s.ok()) Fail("remove " + paths[j] + "/.../" + r.name, s);
        ++removed;
      }
      ++i;
    }
    threads = 0;
  }
  std::vector<std::thread> workers;
  for (uint64_t t = 0; t < threads && t < jobs.size(); ++t) {
    workers.emplace_back([&] {
      for (size_t j; (j = next.fetch_add(1)) < jobs.size();) {
        Status s = list_first ? Status() : plan_job(j);
        if (s.ok()) s = Execute(*fs, plans[j]);
        if (s.ok()) removed += plans[j].size();
        if (!s.ok()) {
          std::lock_guard<std::mutex> l(err_mu);
          err = "remove " + paths[j] + ": " + s.ToString();
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  if (!err.empty()) {
    std::fprintf(stderr, "lib_bench: %s\n", err.c_str());
    return 1;
  }
  if (Status s = fs->Commit(); !s.ok()) Fail("commit", s);
  const double sec = Seconds(Clock::now() - t0);
  const ubtrfs::StatsSnapshot snap = ubtrfs::CollectStats();
  if (std::getenv("LIB_BENCH_STATS_TEXT") != nullptr) std::fputs(snap.ToText().c_str(), stderr);
  const std::string stats = snap.ToJson();
  fs.reset();
  std::printf(
      "{\"workload\": \"delete\", \"list_first\": %s, \"threads\": %llu, \"dirs\": %zu, \"removed\": %llu, \"seconds\": %.6f, "
      "\"entries_per_sec\": %.1f, \"stats\": %s}\n",
      list_first ? "true" : "false", static_cast<unsigned long long>(threads), jobs.size(),
      static_cast<unsigned long long>(removed.load()), sec,
      static_cast<double>(removed.load()) / sec, stats.c_str());
  return 0;
}

int Snapshot(const char* image, int argc, char** argv) {
  if (argc != 2) Usage("snapshot needs SUBVOL and FILE");
  const std::string subvol = argv[0], file = argv[1];
  ubtrfs::OpenOptions o;
  o.writable = true;
  auto fs = ubtrfs::Filesystem::Open(image, o);
  if (!fs.ok()) Fail(image, fs.status());
  ubtrfs::Filesystem& f = **fs;
  auto src = f.Lookup(subvol);
  if (!src.ok()) Fail(subvol, src.status());
  const size_t slash = subvol.find_last_of('/');
  const std::string parent = slash == 0 || slash == std::string::npos ? "/" : subvol.substr(0, slash);
  const std::string name = subvol.substr(slash == std::string::npos ? 0 : slash + 1) + "-bench-snap";
  auto dir = f.Lookup(parent);
  if (!dir.ok()) Fail(parent, dir.status());
  if (auto st = f.Commit(); !st.ok()) Fail("commit", st);
  auto blocks = []() -> uint64_t {
    const ubtrfs::StatsSnapshot snap = ubtrfs::CollectStats();
    const ubtrfs::HistogramSnapshot* h = snap.FindHistogram("commit.blocks_written");
    return h ? h->sum : 0;
  };
  ubtrfs::ResetStats();
  const auto t0 = std::chrono::steady_clock::now();
  auto snap = f.CreateSnapshot(*src, *dir, name, false);
  const auto t1 = std::chrono::steady_clock::now();
  if (!snap.ok()) Fail("snapshot", snap.status());
  const uint64_t snap_blocks = blocks();
  const std::string in_snap = parent + (parent == "/" ? "" : "/") + name + file.substr(subvol.size());
  auto target = f.Lookup(in_snap);
  if (!target.ok()) Fail(in_snap, target.status());
  std::vector<uint8_t> bytes(4096, 0x5a);
  ubtrfs::ResetStats();
  const auto t2 = std::chrono::steady_clock::now();
  auto w = f.Write(*target, 0, bytes);
  if (!w.ok()) Fail("write", w.status());
  if (auto st = f.Commit(); !st.ok()) Fail("commit", st);
  const auto t3 = std::chrono::steady_clock::now();
  const uint64_t write_blocks = blocks();
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  std::printf("{\"workload\": \"snapshot\", \"snapshot_ms\": %.3f, \"snapshot_blocks_written\": %llu, "
              "\"first_write_ms\": %.3f, \"first_write_blocks_written\": %llu}\n",
              ms(t0, t1), static_cast<unsigned long long>(snap_blocks), ms(t2, t3),
              static_cast<unsigned long long>(write_blocks));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) Usage("need a workload (create, delete or snapshot) and an image");
  const std::string_view workload = argv[1];
  if (workload == "create") return Create(argv[2], argc - 3, argv + 3);
  if (workload == "delete") return Delete(argv[2], argc - 3, argv + 3);
  if (workload == "snapshot") return Snapshot(argv[2], argc - 3, argv + 3);
  Usage(("unknown workload '" + std::string(workload) + "'").c_str());
}
