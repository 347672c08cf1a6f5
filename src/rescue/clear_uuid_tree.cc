// `btrfs rescue clear-uuid-tree` (ubtrfs/rescue.h). The tree is only an
// index (subvolume uuids to ids, built again by the kernel from the root
// items), so it can go whole. Its blocks are freed as the extent tree
// records them: a UUID tree worth clearing is often one that does not read.
#include "format/ondisk.h"
#include "rescue/repairs.h"
#include "rescue/rescue_open.h"
#include "tree/cursor.h"
#include "txn/extent_refs.h"
#include "ubtrfs/rescue.h"

namespace ubtrfs {

namespace {

using namespace ubtrfs::format;

struct OwnedBlock {
  uint64_t bytenr = 0;
  int level = 0;
};

// The tree's blocks by walking it; false when one does not read.
Result<bool> WalkTree(txn::Volume& vol, const tree::RootPtr& root, std::vector<OwnedBlock>* out) {
  std::vector<tree::BlockCheck> todo{tree::BlockCheck{root.bytenr, root.level, root.generation, {}}};
  while (!todo.empty()) {
    const tree::BlockCheck want = todo.back();
    todo.pop_back();
    auto b = vol.reader()->Read(want);
    if (!b.ok()) return false;
    out->push_back({want.bytenr, (*b)->level()});
    if ((*b)->is_leaf()) continue;
    for (int i = 0; i < (*b)->nritems(); ++i) {
      todo.push_back(tree::BlockCheck{(*b)->child_bytenr(i), (*b)->level() - 1, (*b)->child_generation(i), (*b)->key(i)});
    }
  }
  return true;
}

// Every tree block the extent tree says tree `owner` references (inline or
// keyed TREE_BLOCK_REF), read or not.
Status OwnedPerExtentTree(txn::Volume& vol, uint64_t owner, std::vector<OwnedBlock>* out) {
  UB_ASSIGN_OR_RETURN(auto extent_root, vol.FindRoot(kExtentTreeObjectid));
  tree::Cursor c(vol.reader(), extent_root.ref);
  UB_RETURN_IF_ERROR(c.SeekFirst());
  OwnedBlock cur;  // the tree block whose keyed refs follow its item
  for (; c.Valid(); ) {
    const Key k = c.key();
    const auto d = c.data();
    if (k.type == kMetadataItemKey || k.type == kExtentItemKey) {
      // (a data extent, or an item too short to say, names no block)
      auto head = txn::ParseExtentItemHead(k, d);
      cur = head.ok() && head->tree_block ? OwnedBlock{k.objectid, head->level} : OwnedBlock{};
      if (cur.bytenr != 0) {
        UB_ASSIGN_OR_RETURN(auto refs,
                            txn::ParseInlineRefs(std::vector<uint8_t>(d.begin(), d.end()), head->refs_start, k));
        for (const auto& r : refs) {
          if (r.type == kTreeBlockRefKey && r.offset == owner) out->push_back(cur);
        }
      }
    } else if (k.type == kTreeBlockRefKey && k.offset == owner && k.objectid == cur.bytenr && cur.bytenr != 0) {
      out->push_back(cur);
    }
    UB_RETURN_IF_ERROR(c.Next());
  }
  return Status::Ok();
}

}  // namespace

namespace rescue {

Result<ClearUuidTreeResult> ClearUuidTreeIn(txn::Volume& vol, txn::TxnManager& txn) {
  ClearUuidTreeResult r;
  auto root = vol.FindRoot(kUuidTreeObjectid);
  if (!root.ok()) {
    if (root.status().code() == ENOENT) return r;
    return root.status().WithContext("the UUID tree's root item");
  }
  r.had_tree = true;
  std::vector<OwnedBlock> blocks;
  UB_ASSIGN_OR_RETURN(bool whole, WalkTree(vol, root->ref, &blocks));
  if (!whole) {
    blocks.clear();
    UB_RETURN_IF_ERROR(OwnedPerExtentTree(vol, kUuidTreeObjectid, &blocks)
                           .WithContext("finding the UUID tree's blocks in the extent tree"));
  }
  for (const OwnedBlock& b : blocks) {
    UB_RETURN_IF_ERROR(txn.FreeTreeBlock(b.bytenr, kUuidTreeObjectid, b.level, /*created_here=*/false)
                           .WithContext("freeing UUID tree block " + std::to_string(b.bytenr)));
  }
  r.blocks_freed = blocks.size();
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, txn.Writer(kRootTreeObjectid));
  UB_RETURN_IF_ERROR(rootw->Delete(root->item_key).WithContext("the UUID tree's root item"));
  UB_ASSIGN_OR_RETURN(txn::Volume::TreeRoot * tr, vol.MutableRoot(kUuidTreeObjectid));
  std::lock_guard lock(vol.roots_mutex());
  tr->deleted = true;
  return r;
}

}  // namespace rescue

Result<ClearUuidTreeResult> ClearUuidTree(const std::string& image, const OpenOptions& where) {
  return rescue::RepairAndCommit<ClearUuidTreeResult>(
      image, where, "the UUID tree's blocks may lie on any of them", rescue::ClearUuidTreeIn,
      [](const ClearUuidTreeResult& r) { return r.had_tree; });
}

}  // namespace ubtrfs
