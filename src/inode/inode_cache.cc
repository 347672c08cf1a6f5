#include "inode/inode_cache.h"

#include "stats/stats.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>

namespace ubtrfs::inode {

// ---- LatencyHistogram --------------------------------------------------------

int LatencyHistogram::Bucket(uint64_t ns) {
  return ns == 0 ? 0 : static_cast<int>(std::bit_width(ns)) - 1;
}

uint64_t LatencyHistogram::PercentileUpperBound(double p) const {
  if (count == 0) return 0;
  uint64_t want = static_cast<uint64_t>(p * static_cast<double>(count));
  if (want == 0) want = 1;
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += buckets[i];
    if (seen >= want) return i == 63 ? ~uint64_t{0} : (uint64_t{2} << i) - 1;
  }
  return ~uint64_t{0};
}

std::string LatencyHistogram::ToString(const char* unit) const {
  int lo = 0, hi = -1;
  while (lo < kBuckets && buckets[lo] == 0) ++lo;
  for (int i = kBuckets - 1; i >= 0; --i) {
    if (buckets[i] != 0) {
      hi = i;
      break;
    }
  }
  std::string out;
  char line[160];
  std::snprintf(line, sizeof(line), "%20s : %-10s distribution\n", unit, "count");
  out += line;
  uint64_t peak = 0;
  for (int i = lo; i <= hi; ++i) peak = std::max(peak, buckets[i]);
  for (int i = lo; i <= hi; ++i) {
    uint64_t from = i == 0 ? 0 : uint64_t{1} << i;
    uint64_t to = i == 63 ? ~uint64_t{0} : (uint64_t{2} << i) - 1;
    int stars = peak == 0 ? 0 : static_cast<int>(buckets[i] * 40 / peak);
    std::snprintf(line, sizeof(line), "%9" PRIu64 " -> %-9" PRIu64 " : %-10" PRIu64 " |%-40s|\n", from, to,
                  buckets[i], std::string(static_cast<size_t>(stars), '*').c_str());
    out += line;
  }
  return out;
}

void InodeCache::AtomicHistogram::Add(uint64_t ns) {
  buckets[LatencyHistogram::Bucket(ns)].fetch_add(1, std::memory_order_relaxed);
  count.fetch_add(1, std::memory_order_relaxed);
  total_ns.fetch_add(ns, std::memory_order_relaxed);
}

LatencyHistogram InodeCache::AtomicHistogram::Snapshot() const {
  LatencyHistogram h;
  for (int i = 0; i < LatencyHistogram::kBuckets; ++i) h.buckets[i] = buckets[i].load(std::memory_order_relaxed);
  h.count = count.load(std::memory_order_relaxed);
  h.total_ns = total_ns.load(std::memory_order_relaxed);
  return h;
}

// ---- InodeCache -------------------------------------------------------------

InodeCache::InodeCache(InodeCacheOptions options)
    : time_ops_(options.time_ops),
      time_every_(std::max<uint32_t>(options.time_every, 1)),
      nshards_(std::clamp<uint32_t>(options.shards, 1, kMaxShards)),
      shards_(new Shard[nshards_]) {
  set_capacity(options.capacity);
}

bool InodeCache::TimeThisCall(uint32_t& calls) const {
  if (!time_ops_) return false;
  if (time_every_ == 1) return true;
  return ++calls % time_every_ == 0;
}

