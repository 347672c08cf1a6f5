#include "tree/dirty_blocks.h"

#include <algorithm>
#include <cstring>

namespace ubtrfs::tree {

using namespace ubtrfs::format;

Result<BlockRef> DirtyBlocks::Read(const BlockCheck& check) {
  // Every level of every descent comes here: a block Peek finds (and that
  // is not dropped) is the current one, without the shard's lock; a miss
  // may only mean a block added a moment ago, which Get settles.
  std::shared_ptr<TreeBlock> mine;
  if (TreeBlock* p = Peek(check.bytenr); p != nullptr && !p->dropped.load(std::memory_order_acquire)) {
    mine = p->shared_from_this();
  } else {
    mine = Get(check.bytenr);
  }
  if (mine == nullptr) return clean_->Read(check);
  const TreeBlock& b = *mine;
  // Our own blocks are trusted, but a pointer that disagrees with them is a bug.
  if ((check.level >= 0 && b.level() != check.level) ||
      (check.generation != 0 && b.generation() != check.generation)) {
    return Status::Corrupt("dirty tree block " + std::to_string(check.bytenr) + ": level/generation mismatch");
  }
  return BlockRef(std::move(mine));
}

std::shared_ptr<TreeBlock> DirtyBlocks::Get(uint64_t bytenr) const {
  const Shard& s = ShardOf(bytenr);
  std::shared_lock lock(s.mu);
  auto it = s.blocks.find(bytenr);
  return it == s.blocks.end() ? nullptr : it->second;
}

namespace {
size_t SlotOf(uint64_t bytenr, size_t mask) { return static_cast<size_t>((bytenr * 0x9E3779B97F4A7C15ull) >> 20) & mask; }
}  // namespace

TreeBlock* DirtyBlocks::Peek(uint64_t bytenr) const {
  const Table* t = ShardOf(bytenr).table.load(std::memory_order_acquire);
  if (t == nullptr) return nullptr;
  for (size_t i = SlotOf(bytenr, t->mask);; i = (i + 1) & t->mask) {
    const uint64_t k = t->slots[i].key.load(std::memory_order_acquire);
    if (k == bytenr + 1) return t->slots[i].block.load(std::memory_order_acquire);
    if (k == 0) return nullptr;
  }
}

void DirtyBlocks::TableStore(Shard& s, uint64_t bytenr, TreeBlock* b) {
  Table* t = s.table.load(std::memory_order_relaxed);
  if (t == nullptr || (s.used + 1) * 2 > t->mask + 1) {
    // Grow: a new table with every live block (the old one stays for
    // readers that still probe it). Dropped blocks are left out.
    auto bigger = std::make_unique<Table>(t == nullptr ? 64 : 2 * (t->mask + 1));
    s.used = 0;
    for (const auto& [addr, blk] : s.blocks) {
      if (addr == bytenr) continue;
      for (size_t i = SlotOf(addr, bigger->mask);; i = (i + 1) & bigger->mask) {
        if (bigger->slots[i].key.load(std::memory_order_relaxed) == 0) {
          bigger->slots[i].block.store(blk.get(), std::memory_order_relaxed);
          bigger->slots[i].key.store(addr + 1, std::memory_order_relaxed);
          ++s.used;
          break;
        }
      }
    }
    t = bigger.get();
    s.tables.push_back(std::move(bigger));
    s.table.store(t, std::memory_order_release);  // publishes the slots filled above
  }
  for (size_t i = SlotOf(bytenr, t->mask);; i = (i + 1) & t->mask) {
    const uint64_t k = t->slots[i].key.load(std::memory_order_relaxed);
    if (k == bytenr + 1) {
      t->slots[i].block.store(b, std::memory_order_release);
      return;
    }
    if (k == 0) {
      if (b == nullptr) return;  // nothing to clear
      t->slots[i].block.store(b, std::memory_order_relaxed);
      t->slots[i].key.store(bytenr + 1, std::memory_order_release);  // the block is visible with its key
      ++s.used;
      return;
    }
  }
}

std::vector<std::pair<uint64_t, std::shared_ptr<TreeBlock>>> DirtyBlocks::All() const {
  std::vector<std::pair<uint64_t, std::shared_ptr<TreeBlock>>> out;
  out.reserve(count());
  for (const Shard& s : shards_) {
    std::shared_lock lock(s.mu);
    out.insert(out.end(), s.blocks.begin(), s.blocks.end());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

void DirtyBlocks::Put(uint64_t bytenr, std::shared_ptr<TreeBlock> b) {
  Shard& s = ShardOf(bytenr);
  std::unique_lock lock(s.mu);
  TreeBlock* raw = b.get();
  auto [it, added] = s.blocks.try_emplace(bytenr, nullptr);
  if (added) {
    count_.fetch_add(1, std::memory_order_relaxed);
  } else {
    it->second->dropped.store(true, std::memory_order_release);  // a Peek may still hold it
    s.dropped.push_back(std::move(it->second));
  }
  it->second = std::move(b);
  TableStore(s, bytenr, raw);
}

Result<std::shared_ptr<TreeBlock>> DirtyBlocks::New(uint64_t owner, int level) {
  UB_ASSIGN_OR_RETURN(uint64_t bytenr, alloc_->AllocTreeBlock(owner, level));
  auto b = TreeBlock::NewBlank(params_.nodesize);
  Header& h = b->mutable_header();
  std::memcpy(h.fsid, tmpl_.fsid, kFsidSize);
  std::memcpy(h.chunk_tree_uuid, tmpl_.chunk_tree_uuid, kUuidSize);
  h.bytenr = bytenr;
  h.flags = kMixedBackrefRev << kBackrefRevShift;
  h.generation = transid_;
  h.owner = owner;
  h.nritems = 0;
  h.level = static_cast<uint8_t>(level);
  Put(bytenr, b);
  return b;
}

Result<std::shared_ptr<TreeBlock>> DirtyBlocks::CopyToNew(const BlockRef& b, uint64_t owner) {
  UB_ASSIGN_OR_RETURN(uint64_t bytenr, alloc_->AllocTreeBlock(owner, b->level()));
  auto copy = b->Clone();
  Header& h = copy->mutable_header();
  h.bytenr = bytenr;
  h.generation = transid_;
  h.owner = owner;
  h.flags = kMixedBackrefRev << kBackrefRevShift;
  Put(bytenr, copy);
  return copy;
}

Result<std::shared_ptr<TreeBlock>> DirtyBlocks::Cow(const BlockRef& b, uint64_t owner) {
  if (auto mine = Get(b->bytenr())) return mine;
  UB_ASSIGN_OR_RETURN(auto copy, CopyToNew(b, owner));  // first: ENOSPC here leaves no reference changed
  UB_RETURN_IF_ERROR(alloc_->RetireCommitted(*b, owner));
  UB_RETURN_IF_ERROR(alloc_->FreeTreeBlock(b->bytenr(), owner, b->level(), false));
  return copy;
}

Status DirtyBlocks::Free(const TreeBlock& b, uint64_t owner) {
  bool created_here;
  {
    Shard& s = ShardOf(b.bytenr());
    std::unique_lock lock(s.mu);
    auto it = s.blocks.find(b.bytenr());
    created_here = it != s.blocks.end();
    if (created_here) {
      it->second->dropped.store(true, std::memory_order_release);
      s.dropped.push_back(std::move(it->second));
      s.blocks.erase(it);
      TableStore(s, b.bytenr(), nullptr);
    }
  }
  if (created_here) {
    count_.fetch_sub(1, std::memory_order_relaxed);
  } else {
    UB_RETURN_IF_ERROR(alloc_->RetireCommitted(b, owner));
  }
  return alloc_->FreeTreeBlock(b.bytenr(), owner, b.level(), created_here);
}

}  // namespace ubtrfs::tree
