// fallocate(2) for the library API: preallocated (PREALLOC) file extents,
// punched holes and zeroed ranges.
//
// A PREALLOC extent owns disk space but reads as zeros. A later write into
// it goes through the ordinary copy-on-write path: the written sectors get a
// new extent and the PREALLOC item is split around them (its head and tail
// keep referencing the old disk extent, one data reference each), as a
// write into a regular extent is.
#include <linux/falloc.h>

#include "fs/fs_impl.h"
#include "txn/clock.h"

namespace ubtrfs::fsimpl {
namespace {

// The largest extent one allocation makes, as for written data.
constexpr uint64_t kMaxPreallocExtent = 128ull << 20;

void SetNow(format::Timespec& ts) {
  const timespec now = txn::WallClock();
  ts.sec = static_cast<uint64_t>(now.tv_sec);
  ts.nsec = static_cast<uint32_t>(now.tv_nsec);
}

// Calls fn(start, end, on_disk) for each of the file's extent items that
// overlaps [a, b), in order (end unclipped; on_disk: data or preallocated
// space, not a hole item).
template <typename F>
Status ForEachExtentIn(tree::BlockSource* src, const tree::RootPtr& tree, InodeId file, uint64_t a, uint64_t b,
                       F&& fn) {
  Cursor c(src, tree);
  UB_RETURN_IF_ERROR(SeekFileExtent(c, file, a));
  for (; c.Valid();) {
    const Key k = c.key();
    if (k.objectid != file.ino || k.type != kExtentDataKey || k.offset >= b) break;
    const auto d = c.data();
    if (d.size() < sizeof(FileExtentItem)) return Status::Corrupt(InodeName(file) + ": short extent item");
    const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
    if (fe->type == kFileExtentInline) return Status::Corrupt(InodeName(file) + ": inline extent among others");
    const uint64_t ks = k.offset, ke = ks + fe->num_bytes.get();
    if (ke > a) fn(ks, ke, fe->disk_bytenr.get() != 0);
    UB_RETURN_IF_ERROR(c.Next());
  }
  return Status::Ok();
}

// Bytes of [a, b) (sector-aligned) that extents with disk space (data or
// preallocated) cover.
Result<uint64_t> CoveredBytes(tree::BlockSource* src, const tree::RootPtr& tree, InodeId file, uint64_t a,
                              uint64_t b) {
  uint64_t covered = 0;
  UB_RETURN_IF_ERROR(ForEachExtentIn(src, tree, file, a, b, [&](uint64_t ks, uint64_t ke, bool on_disk) {
    if (on_disk) covered += std::min(ke, b) - std::max(ks, a);
  }));
  return covered;
}

// An upper bound of the data a fallocate allocates (mode bits as decoded
// in Fallocate; `covered`: CoveredBytes of the aligned range, before the
// call): the partial sectors that punching or zeroing rewrites, an inline
// file turned regular, and PREALLOC extents for what has no extent (for
// zeroing, all of the zeroed range: its extents are dropped first). It
// overshoots by at most the two partial sectors.
uint64_t FallocateDataNeed(bool punch, bool zero, bool inl, uint64_t offset, uint64_t end, uint64_t size,
                           uint32_t ss, uint64_t covered) {
  auto down = [ss](uint64_t v) { return v / ss * ss; };
  auto up = [ss](uint64_t v) { return (v + ss - 1) / ss * ss; };
  uint64_t need = 0;
  const bool inline_stays = size <= kMaxInline && size < ss;
  const uint64_t a = offset, b = std::min(end, size);
  const bool zeroes_inside = (punch || zero) && a < b;
  if (zeroes_inside) {
    if (inl) {
      if (!inline_stays) need += up(size);  // rewritten whole, as a regular file
    } else if (up(a) >= down(b)) {
      need += up(b) - down(a);  // one or two partial sectors
    } else {
      need += (a % ss ? ss : 0) + (b % ss ? ss : 0);
    }
  }
  if (!punch) {
    const uint64_t span = up(end) - down(offset);
    if (inl) {
      need += up(size) + span;  // the inline data as an extent, then the range
    } else if (zero && zeroes_inside) {
      need += span;
    } else {
      need += span - std::min(span, covered);
    }
  }
  return need;
}

}  // namespace

Status FilesystemImpl::Fallocate(InodeId file, int mode, uint64_t offset, uint64_t len) {
  const uint64_t reserve = 8 + len / kMaxPreallocExtent;
  return Change({file}, reserve, [&]() -> Status {
    constexpr int kKnown = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
    if (mode & ~kKnown) return Status::Error(EOPNOTSUPP, "fallocate mode " + std::to_string(mode) + " is not supported");
    const bool keep_size = mode & FALLOC_FL_KEEP_SIZE;
    const bool punch = mode & FALLOC_FL_PUNCH_HOLE;
    const bool zero = mode & FALLOC_FL_ZERO_RANGE;
    const bool stamp = !CallerKeepsFileTimes();
    if (punch && (zero || !keep_size)) {
      return Status::Error(EOPNOTSUPP, "punching a hole needs FALLOC_FL_KEEP_SIZE and excludes FALLOC_FL_ZERO_RANGE");
    }
    if (len == 0) return Status::Invalid("fallocate of length 0");
    const uint64_t end = offset + len;
    if (end < offset || end > (1ull << 62)) return Status::Error(EFBIG, "fallocate range past the largest file size");
    UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(file));
    if (S_ISDIR(ii.mode.get())) return Status::Error(EISDIR, InodeName(file) + " is a directory");
    if (!S_ISREG(ii.mode.get())) return Status::Error(ENODEV, InodeName(file) + " is not a regular file");
    UB_RETURN_IF_ERROR(DataMayChange(file, ii));
    const uint32_t ss = vol_->sectorsize();
    const uint64_t size = ii.size.get();
    const bool csum = !(ii.flags.get() & kInodeNodatasum);
    int64_t nbytes_delta = 0;
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(file.root));

    // (The tree root moves as the range changes: read it afresh each time.)
    auto has_inline = [&]() -> Result<bool> {
      UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(file.root));
      UB_ASSIGN_OR_RETURN(auto first, tree::LookupItem(vol_->source(), tree, Key{file.ino, kExtentDataKey, 0}));
      return first && first->size() >= kFileExtentInlineDataStart &&
             reinterpret_cast<const FileExtentItem*>(first->data())->type == kFileExtentInline;
    };
    // Zeros over [a, b) (inside the file) through the write path: the
    // sectors that end up all zero become holes.
    auto write_zeros = [&](uint64_t a, uint64_t b) -> Status {
      static const std::vector<uint8_t> zeros(1 << 20, 0);
      while (a < b) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(b - a, zeros.size()));
        auto written = WriteImpl(file, a, std::span(zeros.data(), n));
        if (!written.ok()) {
          // WriteImpl marks its own ENOSPC clean, but an earlier step of this
          // call may have changed the file already: never clean here.
          t_clean_failure = false;
          return written.status();
        }
        const size_t done = *written;
        if (done == 0) return Status::IoError("short write while zeroing");
        a += done;
      }
      return Status::Ok();
    };

    // 0. Data space for everything the call may allocate, before anything
    // changes: a full device is an ENOSPC with the file untouched
    // (txn/space_reserve.h). Nothing else allocates data meanwhile (the
    // operation runs exclusive), so what is found here is still there below.
    {
      UB_ASSIGN_OR_RETURN(bool inl, has_inline());
      uint64_t covered = 0;
      if (!punch && !inl) {
        UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(file.root));
        UB_ASSIGN_OR_RETURN(covered, CoveredBytes(vol_->source(), tree, file, offset / ss * ss,
                                                  (end + ss - 1) / ss * ss));
      }
      const uint64_t need = FallocateDataNeed(punch, zero, inl, offset, end, size, ss, covered);
      Status reserved = txn::ReserveData(*txn_, need);
      if (!reserved.ok()) {
        t_clean_failure = true;  // nothing changed yet
        return reserved.WithContext("fallocate of " + std::to_string(len) + " bytes at " + std::to_string(offset));
      }
    }

    // 1. Punch or zero: the range inside the file reads as zeros afterwards;
    // whole sectors lose their extents, partial ones are rewritten.
    if (punch || zero) {
      const uint64_t a = offset, b = std::min(end, size);
      if (a < b) {
        UB_ASSIGN_OR_RETURN(bool inl, has_inline());
        const uint64_t fa = (a + ss - 1) / ss * ss, fb = b / ss * ss;
        if (inl || fa >= fb) {
          UB_RETURN_IF_ERROR(write_zeros(a, b));
        } else {
          UB_RETURN_IF_ERROR(write_zeros(a, fa));
          UB_RETURN_IF_ERROR(write_zeros(fb, b));
          // Whole sectors: with KEEP_SIZE a range reaching the end also
          // frees what was preallocated past it.
          const uint64_t drop_end = (end >= size) ? (end + ss - 1) / ss * ss : fb;
          UB_RETURN_IF_ERROR(DropExtents(file, fa, std::max(fb, drop_end), &nbytes_delta));
        }
      } else if (punch && offset >= size) {
        // Only preallocated space past the end is in the range.
        const uint64_t fa = (offset + ss - 1) / ss * ss, fb = (end + ss - 1) / ss * ss;
        if (fa < fb) UB_RETURN_IF_ERROR(DropExtents(file, fa, fb, &nbytes_delta));
      }
    }

    // 2. Allocate (mode 0, KEEP_SIZE and ZERO_RANGE): PREALLOC extents for
    // every sector of the range that has no extent.
    if (!punch) {
      const uint64_t a = offset / ss * ss, b = (end + ss - 1) / ss * ss;
      UB_ASSIGN_OR_RETURN(bool inl, has_inline());
      if (inl) {
        // An inline extent cannot share a file with others: it becomes a
        // regular one first.
        UB_ASSIGN_OR_RETURN(InodeItem cur, LoadInode(file));
        const uint64_t cur_size = cur.size.get();
        std::vector<uint8_t> content((cur_size + ss - 1) / ss * ss, 0);
        UB_RETURN_IF_ERROR(Read(file, 0, std::span(content).subspan(0, cur_size)).status());
        UB_RETURN_IF_ERROR(DropExtents(file, 0, UINT64_MAX, &nbytes_delta));
        if (!content.empty()) UB_RETURN_IF_ERROR(WriteRegular(file, 0, content, csum, &nbytes_delta));
      }
      // What [a, b) already has: extents with data (or preallocated) stay;
      // explicit hole items (images without no-holes history) are trimmed.
      std::vector<std::pair<uint64_t, uint64_t>> covered;
      std::vector<std::pair<uint64_t, uint64_t>> holes;
      {
        UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(file.root));
        auto note = [&](uint64_t ks, uint64_t ke, bool on_disk) {
          if (on_disk) {
            covered.emplace_back(ks, ke);
          } else {
            holes.emplace_back(std::max(ks, a), std::min(ke, b));
          }
        };
        UB_RETURN_IF_ERROR(ForEachExtentIn(vol_->source(), tree, file, a, b, note));
      }
      for (const auto& [hs, he] : holes) UB_RETURN_IF_ERROR(DropExtents(file, hs, he, &nbytes_delta));
      std::vector<std::pair<uint64_t, uint64_t>> gaps;
      uint64_t pos = a;
      for (const auto& [cs, ce] : covered) {
        if (cs > pos) gaps.emplace_back(pos, std::min(cs, b));
        pos = std::max(pos, ce);
        if (pos >= b) break;
      }
      if (pos < b) gaps.emplace_back(pos, b);
      // Space for every gap before any item changes: a full device is an
      // ENOSPC here (what was taken returns at commit, unreferenced).
      struct Piece {
        uint64_t file_off, bytenr, len;
      };
      std::vector<Piece> pieces;
      for (const auto& [gs, ge] : gaps) {
        uint64_t at = gs;
        while (at < ge) {
          uint64_t want = std::min(ge - at, kMaxPreallocExtent);
          for (;;) {
            auto r = txn_->AllocData(want);
            if (r.ok()) {
              pieces.push_back(Piece{at, *r, want});
              break;
            }
            if (r.status().code() != ENOSPC || want <= ss) {
              if (nbytes_delta == 0 && !inl && holes.empty() && !(punch || zero)) t_clean_failure = true;
              return r.status();
            }
            want = std::max<uint64_t>(ss, want / 2 / ss * ss);
          }
          at += want;
        }
      }
      for (const Piece& p : pieces) {
        const FileExtentItem fe = WholeExtentItem(txn_->transid(), kFileExtentPrealloc, p.bytenr, p.len);
        const auto* fb = reinterpret_cast<const uint8_t*>(&fe);
        UB_RETURN_IF_ERROR(w->Insert(Key{file.ino, kExtentDataKey, p.file_off}, std::span(fb, sizeof fe)));
        UB_RETURN_IF_ERROR(txn_->AddDataRef(p.bytenr, p.len, file.root, file.ino, p.file_off));
        NoteExtentRange(file, p.file_off, p.file_off + p.len, ii.generation.get() > vol_->super().generation.get());
        nbytes_delta += static_cast<int64_t>(p.len);
      }
      UB_ASSIGN_OR_RETURN(ii, LoadInode(file));
      if (!pieces.empty()) ii.flags = ii.flags.get() | kInodePrealloc;
      if (!keep_size && end > ii.size.get()) {
        ii.size = end;
        if (stamp) SetNow(ii.mtime);
      }
    } else {
      UB_ASSIGN_OR_RETURN(ii, LoadInode(file));
      if (stamp) SetNow(ii.mtime);
    }
    if (zero && stamp) SetNow(ii.mtime);
    ii.nbytes = static_cast<uint64_t>(static_cast<int64_t>(ii.nbytes.get()) + nbytes_delta);
    if (stamp) SetNow(ii.ctime);
    return StoreInode(file, ii);
  });
}

}  // namespace ubtrfs::fsimpl