InodeCache::~InodeCache() {
  // No other thread may use the cache now; InodeRefs may still exist.
  for (uint32_t i = 0; i < nshards_; ++i) {
    Shard& sh = shards_[i];
    InodeRecord* r = sh.head;
    while (r != nullptr) {
      InodeRecord* next = r->next_;
      r->cached_ = false;
      r->prev_ = r->next_ = nullptr;
      if (r->refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete r;
      r = next;
    }
    for (auto it = sh.roots.begin(); it != sh.roots.end(); ++it) delete it.value();
  }
}

uint64_t InodeCache::NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

void InodeCache::LinkHead(Shard& sh, InodeRecord* r) {
  r->prev_ = nullptr;
  r->next_ = sh.head;
  if (sh.head != nullptr) sh.head->prev_ = r;
  sh.head = r;
  if (sh.tail == nullptr) sh.tail = r;
}

void InodeCache::Unlink(Shard& sh, InodeRecord* r) {
  if (r->prev_ != nullptr) r->prev_->next_ = r->next_;
  else sh.head = r->next_;
  if (r->next_ != nullptr) r->next_->prev_ = r->prev_;
  else sh.tail = r->prev_;
  r->prev_ = r->next_ = nullptr;
}

void InodeCache::Detach(Shard& sh, InodeRecord* r) {
  Subvol** sv = sh.roots.Find(r->root);
  bool erased = sv != nullptr && (*sv)->inodes.Erase(r->ino);
  (void)erased;
  Unlink(sh, r);
  r->cached_ = false;
  --sh.size;
}

InodeRecord* InodeCache::EvictLocked(Shard& sh, size_t target, size_t budget) {
  InodeRecord* doomed = nullptr;
  while (sh.size > target && budget > 0 && sh.tail != nullptr) {
    --budget;
    ++sh.evict_scans;
    InodeRecord* r = sh.tail;
    // refs_ == 1: only the cache holds it, and only the cache (under the shard's mu)
    // could hand out another reference, so dirty/open_count cannot change
    // under us. acquire pairs with the release in the last InodeRef's
    // decrement, making that holder's writes to dirty/open_count visible.
    bool idle = r->refs_.load(std::memory_order_acquire) == 1 && !r->dirty.load(std::memory_order_relaxed) &&
                r->open_count.load(std::memory_order_relaxed) == 0;
    if (!idle || r->referenced_) {
      r->referenced_ = false;
      Unlink(sh, r);
      LinkHead(sh, r);
      continue;
    }
    Detach(sh, r);
    r->next_ = doomed;
    doomed = r;
    ++sh.evictions;
  }
  return doomed;
}

void InodeCache::DropDetached(InodeRecord* chain) {
  while (chain != nullptr) {
    InodeRecord* next = chain->next_;
    chain->next_ = nullptr;
    if (chain->refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete chain;
    chain = next;
  }
}

InodeRef InodeCache::Lookup(uint64_t root, uint64_t ino) {
  thread_local uint32_t calls = 0;  // each kind of call sampled on its own
  const bool timed = TimeThisCall(calls);
  uint64_t t0 = timed ? NowNs() : 0;
  InodeRecord* found = nullptr;
  {
    Shard& sh = ShardOf(ino);
    std::lock_guard<std::mutex> lock(sh.mu);
    ++sh.lookups;
    if (Subvol** sv = sh.roots.Find(root)) {
      if (InodeRecord** slot = (*sv)->inodes.Find(ino)) {
        found = *slot;
        found->refs_.fetch_add(1, std::memory_order_relaxed);
        found->referenced_ = true;
        ++sh.hits;
      }
    }
  }
  if (timed) {
    const uint64_t ns = NowNs() - t0;
    lookup_hist_.Add(ns);
    static stats::Histogram& h = stats::GetHistogram("inode_cache.lookup_time", "ns");
    h.Record(ns);
  }
  static stats::Counter& hits = stats::GetCounter("inode_cache.hits");
  static stats::Counter& misses = stats::GetCounter("inode_cache.misses");
  (found ? hits : misses).Add();
  return InodeRef(found);
}

InodeRef InodeCache::Insert(uint64_t root, uint64_t ino, const format::InodeItem& item, bool* inserted) {
  thread_local uint32_t calls = 0;
  const bool timed = TimeThisCall(calls);
  uint64_t t0 = timed ? NowNs() : 0;
  // Everything that may need memory, made before locking.
  std::unique_ptr<InodeRecord> fresh(new InodeRecord(root, ino, item));
  InodeTree::Reservation nodes = InodeTree::Reserve(ino);
  Shard& sh = ShardOf(ino);
  std::unique_ptr<Subvol> new_subvol;
  RootTree::Reservation root_nodes;

  InodeRecord* result = nullptr;
  InodeRecord* doomed = nullptr;
  bool stored = false;
  for (;;) {
    std::unique_lock<std::mutex> lock(sh.mu);
    Subvol** sv = sh.roots.Find(root);
    if (sv == nullptr) {
      if (new_subvol == nullptr) {
        // First inode of this subvolume: allocate its tree outside the lock
        // and try again (once per subvolume).
        lock.unlock();
        new_subvol = std::make_unique<Subvol>();
        root_nodes = RootTree::Reserve(root);
        continue;
      }
      sh.roots.StoreReserved(std::move(root_nodes), root, new_subvol.release());
      sv = sh.roots.Find(root);
    }
    auto [slot, added] = (*sv)->inodes.TryStoreReserved(std::move(nodes), ino, fresh.get());
    result = *slot;
    if (added) {
      fresh.release();
      result->refs_.fetch_add(1, std::memory_order_relaxed);  // the caller's, besides the cache's
      result->cached_ = true;
      LinkHead(sh, result);
      ++sh.size;
      ++sh.inserts;
      stored = true;
      // A bounded look at the cold end per insert: when most records are
      // pinned (dirty until the next commit, or open) the cache may grow past
      // its capacity, but an insert never walks the whole list (an unbounded
      // budget made inserts linear in the pinned count, and a run of
      // creates without a commit quadratic).
      if (sh.size > sh.capacity) {
        doomed = EvictLocked(sh, sh.capacity, std::min<size_t>(16 + 2 * (sh.size - sh.capacity), kMaxEvictScan));
      }
    } else {
      result->refs_.fetch_add(1, std::memory_order_relaxed);
      result->referenced_ = true;
      ++sh.insert_races;
    }
    break;
  }
  // Unlocked: free what lost the race or was evicted; `nodes`, `root_nodes`
  // and `new_subvol` release the rest as they go out of scope.
  DropDetached(doomed);
  fresh.reset();
  if (inserted != nullptr) *inserted = stored;
  if (timed) {
    const uint64_t ns = NowNs() - t0;
    insert_hist_.Add(ns);
    static stats::Histogram& h = stats::GetHistogram("inode_cache.insert_time", "ns");
    h.Record(ns);
  }
  return InodeRef(result);
}

bool InodeCache::Remove(uint64_t root, uint64_t ino) {
  InodeRecord* r = nullptr;
  {
    Shard& sh = ShardOf(ino);
    std::lock_guard<std::mutex> lock(sh.mu);
    Subvol** sv = sh.roots.Find(root);
    InodeRecord** slot = sv == nullptr ? nullptr : (*sv)->inodes.Find(ino);
    if (slot == nullptr) return false;
    r = *slot;
    Detach(sh, r);
    ++sh.removals;
  }
  r->next_ = nullptr;
  DropDetached(r);
  return true;
}

InodeRef InodeCache::FindFirstAtOrAfter(uint64_t root, uint64_t min_ino) {
  // Each shard's first inode at or after min_ino; the smallest of them.
  InodeRef best;
  for (uint32_t i = 0; i < nshards_; ++i) {
    Shard& sh = shards_[i];
    std::lock_guard<std::mutex> lock(sh.mu);
    Subvol** sv = sh.roots.Find(root);
    if (sv == nullptr) continue;
    auto hit = (*sv)->inodes.FindFirstAtOrAfter(min_ino);
    if (!hit || (best && best->ino < hit->second->ino)) continue;
    hit->second->refs_.fetch_add(1, std::memory_order_relaxed);
    best = InodeRef(hit->second);
  }
  return best;
}

std::vector<InodeRef> InodeCache::CollectDirty() {
  std::vector<InodeRef> out;
  for (uint32_t i = 0; i < nshards_; ++i) CollectDirtyIn(shards_[i], &out);
  if (nshards_ > 1) {
    std::sort(out.begin(), out.end(),
              [](const InodeRef& a, const InodeRef& b) { return std::pair(a->root, a->ino) < std::pair(b->root, b->ino); });
  }
  return out;
}

void InodeCache::CollectDirtyIn(Shard& sh, std::vector<InodeRef>* out) {
  // Walks in batches so that the shard's mu is never held for long and the vector grows
  // outside it.
  constexpr size_t kMaxFound = 64;
  constexpr size_t kMaxScanned = 1024;
  uint64_t root = 0, ino = 0;  // ino: a key of the shard's trees
  bool done = false;
  while (!done) {
    std::array<InodeRecord*, kMaxFound> found;
    size_t nfound = 0, scanned = 0;
    {
      std::lock_guard<std::mutex> lock(sh.mu);
      for (auto rit = sh.roots.lower_bound(root); ; ++rit) {
        if (rit == sh.roots.end()) {
          done = true;
          break;
        }
        if (rit.key() != root) {
          root = rit.key();
          ino = 0;
        }
        InodeTree& tree = rit.value()->inodes;
        auto it = tree.lower_bound(ino);
        for (; it != tree.end() && nfound < kMaxFound && scanned < kMaxScanned; ++it, ++scanned) {
          InodeRecord* r = it.value();
          if (r->dirty.load(std::memory_order_relaxed)) {
            r->refs_.fetch_add(1, std::memory_order_relaxed);
            found[nfound++] = r;
          }
        }
        if (it != tree.end()) {  // batch full: resume at this inode
          ino = it.key();
          break;
        }
        if (root == ~uint64_t{0}) {
          done = true;
          break;
        }
        ino = 0;  // this subvolume is finished; the next key of roots is > root
        ++root;
        if (nfound == kMaxFound || scanned >= kMaxScanned) break;
      }
    }
    for (size_t i = 0; i < nfound; ++i) out->push_back(InodeRef(found[i]));
  }
}

size_t InodeCache::Shrink(size_t target) {
  const size_t per_shard = (target + nshards_ - 1) / nshards_;
  size_t gone = 0;
  for (uint32_t i = 0; i < nshards_; ++i) {
    Shard& sh = shards_[i];
    InodeRecord* doomed = nullptr;
    {
      std::lock_guard<std::mutex> lock(sh.mu);
      const size_t before = sh.size;
      // Two passes over the list at most: the first clears referenced bits.
      doomed = EvictLocked(sh, nshards_ == 1 ? target : per_shard, 2 * sh.size);
      gone += before - sh.size;
    }
    DropDetached(doomed);
  }
  return gone;
}

void InodeCache::set_capacity(size_t capacity) {
  const size_t per_shard = (capacity + nshards_ - 1) / nshards_;
  for (uint32_t i = 0; i < nshards_; ++i) {
    std::lock_guard<std::mutex> lock(shards_[i].mu);
    shards_[i].capacity = per_shard;
  }
}

size_t InodeCache::size() const {
  size_t n = 0;
  for (uint32_t i = 0; i < nshards_; ++i) {
    std::lock_guard<std::mutex> lock(shards_[i].mu);
    n += shards_[i].size;
  }
  return n;
}

InodeCacheStats InodeCache::stats() const {
  InodeCacheStats s;
  for (uint32_t i = 0; i < nshards_; ++i) {
    const Shard& sh = shards_[i];
    std::lock_guard<std::mutex> lock(sh.mu);
    s.inserts += sh.inserts;
    s.insert_races += sh.insert_races;
    s.lookups += sh.lookups;
    s.hits += sh.hits;
    s.evictions += sh.evictions;
    s.evict_scans += sh.evict_scans;
    s.removals += sh.removals;
    s.cached += sh.size;
    s.subvolumes = std::max(s.subvolumes, sh.roots.size());
    s.node_bytes += sh.roots.memory_bytes();
    for (auto it = sh.roots.begin(); it != sh.roots.end(); ++it) s.node_bytes += it.value()->inodes.memory_bytes();
    s.record_bytes += sh.size * sizeof(InodeRecord);
  }
  s.insert_ns = insert_hist_.Snapshot();
  s.lookup_ns = lookup_hist_.Snapshot();
  return s;
}

}  // namespace ubtrfs::inode
