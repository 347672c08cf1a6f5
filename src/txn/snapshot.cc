// A snapshot as the kernel's create_pending_snapshot makes it: the new tree
// gets a copy of the source's committed root block (root blocks are never
// shared), every child of that block gains a reference keyed by the new
// tree, and the source's last_snapshot moves to this transaction, which
// tells every later copy on write (here and in the kernel) that blocks up to
// that generation may be shared. O(size of one block), whatever the tree.
#include <sys/random.h>
#include <time.h>

#include <cstring>

#include "format/ondisk.h"
#include "txn/transaction.h"
#include "txn/clock.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

Status TxnManager::SnapshotTree(uint64_t src, uint64_t new_id, bool read_only, const uint8_t (&uuid)[kUuidSize]) {
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * from, vol_->MutableRoot(src));
  if (from->ref.generation >= transid()) {
    return Status::Error(EIO, "internal: snapshot of tree " + std::to_string(src) + " with uncommitted changes");
  }
  if (vol_->FindRoot(new_id).ok()) return Status::Error(EEXIST, "tree " + std::to_string(new_id) + " exists");
  UB_ASSIGN_OR_RETURN(tree::BlockRef top,
                      dirty_->Read(tree::BlockCheck{from->ref.bytenr, from->ref.level, from->ref.generation, {}}));
  UB_ASSIGN_OR_RETURN(auto copy, dirty_->CopyToNew(top, new_id));
  {
    auto lock = AllocLock();
    any_shared_.store(true, std::memory_order_relaxed);
    ChangeChildRefs(*top, new_id, +1);
  }
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, Writer(kRootTreeObjectid));
  {
    std::lock_guard lock(vol_->roots_mutex());
    from->item.last_snapshot = transid();
  }
  UB_RETURN_IF_ERROR(rootw->Update(from->item_key, std::span(reinterpret_cast<const uint8_t*>(&from->item),
                                                             from->item_size)));
  RootItem item = from->item;  // zero past a v1 item's end: the v2 fields are set below
  item.bytenr = copy->bytenr();
  item.level = static_cast<uint8_t>(copy->level());
  item.generation = transid();
  item.generation_v2 = transid();
  item.refs = 1;
  std::memset(&item.drop_progress, 0, sizeof(item.drop_progress));
  item.drop_level = 0;
  uint64_t flags = item.flags.get();
  // As the kernel's btrfs_check_and_init_root_item.
  if (!(item.inode.flags.get() & kInodeRootItemInit)) {
    item.inode.flags = item.inode.flags.get() | kInodeRootItemInit;
    flags = 0;
  }
  item.flags = read_only ? flags | kRootSubvolRdonly : flags & ~kRootSubvolRdonly;
  std::memcpy(item.parent_uuid, from->item.uuid, kUuidSize);
  std::memcpy(item.uuid, uuid, kUuidSize);
  if (!read_only) {
    // A writable snapshot is no received subvolume (send/receive would
    // trust it unchanged).
    std::memset(item.received_uuid, 0, kUuidSize);
    item.stransid = 0;
    item.rtransid = 0;
    std::memset(&item.stime, 0, sizeof(item.stime));
    std::memset(&item.rtime, 0, sizeof(item.rtime));
  }
  const timespec now = WallClock();
  item.otime.sec = static_cast<uint64_t>(now.tv_sec);
  item.otime.nsec = static_cast<uint32_t>(now.tv_nsec);
  item.otransid = transid();
  // The key's offset records the transaction that made the snapshot.
  return rootw->Insert(Key{new_id, kRootItemKey, transid()},
                       std::span(reinterpret_cast<const uint8_t*>(&item), sizeof(item)));
}

}  // namespace ubtrfs::txn

namespace ubtrfs::txn {

Result<tree::TreeWriter*> TxnManager::CreateTree(uint64_t id, format::RootItem item, uint64_t item_offset) {
  if (vol_->FindRoot(id).ok()) return Status::Error(EEXIST, "tree " + std::to_string(id) + " exists");
  UB_ASSIGN_OR_RETURN(auto leaf, dirty_->New(id, 0));
  item.bytenr = leaf->bytenr();
  item.level = 0;
  item.generation = transid();
  item.generation_v2 = transid();
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, Writer(kRootTreeObjectid));
  UB_RETURN_IF_ERROR(rootw->Insert(Key{id, kRootItemKey, item_offset},
                                   std::span(reinterpret_cast<const uint8_t*>(&item), sizeof(item))));
  return Writer(id);
}

}  // namespace ubtrfs::txn
