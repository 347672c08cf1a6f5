#include "inode/delayed_index.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "stats/stats.h"
#include "tree/cursor.h"

namespace ubtrfs::inode {

using format::Key;

namespace {
constexpr uint32_t kItemHeader = sizeof(format::Item);

struct Recorders {
  stats::Counter& queued = stats::GetCounter("delayed_index.queued");
  stats::Counter& cancelled = stats::GetCounter("delayed_index.cancelled");
  stats::Counter& batches = stats::GetCounter("delayed_index.batches");
  stats::Counter& full_batches = stats::GetCounter("delayed_index.full_leaf_batches");
  stats::Counter& items = stats::GetCounter("delayed_index.items_inserted");
  stats::Counter& early = stats::GetCounter("delayed_index.early_dir_flushes");
  stats::Histogram& batch_items = stats::GetHistogram("delayed_index.batch_items", "items");
  stats::Histogram& flush_time = stats::GetHistogram("delayed_index.flush_time", "ns");
};
Recorders& R() {
  static Recorders r;
  return r;
}
}  // namespace

size_t DelayedDirIndex::Add(uint64_t root, uint64_t dir, uint64_t index, std::vector<uint8_t> item) {
  Shard& sh = ShardOf(root, dir);
  std::lock_guard lock(sh.mu);
  Queue& q = sh.pending[{root, dir}];
  CountBytes(sh, static_cast<int64_t>(item.size() + kItemHeader));
  if (q.empty() || q.back().first < index) {
    q.emplace_back(index, std::move(item));
    ++sh.count;
  } else {
    auto at = std::lower_bound(q.begin(), q.end(), index, [](const auto& e, uint64_t i) { return e.first < i; });
    if (at != q.end() && at->first == index) {
      CountBytes(sh, -static_cast<int64_t>(at->second.size() + kItemHeader));
      at->second = std::move(item);
    } else {
      q.emplace(at, index, std::move(item));
      ++sh.count;
    }
  }
  ++sh.stats.queued;
  R().queued.Add();
  return q.size();
}

bool DelayedDirIndex::Cancel(uint64_t root, uint64_t dir, uint64_t index) {
  Shard& sh = ShardOf(root, dir);
  std::lock_guard lock(sh.mu);
  auto it = sh.pending.find({root, dir});
  if (it == sh.pending.end()) return false;
  Queue& q = it->second;
  auto at = std::lower_bound(q.begin(), q.end(), index, [](const auto& e, uint64_t i) { return e.first < i; });
  if (at == q.end() || at->first != index) return false;
  CountBytes(sh, -static_cast<int64_t>(at->second.size() + kItemHeader));
  q.erase(at);
  if (q.empty()) sh.pending.erase(it);
  --sh.count;
  ++sh.stats.cancelled;
  R().cancelled.Add();
  return true;
}

const DelayedDirIndex::Queue* DelayedDirIndex::Pending(uint64_t root, uint64_t dir) const {
  const Shard& sh = ShardOf(root, dir);
  std::lock_guard lock(sh.mu);
  auto it = sh.pending.find({root, dir});
  return it == sh.pending.end() ? nullptr : &it->second;
}

size_t DelayedDirIndex::pending_count() const {
  size_t n = 0;
  for (const Shard& sh : shards_) {
    std::lock_guard lock(sh.mu);
    n += sh.count;
  }
  return n;
}

DelayedIndexStats DelayedDirIndex::stats() const {
  DelayedIndexStats out;
  for (const Shard& sh : shards_) {
    std::lock_guard lock(sh.mu);
    out.queued += sh.stats.queued;
    out.cancelled += sh.stats.cancelled;
    out.batches += sh.stats.batches;
    out.full_batches += sh.stats.full_batches;
    out.items += sh.stats.items;
    for (size_t i = 0; i < out.batch_size_log2.size(); ++i) out.batch_size_log2[i] += sh.stats.batch_size_log2[i];
  }
  return out;
}

void DelayedDirIndex::CountBytes(Shard& sh, int64_t delta) {
  sh.unpublished += delta;
  if (sh.unpublished >= kBytesStep || sh.unpublished <= -kBytesStep) {
    bytes_.fetch_add(sh.unpublished, std::memory_order_relaxed);
    sh.unpublished = 0;
  }
}

void DelayedDirIndex::RecordBatch(Shard& sh, size_t items, bool full) {
  std::lock_guard lock(sh.mu);
  ++sh.stats.batches;
  sh.stats.items += items;
  ++sh.stats.batch_size_log2[std::min<size_t>(std::bit_width(items) - 1, 15)];
  if (full) ++sh.stats.full_batches;
  R().batches.Add();
  R().items.Add(items);
  if (full) R().full_batches.Add();
  R().batch_items.Record(items);
}

// One run of successors that fits an empty leaf: one search, one
// insert_empty_items (InsertBatch), the data copied in, the path released
// when InsertBatch returns; the caller frees the items after that.
Status DelayedDirIndex::InsertRun(Shard& sh, tree::TreeWriter* w, std::vector<Key>& keys,
                                  std::vector<std::vector<uint8_t>>& data, bool full) {
  if (keys.empty()) return Status::Ok();
  if (policy_ == BatchPolicy::kLeafFreeSpace) return InsertRunLegacy(sh, w, keys, data);
  UB_RETURN_IF_ERROR(w->InsertBatch(keys, data));
  RecordBatch(sh, keys.size(), full);
  return Status::Ok();
}

// The old behaviour: find the leaf for the first item, then take items while
// they fit in that leaf's free space; what is left starts a new search.
Status DelayedDirIndex::InsertRunLegacy(Shard& sh, tree::TreeWriter* w, std::vector<Key>& keys,
                                        std::vector<std::vector<uint8_t>>& data) {
  size_t done = 0;
  while (done < keys.size()) {
    UB_ASSIGN_OR_RETURN(size_t n, w->InsertPrefixInLeaf(std::span<const Key>(keys).subspan(done),
                                                        std::span<const std::vector<uint8_t>>(data).subspan(done)));
    RecordBatch(sh, n, done + n < keys.size());
    done += n;
  }
  return Status::Ok();
}

Status DelayedDirIndex::FlushDir(uint64_t root, uint64_t dir, const WriterFn& writer, bool full_batches_only) {
  Shard& sh = ShardOf(root, dir);
  Queues::iterator it;
  {
    std::lock_guard lock(sh.mu);
    it = sh.pending.find({root, dir});
    if (it == sh.pending.end()) return Status::Ok();
  }
  // The queue itself belongs to the caller, which holds the directory; only
  // the map of queues is shared (its nodes stay put while others change it).
  stats::ScopedTimer timer(R().flush_time);
  if (full_batches_only) R().early.Add();
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, writer(root));
  Queue& q = it->second;
  std::vector<Key> keys;
  std::vector<std::vector<uint8_t>> data;
  uint32_t bytes = 0;
  int64_t flushed_bytes = 0;
  size_t flushed_end = 0;  // items before this are in the tree
  for (size_t i = 0; i < q.size(); ++i) {
    const uint64_t index = q[i].first;
    const uint32_t need = static_cast<uint32_t>(q[i].second.size() + kItemHeader);
    // A batch is a run of immediate successors that fits in one leaf.
    const bool gap = !keys.empty() && keys.back().offset + 1 != index;
    const bool full = !keys.empty() && bytes + need > leaf_space_;
    if (gap || full) {
      UB_RETURN_IF_ERROR(InsertRun(sh, w, keys, data, full));
      flushed_end = i;
      flushed_bytes += bytes;
      keys.clear();
      data.clear();
      bytes = 0;
    }
    keys.push_back(Key{dir, format::kDirIndexKey, index});
    data.push_back(std::move(q[i].second));
    bytes += need;
  }
  if (!full_batches_only) {
    UB_RETURN_IF_ERROR(InsertRun(sh, w, keys, data, false));
    flushed_end = q.size();
    flushed_bytes += bytes;
  } else {
    for (size_t j = 0; j < data.size(); ++j) q[flushed_end + j].second = std::move(data[j]);  // the tail stays queued
  }
  // Only now, with every batch in the tree and its path released, are the
  // queued items freed.
  const size_t n = flushed_end;
  q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(flushed_end));
  std::lock_guard lock(sh.mu);
  sh.count -= n;
  CountBytes(sh, -flushed_bytes);
  if (q.empty()) sh.pending.erase(it);
  return Status::Ok();
}

Status DelayedDirIndex::Flush(const WriterFn& writer) {
  for (Shard& sh : shards_) {
    while (!sh.pending.empty()) {
      auto [root, dir] = sh.pending.begin()->first;
      UB_RETURN_IF_ERROR(FlushDir(root, dir, writer));
    }
  }
  // Nothing is queued: what the shards still held unpublished adds up to
  // minus what bytes_ says.
  for (Shard& sh : shards_) {
    std::lock_guard lock(sh.mu);
    sh.unpublished = 0;
  }
  bytes_.store(0, std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace ubtrfs::inode
