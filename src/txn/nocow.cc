// Writes in place (NODATACOW files, preallocated extents) need the extent
// to be the file's alone: TxnManager::DataExtentOnlyOf.
#include "format/ondisk.h"
#include "tree/cursor.h"
#include "txn/extent_refs.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

Result<bool> TxnManager::DataExtentOnlyOf(uint64_t bytenr, uint64_t root, uint64_t ino, uint64_t offset) {
  {
    // The queue only, under its lock: the extent tree is read without it
    // (node locks come before this lock, never after). Nothing adds a
    // reference meanwhile: clones and snapshots run exclusive, and the
    // extent tree changes at the commit only.
    auto lock = AllocLock();
    const auto pending = pending_.find(bytenr);
    const bool changed = pending != pending_.end() && (!pending->second.refs.empty() || pending->second.set_flags);
    // References this transaction adds or drops: the file's own only (its
    // earlier writes into the same extent split the item).
    if (changed) {
      if (pending->second.tree || pending->second.set_flags) return false;
      for (const auto& [r, d] : pending->second.refs) {
        if (r.type != kExtentDataRefKey || r.a != root || r.ino != ino || r.off != offset) return false;
      }
    }
    if (new_data_.count(bytenr)) {
      // Written in this transaction: no extent item yet, and no snapshot
      // can share it (a snapshot's source has no uncommitted changes).
      return changed;
    }
  }
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot tree, vol_->FindRoot(root));
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot ext, vol_->FindRoot(kExtentTreeObjectid));
  tree::Cursor c(dirty_.get(), ext.ref);
  UB_RETURN_IF_ERROR(c.Seek(Key{bytenr, kExtentItemKey, 0}));
  if (!c.Valid() || c.key().objectid != bytenr || c.key().type != kExtentItemKey) return false;
  const Key key = c.key();
  const std::vector<uint8_t> item(c.data().begin(), c.data().end());
  if (item.size() < sizeof(ExtentItem)) return false;
  const auto* ei = reinterpret_cast<const ExtentItem*>(item.data());
  if (!(ei->flags.get() & kExtentFlagData) || ei->generation.get() <= tree.item.last_snapshot.get()) return false;
  auto refs = ParseInlineRefs(item, sizeof(ExtentItem), key);
  if (!refs.ok()) return false;
  uint64_t counted = 0;
  for (const InlineRef& r : *refs) {
    if (r.type != kExtentDataRefKey || r.root != root || r.objectid != ino || r.data_offset != offset) return false;
    counted += r.count;
  }
  // Keyed references after the item (more than fit inline).
  UB_RETURN_IF_ERROR(c.Next());
  for (; c.Valid() && c.key().objectid == bytenr;) {
    const Key k = c.key();
    if (k.type == kExtentDataRefKey && c.data().size() >= sizeof(ExtentDataRef)) {
      const auto* dr = reinterpret_cast<const ExtentDataRef*>(c.data().data());
      if (dr->root.get() != root || dr->objectid.get() != ino || dr->offset.get() != offset) return false;
      counted += dr->count.get();
    } else if (k.type == kSharedDataRefKey || k.type == kExtentItemKey || k.type == kMetadataItemKey) {
      return false;
    }
    UB_RETURN_IF_ERROR(c.Next());
  }
  return counted == ei->refs.get();
}

}  // namespace ubtrfs::txn
