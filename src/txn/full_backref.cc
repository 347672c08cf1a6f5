// Copy-on-write of tree blocks with full backrefs (what balance leaves).
//
// A tree block whose extent item has the FULL_BACKREF flag references its
// children by its own address: each child tree block has a SHARED_BLOCK_REF
// keyed by the parent's bytenr, and each data extent a leaf points at has a
// SHARED_DATA_REF keyed by the leaf's bytenr. Relocation leaves such blocks
// behind, each with one reference. When the write path copies (or frees)
// such a block that only one tree holds, the copy is an ordinary block
// (TREE_BLOCK_REF by its tree, what AllocTreeBlock gives it), and the
// references of its children move with it: each child gains a reference
// keyed by the tree and loses the shared one keyed by the old block, as the
// kernel's update_ref_for_cow does for a block with one reference.
//
// Blocks shared for real (refs > 1: snapshots) are still refused when the
// image is opened (transaction.cc).
#include <cstring>

#include "format/ondisk.h"
#include "txn/extent_refs.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

Status TxnManager::NoteExtentItemForCow(const Key& k, uint64_t flags) {
  if (flags & kBlockFlagFullBackref) {
    full_backref_.insert(k.objectid);
    any_full_backref_.store(true, std::memory_order_relaxed);
  }
  return Status::Ok();
}

Status TxnManager::RetireCommitted(const tree::TreeBlock& b, uint64_t owner) {
  if (!any_full_backref_.load(std::memory_order_relaxed)) return Status::Ok();
  auto lock = AllocLock();
  const uint64_t parent = b.bytenr();
  if (full_backref_.erase(parent) == 0) return Status::Ok();
  if (!b.is_leaf()) {
    for (int i = 0; i < b.nritems(); ++i) {
      RefMove& m = tree_ref_moves_[b.child_bytenr(i)];
      m.parent = parent;
      m.root = owner;
      m.level = b.level() - 1;
    }
    return Status::Ok();
  }
  for (int i = 0; i < b.nritems(); ++i) {
    const Key k = b.key(i);
    if (k.type != kExtentDataKey) continue;
    auto d = b.item_data(i);
    if (d.size() < sizeof(FileExtentItem)) continue;  // inline extents reference no data extent
    const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
    if (fe->type != kFileExtentReg && fe->type != kFileExtentPrealloc) continue;
    const uint64_t disk = fe->disk_bytenr.get(), disk_len = fe->disk_num_bytes.get();
    if (disk == 0) continue;  // a hole
    shared_data_refs_[{disk, disk_len, parent}] -= 1;
    data_refs_[{disk, disk_len, owner, k.objectid, k.offset - fe->offset.get()}] += 1;
  }
  return Status::Ok();
}

Status TxnManager::DeleteTreeBlockItems(uint64_t bytenr, int level) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * ext, Writer(kExtentTreeObjectid));
  const std::string where = "dropping tree block " + std::to_string(bytenr);
  UB_RETURN_IF_ERROR(ext->Delete(Key{bytenr, kMetadataItemKey, static_cast<uint64_t>(level)}).WithContext(where));
  if (auto it = tree_ref_items_.find(bytenr); it != tree_ref_items_.end()) {
    for (const Key& k : it->second) UB_RETURN_IF_ERROR(ext->Delete(k).WithContext(where));
    tree_ref_items_.erase(it);
  }
  return Status::Ok();
}

