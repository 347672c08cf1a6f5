#include "tree/dirty_blocks.h"

#include <algorithm>
#include <cstring>

namespace ubtrfs::tree {

using namespace ubtrfs::format;

Result<BlockRef> DirtyBlocks::Read(const BlockCheck& check) {
  std::shared_ptr<TreeBlock> mine = Get(check.bytenr);
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
  if (s.blocks.insert_or_assign(bytenr, std::move(b)).second) count_.fetch_add(1, std::memory_order_relaxed);
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

Result<std::shared_ptr<TreeBlock>> DirtyBlocks::Cow(const BlockRef& b, uint64_t owner) {
  if (auto mine = Get(b->bytenr())) return mine;
  UB_ASSIGN_OR_RETURN(uint64_t bytenr, alloc_->AllocTreeBlock(owner, b->level()));
  auto copy = b->Clone();
  Header& h = copy->mutable_header();
  h.bytenr = bytenr;
  h.generation = transid_;
  h.owner = owner;
  h.flags = kMixedBackrefRev << kBackrefRevShift;
  UB_RETURN_IF_ERROR(alloc_->FreeTreeBlock(b->bytenr(), owner, b->level(), false));
  Put(bytenr, copy);
  return copy;
}

Status DirtyBlocks::Free(const TreeBlock& b, uint64_t owner) {
  bool created_here;
  {
    Shard& s = ShardOf(b.bytenr());
    std::unique_lock lock(s.mu);
    created_here = s.blocks.erase(b.bytenr()) != 0;
  }
  if (created_here) count_.fetch_sub(1, std::memory_order_relaxed);
  return alloc_->FreeTreeBlock(b.bytenr(), owner, b.level(), created_here);
}

}  // namespace ubtrfs::tree
