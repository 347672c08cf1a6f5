// Times the block group allocator on the write path's common case: a 1 GiB
// metadata group, 16 KiB tree blocks, each allocation paired with a free of
// an older block (COW), and a commit every 10,000 pairs, so the allocator
// always works around a clone full of pinned blocks.
//
//   alloc_bench [rounds]      (default 1,000,000)
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <vector>

#include "alloc/block_group.h"
#include "alloc/space_manager.h"
#include "format/ondisk.h"

namespace {

using ubtrfs::alloc::BlockGroup;
using ubtrfs::alloc::SpaceManager;

constexpr uint64_t kGiB = 1ULL << 30;
constexpr uint64_t kNode = 16384;
constexpr uint32_t kUnit = 4096;
constexpr int kCommitEvery = 10000;

struct Row {
  const char* api;
  const char* victim;  // which live block each round frees
  double fill;         // fraction of the group live throughout
  double ns_per_op = 0;
  double commit_us = 0;
  uint64_t clones = 0;
};

// Cheap and deterministic; the standard engines would show up in the timing.
struct XorShift {
  uint64_t s = 0x9E3779B97F4A7C15ULL;
  uint64_t Next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

// Wraps the two APIs so one loop can time both.
struct GroupTarget {
  BlockGroup g{kGiB, kGiB, ubtrfs::format::kBlockGroupMetadata, kUnit};
  bool Alloc(uint64_t* out) {
    auto a = g.Allocate(kNode, kNode);
    if (a) *out = *a;
    return a.has_value();
  }
  bool Free(uint64_t b) { return g.Free(b, kNode).ok(); }
  void Commit() { g.Commit(); }
  uint64_t clones() const { return g.stats().clones_made; }
};

struct ManagerTarget {
  SpaceManager sm{kUnit};
  ManagerTarget() {
    if (!sm.AddGroup(kGiB, kGiB, ubtrfs::format::kBlockGroupMetadata).ok()) std::abort();
  }
  bool Alloc(uint64_t* out) {
    auto a = sm.Allocate(ubtrfs::format::kBlockGroupMetadata, kNode, kNode);
    if (a.ok()) *out = *a;
    return a.ok();
  }
  bool Free(uint64_t b) { return sm.Free(b, kNode).ok(); }
  void Commit() { sm.Commit(); }
  uint64_t clones() const { return sm.stats().clones_made; }
};

template <typename Target>
bool Run(Row& row, uint64_t rounds) {
  using Clock = std::chrono::steady_clock;
  Target t;
  const uint64_t live_target = static_cast<uint64_t>(row.fill * (kGiB / kNode));
  std::deque<uint64_t> live;  // oldest first
  for (uint64_t i = 0; i < live_target; ++i) {
    uint64_t b;
    if (!t.Alloc(&b)) return false;
    live.push_back(b);
  }
  t.Commit();
  const uint64_t clones0 = t.clones();
  const bool random = row.victim[0] == 'r';
  XorShift rng;
  Clock::duration commit_time{};
  const auto t0 = Clock::now();
  for (uint64_t i = 1; i <= rounds; ++i) {
    uint64_t b;
    if (!t.Alloc(&b)) {
      std::fprintf(stderr, "allocation %" PRIu64 " failed\n", i);
      return false;
    }
    uint64_t victim;
    if (random) {
      uint64_t& slot = live[rng.Next() % live.size()];
      victim = slot;
      slot = b;
    } else {
      victim = live.front();
      live.pop_front();
      live.push_back(b);
    }
    if (!t.Free(victim)) {
      std::fprintf(stderr, "free %" PRIu64 " failed\n", i);
      return false;
    }
    if (i % kCommitEvery == 0) {
      const auto c0 = Clock::now();
      t.Commit();
      commit_time += Clock::now() - c0;
    }
  }
  const auto total = Clock::now() - t0;
  const double ns = std::chrono::duration<double, std::nano>(total).count();
  row.ns_per_op = ns / (2.0 * static_cast<double>(rounds));  // an op is one allocation or one free
  row.commit_us =
      std::chrono::duration<double, std::micro>(commit_time).count() / static_cast<double>(rounds / kCommitEvery);
  row.clones = t.clones() - clones0;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t rounds = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1000000;
  if (rounds < kCommitEvery) {
    std::fprintf(stderr, "rounds must be at least %d\n", kCommitEvery);
    return 2;
  }
  std::vector<Row> rows = {
      {"BlockGroup", "oldest", 0.10},   {"BlockGroup", "oldest", 0.50}, {"BlockGroup", "oldest", 0.75},
      {"BlockGroup", "random", 0.10},   {"BlockGroup", "random", 0.50}, {"BlockGroup", "random", 0.75},
      {"SpaceManager", "oldest", 0.50},
  };
  std::printf("1 GiB group, %u-byte units, %" PRIu64 "-byte blocks; %" PRIu64
              " rounds of (allocate + free), commit every %d rounds\n",
              kUnit, kNode, rounds, kCommitEvery);
  std::printf("bitmap %" PRIu64 " bytes; a clone is one %" PRIu64 "-byte page-aligned copy\n\n", (kGiB / kUnit) / 8,
              (kGiB / kUnit) / 8);
  std::printf("%-13s %-7s %5s %10s %11s %8s\n", "api", "frees", "fill", "ns/op", "commit(us)", "clones");
  for (Row& r : rows) {
    const bool ok = r.api[0] == 'B' ? Run<GroupTarget>(r, rounds) : Run<ManagerTarget>(r, rounds);
    if (!ok) return 1;
    std::printf("%-13s %-7s %4.0f%% %10.1f %11.2f %8" PRIu64 "\n", r.api, r.victim, r.fill * 100, r.ns_per_op,
                r.commit_us, r.clones);
  }
  std::printf("\nns/op: wall time over 2 x rounds operations (allocations and frees), commits included.\n");
  return 0;
}
