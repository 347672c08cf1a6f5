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
// fsync instead.
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
  UB_RETURN_IF_ERROR(txn_->chunk_alloc().ReserveMetadata(kItemsPerDeleteSubvol, txn::ReserveFor::kDelete));
  return RemoveSubvolume(dir, name, target);
}

Status FilesystemImpl::RenameSubvolumeEntry(InodeId old_dir, std::string_view old_name, InodeId src, InodeId new_dir,
                                            std::string_view new_name, std::optional<InodeId> dst, unsigned flags) {
  const EntryKind ks = KindOf(old_dir, src);
  const EntryKind kd = dst ? KindOf(new_dir, *dst) : EntryKind::kInode;  // used only with dst
  if (ks == EntryKind::kStub) return Status::Error(ENOTEMPTY, std::string(old_name) + ": a stub of a subvolume cannot move");
  const bool exchange = flags & kRenameExchange;
  if (exchange && kd == EntryKind::kStub) {
    return Status::Error(ENOENT, std::string(new_name) + ": a stub of a subvolume cannot be exchanged with");
  }
  UB_ASSIGN_OR_RETURN(InodeItem src_ii, LoadInode(src));
  const bool src_dir = S_ISDIR(src_ii.mode.get());
  // A directory (a subvolume's top is one) moved into itself.
  if (src_dir) {
    UB_ASSIGN_OR_RETURN(bool loop, IsAncestor(src, new_dir));
    if (loop) return Status::Invalid("cannot move a directory into itself");
  }
  std::optional<InodeItem> dst_ii;
  if (dst && kd != EntryKind::kStub) {
    UB_ASSIGN_OR_RETURN(dst_ii, LoadInode(*dst));
  }
  const bool dst_dir = dst && (kd == EntryKind::kStub || S_ISDIR(dst_ii->mode.get()));
  if (exchange) {
    if (dst_dir) {
      UB_ASSIGN_OR_RETURN(bool loop, IsAncestor(*dst, old_dir));
      if (loop) return Status::Invalid("cannot move a directory into itself");
    }
    if (old_dir.root != new_dir.root && (ks != EntryKind::kSubvolume || kd != EntryKind::kSubvolume)) {
      return Status::Error(EXDEV, "only subvolumes are exchanged across subvolumes");
    }
  } else if (dst) {
    UB_ASSIGN_OR_RETURN(bool holds_src, IsAncestor(*dst, old_dir));
    if (holds_src) return Status::Error(ENOTEMPTY, std::string(new_name) + ": directory not empty");
    if (src_dir && !dst_dir) return Status::Error(ENOTDIR, std::string(new_name) + " is not a directory");
    if (!src_dir && dst_dir) return Status::Error(EISDIR, std::string(new_name) + " is a directory");
    if (kd == EntryKind::kSubvolume) return Status::Error(ENOTEMPTY, std::string(new_name) + " is a subvolume");
  }
  if (ks == EntryKind::kInode && old_dir.root != new_dir.root) return Status::Error(EXDEV, "rename across subvolumes");
  // Moving a directory rewrites its ".."; the kernel asks for write access
  // to it, which a read-only subvolume's top refuses.
  if (!(old_dir == new_dir)) {
    std::vector<uint64_t> moved;
    if (ks == EntryKind::kSubvolume) moved.push_back(src.root);
    if (exchange && kd == EntryKind::kSubvolume) moved.push_back(dst->root);
    for (uint64_t root : moved) {
      UB_ASSIGN_OR_RETURN(bool ro, subvols_->ReadOnly(root));
      if (ro) return Status::Error(EROFS, "subvolume " + std::to_string(root) + " is read-only");
    }
  }
  if (dst && !exchange && kd == EntryKind::kInode && dst_dir) {
    UB_ASSIGN_OR_RETURN(auto entries, ReadDir(*dst));
    if (!entries.empty()) return Status::Error(ENOTEMPTY, std::string(new_name) + ": directory not empty");
  }

  const Time now = Now();
  auto unlink = [&](InodeId dir, std::string_view name, InodeId id, EntryKind kind) -> Status {
    if (kind == EntryKind::kSubvolume) return UnlinkSubvolumeEntry(dir, name, id.root);
    if (kind == EntryKind::kStub) return RemoveStubEntry(dir, name, id);
    return RemoveLink(dir, name, id, nullptr);
  };
  auto link = [&](InodeId dir, std::string_view name, InodeId id, EntryKind kind, const InodeItem& ii) -> Status {
    if (kind == EntryKind::kSubvolume) return LinkSubvolumeEntry(dir, name, id.root);
    UB_RETURN_IF_ERROR(AddLink(dir, name, id, FileTypeOfMode(ii.mode.get()), nullptr));
    // A subvolume's top keeps its ctime: the kernel changes it in memory only.
    UB_ASSIGN_OR_RETURN(InodeItem now_ii, LoadInode(id));
    SetTime(now_ii.ctime, now);
    return StoreInode(id, now_ii);
  };
  UB_RETURN_IF_ERROR(unlink(old_dir, old_name, src, ks));
  if (dst) {
    UB_RETURN_IF_ERROR(unlink(new_dir, new_name, *dst, kd));
    if (!exchange && kd == EntryKind::kInode) UB_RETURN_IF_ERROR(DropName(*dst, dst_dir, now));
  }
  UB_RETURN_IF_ERROR(link(new_dir, new_name, src, ks, src_ii));
  if (exchange) UB_RETURN_IF_ERROR(link(old_dir, old_name, *dst, kd, *dst_ii));
  return hold_commits_ ? Status::Ok() : CommitImpl();
}

}  // namespace ubtrfs::fsimpl
