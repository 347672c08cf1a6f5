// Reflinks (FICLONERANGE): file extent items of one file made to point at the
// disk extents of another range, each with a data reference of its own.
//
// The rules are the kernel's (fs/remap_range.c generic_remap_checks and
// generic_remap_check_len, fs/btrfs/reflink.c btrfs_clone): the argument
// checks come first and change nothing; then the destination range loses
// its extents and gains one item per source extent, clipped to the range
// (offset and num_bytes adjusted, disk_bytenr, disk_num_bytes, compression
// and generation kept, so a compressed extent is shared as it lies). Holes
// stay holes (no-holes images need no items). An inline extent cannot be
// shared: its data is written into the destination, which is what the
// kernel's copy_inline_to_page ends with (and, for a small destination at
// offset 0, its inline copy: the write path makes that inline again).
#include <sys/stat.h>

#include <cstring>

#include "fs/fs_impl.h"
#include "stats/stats.h"
#include "txn/clock.h"

namespace ubtrfs::fsimpl {
namespace {

// The largest file offset the write path accepts.
constexpr uint64_t kMaxFileEnd = 1ull << 62;

Time CloneNow() {
  const timespec ts = txn::WallClock(/*coarse=*/true);
  return Time{ts.tv_sec, static_cast<uint32_t>(ts.tv_nsec)};
}

void SetStamp(Timespec& ts, const Time& t) {
  ts.sec = static_cast<uint64_t>(t.sec);
  ts.nsec = t.nsec;
}

struct SourceExtent {
  Key key;
  std::vector<uint8_t> item;
};

}  // namespace

Status FilesystemImpl::Clone(InodeId src, uint64_t src_offset, InodeId dst, uint64_t dst_offset, uint64_t len) {
  static stats::Histogram& latency = stats::GetHistogram("op.clone", "ns");
  stats::ScopedTimer timer(latency);
  // One new item per source extent, inserted in key order: they fill whole
  // leaves, so a leaf's worth of items costs about one item's reservation.
  // The extents are counted once before the change (without its lock: the
  // count only sizes the reservation).
  uint64_t extents = 0;
  if (txn_) {
    auto guard = Guard();
    auto tree = FsTree(src.root);
    if (tree.ok()) {
      Cursor c(vol_->source(), *tree);
      const uint64_t end = len == 0 || src_offset + len < src_offset ? UINT64_MAX : src_offset + len;
      if (SeekFileExtent(c, src, src_offset).ok()) {
        while (c.Valid() && c.key().objectid == src.ino && c.key().type == kExtentDataKey && c.key().offset < end) {
          ++extents;
          if (!c.Next().ok()) break;
        }
      }
    }
  }
  constexpr uint64_t kItemsPerLeaf = 64;
  // Only the destination changes: cloning out of a read-only snapshot is fine.
  return Change({dst}, 8 + extents / kItemsPerLeaf, [&] { return CloneImpl(src, src_offset, dst, dst_offset, len); });
}

Status FilesystemImpl::CloneImpl(InodeId src, uint64_t src_offset, InodeId dst, uint64_t dst_offset, uint64_t len) {
  UB_ASSIGN_OR_RETURN(InodeItem si, LoadInode(src));
  UB_ASSIGN_OR_RETURN(InodeItem di, LoadInode(dst));
  const uint32_t smode = si.mode.get(), dmode = di.mode.get();
  if (S_ISDIR(smode) || S_ISDIR(dmode)) return Status::Error(EISDIR, "clone of a directory");
  if (!S_ISREG(smode) || !S_ISREG(dmode)) return Status::Invalid("clone of a file that is not a regular file");
  if (di.flags.get() & kInodeImmutable) return Status::Error(EPERM, InodeName(dst) + " is immutable");
  UB_RETURN_IF_ERROR(DataMayChange(dst, di));  // a verity source is fine: only its extents are shared
  // A destination must not end up partly checksummed.
  if ((si.flags.get() & kInodeNodatasum) != (di.flags.get() & kInodeNodatasum)) {
    return Status::Invalid("clone between a file with data checksums and one without (NODATASUM)");
  }
  const uint64_t src_size = si.size.get(), dst_size = di.size.get();
  if (len == 0) {
    if (src_offset == src_size) return Status::Ok();
    if (src_offset > src_size) return Status::Invalid("clone source offset past the end of the file");
    len = src_size - src_offset;
  }
  const uint32_t ss = vol_->sectorsize();
  if (src_offset % ss || dst_offset % ss) {
    return Status::Invalid("clone offsets must be multiples of the sector size (" + std::to_string(ss) + ")");
  }
  if (src_offset + len < src_offset || dst_offset + len < dst_offset) return Status::Invalid("clone range overflows");
  if (src_offset >= src_size) return Status::Invalid("clone source offset at or past the end of the file");
  // FICLONERANGE may not be shortened: a range past the end is refused.
  if (len > src_size - src_offset) return Status::Invalid("clone range past the end of the source");
  // A range may end unaligned only at the source's end; what is shared is
  // then that whole last sector.
  uint64_t span = len;
  if (src_offset + len == src_size) {
    span = (src_size + ss - 1) / ss * ss - src_offset;
  } else if (len % ss) {
    return Status::Invalid("clone length must be a multiple of the sector size unless the range ends at the end of the source");
  }
  if (src == dst && dst_offset + span > src_offset && dst_offset < src_offset + span) {
    return Status::Invalid("clone ranges overlap within one file");
  }
  // A partial last sector may only land at or past the destination's end
  // (else the bytes after the source's end would show inside the file).
  if (len % ss && dst_offset + len < dst_size) {
    return Status::Invalid("clone of a partial last sector into the middle of the destination");
  }
  if (dst_offset + span > kMaxFileEnd) return Status::Error(EFBIG, "clone past the largest file size");
  const uint64_t src_end = src_offset + span;

  // What the source range holds, read before the destination changes (it
  // may be the same file, and the same extent items).
  std::vector<SourceExtent> extents;
  std::optional<std::vector<uint8_t>> inline_data;
  {
    UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(src.root));
    Cursor c(vol_->source(), tree);
    UB_RETURN_IF_ERROR(SeekFileExtent(c, src, src_offset));
    while (c.Valid()) {
      const Key k = c.key();
      if (k.objectid != src.ino || k.type != kExtentDataKey || k.offset >= src_end) break;
      const auto d = c.data();
      if (d.size() < kFileExtentInlineDataStart) return Status::Corrupt(InodeName(src) + ": short extent item");
      const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
      if (fe->type == kFileExtentInline) {
        if (k.offset != 0) return Status::Corrupt(InodeName(src) + ": inline extent at offset " + std::to_string(k.offset));
        // At most a sector long: only a range from 0 (offsets are aligned) meets it.
        if (src_offset == 0) inline_data.emplace();  // read below, once the cursor is gone
        UB_RETURN_IF_ERROR(c.Next());
        continue;
      }
      if (d.size() < sizeof(FileExtentItem)) return Status::Corrupt(InodeName(src) + ": short extent item");
      // Items before the range, and explicit holes (the destination range
      // is a hole already), add nothing.
      if (k.offset + fe->num_bytes.get() > src_offset && fe->disk_bytenr.get() != 0) {
        extents.push_back(SourceExtent{k, std::vector<uint8_t>(d.begin(), d.end())});
      }
      UB_RETURN_IF_ERROR(c.Next());
    }
  }
  if (inline_data) {
    // An inline extent holds at most a sector and starts the file, so it
    // can only meet a range that starts at 0.
    inline_data->resize(std::min<uint64_t>(src_size, ss));
    UB_ASSIGN_OR_RETURN(size_t n, Read(src, 0, *inline_data));
    inline_data->resize(n);
  }

