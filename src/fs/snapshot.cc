// Snapshot creation in the POSIX view: what the kernel's
// create_pending_snapshot does around the tree copy (txn/snapshot.cc): a
// new subvolume id, its entry (subvolume_admin.cc), and a commit on each
// side so that the source is copied as committed and the snapshot is
// durable when the call returns.

#include <cstring>

#include "fs/fs_impl.h"
#include "fs/subvolume.h"
#include "txn/clock.h"

namespace ubtrfs::fsimpl {

using namespace ubtrfs::format;

Result<InodeId> FilesystemImpl::CreateSnapshot(InodeId subvol, InodeId dir, std::string_view name, bool read_only) {
  return Change({dir}, 16, [&]() -> Result<InodeId> {
    UB_ASSIGN_OR_RETURN(auto src, SubvolTop(*vol_, subvol));
    UB_RETURN_IF_ERROR(CheckNewSubvolumeEntry(dir, name));
    // The source as committed: what the copy shares is on disk. Held
    // commits (a receive) leave that to SnapshotTree's check, which refuses
    // a source changed in this transaction.
    if (!hold_commits_) UB_RETURN_IF_ERROR(CommitImpl());
    UB_ASSIGN_OR_RETURN(const uint64_t id, NewSubvolumeId());
    uint8_t uuid[kUuidSize];
    UB_RETURN_IF_ERROR(txn::NewUuid(uuid));
    UB_RETURN_IF_ERROR(txn_->SnapshotTree(subvol.root, id, read_only, uuid));
    UB_RETURN_IF_ERROR(txn_->NewQgroup(id, subvol.root, dir.root));
    UB_RETURN_IF_ERROR(LinkSubvolume(dir, name, id, uuid));
    if (!hold_commits_) UB_RETURN_IF_ERROR(CommitImpl());
    return InodeId{id, src.item.root_dirid.get()};
  });
}

}  // namespace ubtrfs::fsimpl
