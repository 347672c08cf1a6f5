// Files that outlive their last name. POSIX keeps a file that is unlinked
// while open until its last close; the kernel's btrfs keeps such an inode
// with nlink 0 and an ORPHAN_ITEM (ORPHAN -5, ORPHAN_ITEM, ino) in its
// subvolume's tree, and deletes it at the last close -- or, after a crash,
// at the next mount's orphan cleanup. Here the same on disk: PinInode marks
// an inode open (the mount's open files), DropOrOrphan keeps a pinned inode
// whose last name went (write_ops.cc, beside DropInode), UnpinInode deletes it at the last release, and a
// writable open deletes what a crash left (CleanOrphans).
#include "fs/fs_impl.h"

namespace ubtrfs::fsimpl {

void FilesystemImpl::PinInode(InodeId id) {
  std::lock_guard lock(pins_mu_);
  ++pins_[{id.root, id.ino}].opens;
}

Status FilesystemImpl::UnpinInode(InodeId id) {
  bool orphaned;
  {
    std::lock_guard lock(pins_mu_);
    auto it = pins_.find({id.root, id.ino});
    if (it == pins_.end()) return Status::Ok();
    if (--it->second.opens > 0) return Status::Ok();
    orphaned = it->second.orphaned;
    pins_.erase(it);
  }
  if (!txn_) return Status::Ok();
  if (!orphaned) {
    // The usual last close of a file that still has its name: nothing to
    // drop, found under the shared operation lock. The exclusive one the
    // drop takes would make every close wait for every operation in flight
    // (on a create storm through the mount, a tenth of the daemon's CPU
    // went to that). An unlink that found the pin marked it orphaned before
    // the pin went; one after that found no pin and dropped the inode itself.
    auto guard = Guard();
    auto ii = LoadInode(id);
    if (!ii.ok()) return ii.status().code() == ENOENT ? Status::Ok() : ii.status();
    if (ii->nlink.get() != 0) return Status::Ok();
  }
  return Change({}, txn::ReserveFor::kDelete, 4, [&]() -> Status {
    auto ii = LoadInode(id);
    if (!ii.ok()) return ii.status().code() == ENOENT ? Status::Ok() : ii.status();
    if (ii->nlink.get() != 0) return Status::Ok();  // it has a name again, or never lost it
    UB_RETURN_IF_ERROR(DropInode(id));
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(id.root));
    Status s = w->Delete(OrphanKey(id.ino));
    return s.code() == ENOENT ? Status::Ok() : s;
  });
}

Status FilesystemImpl::CleanOrphans() {
  UB_ASSIGN_OR_RETURN(auto subvols, ListSubvolumes());  // (from 256 on)
  SubvolumeInfo top;
  top.id = kFsTreeObjectid;
  subvols.insert(subvols.begin(), top);
  for (const SubvolumeInfo& sv : subvols) {
    if (sv.read_only) continue;  // as the kernel, which cleans only what it may write
    UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(sv.id));
    std::vector<uint64_t> inos;
    {
      Cursor c(vol_->source(), tree);
      UB_RETURN_IF_ERROR(c.Seek(OrphanKey(0)));
      for (; c.Valid() && c.key().objectid == kOrphanObjectid && c.key().type == kOrphanItemKey;) {
        inos.push_back(c.key().offset);
        UB_RETURN_IF_ERROR(c.Next());
      }
    }
    for (uint64_t ino : inos) {
      const InodeId id{sv.id, ino};
      UB_RETURN_IF_ERROR(Change({}, txn::ReserveFor::kDelete, 4, [&]() -> Status {
        auto ii = LoadInode(id);
        if (!ii.ok() && ii.status().code() != ENOENT) return ii.status();
        // With names (the kernel's truncate orphans, and its marker of an
        // fs-verity enable a crash cut short), the inode stays; what such
        // an enable wrote goes, as the kernel's orphan cleanup drops it.
        // (The kernel drops it even under a VERITY flag; here a finished
        // enable's items stay, since without them the file is unreadable.)
        if (ii.ok() && ii->nlink.get() == 0) UB_RETURN_IF_ERROR(DropInode(id));
        if (ii.ok() && ii->nlink.get() != 0 && !(ii->flags.get() & kInodeRoVerity)) {
          UB_RETURN_IF_ERROR(DropVerityItems(id));
        }
        UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(id.root));
        return w->Delete(OrphanKey(ino));
      }).WithContext("removing orphan inode " + std::to_string(ino) + " of subvolume " + std::to_string(sv.id)));
    }
  }
  return Status::Ok();
}

}  // namespace ubtrfs::fsimpl
