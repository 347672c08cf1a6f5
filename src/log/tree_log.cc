// Writing the tree log (see tree_log.h).
#include "log/tree_log.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "format/checksum.h"
#include "format/ondisk.h"
#include "tree/tree_block.h"

namespace ubtrfs::log {

using namespace ubtrfs::format;
using Bytes = std::vector<uint8_t>;

void TreeLog::Put(uint64_t root, const Key& k, Bytes data) {
  Tree& t = trees_[root];
  auto [it, added] = t.items.try_emplace(k);
  if (!added) bytes_ -= sizeof(Item) + it->second.size();
  bytes_ += sizeof(Item) + data.size();
  it->second = std::move(data);
}

void TreeLog::Erase(uint64_t root, const Key& from, const Key& to) {
  auto t = trees_.find(root);
  if (t == trees_.end()) return;
  auto& items = t->second.items;
  for (auto it = items.lower_bound(from); it != items.end() && !(to < it->first);) {
    bytes_ -= sizeof(Item) + it->second.size();
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

void TreeLog::PutCsums(uint64_t root, uint64_t logical, std::span<const uint8_t> sums) {
  const size_t csize = CsumSize(vol_->csum_type());
  const uint32_t ss = vol_->sectorsize();
  Tree& t = trees_[root];
  for (size_t i = 0; i + csize <= sums.size(); i += csize, logical += ss) {
    auto [it, added] = t.csums.try_emplace(logical);
    if (added) bytes_ += csize;
    it->second.assign(sums.begin() + static_cast<long>(i), sums.begin() + static_cast<long>(i + csize));
  }
}

void TreeLog::Reset() {
  trees_.clear();
  bytes_ = 0;
  owned_.clear();
  live_.clear();
  live_content_.clear();
  pending_.clear();
  taken_.clear();
}

// Runs of neighbouring sectors as EXTENT_CSUM items no larger than the
// kernel's (a leaf less two item headers, one checksum to spare).
std::vector<std::pair<Key, Bytes>> TreeLog::CsumItems(const Tree& t) const {
  const size_t csize = CsumSize(vol_->csum_type());
  const uint32_t ss = vol_->sectorsize();
  const size_t max_sums = (vol_->nodesize() - sizeof(Header) - 2 * sizeof(Item)) / csize - 1;
  std::vector<std::pair<Key, Bytes>> out;
  uint64_t next = 0;
  for (const auto& [logical, sum] : t.csums) {
    if (out.empty() || logical != next || out.back().second.size() / csize >= max_sums) {
      out.push_back({Key{kExtentCsumObjectid, kExtentCsumKey, logical}, {}});
    }
    out.back().second.insert(out.back().second.end(), sum.begin(), sum.end());
    next = logical + ss;
  }
  return out;
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

Result<uint64_t> TreeLog::Place(txn::TxnManager* txn, Bytes bytes, std::vector<uint64_t>* used) {
  // `bytes` has bytenr and checksum zero: the form live blocks are kept in.
  const uint64_t h = HashOf(bytes);
  uint64_t bytenr = 0;
  auto [lo, hi] = live_content_.equal_range(h);
  for (auto it = lo; it != hi; ++it) {
    if (!taken_.count(it->second.first) && it->second.second == bytes) {
      bytenr = it->second.first;
      break;
    }
  }
  used->push_back(0);  // filled below; the order is the tree's
  if (bytenr != 0) {
    taken_.insert(bytenr);
    used->back() = bytenr;
    ++stats_.blocks_kept;
    return bytenr;
  }
  UB_ASSIGN_OR_RETURN(bytenr, TakeBlock(txn));
  taken_.insert(bytenr);
  used->back() = bytenr;
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

Result<TreeLog::Built> TreeLog::BuildTree(txn::TxnManager* txn,
                                          const std::vector<std::pair<Key, std::span<const uint8_t>>>& items,
                                          std::vector<uint64_t>* used) {
  const uint32_t nodesize = vol_->nodesize();
  const size_t space = nodesize - sizeof(Header);
  const uint64_t transid = txn->transid();
  const tree::HeaderTemplate& tmpl = txn->header_template();
  auto blank = [&](int level) {
    Bytes b(nodesize, 0);
    auto* h = reinterpret_cast<Header*>(b.data());
    std::memcpy(h->fsid, tmpl.fsid, kFsidSize);
    std::memcpy(h->chunk_tree_uuid, tmpl.chunk_tree_uuid, kUuidSize);
    h->flags = kHeaderFlagWritten | (kMixedBackrefRev << kBackrefRevShift);
    h->generation = transid;
    h->owner = kTreeLogObjectid;
    h->level = static_cast<uint8_t>(level);
    return b;
  };
  struct Child {
    Key first;
    uint64_t bytenr;
  };
  std::vector<Child> level_blocks;
  // Leaves, filled in key order (an unchanged item run keeps its leaves
  // byte for byte, so they are not written again).
  size_t i = 0;
  do {
    Bytes b = blank(0);
    auto* h = reinterpret_cast<Header*>(b.data());
    auto* slots = reinterpret_cast<Item*>(b.data() + sizeof(Header));
    size_t n = 0, data_end = space;
    const Key first = i < items.size() ? items[i].first : Key{};
    for (; i < items.size(); ++i, ++n) {
      const auto& [k, d] = items[i];
      const size_t need = sizeof(Item) + d.size();
      if (need > space) return Status::Error(EIO, "internal: log item " + KeyToString(k) + " does not fit in a leaf");
      if ((n + 1) * sizeof(Item) + (space - data_end) + d.size() > space) break;
      data_end -= d.size();
      k.To(&slots[n].key);
      slots[n].offset = static_cast<uint32_t>(data_end);
      slots[n].size = static_cast<uint32_t>(d.size());
      if (!d.empty()) std::memcpy(b.data() + sizeof(Header) + data_end, d.data(), d.size());
    }
    h->nritems = static_cast<uint32_t>(n);
    UB_ASSIGN_OR_RETURN(uint64_t bytenr, Place(txn, std::move(b), used));
    level_blocks.push_back(Child{first, bytenr});
  } while (i < items.size());
  int level = 0;
  const size_t max_ptrs = space / sizeof(KeyPtr);
  while (level_blocks.size() > 1) {
    ++level;
    if (level >= kMaxLevel) return Status::Error(EIO, "internal: tree log too tall");
    const size_t n = level_blocks.size();
    const size_t groups = (n + max_ptrs - 1) / max_ptrs;
    std::vector<Child> up;
    for (size_t g = 0; g < groups; ++g) {
      const size_t from = n * g / groups, to = n * (g + 1) / groups;
      Bytes b = blank(level);
      auto* ptrs = reinterpret_cast<KeyPtr*>(b.data() + sizeof(Header));
      for (size_t c = from; c < to; ++c) {
        level_blocks[c].first.To(&ptrs[c - from].key);
        ptrs[c - from].blockptr = level_blocks[c].bytenr;
        ptrs[c - from].generation = transid;
      }
      reinterpret_cast<Header*>(b.data())->nritems = static_cast<uint32_t>(to - from);
      UB_ASSIGN_OR_RETURN(uint64_t bytenr, Place(txn, std::move(b), used));
      up.push_back(Child{level_blocks[from].first, bytenr});
    }
    level_blocks = std::move(up);
  }
  return Built{level_blocks.front().bytenr, transid, level};
}

Status TreeLog::Sync(txn::TxnManager* txn) {
  if (vol_->super().log_root.get() != 0) return Status::Error(EIO, "internal: an unreplayed log is still in place");
  pending_.clear();
  taken_.clear();
  std::vector<uint64_t> used;
  const uint64_t transid = txn->transid();
  // Each subvolume's log tree, then the log root tree with their ROOT_ITEMs.
  std::vector<std::pair<Key, Bytes>> root_items;
  for (const auto& [root, t] : trees_) {
    const auto csums = CsumItems(t);
    std::vector<std::pair<Key, std::span<const uint8_t>>> items;
    items.reserve(t.items.size() + csums.size());
    for (const auto& [k, d] : t.items) items.push_back({k, d});
    for (const auto& [k, d] : csums) items.push_back({k, d});  // EXTENT_CSUM_OBJECTID sorts after every inode
    UB_ASSIGN_OR_RETURN(Built b, BuildTree(txn, items, &used));
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
    root_items.push_back({Key{kTreeLogObjectid, kRootItemKey, root}, Bytes(reinterpret_cast<uint8_t*>(&ri),
                                                                          reinterpret_cast<uint8_t*>(&ri) + sizeof ri)});
  }
  std::vector<std::pair<Key, std::span<const uint8_t>>> items;
  for (const auto& [k, d] : root_items) items.push_back({k, d});
  UB_ASSIGN_OR_RETURN(Built top, BuildTree(txn, items, &used));
  (void)transid;

  // The new blocks, neighbours gathered into one write; then the superblock
  // only once they are durable.
  io::BlockDevice* dev = vol_->device();
  std::vector<std::span<const uint8_t>> run;
  uint64_t run_start = 0, run_bytes = 0;
  auto flush_run = [&]() -> Status {
    if (run.empty()) return Status::Ok();
    UB_RETURN_IF_ERROR(dev->WriteGather(run_start, run));
    run.clear();
    run_bytes = 0;
    return Status::Ok();
  };
  std::vector<std::pair<uint64_t, std::span<const uint8_t>>> writes;  // physical, bytes
  for (const auto& [bytenr, bytes] : pending_) {
    UB_ASSIGN_OR_RETURN(auto copies, vol_->chunks().Map(bytenr, bytes.size()));
    for (uint64_t p : copies) writes.push_back({p, bytes});
  }
  std::sort(writes.begin(), writes.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [phys, bytes] : writes) {
    if (!run.empty() && (phys != run_start + run_bytes || run_bytes >= (1u << 20))) UB_RETURN_IF_ERROR(flush_run());
    if (run.empty()) run_start = phys;
    run.push_back(bytes);
    run_bytes += bytes.size();
  }
  UB_RETURN_IF_ERROR(flush_run());
  UB_RETURN_IF_ERROR(dev->Flush());
  UB_RETURN_IF_ERROR(vol_->WriteLogSuperblock(top.bytenr, static_cast<uint8_t>(top.level)));
  UB_RETURN_IF_ERROR(dev->Flush());
  // The commit that ends this transaction must write a superblock, whatever
  // else it holds: the one on the device points at this log.
  txn->ForceSuperblockWrite();

  // Durable: the new log's blocks are the live ones.
  stats_.blocks_written += pending_.size();
  ++stats_.syncs;
  std::unordered_multimap<uint64_t, std::pair<uint64_t, Bytes>> content;
  for (auto& [h, entry] : live_content_) {
    if (taken_.count(entry.first)) content.emplace(h, std::move(entry));
  }
  for (auto& [bytenr, bytes] : pending_) {
    std::memset(bytes.data(), 0, kCsumSize);
    reinterpret_cast<Header*>(bytes.data())->bytenr = 0;
    const uint64_t h = HashOf(bytes);
    content.emplace(h, std::make_pair(bytenr, std::move(bytes)));
  }
  live_content_ = std::move(content);
  live_ = taken_;
  pending_.clear();
  taken_.clear();
  return Status::Ok();
}

}  // namespace ubtrfs::log
