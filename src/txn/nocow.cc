// Writes in place (NODATACOW files, preallocated extents) need the extent
// to be the file's alone: TxnManager::DataExtentOnlyOf.
#include <cerrno>

#include "format/ondisk.h"
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
  auto stored = ReadStoredRefs(dirty_.get(), ext.ref, bytenr);
  if (!stored.ok()) {
    // An item it cannot read is a doubt; a block it cannot read, an error.
    const int code = stored.status().code();
    if (code == EUCLEAN || code == EOPNOTSUPP) return false;
    return stored.status();
  }
  if (stored->items != 1 || stored->key.type != kExtentItemKey) return false;
  const ExtentItem& ei = stored->item;
  if (!(ei.flags.get() & kExtentFlagData) || ei.generation.get() <= tree.item.last_snapshot.get()) return false;
  uint64_t counted = 0;
  for (const InlineRef& r : stored->refs) {
    if (r.type != kExtentDataRefKey || r.root != root || r.objectid != ino || r.data_offset != offset) return false;
    counted += r.count;
  }
  return counted == ei.refs.get();
}

}  // namespace ubtrfs::txn
