// Writing the tree log (see tree_log.h).
#include "log/tree_log.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "format/checksum.h"
#include "format/ondisk.h"
#include "tree/tree_block.h"
#include "txn/extent_refs.h"

namespace ubtrfs::log {

using namespace ubtrfs::format;
using Bytes = std::vector<uint8_t>;

namespace {

bool IsCsum(const Key& k) { return k.objectid == kExtentCsumObjectid && k.type == kExtentCsumKey; }

}  // namespace

void TreeLog::Put(uint64_t root, const Key& k, Bytes data) {
  Tree& t = trees_[root];
  auto [it, added] = t.items.try_emplace(k);
  if (!added) bytes_ -= sizeof(Item) + it->second.size();
  bytes_ += sizeof(Item) + data.size();
  it->second = std::move(data);
  Touch(t, k);
}

void TreeLog::Erase(uint64_t root, const Key& from, const Key& to) {
  auto t = trees_.find(root);
  if (t == trees_.end()) return;
  auto& items = t->second.items;
  for (auto it = items.lower_bound(from); it != items.end() && !(to < it->first);) {
    bytes_ -= sizeof(Item) + it->second.size();
    Touch(t->second, it->first);
    it = items.erase(it);
  }
}

std::vector<std::pair<Key, const Bytes*>> TreeLog::Items(uint64_t root, const Key& from, const Key& to) const {
  std::vector<std::pair<Key, const Bytes*>> out;
  auto t = trees_.find(root);
  if (t == trees_.end()) return out;
  const auto& items = t->second.items;
  for (auto it = items.lower_bound(from); it != items.end() && !(to < it->first); ++it) {
    out.push_back({it->first, &it->second});
  }
  return out;
}

std::optional<std::pair<Key, const Bytes*>> TreeLog::ItemAtOrBefore(uint64_t root, const Key& key) const {
  auto t = trees_.find(root);
  if (t == trees_.end()) return std::nullopt;
  const auto& items = t->second.items;
  auto it = items.upper_bound(key);
  if (it == items.begin()) return std::nullopt;
  --it;
  if (it->first.objectid != key.objectid || it->first.type != key.type) return std::nullopt;
  return std::make_pair(it->first, &it->second);
}

// EXTENT_CSUM items as the csum tree has them: keyed by their first
// sector, never overlapping, at most the kernel's size (a leaf less two
// item headers, one checksum to spare).
void TreeLog::PutCsums(uint64_t root, uint64_t logical, std::span<const uint8_t> sums) {
  const size_t csize = CsumSize(vol_->csum_type());
  const uint32_t ss = vol_->sectorsize();
  const size_t max_sums = MaxCsumsPerItem(vol_->nodesize(), csize);
  const uint64_t end = logical + sums.size() / csize * ss;
  Tree& t = trees_[root];
  auto& items = t.items;
  auto put = [&](uint64_t at, Bytes d) {
    const Key k{kExtentCsumObjectid, kExtentCsumKey, at};
    bytes_ += sizeof(Item) + d.size();
    items[k] = std::move(d);
    Touch(t, k);
  };
  auto drop = [&](std::map<Key, Bytes>::iterator it) {
    bytes_ -= sizeof(Item) + it->second.size();
    Touch(t, it->first);
    return items.erase(it);
  };
  // What the log had over [logical, end) goes; pieces outside stay.
  auto it = items.lower_bound(Key{kExtentCsumObjectid, kExtentCsumKey, logical});
  if (it != items.begin() && IsCsum(std::prev(it)->first)) {
    auto prev = std::prev(it);
    const uint64_t ps = prev->first.offset, pe = ps + prev->second.size() / csize * ss;
    if (pe > logical) {
      Bytes head(prev->second.begin(), prev->second.begin() + static_cast<long>((logical - ps) / ss * csize));
      Bytes tail;
      if (pe > end) tail.assign(prev->second.begin() + static_cast<long>((end - ps) / ss * csize), prev->second.end());
      drop(prev);
      put(ps, std::move(head));
      if (!tail.empty()) put(end, std::move(tail));
      it = items.lower_bound(Key{kExtentCsumObjectid, kExtentCsumKey, logical});
    }
  }
  while (it != items.end() && IsCsum(it->first) && it->first.offset < end) {
    const uint64_t is = it->first.offset, ie = is + it->second.size() / csize * ss;
    Bytes tail;
    if (ie > end) tail.assign(it->second.begin() + static_cast<long>((end - is) / ss * csize), it->second.end());
    it = drop(it);
    if (!tail.empty()) {
      put(end, std::move(tail));
      break;
    }
  }
  for (size_t i = 0; i < sums.size() / csize; i += max_sums) {
    const size_t n = std::min(max_sums, sums.size() / csize - i);
    put(logical + i * ss, Bytes(sums.begin() + static_cast<long>(i * csize),
                                sums.begin() + static_cast<long>((i + n) * csize)));
  }
}

void TreeLog::Reset() {
  transid_ = 0;
  trees_.clear();
  bytes_ = 0;
  owned_.clear();
  live_.clear();
  live_nodes_.clear();
  new_nodes_.clear();
  pending_.clear();
  taken_.clear();
}

uint64_t TreeLog::HashOf(std::span<const uint8_t> b) {
  // FNV-1a over 8-byte words: only to find candidates, which are compared.
  uint64_t h = 1469598103934665603ull;
  size_t i = 0;
  for (; i + 8 <= b.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, b.data() + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < b.size(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

Result<uint64_t> TreeLog::TakeBlock(txn::TxnManager* txn) {
  for (uint64_t b : owned_) {
    if (!live_.count(b) && !taken_.count(b)) return b;
  }
  UB_ASSIGN_OR_RETURN(uint64_t b, txn->AllocLogBlock());
  owned_.insert(b);
  return b;
}

Bytes TreeLog::Blank(txn::TxnManager* txn, int level) const {
  Bytes b(vol_->nodesize(), 0);
  auto* h = reinterpret_cast<Header*>(b.data());
  const tree::HeaderTemplate& tmpl = txn->header_template();
  std::memcpy(h->fsid, tmpl.fsid, kFsidSize);
  std::memcpy(h->chunk_tree_uuid, tmpl.chunk_tree_uuid, kUuidSize);
  h->flags = kHeaderFlagWritten | (kMixedBackrefRev << kBackrefRevShift);
  h->generation = txn->transid();
  h->owner = kTreeLogObjectid;
  h->level = static_cast<uint8_t>(level);
  return b;
}

Result<uint64_t> TreeLog::Place(txn::TxnManager* txn, Bytes bytes, bool reuse) {
  // `bytes` has bytenr and checksum zero: the form durable nodes are kept in.
  const uint64_t h = reuse ? HashOf(bytes) : 0;
  if (reuse) {
    auto [lo, hi] = live_nodes_.equal_range(h);
    for (auto it = lo; it != hi; ++it) {
      if (!taken_.count(it->second.first) && it->second.second == bytes) {
        const uint64_t bytenr = it->second.first;
        taken_.insert(bytenr);
        new_nodes_.emplace(h, std::make_pair(bytenr, std::move(bytes)));
        ++stats_.blocks_kept;
        return bytenr;
      }
    }
  }
  UB_ASSIGN_OR_RETURN(uint64_t bytenr, TakeBlock(txn));
  taken_.insert(bytenr);
  if (reuse) new_nodes_.emplace(h, std::make_pair(bytenr, bytes));
  auto* hdr = reinterpret_cast<Header*>(bytes.data());
  hdr->bytenr = bytenr;
  CsumBytes c = ComputeCsum(vol_->csum_type(), std::span<const uint8_t>(bytes).subspan(kCsumSize));
  std::memcpy(bytes.data(), c.data(), kCsumSize);
  UB_RETURN_IF_ERROR(tree::VerifyTreeBlock(bytes, vol_->reader()->params(),
                                           tree::BlockCheck{bytenr, hdr->level, hdr->generation.get(), {}})
                         .WithContext("refusing to write a tree log block"));
  pending_[bytenr] = std::move(bytes);
  return bytenr;
}

Result<uint64_t> TreeLog::WriteLeaf(txn::TxnManager* txn, std::span<const std::pair<Key, std::span<const uint8_t>>> items) {
  Bytes b = Blank(txn, 0);
  const size_t space = vol_->nodesize() - sizeof(Header);
  auto* slots = reinterpret_cast<Item*>(b.data() + sizeof(Header));
  size_t data_end = space;
  for (size_t n = 0; n < items.size(); ++n) {
    const auto& [k, d] = items[n];
    data_end -= d.size();
    k.To(&slots[n].key);
    slots[n].offset = static_cast<uint32_t>(data_end);
    slots[n].size = static_cast<uint32_t>(d.size());
    if (!d.empty()) std::memcpy(b.data() + sizeof(Header) + data_end, d.data(), d.size());
  }
  reinterpret_cast<Header*>(b.data())->nritems = static_cast<uint32_t>(items.size());
  return Place(txn, std::move(b), false);
}

Result<std::vector<TreeLog::Leaf>> TreeLog::BuildLeaves(txn::TxnManager* txn, const Tree& t) {
  const size_t space = vol_->nodesize() - sizeof(Header);
  std::vector<Leaf> out;
  // Packs the items in [lo, hi) (hi: none = to the end) into new leaves.
  auto pack = [&](const Key& lo, const std::optional<Key>& hi) -> Status {
    std::vector<std::pair<Key, std::span<const uint8_t>>> run;
    size_t used = 0;
    auto flush = [&]() -> Status {
      if (run.empty()) return Status::Ok();
      UB_ASSIGN_OR_RETURN(uint64_t bytenr, WriteLeaf(txn, run));
      out.push_back(Leaf{run.front().first, bytenr});
      run.clear();
      used = 0;
      return Status::Ok();
    };
    for (auto it = t.items.lower_bound(lo); it != t.items.end() && (!hi || it->first < *hi); ++it) {
      const size_t need = sizeof(Item) + it->second.size();
      if (need > space) {
        return Status::Error(EIO, "internal: log item " + KeyToString(it->first) + " does not fit in a leaf");
      }
      if (used + need > space) UB_RETURN_IF_ERROR(flush());
      run.push_back({it->first, it->second});
      used += need;
    }
    return flush();
  };
  const std::vector<Leaf>& old = t.leaves;
  if (old.empty()) {
    UB_RETURN_IF_ERROR(pack(Key{}, std::nullopt));
  } else {
    // Each leaf of the durable log holds the keys from its first to the next
    // leaf's first (the first leaf: from the start). A leaf with no key
    // changed in that range is kept; runs of changed ones are packed anew.
    size_t i = 0;
    while (i < old.size()) {
      auto range_lo = [&](size_t j) { return j == 0 ? Key{} : old[j].first; };
      auto changed = [&](size_t j) {
        auto d = t.dirty.lower_bound(range_lo(j));
        return d != t.dirty.end() && (j + 1 == old.size() || *d < old[j + 1].first);
      };
      if (!changed(i)) {
        out.push_back(old[i]);
        taken_.insert(old[i].bytenr);
        ++stats_.blocks_kept;
        ++i;
        continue;
      }
      size_t j = i;
      while (j < old.size() && changed(j)) ++j;
      UB_RETURN_IF_ERROR(pack(range_lo(i), j < old.size() ? std::optional<Key>(old[j].first) : std::nullopt));
      i = j;
    }
  }
  if (out.empty()) {
    UB_ASSIGN_OR_RETURN(uint64_t bytenr, WriteLeaf(txn, {}));
    out.push_back(Leaf{Key{}, bytenr});
  }
  return out;
}

Result<TreeLog::Built> TreeLog::BuildNodes(txn::TxnManager* txn, std::vector<Leaf> level_blocks) {
  const size_t max_ptrs = (vol_->nodesize() - sizeof(Header)) / sizeof(KeyPtr);
  const uint64_t transid = txn->transid();
  int level = 0;
  while (level_blocks.size() > 1) {
    ++level;
    if (level >= kMaxLevel) return Status::Error(EIO, "internal: tree log too tall");
    const size_t n = level_blocks.size();
    const size_t groups = (n + max_ptrs - 1) / max_ptrs;
    std::vector<Leaf> up;
    for (size_t g = 0; g < groups; ++g) {
      const size_t from = n * g / groups, to = n * (g + 1) / groups;
      Bytes b = Blank(txn, level);
      auto* ptrs = reinterpret_cast<KeyPtr*>(b.data() + sizeof(Header));
      for (size_t c = from; c < to; ++c) {
        level_blocks[c].first.To(&ptrs[c - from].key);
        ptrs[c - from].blockptr = level_blocks[c].bytenr;
        ptrs[c - from].generation = transid;
      }
      reinterpret_cast<Header*>(b.data())->nritems = static_cast<uint32_t>(to - from);
      UB_ASSIGN_OR_RETURN(uint64_t bytenr, Place(txn, std::move(b), true));
      up.push_back(Leaf{level_blocks[from].first, bytenr});
    }
    level_blocks = std::move(up);
  }
  return Built{level_blocks.front().bytenr, transid, level};
}

bool TreeLog::NamesADataExtentTwice() const {
  std::set<uint64_t> seen;
  for (const auto& [root, t] : trees_) {
    for (const auto& [k, d] : t.items) {
      if (k.type != format::kExtentDataKey) continue;
      const auto* fe = txn::DataExtentItem(d);
      if (fe != nullptr && !seen.insert(fe->disk_bytenr.get()).second) return true;
    }
  }
  return false;
}

Status TreeLog::Sync(txn::TxnManager* txn) {
  if (vol_->super().log_root.get() != 0) return Status::Error(EIO, "internal: an unreplayed log is still in place");
  // Blocks kept from an earlier sync were pinned by this transaction only.
  if (transid_ != 0 && transid_ != txn->transid()) {
    return Status::Error(EIO, "internal: the tree log outlived its transaction");
  }
  transid_ = txn->transid();
  pending_.clear();
  taken_.clear();
  new_nodes_.clear();
  // Each subvolume's log tree, then the log root tree with their ROOT_ITEMs.
  std::map<uint64_t, std::vector<Leaf>> new_leaves;
  Tree roots;
  for (const auto& [root, t] : trees_) {
    UB_ASSIGN_OR_RETURN(auto leaves, BuildLeaves(txn, t));
    new_leaves[root] = leaves;
    UB_ASSIGN_OR_RETURN(Built b, BuildNodes(txn, std::move(leaves)));
    RootItem ri{};
    ri.inode.generation = 1;
    ri.inode.size = 3;
    ri.inode.nlink = 1;
    ri.inode.nbytes = vol_->nodesize();
    ri.inode.mode = S_IFDIR | 0755;
    ri.generation = b.generation;
    ri.generation_v2 = b.generation;
    ri.bytenr = b.bytenr;
    ri.level = static_cast<uint8_t>(b.level);
    const auto* p = reinterpret_cast<const uint8_t*>(&ri);
    roots.items[Key{kTreeLogObjectid, kRootItemKey, root}] = Bytes(p, p + sizeof ri);
  }
  UB_ASSIGN_OR_RETURN(auto root_leaves, BuildLeaves(txn, roots));
  UB_ASSIGN_OR_RETURN(Built top, BuildNodes(txn, std::move(root_leaves)));

  // The new blocks (every copy, on every device), then the superblock only
  // once they are durable -- and only once the last commit's superblock is:
  // the log's starts from it.
  auto super_lock = vol_->SuperLock();
  for (const auto& [bytenr, bytes] : pending_) {
    UB_RETURN_IF_ERROR(vol_->chunk_io().Write(bytenr, bytes).WithContext("writing a tree log block"));
  }
  UB_RETURN_IF_ERROR(vol_->devices().Flush());
  UB_RETURN_IF_ERROR(vol_->WriteLogSuperblock(top.bytenr, static_cast<uint8_t>(top.level)));
  UB_RETURN_IF_ERROR(vol_->devices().Flush());
  // The commit that ends this transaction must write a superblock, whatever
  // else it holds: the one on the device points at this log.
  txn->ForceSuperblockWrite();

  // Durable: the new log's blocks are the live ones.
  stats_.blocks_written += pending_.size();
  ++stats_.syncs;
  for (auto& [root, t] : trees_) {
    t.leaves = std::move(new_leaves[root]);
    t.dirty.clear();
  }
  live_nodes_ = std::move(new_nodes_);
  new_nodes_.clear();
  live_ = std::move(taken_);
  taken_.clear();
  pending_.clear();
  return Status::Ok();
}

}  // namespace ubtrfs::log
