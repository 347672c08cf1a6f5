// Hole items for images without the no-holes feature.
//
// Before no-holes (the mkfs.btrfs default since 5.15, so most images made
// before 2022), the extent items of a regular file cover it from offset 0
// to its size rounded up to a sector: a range without data has an explicit
// hole item (disk_bytenr 0), and btrfs check reports a gap as an error. The
// kernel inserts such items where it makes a hole (a write or a truncate
// past the end, a punched range). Here the write paths make holes as on
// no-holes images, and FlushInodes fills the gaps of every regular file
// changed since it last ran, so that no path that leaves a gap (a write,
// truncate, fallocate, clone, the import of a sparse file, a received
// stream) can miss one. It runs at each commit and at each fsync before the
// log is written; a filled range is noted as changed, so the log carries
// its hole items to a replay.
#include <optional>
#include <vector>

#include "fs/fs_impl.h"

namespace ubtrfs::fsimpl {

Status FilesystemImpl::FillHoles(InodeId file, uint64_t size) {
  const uint32_t ss = vol_->sectorsize();
  const uint64_t end = (size + ss - 1) / ss * ss;
  if (end == 0) return Status::Ok();
  // The hole item that ends where a gap starts grows over the gap, as the
  // kernel merges a new hole into its neighbour: repeated truncates past
  // the end leave one item, not one per truncate.
  struct Gap {
    uint64_t from, to;
    std::optional<Key> grow;  // a hole item ending at `from`
  };
  std::vector<Gap> gaps;
  {
    UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(file.root));
    Cursor c(vol_->source(), tree);
    UB_RETURN_IF_ERROR(c.Seek(Key{file.ino, kExtentDataKey, 0}));
    uint64_t pos = 0;
    std::optional<Key> last_hole;  // the item before `pos`, when it is a hole ending there
    for (; c.Valid();) {
      const Key k = c.key();
      if (k.objectid != file.ino || k.type != kExtentDataKey || k.offset >= end) break;
      if (k.offset > pos) gaps.push_back(Gap{pos, k.offset, last_hole});
      const auto d = c.data();
      if (d.size() < kFileExtentInlineDataStart) return Status::Corrupt(InodeName(file) + ": short extent item");
      const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
      bool hole = false;
      if (fe->type != kFileExtentInline) {
        if (d.size() < sizeof(FileExtentItem)) return Status::Corrupt(InodeName(file) + ": short extent item");
        hole = fe->disk_bytenr.get() == 0 && fe->type == kFileExtentReg && fe->offset.get() == 0;
      }
      const uint64_t e = FileExtentEnd(k, d, ss);
      if (e >= pos) {
        last_hole = hole ? std::optional<Key>(k) : std::nullopt;
        pos = e;
      }
      UB_RETURN_IF_ERROR(c.Next());
    }
    if (pos < end) gaps.push_back(Gap{pos, end, last_hole});
  }
  if (gaps.empty()) return Status::Ok();
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(file.root));
  for (const Gap& g : gaps) {
    const uint64_t start = g.grow ? g.grow->offset : g.from;
    const FileExtentItem fe = HoleExtentItem(txn_->transid(), g.to - start);
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(&fe), sizeof fe);
    if (g.grow) {
      UB_RETURN_IF_ERROR(w->Update(*g.grow, bytes));
    } else {
      UB_RETURN_IF_ERROR(w->Insert(Key{file.ino, kExtentDataKey, g.from}, bytes));
    }
    NoteExtentRange(file, start, g.to, /*new_inode=*/false);
  }
  return Status::Ok();
}

}  // namespace ubtrfs::fsimpl
