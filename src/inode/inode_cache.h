// The open-inode cache: in-memory inode records keyed by (subvolume root,
// inode number), one RadixTree per subvolume.
//
// Allocation stays outside the lock: Insert() builds the record and reserves
// the radix-tree nodes its path may need before taking mu_, stores under
// mu_ without calling the allocator, and frees whatever it did not use (a
// record that lost a race, evicted records, spare nodes) after unlocking.
//
// Shards: with options.shards > 1 the inodes are spread over that many
// independent parts (blocks of 64 consecutive numbers, one leaf of the radix
// tree, each in one part; see ShardIndex), each with its own lock, radix
// trees, CLOCK list and capacity / shards. Threads working on different
// inodes then rarely meet on a lock or its cache line (a file system
// creating in two directories looks up both directories and inserts new
// inodes on every create). One shard (the default) is the plain cache.
//
// Records are reference counted (InodeRef). A cached record is evicted, when
// the cache is over capacity, only if it is clean, has open_count 0 and no
// InodeRef exists: nobody can then be using it, and nobody can get a new
// reference without mu_. Eviction is CLOCK ("LRU-ish"): a hit sets a
// referenced bit; the cold end of the list gives a referenced record a second
// chance and rotates pinned ones to the warm end.
//
// Memory per cached inode (LP64, glibc): sizeof(InodeRecord) = 208 bytes
// (root, ino, the 160-byte InodeItem, flags, refcount, list links), a 224-byte
// malloc chunk, plus the record's radix-tree slot: with dense inode numbers a
// 520-byte leaf holds 64 records (8.1 bytes each) and interior nodes add
// about 0.1, so about 232 bytes per inode. Sparse numbers cost more (up to a
// leaf per inode). The bench prints the measured figure.
#ifndef UBTRFS_INODE_INODE_CACHE_H_
#define UBTRFS_INODE_INODE_CACHE_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "format/ondisk.h"
#include "inode/radix_tree.h"

namespace ubtrfs::inode {

class InodeCache;
class InodeRef;

// One in-memory inode.
//
// Guards: root and ino never change. `item` belongs to the file system layer,
// which serializes changes to one inode (today: the record lock of
// its inode); the cache copies it in at Insert and never touches it again. `dirty`
// and `open_count` are atomics that holders of an InodeRef set; the cache
// reads them only to decide eviction, and only for records no InodeRef
// points to, so it never races with a change.
class InodeRecord {
 public:
  InodeRecord(const InodeRecord&) = delete;
  InodeRecord& operator=(const InodeRecord&) = delete;

  const uint64_t root;
  const uint64_t ino;
  format::InodeItem item;                // the on-disk inode item, 160 bytes
  std::atomic<bool> dirty{false};        // changed since written back: never evicted
  std::atomic<uint32_t> open_count{0};   // open handles (e.g. FUSE opens): never evicted while > 0
  // Made by this process with no xattr, and none set since: a look-up of
  // one needs no tree search (the kernel asks a FUSE mount for
  // security.capability before every write). The file system layer sets
  // it at create and clears it before it adds an xattr item.
  std::atomic<bool> without_xattrs{false};

 private:
  friend class InodeCache;
  friend class InodeRef;
  InodeRecord(uint64_t r, uint64_t i, const format::InodeItem& it) : root(r), ino(i), item(it) {}

