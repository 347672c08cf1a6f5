#include "tree/dirty_blocks.h"

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
  std::shared_lock lock(mu_);
  auto it = blocks_.find(bytenr);
  return it == blocks_.end() ? nullptr : it->second;
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
  std::unique_lock lock(mu_);
  blocks_[bytenr] = b;
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
  std::unique_lock lock(mu_);
  blocks_[bytenr] = copy;
  return copy;
}

Status DirtyBlocks::Free(const TreeBlock& b, uint64_t owner) {
  bool created_here;
  {
    std::unique_lock lock(mu_);
    created_here = blocks_.erase(b.bytenr()) != 0;
  }
  return alloc_->FreeTreeBlock(b.bytenr(), owner, b.level(), created_here);
}

}  // namespace ubtrfs::tree
