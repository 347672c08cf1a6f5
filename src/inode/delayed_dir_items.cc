#include "inode/delayed_dir_items.h"

#include <algorithm>

#include "stats/stats.h"

namespace ubtrfs::inode {

namespace {

struct Counters {
  stats::Counter& indexes = stats::GetCounter("dir_items.indexes");
  stats::Counter& queued = stats::GetCounter("dir_items.queued");
  stats::Counter& flushed = stats::GetCounter("dir_items.flushed");
  stats::Counter& fallbacks = stats::GetCounter("dir_items.fallbacks");
  stats::Counter& negative = stats::GetCounter("dir_items.negative");
};
Counters& Count() {
  static Counters c;
  return c;
}

}  // namespace

// ---- HashSlots ----

size_t HashSlots::SlotOf(uint32_t hash) const {
  // Name hashes are crc32c values: mix them so that runs do not cluster.
  return static_cast<size_t>((uint64_t{hash} * 0x9E3779B97F4A7C15ull) >> 20) & (slots_.size() - 1);
}

bool HashSlots::Find(uint32_t hash, uint32_t* value) const {
  if (slots_.empty()) return false;
  for (size_t i = SlotOf(hash);; i = (i + 1) & (slots_.size() - 1)) {
    const Slot& e = slots_[i];
    if (e.tag == 0) return false;
    if (e.hash == hash) {
      if (value != nullptr) *value = e.tag - 1;
      return true;
    }
  }
}

HashSlots::Slot& HashSlots::SlotFor(uint32_t hash) {
  if ((used_ + 1) * 2 > slots_.size()) Grow();
  for (size_t i = SlotOf(hash);; i = (i + 1) & (slots_.size() - 1)) {
    Slot& e = slots_[i];
    if (e.tag == 0 || e.hash == hash) return e;
  }
}

void HashSlots::Set(uint32_t hash, uint32_t value) {
  Slot& e = SlotFor(hash);
  if (e.tag == 0) ++used_;
  e = Slot{hash, value + 1};
}

bool HashSlots::Insert(uint32_t hash, uint32_t value) {
  Slot& e = SlotFor(hash);
  if (e.tag != 0) return false;
  e = Slot{hash, value + 1};
  ++used_;
  return true;
}

void HashSlots::Grow() {
  auto old = std::move(slots_);
  slots_.assign(std::max<size_t>(64, old.size() * 2), Slot{});
  for (const Slot& e : old) {
    if (e.tag == 0) continue;
    size_t i = SlotOf(e.hash);
    while (slots_[i].tag != 0) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = e;
  }
}

// ---- DelayedDirItems ----

DelayedDirItems::NodeRef DelayedDirItems::Get(uint64_t root, uint64_t dir) const {
  const Shard& sh = shards_[ShardIndex(root, dir)];
  std::lock_guard lock(sh.mu);
  auto it = sh.nodes.find({root, dir});
  return it == sh.nodes.end() ? nullptr : it->second;
}

DelayedDirItems::NodeRef DelayedDirItems::GetOrMake(uint64_t root, uint64_t dir) {
  Shard& sh = shards_[ShardIndex(root, dir)];
  std::lock_guard lock(sh.mu);
  NodeRef& n = sh.nodes[{root, dir}];
  if (!n) n = std::make_shared<Node>();
  return n;
}

bool DelayedDirItems::HasIndex(uint64_t root, uint64_t dir) const {
  NodeRef n = Get(root, dir);
  if (!n) return false;
  std::lock_guard lock(n->mu);
  return n->indexed;
}

void DelayedDirItems::SetIndex(uint64_t root, uint64_t dir, std::span<const uint64_t> hashes) {
  NodeRef n = GetOrMake(root, dir);
  HashSlots index;
  for (uint64_t h : hashes) index.Set(static_cast<uint32_t>(h), 0);
  std::lock_guard lock(n->mu);
  if (n->indexed) return;
  n->index = std::move(index);
  n->indexed = true;
  Count().indexes.Add();
}

DelayedDirItems::Verdict DelayedDirItems::Add(uint64_t root, uint64_t dir, uint32_t hash,
                                              std::span<const uint8_t> item, bool* flush, uint64_t* creates) {
  *flush = false;
  NodeRef n = creates != nullptr ? GetOrMake(root, dir) : Get(root, dir);
  if (!n) return Verdict::kNoIndex;
  std::lock_guard lock(n->mu);
  if (creates != nullptr) *creates = ++n->creates;
  if (!n->indexed) {
    return creates != nullptr && n->creates % options_.index_after == 0 ? Verdict::kConsiderIndex : Verdict::kNoIndex;
  }
  if (!n->index.Insert(hash, static_cast<uint32_t>(n->queue.size() + 1))) {
    Count().fallbacks.Add();
    return Verdict::kMayExist;
  }
  n->queue.push_back(Pending{hash, static_cast<uint32_t>(item.size()), n->bytes.size()});
  n->bytes.insert(n->bytes.end(), item.begin(), item.end());
  *flush = n->queue.size() >= options_.dir_batch;
  if (const size_t uncounted = n->queue.size() - n->counted; uncounted >= total_step_) {
    n->counted = n->queue.size();
    const size_t total = total_.fetch_add(uncounted, std::memory_order_relaxed) + uncounted;
    *flush = *flush || total >= options_.total_limit;
  }
  if (const size_t now = QueueBytes(*n); now - n->counted_bytes >= kBytesStep) {
    bytes_.fetch_add(now - n->counted_bytes, std::memory_order_relaxed);
    n->counted_bytes = now;
  }
  Count().queued.Add();
  return Verdict::kQueued;
}

void DelayedDirItems::NoteInserted(uint64_t root, uint64_t dir, uint32_t hash) {
  NodeRef n = Get(root, dir);
  if (!n) return;
  std::lock_guard lock(n->mu);
  if (n->indexed && !n->index.Find(hash)) n->index.Set(hash, 0);
}

DelayedDirItems::Probe DelayedDirItems::Find(uint64_t root, uint64_t dir, uint32_t hash,
                                             std::vector<uint8_t>* item) const {
  NodeRef n = Get(root, dir);
  if (!n) return Probe::kUnknown;
  std::lock_guard lock(n->mu);
  if (!n->indexed) return Probe::kUnknown;
  uint32_t v = 0;
  if (!n->index.Find(hash, &v)) {
    Count().negative.Add();
    return Probe::kAbsent;
  }
  if (v == 0) return Probe::kUnknown;
  const Pending& p = n->queue[v - 1];
  item->assign(n->bytes.begin() + static_cast<ptrdiff_t>(p.offset),
               n->bytes.begin() + static_cast<ptrdiff_t>(p.offset + p.size));
  return Probe::kPending;
}

size_t DelayedDirItems::PendingIn(uint64_t root, uint64_t dir) const {
  NodeRef n = Get(root, dir);
  if (!n) return 0;
  std::lock_guard lock(n->mu);
  return n->queue.size();
}

Status DelayedDirItems::FlushNode(uint64_t root, uint64_t dir, Node& n, const InsertFn& insert) {
  {
    std::lock_guard lock(n.mu);
    if (n.queue.empty()) return Status::Ok();
    std::sort(n.queue.begin(), n.queue.end(), [](const Pending& a, const Pending& b) { return a.hash < b.hash; });
    for (size_t i = 0; i < n.queue.size(); ++i) n.index.Set(n.queue[i].hash, static_cast<uint32_t>(i + 1));
  }
  // Only this thread changes the queue now (the caller holds the
  // directory); Find reads it beside us, and still finds every item until
  // it is in the tree.
  {
    thread_local std::vector<uint32_t> hashes;
    thread_local std::vector<std::span<const uint8_t>> items;
    hashes.clear();
    items.clear();
    for (const Pending& p : n.queue) {
      hashes.push_back(p.hash);
      items.emplace_back(n.bytes.data() + p.offset, p.size);
    }
    Status st = insert(root, dir, hashes, items);
    items.clear();  // no views left behind into the queue
    UB_RETURN_IF_ERROR(st);
  }
  size_t done;
  {
    std::lock_guard lock(n.mu);
    for (const Pending& p : n.queue) n.index.Set(p.hash, 0);
    done = n.queue.size();
    total_.fetch_sub(n.counted, std::memory_order_relaxed);
    n.counted = 0;
    bytes_.fetch_sub(n.counted_bytes, std::memory_order_relaxed);
    n.counted_bytes = 0;
    n.queue.clear();
    n.bytes.clear();
  }
  Count().flushed.Add(done);
  return Status::Ok();
}

Status DelayedDirItems::FlushDir(uint64_t root, uint64_t dir, const InsertFn& insert) {
  NodeRef n = Get(root, dir);
  return n ? FlushNode(root, dir, *n, insert) : Status::Ok();
}

Status DelayedDirItems::FlushAll(const InsertFn& insert) {
  for (Shard& sh : shards_) {
    std::vector<std::pair<std::pair<uint64_t, uint64_t>, NodeRef>> nodes;
    {
      std::lock_guard lock(sh.mu);
      nodes.assign(sh.nodes.begin(), sh.nodes.end());
    }
    for (auto& [key, n] : nodes) UB_RETURN_IF_ERROR(FlushNode(key.first, key.second, *n, insert));
  }
  return Status::Ok();
}

void DelayedDirItems::Forget(uint64_t root, uint64_t dir) {
  NodeRef gone;
  Shard& sh = shards_[ShardIndex(root, dir)];
  std::lock_guard lock(sh.mu);
  auto it = sh.nodes.find({root, dir});
  if (it == sh.nodes.end()) return;
  gone = std::move(it->second);
  sh.nodes.erase(it);
  std::lock_guard node_lock(gone->mu);
  total_.fetch_sub(gone->counted, std::memory_order_relaxed);
  bytes_.fetch_sub(gone->counted_bytes, std::memory_order_relaxed);
}

}  // namespace ubtrfs::inode
