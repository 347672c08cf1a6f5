// The tree-comparing send (send/incremental.cc): see its header comment.
#ifndef UBTRFS_SEND_INCREMENTAL_H_
#define UBTRFS_SEND_INCREMENTAL_H_

#include <string>

#include "send/stream.h"
#include "ubtrfs/send.h"

namespace ubtrfs::fsimpl {
class FilesystemImpl;
}

namespace ubtrfs::send {

// Writes the stream of subvolume `send_id` after its header: SNAPSHOT of
// options.parent (or SUBVOL without one) named `name`, the changes, END.
Status SendByComparison(fsimpl::FilesystemImpl& fs, StreamWriter& w, const SendOptions& options, SendResult* result,
                        uint64_t send_id, const std::string& name);

}  // namespace ubtrfs::send

#endif  // UBTRFS_SEND_INCREMENTAL_H_