  int64_t nbytes_delta = 0;
  const bool csum = !(di.flags.get() & kInodeNodatasum);
  // An inline extent must be a file's only extent: one that the range does
  // not cover (it lies before dst_offset) becomes a regular extent first,
  // as the kernel's expansion of the destination does.
  if (dst_offset > 0) {
    UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(dst.root));
    UB_ASSIGN_OR_RETURN(auto first, tree::LookupItem(vol_->source(), tree, Key{dst.ino, kExtentDataKey, 0}));
    if (first && first->size() >= kFileExtentInlineDataStart &&
        reinterpret_cast<const FileExtentItem*>(first->data())->type == kFileExtentInline) {
      std::vector<uint8_t> content((dst_size + ss - 1) / ss * ss, 0);
      UB_RETURN_IF_ERROR(Read(dst, 0, std::span(content).subspan(0, dst_size)).status());
      auto pieces = AllocPieces(0, content);
      if (!pieces.ok()) {
        t_clean_failure = true;  // nothing changed yet
        return pieces.status();
      }
      UB_RETURN_IF_ERROR(DropExtents(dst, 0, UINT64_MAX, &nbytes_delta));
      UB_RETURN_IF_ERROR(WritePieces(dst, *pieces, content, csum, &nbytes_delta));
    }
  }

  UB_RETURN_IF_ERROR(DropExtents(dst, dst_offset, dst_offset + span, &nbytes_delta));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(dst.root));
  for (SourceExtent& e : extents) {
    auto* fe = reinterpret_cast<FileExtentItem*>(e.item.data());
    const uint64_t ks = e.key.offset;
    uint64_t data_off = fe->offset.get(), data_len = fe->num_bytes.get();
    if (ks + data_len > src_end) data_len = src_end - ks;
    if (src_offset > ks) {
      data_off += src_offset - ks;
      data_len -= src_offset - ks;
    }
    const uint64_t file_off = ks >= src_offset ? ks - src_offset + dst_offset : dst_offset;
    fe->offset = data_off;
    fe->num_bytes = data_len;
    UB_RETURN_IF_ERROR(w->Insert(Key{dst.ino, kExtentDataKey, file_off}, e.item));
    // The reference's offset is where the extent's byte 0 would sit in the
    // file, wrapping below 0 as the kernel's does.
    UB_RETURN_IF_ERROR(txn_->AddDataRef(fe->disk_bytenr.get(), fe->disk_num_bytes.get(), dst.root, dst.ino,
                                        file_off - data_off));
    nbytes_delta += static_cast<int64_t>(data_len);
  }

  UB_ASSIGN_OR_RETURN(di, LoadInode(dst));
  di.nbytes = static_cast<uint64_t>(static_cast<int64_t>(di.nbytes.get()) + nbytes_delta);
  // The size counts the range as asked, not its last sector rounded up.
  if (dst_offset + len > di.size.get()) di.size = dst_offset + len;
  const Time now = CloneNow();
  const bool stamp = !CallerKeepsFileTimes();
  if (stamp) {
    SetStamp(di.mtime, now);
    SetStamp(di.ctime, now);
  }
  UB_RETURN_IF_ERROR(StoreInode(dst, di));

  if (inline_data && !inline_data->empty()) {
    // The range at the destination is a hole now: the write leaves the rest
    // of its sector zero, as the source has it.
    auto written = WriteImpl(dst, dst_offset, *inline_data);
    if (!written.ok()) {
      t_clean_failure = false;  // the destination changed above
      return written.status();
    }
    if (stamp) {
      UB_ASSIGN_OR_RETURN(di, LoadInode(dst));
      SetStamp(di.mtime, now);
      SetStamp(di.ctime, now);
      UB_RETURN_IF_ERROR(StoreInode(dst, di));
    }
  }
  return Status::Ok();
}

}  // namespace ubtrfs::fsimpl
