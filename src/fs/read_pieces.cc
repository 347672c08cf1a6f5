// Reads whose bytes are handed on in place (Filesystem::ReadPieces): the
// FUSE mount writes its reply straight from a map of the image file, where
// Read would first copy the bytes into a buffer. On a cold read of a large
// file that copy is the first touch of the data the disk brought in, about
// a quarter of the mount's time (docs/BENCHMARKS.md, session 50).
//
// Only whole sectors of uncompressed extents are mapped; holes, inline,
// compressed and preallocated extents, and any extent that does not map or
// whose checksums fail there (read again by CopyExtent, which tries the
// other mirrors and names the error), land in the caller's scratch buffer
// as Read puts them.
#include <cstring>

#include "fs/fs_impl.h"

namespace ubtrfs::fsimpl {
namespace {

// Shorter pieces are copied: a map and unmap cost more system time than
// copying a few pages that the read brings into the cache anyway (4 KiB
// random reads through the mount).
constexpr uint64_t kMinMappedBytes = 64 << 10;

}  // namespace

Result<size_t> FilesystemImpl::ReadPieces(InodeId file, uint64_t offset, std::span<uint8_t> scratch,
                                          const ReadSink& send) {
  // Held until `send` returns: a commit, which could let a freed extent be
  // written again, waits for it.
  auto guard = Guard();
  UB_ASSIGN_OR_RETURN(ReadStart r, StartRead(file, offset, scratch.size()));
  if (r.len == 0) {
    send({});
    return size_t{0};
  }
  const uint64_t len = r.len, end = offset + len;
  const bool verify = r.verify;
  Cursor c(vol_->source(), r.tree);
  UB_RETURN_IF_ERROR(SeekFileExtent(c, file, offset));
  const uint32_t ss = vol_->sectorsize();
  std::vector<io::MappedBytes> maps;
  std::vector<ReadPiece> pieces;
  // scratch holds [offset, filled); the part of it after the last mapped
  // piece becomes a piece when the next mapped one (or the end) comes.
  uint64_t filled = offset, scratch_from = offset;
  auto scratch_upto = [&](uint64_t upto) {
    if (upto > scratch_from) {
      pieces.push_back({scratch.data() + (scratch_from - offset), static_cast<size_t>(upto - scratch_from)});
    }
    scratch_from = upto;
  };
  auto zero_upto = [&](uint64_t upto) {
    if (upto > filled) std::memset(scratch.data() + (filled - offset), 0, upto - filled);
    filled = std::max(filled, upto);
  };
  for (; c.Valid(); ) {
    const Key k = c.key();
    if (k.objectid != file.ino || k.type != kExtentDataKey || k.offset >= end) break;
    const auto d = c.data();
    io::MappedBytes m;
    uint64_t from = 0, to = 0;
    if (d.size() >= sizeof(FileExtentItem)) {
      const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
      const uint64_t num = fe->num_bytes.get(), ext_off = fe->offset.get(), disk = fe->disk_bytenr.get();
      from = std::max(k.offset, filled);  // filled never lies before offset
      to = std::min(end, k.offset + num);
      const uint64_t in_ext = ext_off + (from - k.offset);
      // Plain data on disk, whole sectors, a sane item (CopyExtent names
      // what is wrong with any other).
      const bool plain = fe->type == kFileExtentReg && disk != 0 && fe->compression == kCompressNone &&
                         fe->encryption == 0 && fe->other_encoding.get() == 0;
      const bool sane = k.offset + num > k.offset && ext_off + num >= ext_off &&
                        ext_off + num <= fe->disk_num_bytes.get() && disk % ss == 0;
      if (plain && sane && from < to && to - from >= kMinMappedBytes && in_ext % ss == 0 && (to - from) % ss == 0) {
        UB_ASSIGN_OR_RETURN(m, vol_->MapData(disk + in_ext, to - from, verify));
      }
    }
    if (!m.empty()) {
      zero_upto(from);  // a gap before the extent is a hole
      scratch_upto(from);
      pieces.push_back({m.bytes().data(), m.bytes().size()});
      maps.push_back(std::move(m));
      filled = scratch_from = to;
    } else {
      zero_upto(k.offset);  // a gap before the extent is a hole (k.offset < end)
      UB_RETURN_IF_ERROR(CopyExtent(file, k, d, offset, end, scratch.data(), verify, &filled));
    }
    UB_RETURN_IF_ERROR(c.Next());
  }
  zero_upto(end);
  scratch_upto(end);
  send(pieces);
  return static_cast<size_t>(len);
}

}  // namespace ubtrfs::fsimpl
