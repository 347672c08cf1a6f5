// Decompression (and compression) of btrfs compressed file extents, in the
// on-disk framing btrfs uses for each algorithm. The codecs themselves come
// from Debian libraries (zlib, libzstd, liblzo2); only the btrfs framing is
// implemented here.
//
//   zlib (1): one standard zlib stream (RFC 1950 header + deflate + adler32)
//             covering the whole extent.
//   lzo  (2): btrfs framing: a LE32 total length (including itself), then
//             segments, each a LE32 length + an lzo1x block that decodes to at
//             most one sector. A segment header never straddles a sector
//             boundary of the compressed buffer; the 1-3 bytes before such a
//             boundary are zero padding.
//   zstd (3): one standard zstd frame (content size optional).
//
// Inline extents use the same framing as regular ones.
#ifndef UBTRFS_FS_COMPRESS_H_
#define UBTRFS_FS_COMPRESS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "ubtrfs/status.h"

namespace ubtrfs::fs {

// Largest zstd window (log2 bytes) the decoder accepts. btrfs writes at most
// 17 (128 KiB extents); the margin admits other writers while keeping the
// decoder's memory bounded (about 2^27 bytes) for hostile input.
inline constexpr int kZstdWindowLogMax = 27;

// type: 1 = zlib, 2 = lzo, 3 = zstd (btrfs file_extent_item.compression values).
// Decompresses `in` (the on-disk compressed bytes of one extent, or the data of
// an inline extent) into exactly out.size() bytes (the extent's ram_bytes).
//  - If the stream decodes to fewer bytes than out.size(), the rest of `out`
//    is zero-filled (as btrfs does).
//  - If it would produce more, decoding stops at out.size() without error.
//  - Bytes after the end of a zlib stream / zstd frame / the lzo total length
//    are ignored (regular extents are read in whole sectors).
//  - An empty `out` is trivially satisfied (returns OK without decoding).
// Malformed input returns Status::Corrupt naming the algorithm and the fault;
// an unknown type returns Status::Unsupported("compression type N").
// sectorsize: the filesystem sector size (4096 normally); the lzo framing
// depends on it and for lzo it must be a power of two in [512, 65536]
// (Status::Invalid otherwise). zlib and zstd ignore it.
// Thread-safe; on error the contents of `out` are unspecified.
Status Decompress(uint8_t type, std::span<const uint8_t> in, std::span<uint8_t> out, uint32_t sectorsize);

// Compresses `in` into btrfs's on-disk framing for `type` (zlib level 3;
// zstd level 3 with window log 17; lzo1x-1 per sector with the btrfs segment
// framing and padding, as the kernel writes them). The result may be larger
// than `in`; deciding whether compression is worthwhile is the caller's job.
// `level` 0 is those defaults; otherwise it goes to zlib / zstd as given
// (lzo ignores it). Unknown type: Status::Unsupported; for lzo a bad
// sectorsize is Status::Invalid.
Result<std::vector<uint8_t>> Compress(uint8_t type, std::span<const uint8_t> in, uint32_t sectorsize, int level = 0);

}  // namespace ubtrfs::fs

#endif  // UBTRFS_FS_COMPRESS_H_
