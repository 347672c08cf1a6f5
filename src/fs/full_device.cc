// A full device: the commit-and-retry that gives a change a second chance
// before its ENOSPC reaches the caller, as the kernel's flush/commit steps
// of space reservation do (fs/btrfs/space-info.c, in spirit).
//
// Space the running transaction freed is pinned until it commits (the last
// committed trees may still point at it), and the commit reserve grows with
// every block the transaction dirtied. A commit releases both, so an ENOSPC
// that left nothing half done (the reservation, or a failure the operation
// marked clean) commits and runs the change once more. A failure that did
// change something has aborted the transaction already (NoteFailure) and is
// never retried. Not where the caller asked to be able to undo everything
// since its last commit (OpenOptions::undo_uncommitted).
#include "fs/fs_impl.h"
#include "stats/stats.h"

namespace ubtrfs::fsimpl {

bool FilesystemImpl::RetryAfterCommit(const Status& st, int attempt, bool outermost) {
  if (st.code() != ENOSPC || attempt > 0 || !outermost || aborted_ || hold_commits_) return false;
  // With OpenOptions::undo_uncommitted only the caller commits: a commit of
  // our own would make half of an all-or-nothing edit durable.
  if (!undo_.empty()) return false;
  // A transaction with nothing in it has nothing to release.
  return txn_->HasChanges() || delayed_->pending_count() > 0;
}

Status FilesystemImpl::CommitForSpace() {
  static stats::Counter& commits = stats::GetCounter("space.enospc_commits");
  commits.Add();
  auto guard = ExclusiveGuard();
  UB_RETURN_IF_ERROR(CheckWritable());
  Status st = CommitImpl();
  NoteFailure(st);
  return st;
}

}  // namespace ubtrfs::fsimpl