Status TxnManager::MoveTreeRef(uint64_t bytenr, const RefMove& move) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * ext, Writer(kExtentTreeObjectid));
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * ext_root, vol_->MutableRoot(kExtentTreeObjectid));
  const Key key{bytenr, kMetadataItemKey, static_cast<uint64_t>(move.level)};
  const std::string where = "tree block " + std::to_string(bytenr) + " (child of " + std::to_string(move.parent) + ")";
  UB_ASSIGN_OR_RETURN(auto existing, tree::LookupItem(dirty_.get(), ext_root->ref, key));
  if (!existing) return Status::Corrupt(where + ": no METADATA_ITEM " + KeyToString(key));
  std::vector<uint8_t>& item = *existing;
  if (item.size() < sizeof(ExtentItem)) return Status::Corrupt(where + ": short extent item");
  UB_ASSIGN_OR_RETURN(auto refs, ParseInlineRefs(item, sizeof(ExtentItem), key));
  InlineRef shared;
  shared.type = kSharedBlockRefKey;
  shared.offset = move.parent;
  if (auto r = FindInlineRef(refs, shared)) {
    EraseInlineRef(item, *r);
    UB_ASSIGN_OR_RETURN(refs, ParseInlineRefs(item, sizeof(ExtentItem), key));
  } else {
    // The shared ref is an item of its own.
    const Key ref_key{bytenr, kSharedBlockRefKey, move.parent};
    auto it = tree_ref_items_.find(bytenr);
    bool found = false;
    if (it != tree_ref_items_.end()) {
      for (size_t i = 0; i < it->second.size(); ++i) {
        if (it->second[i] == ref_key) {
          it->second.erase(it->second.begin() + static_cast<long>(i));
          found = true;
          break;
        }
      }
    }
    if (!found) return Status::Corrupt(where + ": no SHARED_BLOCK_REF to its parent");
    UB_RETURN_IF_ERROR(ext->Delete(ref_key).WithContext(where));
  }
  InlineRef keyed;
  keyed.type = kTreeBlockRefKey;
  keyed.offset = move.root;
  if (FindInlineRef(refs, keyed)) return Status::Corrupt(where + ": referenced twice by tree " + std::to_string(move.root));
  InsertInlineRef(item, refs, sizeof(ExtentItem), keyed);
  return ext->Update(key, item).WithContext(where);
}

Status TxnManager::ApplySharedDataRef(const std::tuple<uint64_t, uint64_t, uint64_t>& ref, int delta) {
  const auto [bytenr, num_bytes, parent] = ref;
  const std::string where = "data extent " + std::to_string(bytenr) + " (shared ref of leaf " + std::to_string(parent) + ")";
  if (delta > 0) return Status::Error(EIO, "internal: " + where + ": adding shared data refs");
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * ext, Writer(kExtentTreeObjectid));
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * ext_root, vol_->MutableRoot(kExtentTreeObjectid));
  const Key key{bytenr, kExtentItemKey, num_bytes};
  UB_ASSIGN_OR_RETURN(auto existing, tree::LookupItem(dirty_.get(), ext_root->ref, key));
  if (!existing) return Status::Corrupt(where + ": no EXTENT_ITEM");
  std::vector<uint8_t>& item = *existing;
  if (item.size() < sizeof(ExtentItem)) return Status::Corrupt(where + ": short extent item");
  const uint64_t drop = static_cast<uint64_t>(-delta);
  UB_ASSIGN_OR_RETURN(auto refs, ParseInlineRefs(item, sizeof(ExtentItem), key));
  InlineRef want;
  want.type = kSharedDataRefKey;
  want.offset = parent;
  std::optional<InlineRef> inl = FindInlineRef(refs, want);
  const Key ref_key{bytenr, kSharedDataRefKey, parent};
  std::optional<std::vector<uint8_t>> separate;
  if (!inl) {
    UB_ASSIGN_OR_RETURN(separate, tree::LookupItem(dirty_.get(), ext_root->ref, ref_key));
    if (!separate || separate->size() < sizeof(SharedDataRef)) return Status::Corrupt(where + ": no such reference");
  }
  const uint64_t count = inl ? inl->count : reinterpret_cast<const SharedDataRef*>(separate->data())->count.get();
  auto* ei = reinterpret_cast<ExtentItem*>(item.data());
  if (count < drop || ei->refs.get() < drop) return Status::Corrupt(where + ": reference count below zero");
  const uint64_t refs_left = ei->refs.get() - drop;
  if (refs_left == 0) {
    if (separate) UB_RETURN_IF_ERROR(ext->Delete(ref_key).WithContext(where));
    UB_RETURN_IF_ERROR(ext->Delete(key).WithContext(where));
    UB_RETURN_IF_ERROR(space_->Free(bytenr, num_bytes));
    MarkGroupDirty(bytenr);
    return DeleteCsums(bytenr, num_bytes);
  }
  ei->refs = refs_left;
  if (inl) {
    if (count == drop) {
      EraseInlineRef(item, *inl);
    } else {
      SetInlineCount(item, *inl, static_cast<uint32_t>(count - drop));
    }
  } else if (count == drop) {
    UB_RETURN_IF_ERROR(ext->Delete(ref_key).WithContext(where));
  } else {
    reinterpret_cast<SharedDataRef*>(separate->data())->count = static_cast<uint32_t>(count - drop);
    UB_RETURN_IF_ERROR(ext->Update(ref_key, *separate).WithContext(where));
  }
  return ext->Update(key, item).WithContext(where);
}

}  // namespace ubtrfs::txn
