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
  return DropOrphanInSteps(id);
}

Result<bool> FilesystemImpl::HasMoreExtentsThan(InodeId id, size_t n) {
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
  Cursor c(vol_->source(), tree);
  UB_RETURN_IF_ERROR(c.Seek(Key{id.ino, kExtentDataKey, 0}));
  for (size_t seen = 0; c.Valid() && c.key().objectid == id.ino && c.key().type == kExtentDataKey; ++seen) {
    if (seen == n) return true;
    UB_RETURN_IF_ERROR(c.Next());
  }
  return false;
}

void FilesystemImpl::StageDrop(InodeId id) {
  std::lock_guard lock(staged_mu_);
  staged_drops_.push_back(id);
  has_staged_.store(true, std::memory_order_relaxed);
}

Status FilesystemImpl::DropStaged() {
  // The steps are changes of their own, which end here again.
  static thread_local bool dropping = false;
  if (dropping) return Status::Ok();
  dropping = true;
  struct Reset {
    ~Reset() { dropping = false; }
  } reset;
  for (;;) {
    InodeId id;
    {
      std::lock_guard lock(staged_mu_);
      if (staged_drops_.empty()) {
        has_staged_.store(false, std::memory_order_relaxed);
        return Status::Ok();
      }
      id = staged_drops_.back();
      staged_drops_.pop_back();
    }
    Status st = DropOrphanInSteps(id);
    // The name is gone and the orphan item is in the tree: a device too full
    // to drop the rest now leaves it to the next writable open (as the
    // kernel's orphan cleanup), not the caller's change undone.
    if (!st.ok() && st.code() != ENOSPC) return st;
  }
}

Status FilesystemImpl::DropOrphanInSteps(InodeId id) {
  for (;;) {
    bool done = false;
    // Each step is a change of its own: one that meets a full device
    // commits (releasing what the steps before it freed) and runs again.
    UB_RETURN_IF_ERROR(Change({}, txn::ReserveFor::kDelete, 8, [&]() -> Status {
      auto ii = LoadInode(id);
      if (!ii.ok()) {
        done = true;
        return ii.status().code() == ENOENT ? Status::Ok() : ii.status();
      }
      if (ii->nlink.get() != 0) {  // it has a name again, or never lost it
        done = true;
        return Status::Ok();
      }
      // The last kDropStepExtents extent items go, and the size comes down
      // to where they began (the kernel's truncate of an evicted inode;
      // what a commit between steps writes is a file that is shorter).
      uint64_t cut = 0;
      bool more = false;  // extent items before the step's
      {
        UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
        Cursor c(vol_->source(), tree);
        UB_RETURN_IF_ERROR(c.SeekAtOrBefore(Key{id.ino, kExtentDataKey, UINT64_MAX}));
        auto extent_item = [&] { return c.Valid() && c.key().objectid == id.ino && c.key().type == kExtentDataKey; };
        for (size_t found = 0; extent_item() && found < kDropStepExtents; ++found) {
          cut = c.key().offset;
          UB_RETURN_IF_ERROR(c.Prev());
        }
        more = extent_item();
      }
      if (more) {
        int64_t nbytes = 0;
        UB_RETURN_IF_ERROR(DropExtents(id, cut, UINT64_MAX, &nbytes));
        InodeItem next = *ii;
        next.size = cut;
        next.nbytes = static_cast<uint64_t>(std::max<int64_t>(0, static_cast<int64_t>(next.nbytes.get()) + nbytes));
        return StoreInode(id, next);
      }
      done = true;
      UB_RETURN_IF_ERROR(DropInode(id));
      UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(id.root));
      Status s = w->Delete(OrphanKey(id.ino));
      return s.code() == ENOENT ? Status::Ok() : s;
    }));
    if (done) return Status::Ok();
  }
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
      if (auto ii = LoadInode(id); ii.ok() && ii->nlink.get() == 0 && S_ISREG(ii->mode.get())) {
        UB_RETURN_IF_ERROR(DropOrphanInSteps(id).WithContext("removing orphan inode " + std::to_string(ino) +
                                                             " of subvolume " + std::to_string(sv.id)));
        continue;
      }
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
