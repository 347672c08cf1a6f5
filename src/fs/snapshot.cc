// Snapshot creation in the POSIX view: what the kernel's
// create_pending_snapshot does around the tree copy (txn/snapshot.cc) --
// a new subvolume id, the ROOT_REF/ROOT_BACKREF pair, the directory entry
// that names the snapshot (location: the new root, type directory), the
// UUID tree item, and a commit on each side so that the source is copied
// as committed and the snapshot is durable when the call returns.
#include <sys/random.h>

#include <cstring>

#include "fs/fs_impl.h"
#include "fs/subvolume.h"

namespace ubtrfs::fsimpl {

using namespace ubtrfs::format;

namespace {

// The kernel takes the next id above the largest objectid of the root tree
// in the subvolume range.
Result<uint64_t> NextSubvolumeId(tree::BlockSource* src, const tree::RootPtr& root_tree) {
  tree::Cursor c(src, root_tree);
  UB_RETURN_IF_ERROR(c.SeekAtOrBefore(Key{kLastFreeObjectid, 255, UINT64_MAX}));
  if (!c.Valid() || c.key().objectid < kFirstFreeObjectid) return kFirstFreeObjectid;
  if (c.key().objectid >= kLastFreeObjectid) return Status::Error(ENOSPC, "no free subvolume id");
  return c.key().objectid + 1;
}

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

Result<InodeId> FilesystemImpl::CreateSnapshot(InodeId subvol, InodeId dir, std::string_view name, bool read_only) {
  return Change({dir}, 16, [&]() -> Result<InodeId> {
    UB_RETURN_IF_ERROR(CheckName(name));
    UB_ASSIGN_OR_RETURN(auto src, SubvolTop(*vol_, subvol));
    UB_ASSIGN_OR_RETURN(Stat dst, GetStat(dir));
    if ((dst.mode & S_IFMT) != S_IFDIR) return Status::Error(ENOTDIR, InodeName(dir) + " is not a directory");
    auto existing = LookupChild(dir, name);
    if (existing.ok()) return Status::Error(EEXIST, std::string(name) + " exists");
    if (existing.status().code() != ENOENT) return existing.status();
    // The source as committed: what the copy shares is on disk.
    UB_RETURN_IF_ERROR(CommitImpl());
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, txn_->Writer(kRootTreeObjectid));
    UB_ASSIGN_OR_RETURN(const uint64_t id, NextSubvolumeId(vol_->source(), rootw->LiveRef()));
    uint8_t uuid[kUuidSize];
    if (getrandom(uuid, sizeof(uuid), 0) != static_cast<ssize_t>(sizeof(uuid))) {
      return Status::Error(errno, "getrandom for the snapshot's uuid");
    }
    UB_RETURN_IF_ERROR(txn_->SnapshotTree(subvol.root, id, read_only, uuid));

    // The entry in `dir`, with its index, and the refs between the roots.
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(dir.root));
    auto entry = DirItemBytes(Key{id, kRootItemKey, UINT64_MAX}, txn_->transid(), kFtDir, name, {});
    const uint32_t hash = static_cast<uint32_t>(NameHash(name));
    dir_items_->NoteInserted(dir.root, dir.ino, hash);
    UB_RETURN_IF_ERROR(InsertDirItem(w, dir, hash, entry));
    UB_ASSIGN_OR_RETURN(uint64_t index, NextDirIndex(dir));
    UB_RETURN_IF_ERROR(w->Insert(Key{dir.ino, kDirIndexKey, index}, entry));
    const auto ref = RootRefBytes(dir.ino, index, name);
    UB_RETURN_IF_ERROR(rootw->Insert(Key{dir.root, kRootRefKey, id}, ref));
    UB_RETURN_IF_ERROR(rootw->Insert(Key{id, kRootBackrefKey, dir.root}, ref));
    UB_RETURN_IF_ERROR(TouchDir(dir, 2 * static_cast<int64_t>(name.size())));

    // The UUID tree finds subvolumes by uuid (send/receive). An image
    // without one gets it from the kernel's next mount, which rescans.
    if (vol_->FindRoot(kUuidTreeObjectid).ok()) {
      UB_ASSIGN_OR_RETURN(tree::TreeWriter * uw, txn_->Writer(kUuidTreeObjectid));
      const Key ukey{LoadLe<uint64_t>(uuid), kUuidKeySubvol, LoadLe<uint64_t>(uuid + 8)};
      std::vector<uint8_t> ids(8);
      StoreLe<uint64_t>(ids.data(), id);
      UB_ASSIGN_OR_RETURN(auto have, tree::LookupItem(vol_->source(), uw->LiveRef(), ukey));
      if (have) {
        have->insert(have->end(), ids.begin(), ids.end());
        UB_RETURN_IF_ERROR(uw->Update(ukey, *have));
      } else {
        UB_RETURN_IF_ERROR(uw->Insert(ukey, ids));
      }
    }
    UB_RETURN_IF_ERROR(CommitImpl());
    return InodeId{id, src.item.root_dirid.get()};
  });
}

}  // namespace ubtrfs::fsimpl
