// The directory entries that name subvolumes, and what rmdir(2), unlink(2)
// and rename(2) do to them, with the kernel's answers (checked on a loop
// mount of kernel 6.18; tests/subvolume_entries_test.cc):
// - rmdir of an empty subvolume deletes it (as `btrfs subvolume delete`),
//   read-only or not; ENOTEMPTY when it has entries, EPERM for the default
//   subvolume. rmdir of a snapshot's stub of a nested subvolume removes the
//   stub's entry. unlink of either is EISDIR.
// - A subvolume can be renamed, and moved to a directory of any subvolume
//   (a plain inode only within its own: EXDEV); a read-only one only within
//   its directory (EROFS, as the kernel's permission check on the moved
//   directory answers). It replaces an empty directory or a stub, never a
//   subvolume (ENOTEMPTY, even an empty one; EISDIR for a file).
// - RENAME_EXCHANGE swaps a subvolume with anything in the same subvolume's
//   directories, and two subvolumes anywhere.
// - A stub cannot be renamed (ENOTEMPTY) nor exchanged with (the kernel
//   aborts its transaction there; we answer ENOENT as it does first).
// A subvolume's entry lives in two trees (DIR_ITEM/DIR_INDEX in its
// parent's, ROOT_REF/ROOT_BACKREF in the root tree). The tree log carries
// only the first, so each of these changes commits before it returns, as
// subvolume creation does; the kernel forces a full commit on the next
// fsync instead. Rename takes every kind of entry in one place
// (RenameImpl, write_ops.cc), with the helpers here.
#include <sys/stat.h>

#include <cstring>

#include "fs/fs_impl.h"
#include "fs/subvolume.h"

namespace ubtrfs::fsimpl {

using namespace ubtrfs::format;

namespace {

std::vector<uint8_t> RootRefBytes(uint64_t dirid, uint64_t index, std::string_view name) {
  std::vector<uint8_t> b(sizeof(RootRef) + name.size());
  auto* rr = reinterpret_cast<RootRef*>(b.data());
  rr->dirid = dirid;
  rr->sequence = index;
  rr->name_len = static_cast<uint16_t>(name.size());
  std::memcpy(b.data() + sizeof(RootRef), name.data(), name.size());
  return b;
}

}  // namespace

FilesystemImpl::EntryKind FilesystemImpl::KindOf(InodeId dir, InodeId target) {
  if (target.root == dir.root) return EntryKind::kInode;
  return target.ino == kEmptySubvolDirObjectid ? EntryKind::kStub : EntryKind::kSubvolume;
}

Status FilesystemImpl::LinkSubvolumeEntry(InodeId dir, std::string_view name, uint64_t id) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, txn_->Writer(kRootTreeObjectid));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(dir.root));
  auto entry = DirItemBytes(Key{id, kRootItemKey, UINT64_MAX}, txn_->transid(), kFtDir, name, {});
  const uint32_t hash = static_cast<uint32_t>(NameHash(name));
  UB_RETURN_IF_ERROR(FlushDirItems(dir));
  dir_items_->NoteInserted(dir.root, dir.ino, hash);
  UB_RETURN_IF_ERROR(InsertDirItem(w, dir, hash, entry));
  UB_ASSIGN_OR_RETURN(uint64_t index, NextDirIndex(dir));
  UB_RETURN_IF_ERROR(w->Insert(Key{dir.ino, kDirIndexKey, index}, entry));
  const auto ref = RootRefBytes(dir.ino, index, name);
  UB_RETURN_IF_ERROR(rootw->Insert(Key{dir.root, kRootRefKey, id}, ref));
  UB_RETURN_IF_ERROR(rootw->Insert(Key{id, kRootBackrefKey, dir.root}, ref));
  return TouchDir(dir, 2 * static_cast<int64_t>(name.size()));
}

Status FilesystemImpl::UnlinkSubvolumeEntry(InodeId dir, std::string_view name, uint64_t id) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, txn_->Writer(kRootTreeObjectid));
  UB_RETURN_IF_ERROR(DropNameFromDirItem(dir, name));
  // The ROOT_REF records the DIR_INDEX the entry has.
  const Key ref_key{dir.root, kRootRefKey, id};
  UB_ASSIGN_OR_RETURN(auto ref, tree::LookupItem(vol_->source(), rootw->LiveRef(), ref_key));
  if (!ref || ref->size() < sizeof(RootRef)) return Status::Corrupt("subvolume " + std::to_string(id) + ": no ROOT_REF");
  const uint64_t index = reinterpret_cast<const RootRef*>(ref->data())->sequence.get();
  UB_RETURN_IF_ERROR(rootw->Delete(ref_key));
  UB_RETURN_IF_ERROR(rootw->Delete(Key{id, kRootBackrefKey, dir.root}));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(dir.root));
  if (!delayed_->Cancel(dir.root, dir.ino, index)) {
    UB_RETURN_IF_ERROR(w->Delete(Key{dir.ino, kDirIndexKey, index}).WithContext("dir index of '" + std::string(name) + "'"));
  }
  return TouchDir(dir, -2 * static_cast<int64_t>(name.size()));
}

// A stub has no ROOT_REF to name its index: the directory's DIR_INDEX items
// are searched for the entry.
Status FilesystemImpl::RemoveStubEntry(InodeId dir, std::string_view name, InodeId stub) {
  UB_RETURN_IF_ERROR(DropNameFromDirItem(dir, name));
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(dir.root));
  std::optional<Key> found;
  {
    Cursor c(vol_->source(), tree);
    UB_RETURN_IF_ERROR(c.Seek(Key{dir.ino, kDirIndexKey, 0}));
    while (c.Valid() && !found) {
      const Key k = c.key();
      if (k.objectid != dir.ino || k.type != kDirIndexKey) break;
      UB_ASSIGN_OR_RETURN(auto entries, ParseDirItems(c.data(), k));
      for (const auto& e : entries) {
        if (e.location.type == kRootItemKey && e.location.objectid == stub.root && e.name == name) found = k;
      }
      UB_RETURN_IF_ERROR(c.Next());
    }
  }
  if (!found) return Status::Corrupt(InodeName(dir) + ": entry '" + std::string(name) + "' has no DIR_INDEX");
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(dir.root));
  UB_RETURN_IF_ERROR(w->Delete(*found));
  return TouchDir(dir, -2 * static_cast<int64_t>(name.size()));
}

Status FilesystemImpl::RmdirSubvolumeEntry(InodeId dir, std::string_view name, InodeId target) {
  if (KindOf(dir, target) == EntryKind::kStub) {
    UB_RETURN_IF_ERROR(RemoveStubEntry(dir, name, target));
    return hold_commits_ ? Status::Ok() : CommitImpl();
  }
  UB_ASSIGN_OR_RETURN(auto entries, ReadDir(target));
  if (!entries.empty()) return Status::Error(ENOTEMPTY, std::string(name) + ": directory not empty");
  {
    auto lock = txn_->AllocLock();
    UB_RETURN_IF_ERROR(txn_->chunk_alloc().ReserveMetadata(kItemsPerDeleteSubvol, txn::ReserveFor::kDelete));
  }
  return RemoveSubvolume(dir, name, target);
}

}  // namespace ubtrfs::fsimpl
