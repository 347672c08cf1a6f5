// Offline resizing of a filesystem in an image file (or on a block device):
// `ubtrfs resize` and `ubtrfs mkfs --shrink`. Nothing may have the image
// open meanwhile (no mount).
#ifndef UBTRFS_RESIZE_H_
#define UBTRFS_RESIZE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "ubtrfs/export_macros.h"
#include "ubtrfs/status.h"

namespace ubtrfs {

struct ResizeTarget {
  enum Kind {
    kBytes,     // exactly `bytes`
    kGrowBy,    // the current size plus `bytes`
    kShrinkBy,  // the current size less `bytes`
    kMax,       // the whole image file or device
    kMin,       // the smallest size that holds the chunks once moved down
  };
  Kind kind = kBytes;
  uint64_t bytes = 0;
};

// A byte count with an optional binary unit, as `mkfs --size` and `resize`
// take it: "65536", "64k", "512M", "512MiB", "1G", "2T" (K, M, G, T, P, E:
// powers of 1024, either case, optionally followed by B or iB). EINVAL for
// anything else, ERANGE past 2^64 - 1, with a message quoting `text`.
UBTRFS_API Status ParseByteSize(std::string_view text, uint64_t* bytes);

// "10G", "+512M", "-1G", "max", "min" (sizes as ParseByteSize takes them).
UBTRFS_API Status ParseResizeTarget(std::string_view text, ResizeTarget* out);

struct ResizeResult {
  uint64_t old_bytes = 0;       // the filesystem's size before
  uint64_t new_bytes = 0;       // and after (the image file is cut or extended to it)
  uint64_t stripes_moved = 0;   // chunk copies moved down the device
  uint64_t bytes_copied = 0;    // bytes those moves copied
  uint64_t bytes_trimmed = 0;   // device bytes taken from chunks' unused tails (ShrinkImageToFit)
};

// Grows or shrinks the filesystem in `path` to `target`, committing each
// step. Growing extends an image file first. Shrinking moves every chunk
// copy that lies past the new end into free device space below it (its
// bytes copied, the chunk and dev extent items changed; logical addresses,
// and so every reference, stay as they are), then cuts the image file.
// When the chunks do not fit below the new end, EINVAL names the chunk that
// does not and the smallest size `min` can reach; nothing has changed then
// but moves already committed.
UBTRFS_API Status ResizeImage(const std::string& path, const ResizeTarget& target, ResizeResult* result);

// mkfs --shrink: cuts every chunk to what it holds (keeping the metadata
// the kernel's global reserve needs), moves the copies down to the lowest
// free places, and cuts the image file at the end of the last one.
UBTRFS_API Status ShrinkImageToFit(const std::string& path, ResizeResult* result);

}  // namespace ubtrfs

#endif  // UBTRFS_RESIZE_H_
