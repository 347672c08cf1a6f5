// btrfs send streams without the kernel: Receive applies a stream that the
// kernel's `btrfs send` made (protocol 1, 2 or 3) to an image, as `btrfs
// receive` applies it to a mounted filesystem; DumpStream prints one as
// `btrfs receive --dump` does; Send makes a full or incremental stream of a
// read-only subvolume of an image.
//
//   auto fs = ubtrfs::Filesystem::Open("disk.img", {.writable = true});
//   ubtrfs::ReceiveResult res;
//   Status st = ubtrfs::Receive(**fs, ubtrfs::ReadFromFd(0), {}, &res);
#ifndef UBTRFS_SEND_H_
#define UBTRFS_SEND_H_

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ubtrfs/export_macros.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/status.h"

namespace ubtrfs {

// Where stream bytes come from: fills up to buf.size() bytes of `buf` and
// returns how many, 0 only at the end of the stream.
using StreamSource = std::function<Result<size_t>(std::span<uint8_t> buf)>;

// A source reading a file descriptor (a pipe, a file, stdin); retries EINTR.
inline StreamSource ReadFromFd(int fd) {
  return [fd](std::span<uint8_t> buf) -> Result<size_t> {
    for (;;) {
      const ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n >= 0) return static_cast<size_t>(n);
      if (errno != EINTR) return Status::Error(errno, "read");
    }
  };
}

struct ReceiveOptions {
  // The directory that takes the received subvolumes (btrfs receive's
  // destination); default: the view's root.
  std::optional<InodeId> dest;
};

struct ReceivedSubvolume {
  std::string name;  // its entry in the destination directory
  uint64_t id = 0;   // its subvolume id in the image
  bool snapshot = false;  // an incremental stream: a snapshot of `parent_id`
  uint64_t parent_id = 0;
  std::array<uint8_t, 16> received_uuid{};  // the sent subvolume's uuid (its received uuid if it was received itself)
  uint64_t stransid = 0, rtransid = 0;
};

struct ReceiveResult {
  std::vector<ReceivedSubvolume> subvolumes;
  uint64_t commands = 0;
  uint64_t stream_bytes = 0;
  uint64_t data_bytes = 0;       // bytes written by write and encoded_write
  uint64_t clones = 0;           // clone commands applied as reflinks
  uint64_t clone_copies = 0;     // clone commands the reflink rules refused, copied instead
  uint64_t encoded_writes = 0;   // encoded_write commands (whole extents kept compressed, pieces written plain)
};

// Applies every subvolume of `source` (one stream, or several concatenated)
// to `fs` (opened writable), as btrfs receive: a full stream's SUBVOL makes a
// new subvolume, an incremental stream's SNAPSHOT snapshots the parent found
// by received uuid (else uuid) among the image's subvolumes; the commands
// then change it by path; at the end it gets its received uuid, stransid and
// rtransid and becomes read-only. Changes made through `fs` before the call
// are committed first. The whole stream is one transaction: on success it is
// committed; on any error (a damaged or cut stream, a command that cannot
// apply) nothing of it is, `fs` is discarded (Filesystem::Discard: close it)
// and the image keeps its state as of the call. One exception: a snapshot
// whose parent came earlier in the same stream (btrfs send -c a b c) first
// commits the subvolumes received before it, which an error after that
// leaves in place, complete and read-only (as btrfs receive leaves them);
// result->subvolumes then lists those. Errors of the stream name the
// command, its number and byte offset.
UBTRFS_API Status Receive(Filesystem& fs, const StreamSource& source, const ReceiveOptions& options = {},
                          ReceiveResult* result = nullptr);

// Prints each command of `source` as `btrfs receive --dump`: one line per
// command through `out` (without its newline). Stops at the first error.
UBTRFS_API Status DumpStream(const StreamSource& source, const std::function<void(std::string_view line)>& out);

// Where stream bytes go: takes each piece in order.
using StreamSink = std::function<Status(std::span<const uint8_t> bytes)>;

struct SendOptions {
  uint32_t proto = 1;  // stream version: 1, 2 or 3
  // An incremental stream against this read-only subvolume (its top), as
  // `btrfs send -p`: the receiver snapshots its copy of the parent and
  // applies only what differs.
  std::optional<InodeId> parent;
  // Read-only subvolumes (their tops) whose extents the stream may clone
  // from, as `btrfs send -c`; the parent is always one.
  std::vector<InodeId> clone_sources;
  // Compressed extents as ENCODED_WRITE of their compressed bytes (proto >= 2).
  bool compressed_data = false;
};

struct SendResult {
  uint64_t commands = 0;       // END included
  uint64_t stream_bytes = 0;
  uint64_t data_bytes = 0;     // file bytes in WRITE and ENCODED_WRITE (compressed size for the latter)
  uint64_t clones = 0;         // CLONE commands
  uint64_t encoded_writes = 0;
  // The tree comparison (streams made against a parent, clone sources or
  // with compressed data): tree blocks read from both trees, subtrees both
  // share and that were skipped unread, inodes found changed.
  uint64_t blocks_read = 0;
  uint64_t shared_subtrees_skipped = 0;
  uint64_t changed_inodes = 0;
};

// A stream of the read-only subvolume whose top is `subvol`, which the
// kernel's `btrfs receive` and Receive accept: full, or incremental against
// options.parent. The incremental stream is found by comparing the two
// trees as the kernel's send does (subtrees the two share are not read).
// EINVAL for a writable subvolume, the top level, a parent or clone source
// that is not a read-only subvolume's top, or --compressed-data with proto 1.
UBTRFS_API Status Send(Filesystem& fs, InodeId subvol, const StreamSink& sink, const SendOptions& options = {},
                       SendResult* result = nullptr);

}  // namespace ubtrfs

#endif  // UBTRFS_SEND_H_
