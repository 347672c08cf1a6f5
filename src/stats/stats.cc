// Process-wide registry of counters and histograms, and their snapshots.
#include "stats/stats.h"

#include <algorithm>
#include <bit>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include <fmt/format.h>

namespace ubtrfs {
namespace stats {
namespace {

struct Registry {
  std::mutex mu;  // guards the maps; the objects themselves are atomics
  std::map<std::string, std::unique_ptr<Counter>> counters;
  std::map<std::string, std::pair<std::string, std::unique_ptr<Histogram>>> histograms;
};

Registry& TheRegistry() {
  static Registry* r = new Registry;  // never destroyed: recorders may run during exit
  return *r;
}

int BucketOf(uint64_t v) { return v == 0 ? 0 : 64 - std::countl_zero(v); }

}  // namespace

int ThreadSlot() {
  static std::atomic<int> next{0};
  thread_local const int slot = next.fetch_add(1, std::memory_order_relaxed) % kSlots;
  return slot;
}

void Histogram::Record(uint64_t v) {
  Slot& s = slots_[ThreadSlot()];
  s.buckets[BucketOf(v)].fetch_add(1, std::memory_order_relaxed);
  s.sum.fetch_add(v, std::memory_order_relaxed);
  uint64_t m = s.max.load(std::memory_order_relaxed);
  while (v > m && !s.max.compare_exchange_weak(m, v, std::memory_order_relaxed)) {
  }
}

void Histogram::Reset() {
  for (Slot& s : slots_) {
    for (auto& b : s.buckets) b.store(0, std::memory_order_relaxed);
    s.sum.store(0, std::memory_order_relaxed);
    s.max.store(0, std::memory_order_relaxed);
  }
}

HistogramSnapshot Histogram::Snapshot(const std::string& name, const std::string& unit) const {
  HistogramSnapshot s;
  s.name = name;
  s.unit = unit;
  s.buckets.assign(kBuckets, 0);
  for (const Slot& slot : slots_) {
    for (int i = 0; i < kBuckets; ++i) s.buckets[i] += slot.buckets[i].load(std::memory_order_relaxed);
    s.sum += slot.sum.load(std::memory_order_relaxed);
    s.max = std::max(s.max, slot.max.load(std::memory_order_relaxed));
  }
  while (!s.buckets.empty() && s.buckets.back() == 0) s.buckets.pop_back();
  // The count is the sum of the buckets so that a snapshot taken while
  // others record is consistent with itself.
  for (uint64_t b : s.buckets) s.count += b;
  return s;
}

Counter& GetCounter(const std::string& name) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto& slot = r.counters[name];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Histogram& GetHistogram(const std::string& name, const std::string& unit) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto& slot = r.histograms[name];
  if (!slot.second) slot = {unit, std::make_unique<Histogram>()};
  return *slot.second;
}

}  // namespace stats

uint64_t HistogramSnapshot::PercentileBound(double p) const {
  if (count == 0) return 0;
  uint64_t want = uint64_t(double(count) * p / 100.0 + 0.999999);
  if (want == 0) want = 1;
  uint64_t seen = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    seen += buckets[i];
    if (seen >= want) return i == 0 ? 0 : (i >= 64 ? UINT64_MAX : (uint64_t{1} << i) - 1);
  }
  return max;
}

const HistogramSnapshot* StatsSnapshot::FindHistogram(const std::string& name) const {
  for (const auto& h : histograms) {
    if (h.name == name) return &h;
  }
  return nullptr;
}

uint64_t StatsSnapshot::Counter(const std::string& name) const {
  for (const auto& c : counters) {
    if (c.name == name) return c.value;
  }
  return 0;
}

StatsSnapshot CollectStats() {
  stats::Registry& r = stats::TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  StatsSnapshot s;
  for (const auto& [name, c] : r.counters) s.counters.push_back({name, c->Get()});
  for (const auto& [name, h] : r.histograms) s.histograms.push_back(h.second->Snapshot(name, h.first));
  return s;
}

void ResetStats() {
  stats::Registry& r = stats::TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& [name, c] : r.counters) c->Reset();
  for (auto& [name, h] : r.histograms) h.second->Reset();
}

std::string StatsSnapshot::ToText() const {
  std::string out;
  out += "counters:\n";
  for (const auto& c : counters) out += fmt::format("  {:<40} {}\n", c.name, c.value);
  for (const auto& h : histograms) {
    out += fmt::format("\n{} ({}): count {}, mean {:.1f}, max {}\n", h.name, h.unit, h.count, h.Mean(), h.max);
    if (h.count == 0) continue;
    uint64_t top = *std::max_element(h.buckets.begin(), h.buckets.end());
    size_t first = 0;
    while (first < h.buckets.size() && h.buckets[first] == 0) ++first;
    out += fmt::format("  {:>24} : {:<10} {}\n", h.unit, "count", "distribution");
    for (size_t i = first; i < h.buckets.size(); ++i) {
      uint64_t lo = i == 0 ? 0 : (uint64_t{1} << (i - 1));
      uint64_t hi = i == 0 ? 0 : (i >= 64 ? UINT64_MAX : (uint64_t{1} << i) - 1);
      int bar = top ? int(40 * h.buckets[i] / top) : 0;
      out += fmt::format("  {:>11} -> {:<10} : {:<10} |{:<40}|\n", lo, hi, h.buckets[i], std::string(bar, '*'));
    }
  }
  return out;
}

namespace {
std::string JsonString(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      o += fmt::format("\\u{:04x}", int(c));
    } else {
      o += c;
    }
  }
  return o + "\"";
}
}  // namespace

std::string StatsSnapshot::ToJson() const {
  std::string o = "{\"counters\":{";
  for (size_t i = 0; i < counters.size(); ++i) {
    o += fmt::format("{}{}:{}", i ? "," : "", JsonString(counters[i].name), counters[i].value);
  }
  o += "},\"histograms\":{";
  for (size_t i = 0; i < histograms.size(); ++i) {
    const auto& h = histograms[i];
    o += fmt::format("{}{}:{{\"unit\":{},\"count\":{},\"sum\":{},\"max\":{},\"mean\":{:.3f},\"p50_le\":{},\"p99_le\":{},"
                     "\"log2_buckets\":[",
                     i ? "," : "", JsonString(h.name), JsonString(h.unit), h.count, h.sum, h.max, h.Mean(),
                     h.PercentileBound(50), h.PercentileBound(99));
    for (size_t b = 0; b < h.buckets.size(); ++b) o += fmt::format("{}{}", b ? "," : "", h.buckets[b]);
    o += "]}";
  }
  return o + "}}";
}

}  // namespace ubtrfs