  std::atomic<uint32_t> refs_{1};  // InodeRefs, plus one while the cache holds the record
  // Guarded by the mu of the InodeCache shard holding the record.
  bool cached_ = false;
  bool referenced_ = false;  // CLOCK bit: used since the hand last passed
  InodeRecord* prev_ = nullptr;  // toward the warm end (head)
  InodeRecord* next_ = nullptr;  // toward the cold end (tail); also chains detached records
};

// A counted reference to an InodeRecord. While one exists the record stays
// in memory (and in the cache unless Remove()d). Copies are cheap (one atomic
// increment); it may be handed between threads.
class InodeRef {
 public:
  InodeRef() = default;
  InodeRef(const InodeRef& o) : r_(o.r_) {
    if (r_ != nullptr) r_->refs_.fetch_add(1, std::memory_order_relaxed);
  }
  InodeRef(InodeRef&& o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
  InodeRef& operator=(InodeRef o) noexcept {
    std::swap(r_, o.r_);
    return *this;
  }
  ~InodeRef() { Reset(); }

  void Reset() {
    // The last reference to a record the cache has let go of frees it.
    if (r_ != nullptr && r_->refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete r_;
    r_ = nullptr;
  }
  InodeRecord* get() const { return r_; }
  InodeRecord* operator->() const { return r_; }
  InodeRecord& operator*() const { return *r_; }
  explicit operator bool() const { return r_ != nullptr; }

 private:
  friend class InodeCache;
  explicit InodeRef(InodeRecord* adopt) : r_(adopt) {}  // takes over one reference
  InodeRecord* r_ = nullptr;
};

// A log2 histogram of nanoseconds, like bcc's funclatency: bucket i counts
// values in [2^i, 2^(i+1)); bucket 0 also holds 0.
struct LatencyHistogram {
  static constexpr int kBuckets = 64;
  std::array<uint64_t, kBuckets> buckets{};
  uint64_t count = 0;
  uint64_t total_ns = 0;

  static int Bucket(uint64_t ns);
  double mean_ns() const { return count == 0 ? 0 : static_cast<double>(total_ns) / count; }
  // Upper bound of the bucket holding the p-th fraction (0..1) of values.
  uint64_t PercentileUpperBound(double p) const;
  // funclatency-style table of the non-empty bucket range.
  std::string ToString(const char* unit = "nsecs") const;
};

struct InodeCacheStats {
  uint64_t inserts = 0;       // records added
  uint64_t insert_races = 0;  // Insert() found the inode cached already (its new record was dropped)
  uint64_t lookups = 0;
  uint64_t hits = 0;
  uint64_t evictions = 0;
  uint64_t evict_scans = 0;   // records looked at by eviction (at most kMaxEvictScan per insert)
  uint64_t removals = 0;      // Remove() calls that found the inode
  size_t cached = 0;          // records in the cache now
  size_t subvolumes = 0;      // subvolume trees
  size_t node_bytes = 0;      // radix-tree nodes of every subvolume tree and of the root map
  size_t record_bytes = 0;    // cached * sizeof(InodeRecord)
  LatencyHistogram insert_ns;
  LatencyHistogram lookup_ns;
};

struct InodeCacheOptions {
  size_t capacity = size_t{1} << 18;  // records kept when idle ones can be evicted
  bool time_ops = true;               // fill the latency histograms (two clock reads per call)
  uint32_t time_every = 1;            // time one call in this many (per thread); 1: all
  uint32_t shards = 1;                // independent parts, each with its own lock (at most kMaxShards)
};

class InodeCache {
 public:
  explicit InodeCache(InodeCacheOptions options = InodeCacheOptions());
  InodeCache(const InodeCache&) = delete;
  InodeCache& operator=(const InodeCache&) = delete;
  // Lets go of every record; records that InodeRefs still point to live on
  // until the last of those goes.
  ~InodeCache();

  // Records one Insert looks at, at most, to evict idle ones.
  static constexpr size_t kMaxEvictScanForTests() { return kMaxEvictScan; }

  // The cached record, or an empty ref.
  InodeRef Lookup(uint64_t root, uint64_t ino);
  // Caches a record holding a copy of `item` unless (root, ino) is cached
  // already; returns the cached record either way. *inserted (if given)
  // tells which. May evict idle records to stay within the capacity.
  InodeRef Insert(uint64_t root, uint64_t ino, const format::InodeItem& item, bool* inserted = nullptr);
  // Drops (root, ino) from the cache (e.g. the inode was deleted); existing
  // InodeRefs keep the record alive. False if it was not cached.
  bool Remove(uint64_t root, uint64_t ino);
  // The cached inode of `root` with the smallest number >= min_ino.
  InodeRef FindFirstAtOrAfter(uint64_t root, uint64_t min_ino);
  // Every dirty record, in (root, ino) order; for write-back at commit.
  std::vector<InodeRef> CollectDirty();
  // Evicts idle records (clean, open_count 0, no InodeRef) until at most
  // `target` remain or none is idle. Returns how many went.
  size_t Shrink(size_t target);

  void set_capacity(size_t capacity);
  size_t size() const;
  InodeCacheStats stats() const;
  // Bytes one cached record costs besides its share of tree nodes.
  static constexpr size_t kRecordBytes = sizeof(InodeRecord);
  static constexpr uint32_t kMaxShards = 64;

 private:
  struct Subvol {
    RadixTree<InodeRecord*> inodes;
  };
  using InodeTree = RadixTree<InodeRecord*>;
  using RootTree = RadixTree<Subvol*>;

  // Atomics: updated after mu_ is dropped, so that the time spent waiting
  // for and holding the lock is part of what they measure.
  struct AtomicHistogram {
    std::array<std::atomic<uint64_t>, LatencyHistogram::kBuckets> buckets{};
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> total_ns{0};
    void Add(uint64_t ns);
    LatencyHistogram Snapshot() const;
  };

  // mu guards every field of its shard and the cache-private fields of
  // every InodeRecord cached in it (cached_, referenced_, prev_, next_). It
  // is a leaf lock: nothing else is locked, and the allocator is not called,
  // while it is held (nodes come from reservations made before locking;
  // records are created before and freed after). The one exception: an Erase
  // that frees a tree node calls operator delete if the thread's spare pool
  // is full.
  struct alignas(64) Shard {
    mutable std::mutex mu;
    RootTree roots;                   // subvolume root id -> Subvol (never removed before ~InodeCache)
    InodeRecord* head = nullptr;      // warm end of the CLOCK list
    InodeRecord* tail = nullptr;      // cold end
    size_t size = 0;
    size_t capacity = 0;
    uint64_t inserts = 0;
    uint64_t insert_races = 0;
    uint64_t lookups = 0;
    uint64_t hits = 0;
    uint64_t evictions = 0;
    uint64_t evict_scans = 0;
    uint64_t removals = 0;
  };
  // Each block of 64 consecutive numbers (one radix-tree leaf) lives in one
  // shard, chosen by a hash of the block. A thread that takes numbers from
  // its own run (fs/ gives each directory runs of 1024 and more) stays on one
  // shard's lock and cache line for 64 inodes; two threads meet on a shard
  // only while their current blocks hash alike (1 in n). Spreading every
  // number over all shards made each insert pull the shard's lock line from
  // the other core.
  static constexpr unsigned kShardBlockShift = 6;
  uint32_t ShardIndex(uint64_t ino) const {
    return static_cast<uint32_t>(((ino >> kShardBlockShift) * 0x9E3779B97F4A7C15ull >> 32) % nshards_);
  }
  Shard& ShardOf(uint64_t ino) { return shards_[ShardIndex(ino)]; }

  // All below: called with the shard's mu held.
  static void LinkHead(Shard& sh, InodeRecord* r);
  static void Unlink(Shard& sh, InodeRecord* r);
  void Detach(Shard& sh, InodeRecord* r);  // out of the tree and the list; the cache's reference stays with the caller
  // Detaches idle records from the cold end until size <= target or `budget`
  // records were looked at; returns them chained through next_.
  InodeRecord* EvictLocked(Shard& sh, size_t target, size_t budget);
  // CollectDirty for one shard, appended to *out.
  void CollectDirtyIn(Shard& sh, std::vector<InodeRef>* out);

  static void DropDetached(InodeRecord* chain);  // after unlocking
  static constexpr size_t kMaxEvictScan = 64;  // records an Insert looks at to evict
  static uint64_t NowNs();

  const bool time_ops_;
  const uint32_t time_every_;
  const uint32_t nshards_;
  bool TimeThisCall(uint32_t& calls) const;  // calls: the caller's per-thread count
  AtomicHistogram insert_hist_;
  AtomicHistogram lookup_hist_;
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace ubtrfs::inode

#endif  // UBTRFS_INODE_INODE_CACHE_H_
