// Runtime statistics of libubtrfs: counters and log2-bucket histograms
// (bucket i counts values v with 2^(i-1) <= v < 2^i; bucket 0 counts v == 0),
// in the style of bcc's funclatency. Process-wide: every Filesystem in the
// process records into the same set. `ubtrfs stats` and the benchmarks print
// a snapshot as text or JSON.
#ifndef UBTRFS_STATS_H_
#define UBTRFS_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ubtrfs/export_macros.h"

namespace ubtrfs {

struct UBTRFS_API HistogramSnapshot {
  std::string name;
  std::string unit;                // "ns", "items", "blocks", ...
  std::vector<uint64_t> buckets;   // log2 buckets, trailing zero buckets trimmed
  uint64_t count = 0;
  uint64_t sum = 0;
  uint64_t max = 0;
  double Mean() const { return count ? double(sum) / double(count) : 0.0; }
  // The upper bound of the bucket holding the p-th percentile (0 < p <= 100).
  uint64_t PercentileBound(double p) const;
};

struct CounterSnapshot {
  std::string name;
  uint64_t value = 0;
};

struct UBTRFS_API StatsSnapshot {
  std::vector<CounterSnapshot> counters;      // sorted by name
  std::vector<HistogramSnapshot> histograms;  // sorted by name
  const HistogramSnapshot* FindHistogram(const std::string& name) const;
  uint64_t Counter(const std::string& name) const;  // 0 when absent
  std::string ToText() const;  // funclatency-style bars
  std::string ToJson() const;
};

// The current values of every counter and histogram.
UBTRFS_API StatsSnapshot CollectStats();
// Sets everything back to zero (benchmarks reset between runs).
UBTRFS_API void ResetStats();

}  // namespace ubtrfs

#endif  // UBTRFS_STATS_H_
