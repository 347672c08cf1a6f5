// Compression of file data on write (OpenOptions::compress, the
// btrfs.compression property, the COMPRESS/NOCOMPRESS inode flags), with
// the kernel's rules (fs/btrfs/inode.c compress_file_range and
// inode_need_compress, fs/btrfs/compression.c btrfs_compress_heuristic):
//  - data is cut into ranges of at most 128 KiB of file data, each its own
//    extent (num_bytes = ram_bytes = the range rounded up to sectors,
//    disk_num_bytes = the compressed bytes rounded up to sectors);
//  - a range is stored compressed only if that saves at least one sector;
//    otherwise it is stored plain and, unless compress-force or the property
//    chose the algorithm, the file is marked NOCOMPRESS;
//  - without force a cheap sample of the range (the kernel's heuristic:
//    repeated halves, byte set, core set, entropy) decides whether to try;
//  - a file of at most one sector whose compressed bytes fit in max_inline
//    becomes a compressed inline extent.
// The codecs and the on-disk framing are fs/compress.h; this file decides.
#ifndef UBTRFS_FS_COMPRESS_WRITE_H_
#define UBTRFS_FS_COMPRESS_WRITE_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "ubtrfs/filesystem.h"

namespace ubtrfs::fs {

// The kernel's BTRFS_MAX_UNCOMPRESSED: file bytes per compressed extent.
inline constexpr uint64_t kMaxCompressRange = 128 * 1024;

// How one write to one inode compresses (after flags and property).
struct WriteCompression {
  uint8_t type = 0;  // format::kCompress*; 0: write plain
  int level = 0;     // 0: the algorithm's default
  bool force = false;
  bool by_property = false;  // the btrfs.compression property chose `type`
  bool on() const { return type != 0; }
};

// The btrfs.compression property value as a compression type: 1..3 for an
// algorithm (a ":level" suffix is allowed, as the kernel), 0 for "no",
// "none" or empty; nullopt for anything else (EINVAL when setting it).
std::optional<uint8_t> PropertyType(std::string_view value);

// Inode flags after the property is set to `value` (nullopt: removed), as
// the kernel's prop_compression_apply: an algorithm sets COMPRESS and clears
// NOCOMPRESS, "no"/"none" the reverse, removal (or empty) clears both.
uint64_t FlagsForProperty(uint64_t flags, std::optional<std::string_view> value);

// The policy for a write to an inode with `flags`: `mount` is the
// OpenOptions setting, `prop_type` the property's type (0: none/absent).
WriteCompression ChooseCompression(const CompressOptions& mount, uint64_t flags, uint8_t prop_type);

// The kernel's sampling heuristic: worth trying to compress `data` (the
// range as it sits in sectors, up to its first 128 KiB)?
bool LooksCompressible(std::span<const uint8_t> data);

// What became of one range.
struct RangeResult {
  enum Kind : uint8_t { kPlain, kIncompressible, kCompressed } kind = kPlain;
  std::vector<uint8_t> bytes;  // kCompressed: the framed data, zero-padded to whole sectors
};

// Tries one range: `file_bytes` are its bytes up to the end of the file,
// `in_sectors` the same range padded to whole sectors (what the heuristic
// samples). kPlain: the heuristic said no, nothing to mark.
RangeResult CompressRange(const WriteCompression& c, std::span<const uint8_t> file_bytes,
                          std::span<const uint8_t> in_sectors, uint32_t sectorsize);

// A file of at most one sector: its compressed inline data if the kernel
// would store it so (compressor output smaller than the input and within
// max_inline), else nullopt with *incompressible telling whether the attempt
// counts as a failure (NOCOMPRESS) or was not made (heuristic).
std::optional<std::vector<uint8_t>> CompressInline(const WriteCompression& c, std::span<const uint8_t> content,
                                                   uint32_t sectorsize, uint64_t max_inline, bool* incompressible);

// The ranges the write path cuts a sector-aligned buffer into: runs of
// non-zero sectors (zero sectors become holes), each cut every 128 KiB from
// its start. Shared by the import's compression workers so that their
// ranges are the write path's.
struct Range {
  size_t pos, len;
};
std::vector<Range> PlanRanges(std::span<const uint8_t> aligned, uint32_t sectorsize);

// The file bytes of range `r` that a write from `start` (the buffer's first
// byte, sector-aligned) into a file of `file_len` bytes past `start` tries
// to compress; 0 where it does not try, as compress_file_range: nothing of
// the file in it, or one sector only that is not the whole file. The write
// path and the import's read-ahead both ask here, so their ranges match.
uint64_t BytesToTry(const Range& r, uint64_t start, uint64_t file_len, uint32_t sectorsize);

// A range compressed ahead of the write (by the import's workers), used by
// the write path when offset, length, algorithm and level match.
struct Precompressed {
  uint64_t file_off = 0;
  uint64_t file_len = 0;  // bytes up to the end of the file
  uint8_t type = 0;
  int level = 0;
  bool force = false;
  RangeResult result;
};

}  // namespace ubtrfs::fs

#endif  // UBTRFS_FS_COMPRESS_WRITE_H_
