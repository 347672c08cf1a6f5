// Writes that go into the extents already there, as the kernel's nocow
// path (can_nocow_extent) sends them: into a preallocated extent, and into
// any extent of a NODATACOW file, where the extent is the file's alone
// (TxnManager::DataExtentOnlyOf). A preallocated range is space promised
// to the file: copying a write into it elsewhere needs space a full device
// does not have (fallocate, fill the device, write: ENOSPC, which the
// kernel never gives there). A NODATACOW file (VM images, databases,
// swap files) keeps its extents where they are.
//
// A preallocated piece that is written becomes a regular extent item over
// the same disk extent (one more reference from the same file), with
// checksums unless the file is NODATASUM; a regular NODATACOW extent needs
// no change of metadata at all. Regular extents of a file that keeps
// checksums are copied as before (their old checksums would need
// replacing), as are compressed, inline and shared extents and holes.
#include <cstring>

#include "fs/fs_impl.h"

namespace ubtrfs::fsimpl {

Result<bool> FilesystemImpl::WriteInPlace(InodeId id, const InodeItem& ii, uint64_t offset,
                                          std::span<const uint8_t> data, int64_t* nbytes_delta) {
  const uint32_t ss = vol_->sectorsize();
  const uint64_t end = offset + data.size();
  const uint64_t a = offset / ss * ss, b = (end + ss - 1) / ss * ss;
  const bool csum = !(ii.flags.get() & kInodeNodatasum);
  struct Piece {
    Key key;
    FileExtentItem fe;
    uint64_t from, to;  // the part of [a, b) this item covers
  };
  std::vector<Piece> pieces;
  {
    UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
    Cursor c(vol_->source(), tree);
    UB_RETURN_IF_ERROR(SeekFileExtent(c, id, a));
    uint64_t at = a;
    for (; c.Valid() && at < b;) {
      const Key k = c.key();
      if (k.objectid != id.ino || k.type != kExtentDataKey || k.offset > at) break;
      if (c.data().size() != sizeof(FileExtentItem)) return false;  // inline
      FileExtentItem fe;
      std::memcpy(&fe, c.data().data(), sizeof fe);
      const uint64_t ke = k.offset + fe.num_bytes.get();
      if (ke <= at) {
        UB_RETURN_IF_ERROR(c.Next());
        continue;
      }
      const bool prealloc = fe.type == kFileExtentPrealloc;
      const bool regular = fe.type == kFileExtentReg && (ii.flags.get() & kInodeNodatacow) && !csum;
      if (!(prealloc || regular) || fe.disk_bytenr.get() == 0 || fe.compression != kCompressNone ||
          fe.encryption != 0 || fe.other_encoding.get() != 0 || fe.offset.get() % ss != 0 || k.offset % ss != 0) {
        return false;
      }
      pieces.push_back(Piece{k, fe, at, std::min(ke, b)});
      at = std::min(ke, b);
      UB_RETURN_IF_ERROR(c.Next());
    }
    if (at < b) return false;  // a hole, or the end of the file's extents
  }
  for (const Piece& p : pieces) {
    UB_ASSIGN_OR_RETURN(bool alone, txn_->DataExtentOnlyOf(p.fe.disk_bytenr.get(), id.root, id.ino,
                                                           p.key.offset - p.fe.offset.get()));
    if (!alone) return false;
  }
  // Whole sectors from here on: the edges of an unaligned write keep the
  // bytes around it (a preallocated sector reads as zeros).
  std::vector<uint8_t> edges;
  std::span<const uint8_t> bytes = data;
  if (a != offset || b != end) {
    edges.assign(b - a, 0);
    UB_RETURN_IF_ERROR(Read(id, a, std::span(edges).subspan(0, std::min(b, std::max(a, ii.size.get())) - a)).status());
    std::memcpy(edges.data() + (offset - a), data.data(), data.size());
    bytes = edges;
  }
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(id.root));
  for (const Piece& p : pieces) {
    const FileExtentItem& fe = p.fe;
    const uint64_t disk = fe.disk_bytenr.get(), disk_len = fe.disk_num_bytes.get();
    const uint64_t logical = disk + fe.offset.get() + (p.from - p.key.offset);
    const bool prealloc = fe.type == kFileExtentPrealloc;
    UB_RETURN_IF_ERROR(txn_->WriteData(logical, bytes.subspan(p.from - a, p.to - p.from), prealloc && csum));
    if (!prealloc) continue;
    // [from, to) of the preallocated item becomes a regular one over the
    // same disk bytes; DropExtents keeps the parts around it.
    UB_RETURN_IF_ERROR(DropExtents(id, p.from, p.to, nbytes_delta));
    FileExtentItem reg = fe;
    reg.generation = txn_->transid();
    reg.type = kFileExtentReg;
    reg.offset = fe.offset.get() + (p.from - p.key.offset);
    reg.num_bytes = p.to - p.from;
    UB_RETURN_IF_ERROR(
        w->Insert(Key{id.ino, kExtentDataKey, p.from}, std::span(reinterpret_cast<const uint8_t*>(&reg), sizeof reg)));
    UB_RETURN_IF_ERROR(txn_->AddDataRef(disk, disk_len, id.root, id.ino, p.key.offset - fe.offset.get()));
    *nbytes_delta += static_cast<int64_t>(p.to - p.from);
  }
  return true;
}

}  // namespace ubtrfs::fsimpl
