// Quota groups in the POSIX view: the rescan (txn/qgroups.cc counts, from
// the committed state; the commits on either side make that state this
// view's and the result durable).
#include "fs/fs_impl.h"

namespace ubtrfs::fsimpl {

Status FilesystemImpl::RescanQuotas() {
  return Change({}, kItemsPerDeleteSubvol, [&]() -> Status {
    UB_RETURN_IF_ERROR(CommitImpl());
    UB_RETURN_IF_ERROR(txn_->RescanQuotas());
    return CommitImpl();
  });
}

}  // namespace ubtrfs::fsimpl
