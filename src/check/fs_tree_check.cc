#include "check/fs_tree_check.h"

#include <algorithm>
#include <cstring>

#include "format/checksum.h"
#include "format/ondisk.h"

namespace ubtrfs::check {

using namespace ubtrfs::format;

namespace {

constexpr uint32_t kModeTypeMask = 0170000;
constexpr uint32_t kModeReg = 0100000, kModeDir = 0040000, kModeLnk = 0120000, kModeChr = 0020000,
                   kModeBlk = 0060000, kModeFifo = 0010000, kModeSock = 0140000;
constexpr uint32_t kNameMax = 255;

bool IsDir(uint32_t mode) { return (mode & kModeTypeMask) == kModeDir; }
bool IsRegOrLink(uint32_t mode) {
  return (mode & kModeTypeMask) == kModeReg || (mode & kModeTypeMask) == kModeLnk;
}

uint8_t ModeToFileType(uint32_t mode) {
  switch (mode & kModeTypeMask) {
    case kModeReg: return kFtRegFile;
    case kModeDir: return kFtDir;
    case kModeChr: return kFtChrdev;
    case kModeBlk: return kFtBlkdev;
    case kModeFifo: return kFtFifo;
    case kModeSock: return kFtSock;
    case kModeLnk: return kFtSymlink;
    default: return kFtUnknown;
  }
}

std::string Str(std::span<const uint8_t> d, size_t off, size_t len) {
  return std::string(reinterpret_cast<const char*>(d.data()) + off, len);
}

uint64_t RoundUp(uint64_t v, uint64_t a) { return v + (a - v % a) % a; }

}  // namespace

void FsTreeChecker::Error(const std::string& what) { env_.report->Error(TreeLabel(env_.tree_id) + ": " + what); }

std::string FsTreeChecker::Where(const Key& key) const { return "item " + KeyToString(key); }

void FsTreeChecker::Leaf(const tree::TreeBlock& leaf) {
  for (int slot = 0; slot < leaf.nritems(); ++slot) Item(leaf, slot, leaf.key(slot));
}

void FsTreeChecker::Item(const tree::TreeBlock& leaf, int slot, const Key& key) {
  // The free inode number cache (mount -o inode_cache, gone since Linux
  // 5.11): its header at FREE_SPACE, its hidden inode at FREE_INO. The
  // kernel ignores both now; btrfs check reports them.
  if (key.objectid == kFreeSpaceObjectid || key.objectid == kFreeInoObjectid) {
    ino_cache_ = true;
    return;
  }
  if (key.type == kOrphanItemKey) {
    if (key.objectid == kOrphanObjectid) orphans_.insert(key.offset);
    return;
  }
  if (key.objectid > kLastFreeObjectid) return;  // no inodes up there
  if (!have_cur_ || key.objectid != cur_ino_) {
    if (have_cur_) FinishInode(cur_ino_);
    have_cur_ = true;
    cur_ino_ = key.objectid;
  }
  InodeRec& rec = recs_[key.objectid];
  const auto d = leaf.item_data(slot);
  switch (key.type) {
    case kInodeItemKey: OnInodeItem(rec, key, d); break;
    case kInodeRefKey: OnInodeRefs(key, d, false); break;
    case kInodeExtrefKey: OnInodeRefs(key, d, true); break;
    case kDirItemKey:
    case kDirIndexKey: OnDirItems(rec, key, d); break;
    case kXattrItemKey: OnXattrItems(key, d); break;
    case kExtentDataKey: OnFileExtent(rec, key, d, leaf.owner()); break;
    case kVerityDescItemKey:
    case kVerityMerkleItemKey: verity_.Add(key, d); break;
    default:
      // The kernel writes no other kind into an fs tree (a new kind would
      // come with a feature flag ubtrfs refuses); btrfs check reports it too.
      Error(Where(key) + ": an item type (" + std::to_string(key.type) + ") that no fs tree holds");
      break;
  }
}

void FsTreeChecker::OnInodeItem(InodeRec& rec, const Key& key, std::span<const uint8_t> d) {
  if (rec.have_item) {
    Error(Where(key) + ": a second INODE_ITEM for inode " + std::to_string(key.objectid));
    return;
  }
  if (d.size() < sizeof(InodeItem)) {
    Error(Where(key) + ": INODE_ITEM is " + std::to_string(d.size()) + " bytes, shorter than " +
          std::to_string(sizeof(InodeItem)));
    return;
  }
  const auto* ii = reinterpret_cast<const InodeItem*>(d.data());
  rec.have_item = true;
  rec.nlink = ii->nlink.get();
  rec.mode = ii->mode.get();
  rec.isize = ii->size.get();
  rec.nbytes = ii->nbytes.get();
  rec.flags = ii->flags.get();
  const std::string ino = "inode " + std::to_string(key.objectid);
  if ((rec.mode & kModeTypeMask) == kModeLnk && (rec.flags & (kInodeImmutable | kInodeAppend))) {
    Error(ino + ": symlink with the immutable or append flag");
  }
  if (IsDir(rec.mode) && rec.nlink >= 2) {
    Error(ino + ": directory with nlink " + std::to_string(rec.nlink) + " (btrfs directories have nlink 1)");
  }
  const uint64_t limit = env_.super_generation + 1;
  if (ii->generation.get() > limit || ii->transid.get() > limit) {
    Error(ino + ": generation " + std::to_string(ii->generation.get()) + " / transid " +
          std::to_string(ii->transid.get()) + " beyond the superblock generation " +
          std::to_string(env_.super_generation));
  }
}

void FsTreeChecker::OnInodeRefs(const Key& key, std::span<const uint8_t> d, bool extended) {
  const size_t head = extended ? sizeof(InodeExtref) : sizeof(InodeRef);
  size_t cur = 0;
  while (cur < d.size()) {
    if (cur + head > d.size()) {
      Error(Where(key) + ": truncated entry at byte " + std::to_string(cur));
      break;
    }
    uint64_t dir, index;
    uint32_t name_len;
    if (extended) {
      const auto* r = reinterpret_cast<const InodeExtref*>(d.data() + cur);
      dir = r->parent_objectid.get();
      index = r->index.get();
      name_len = r->name_len.get();
    } else {
      const auto* r = reinterpret_cast<const InodeRef*>(d.data() + cur);
      dir = key.offset;
      index = r->index.get();
      name_len = r->name_len.get();
    }
    uint32_t len = name_len;
    if (cur + head + name_len > d.size() || name_len > kNameMax) {
      Error(Where(key) + ": name length " + std::to_string(name_len) + " overruns the item or exceeds 255");
      len = static_cast<uint32_t>(std::min<size_t>(d.size() - cur - head, kNameMax));
    }
    ++recs_[key.objectid].ref_names;
    AddBackref(key.objectid, dir, Str(d, cur + head, len), index, 0, key.type);
    cur += head + name_len;
  }
}

void FsTreeChecker::OnDirItems(InodeRec& rec, const Key& key, std::span<const uint8_t> d) {
  rec.own_dir_items = true;
  if (rec.have_item && rec.nlink == 0) return;  // a directory being deleted
  size_t cur = 0;
  int entries = 0;
  std::vector<std::string> names;  // this DIR_ITEM's: names of one hash
  while (cur < d.size()) {
    if (cur + sizeof(DirItem) > d.size()) {
      Error(Where(key) + ": truncated entry at byte " + std::to_string(cur));
      break;
    }
    const auto* di = reinterpret_cast<const DirItem*>(d.data() + cur);
    const uint32_t name_len = di->name_len.get(), data_len = di->data_len.get();
    const Key loc = Key::From(di->location);
    ++entries;
    rec.found_size += name_len;
    uint32_t len = name_len;
    if (cur + sizeof(DirItem) + name_len > d.size() || name_len > kNameMax) {
      Error(Where(key) + ": name length " + std::to_string(name_len) + " overruns the item or exceeds 255");
      len = static_cast<uint32_t>(std::min<size_t>(d.size() - cur - sizeof(DirItem), kNameMax));
    }
    const std::string name = Str(d, cur + sizeof(DirItem), len);
    if (key.type == kDirItemKey) {
      // Two entries of one name: a lookup finds only the first, and the
      // kernel's rename or unlink of it may take the other.
      if (std::find(names.begin(), names.end(), name) != names.end()) {
        Error(Where(key) + ": the directory holds the name '" + Esc(name) + "' twice");
      }
      names.push_back(name);
    }
    if (key.type == kDirItemKey && key.offset != NameHash(name)) {
      Error(Where(key) + ": name '" + Esc(name) + "' hashes to " + std::to_string(NameHash(name)) +
            ", not the key offset");
    } else if (loc.type == kInodeItemKey) {
      AddBackref(loc.objectid, key.objectid, name, key.type == kDirIndexKey ? key.offset : 0, di->type, key.type);
    } else if (loc.type == kRootItemKey) {
      subvol_entries_.push_back(SubvolEntry{env_.tree_id, key.objectid, loc.objectid,
                                            key.type == kDirIndexKey ? key.offset : 0, name,
                                            key.type == kDirIndexKey});
    } else {
      Error(Where(key) + ": entry '" + Esc(name) + "' points at " + KeyToString(loc) +
            ", neither an inode nor a subvolume");
    }
    cur += sizeof(DirItem) + name_len + data_len;
  }
  if (key.type == kDirIndexKey && entries > 1) {
    Error(Where(key) + ": DIR_INDEX holds " + std::to_string(entries) + " entries");
  }
}

void FsTreeChecker::OnXattrItems(const Key& key, std::span<const uint8_t> d) {
  size_t cur = 0;
  while (cur < d.size()) {
    if (cur + sizeof(DirItem) > d.size()) {
      Error(Where(key) + ": truncated xattr entry at byte " + std::to_string(cur));
      break;
    }
    const auto* di = reinterpret_cast<const DirItem*>(d.data() + cur);
    const uint32_t name_len = di->name_len.get(), data_len = di->data_len.get();
    if (name_len > kNameMax) Error(Where(key) + ": xattr name of " + std::to_string(name_len) + " bytes");
    if (cur + sizeof(DirItem) + name_len + data_len > d.size()) {
      Error(Where(key) + ": xattr entry overruns the item");
      break;
    }
    cur += sizeof(DirItem) + name_len + data_len;
  }
}

void FsTreeChecker::OnFileExtent(InodeRec& rec, const Key& key, std::span<const uint8_t> d, uint64_t leaf_owner) {
  rec.file_extents = true;
  if (rec.extent_start == UINT64_MAX) rec.extent_start = rec.extent_end = key.offset;
  if (rec.extent_end > key.offset) {
    rec.overlap = true;
  } else if (rec.extent_end < key.offset) {
    rec.first_gap = std::min(rec.first_gap, rec.extent_end);
  }
  if (d.size() < kFileExtentInlineDataStart) {
    Error(Where(key) + ": EXTENT_DATA item is " + std::to_string(d.size()) + " bytes");
    return;
  }
  const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
  const uint32_t ss = env_.sectorsize;
  const bool nodatasum = rec.flags & kInodeNodatasum;
  uint64_t num = 0, disk = 0, off = 0, disk_num = 0;
  const std::string where = Where(key);
  // As the kernel's tree checker, which refuses the whole leaf for these
  // (btrfs check 6.2 does not look).
  if (fe->compression > kCompressZstd) Error(where + ": unknown compression type " + std::to_string(fe->compression));
  if (fe->encryption != 0) Error(where + ": encryption " + std::to_string(fe->encryption) + ", expected 0");
  if (fe->type == kFileExtentInline) {
    num = fe->ram_bytes.get();
    const uint64_t inline_len = d.size() - kFileExtentInlineDataStart;
    const uint64_t max_inline =
        std::min<uint64_t>(ss - 1, env_.nodesize - sizeof(Header) - sizeof(format::Item) - kFileExtentInlineDataStart);
    if (num == 0) Error(where + ": inline extent with ram_bytes 0");
    if (fe->compression != kCompressNone) {
      if (inline_len > max_inline || num > ss) {
        Error(where + ": compressed inline extent too large (" + std::to_string(inline_len) + " bytes, ram_bytes " +
              std::to_string(num) + ")");
      }
    } else {
      if (num > max_inline) Error(where + ": inline extent of " + std::to_string(num) + " bytes is too large");
      if (inline_len != num) {
        Error(where + ": inline extent holds " + std::to_string(inline_len) + " bytes but ram_bytes is " +
              std::to_string(num));
      }
    }
    rec.found_size += num;
    num = RoundUp(num, ss);
  } else if (fe->type == kFileExtentReg || fe->type == kFileExtentPrealloc) {
    if (d.size() < sizeof(FileExtentItem)) {
      Error(where + ": EXTENT_DATA item is " + std::to_string(d.size()) + " bytes, shorter than " +
            std::to_string(sizeof(FileExtentItem)));
      return;
    }
    num = fe->num_bytes.get();
    disk = fe->disk_bytenr.get();
    disk_num = fe->disk_num_bytes.get();
    off = fe->offset.get();
    if (num == 0 || num % ss != 0) Error(where + ": num_bytes " + std::to_string(num) + " is 0 or unaligned");
    if (num + off < num || num + off > fe->ram_bytes.get()) {
      Error(where + ": offset " + std::to_string(off) + " + num_bytes " + std::to_string(num) +
            " exceeds ram_bytes " + std::to_string(fe->ram_bytes.get()));
    }
    if (fe->type == kFileExtentPrealloc &&
        (fe->compression != 0 || fe->encryption != 0 || fe->other_encoding.get() != 0)) {
      Error(where + ": preallocated extent with compression or encoding");
    }
    if (fe->compression != 0 && nodatasum) Error(where + ": compressed extent in a NODATASUM inode");
    if (disk != 0) rec.found_size += num;
  } else {
    Error(where + ": unknown file extent type " + std::to_string(fe->type));
  }
  rec.extent_end = key.offset + num;

  // Checksums: the data reloc tree copies extents without their csums.
  if (disk != 0 && leaf_owner != kDataRelocTreeObjectid && env_.csums != nullptr) {
    uint64_t start = disk + off, len = num;
    if (fe->compression != 0) {
      start = disk;
      len = disk_num;
    }
    const uint64_t found = env_.csums->Covered(start, len);
    if (fe->type == kFileExtentReg) {
      if (found > 0) rec.found_csum = true;
      if (found < len) {
        rec.csum_missing = true;
        if (fe->compression != 0) {
          Error(where + ": compressed extent at " + std::to_string(disk) + " has csums for only " +
                std::to_string(found) + " of " + std::to_string(len) + " bytes");
        }
      }
    } else if (found > 0) {
      prealloc_csums_.push_back(PreallocCsum{env_.tree_id, key.objectid, key.offset, disk});
    }
  }
}

void FsTreeChecker::AddBackref(uint64_t ino, uint64_t dir, const std::string& name, uint64_t index, uint8_t filetype,
                               uint8_t item_type) {
  InodeRec& rec = recs_[ino];
  Backref* br = nullptr;
  for (auto& b : rec.backrefs) {
    if (b.dir == dir && b.name == name) {
      br = &b;
      break;
    }
  }
  if (br == nullptr) {
    rec.backrefs.push_back(Backref{dir, name});
    br = &rec.backrefs.back();
  }
  if (item_type == kDirIndexKey) {
    if (br->dir_index) br->problems += ", duplicate DIR_INDEX";
    if (br->inode_ref && br->index != index) br->problems += ", index mismatch";
    if (br->dir_item && br->filetype != filetype) br->problems += ", file type mismatch";
    br->index = index;
    br->filetype = filetype;
    br->dir_index = true;
  } else if (item_type == kDirItemKey) {
    ++rec.found_link;
    if (br->dir_item) br->problems += ", duplicate DIR_ITEM";
    if (br->dir_index && br->filetype != filetype) br->problems += ", file type mismatch";
    br->filetype = filetype;
    br->dir_item = true;
  } else {
    if (br->inode_ref) br->problems += ", duplicate INODE_REF";
    if (br->dir_index && br->index != index) {
      br->problems += ", index mismatch";
    } else {
      br->index = index;
    }
    br->inode_ref = true;
  }
  MaybeFree(ino);
}

void FsTreeChecker::MaybeFree(uint64_t ino) {
  auto it = recs_.find(ino);
  if (it == recs_.end()) return;
  InodeRec& rec = it->second;
  if (!rec.have_item) return;
  const uint8_t ft = ModeToFileType(rec.mode);
  std::erase_if(rec.backrefs, [&](const Backref& b) {
    return b.dir_item && b.dir_index && b.inode_ref && b.problems.empty() && b.filetype == ft;
  });
  if (rec.done && rec.backrefs.empty() && ino != env_.root_dirid && rec.nlink > 0 && rec.nlink == rec.found_link &&
      rec.nlink == rec.ref_names) {
    recs_.erase(it);
  }
}

void FsTreeChecker::FinishInode(uint64_t ino) {
  auto it = recs_.find(ino);
  if (it == recs_.end()) return;
  InodeRec& rec = it->second;
  rec.done = true;
  const std::string who = "inode " + std::to_string(ino);
  if (rec.have_item && (rec.flags & kInodeRoVerity)) {
    if ((rec.mode & kModeTypeMask) != kModeReg) Error(who + ": the VERITY flag on a file that is not regular");
    for (const std::string& p : verity_.Finish(rec.isize)) Error(who + ": " + p);
  } else if (verity_.any()) {
    stray_verity_.push_back(ino);
  }
  verity_.Reset();
  if (!rec.have_item) return;  // reported at the end, unless it never mattered
  ++inodes_;
  switch (rec.mode & ~uint32_t{07777}) {  // a file type and nothing above it
    case kModeReg: case kModeDir: case kModeLnk: case kModeChr: case kModeBlk: case kModeFifo: case kModeSock:
      break;
    default:
      Error(who + ": invalid mode 0" + [&] {
        char b[16];
        std::snprintf(b, sizeof b, "%o", rec.mode);
        return std::string(b);
      }());
  }
  if (IsDir(rec.mode)) {
    if (rec.isize != rec.found_size) {
      Error(who + ": directory size " + std::to_string(rec.isize) + ", but the names of its DIR_ITEM and DIR_INDEX "
            "entries add up to " + std::to_string(rec.found_size));
    }
    if (rec.file_extents) Error(who + ": directory with EXTENT_DATA items");
  } else if (IsRegOrLink(rec.mode)) {
    if (rec.own_dir_items) Error(who + ": non-directory with DIR_ITEM/DIR_INDEX items");
    if (rec.nlink > 0 && rec.found_size != rec.nbytes) {
      Error(who + ": nbytes " + std::to_string(rec.nbytes) + ", but its file extents hold " +
            std::to_string(rec.found_size) + " bytes");
    }
    if (rec.nlink > 0 && !env_.no_holes && rec.isize != 0 &&
        (rec.extent_end < rec.isize || rec.extent_start != 0 || rec.first_gap < rec.isize)) {
      uint64_t gap = rec.first_gap;
      if (rec.extent_start != 0) gap = 0;
      if (gap == UINT64_MAX) gap = rec.extent_end;
      Error(who + ": file extents leave a gap at offset " + std::to_string(gap) + " (size " +
            std::to_string(rec.isize) + ", no no-holes feature)");
    }
  }
  if (IsRegOrLink(rec.mode)) {
    const bool nodatasum = rec.flags & kInodeNodatasum;
    if (rec.found_csum && nodatasum) Error(who + ": NODATASUM inode whose data has csums");
    if (rec.csum_missing && !nodatasum) Error(who + ": some data sectors have no csum");
  }
  if (rec.overlap) Error(who + ": file extents overlap");
  MaybeFree(ino);
}

void FsTreeChecker::CheckRootDir(const InodeRec& rec) {
  const std::string who = "root directory " + std::to_string(env_.root_dirid);
  if (!rec.have_item) {
    Error(who + ": no INODE_ITEM");
    return;
  }
  if (rec.nlink != 1) Error(who + ": nlink " + std::to_string(rec.nlink) + ", expected 1");
  if (rec.found_link != 0) Error(who + ": named by " + std::to_string(rec.found_link) + " DIR_ITEM(s)");
  bool dotdot = false;
  for (const auto& b : rec.backrefs) {
    if (!dotdot && b.name == ".." && b.inode_ref && !b.dir_item && !b.dir_index && b.index == 0 &&
        b.problems.empty()) {
      dotdot = true;
      continue;
    }
    Error(who + ": unexpected name '" + Esc(b.name) + "' in directory " + std::to_string(b.dir));
  }
  if (!dotdot) Error(who + ": no INODE_REF '..' with index 0");
}

void FsTreeChecker::ReportUnsettled(uint64_t ino, const InodeRec& rec) {
  const std::string who = "inode " + std::to_string(ino);
  if (!rec.have_item) {
    std::string by;
    for (const auto& b : rec.backrefs) {
      by += (by.empty() ? " (named '" : ", '") + Esc(b.name) + "' in directory " + std::to_string(b.dir);
    }
    if (!by.empty()) by += ")";
    Error(who + ": no INODE_ITEM" + by);
    return;
  }
  const bool orphan = rec.nlink == 0 && orphans_.count(ino) != 0;
  if (rec.nlink == 0 && !orphan) Error(who + ": nlink 0 and no ORPHAN_ITEM");
  if (rec.found_link != rec.nlink || rec.ref_names != rec.nlink) {
    Error(who + ": nlink " + std::to_string(rec.nlink) + ", but " + std::to_string(rec.found_link) +
          " DIR_ITEM name(s) and " + std::to_string(rec.ref_names) + " INODE_REF/INODE_EXTREF name(s) refer to it");
  }
  const uint8_t ft = ModeToFileType(rec.mode);
  for (const auto& b : rec.backrefs) {
    std::string p;
    if (!b.dir_item) p += ", no DIR_ITEM";
    if (!b.dir_index) p += ", no DIR_INDEX";
    if (!b.inode_ref) p += ", no INODE_REF";
    p += b.problems;
    if (b.dir_item && b.dir_index && b.filetype != ft) p += ", entry file type does not match the inode mode";
    if (p.empty()) continue;
    Error(who + ": name '" + Esc(b.name) + "' in directory " + std::to_string(b.dir) + " (index " +
          std::to_string(b.index) + ")" + p);
  }
}

void FsTreeChecker::Finish() {
  if (have_cur_) FinishInode(cur_ino_);
  have_cur_ = false;
  for (uint64_t ino : stray_verity_) {
    if (!orphans_.count(ino)) {
      Error("inode " + std::to_string(ino) + ": fs-verity items without the VERITY flag or an orphan item");
    }
  }
  stray_verity_.clear();
  for (const auto& [ino, rec] : recs_) {
    if (ino == env_.root_dirid) {
      CheckRootDir(rec);
      continue;
    }
    ReportUnsettled(ino, rec);
  }
  if (recs_.count(env_.root_dirid) == 0) Error("root directory " + std::to_string(env_.root_dirid) + " not found");
  recs_.clear();
}

}  // namespace ubtrfs::check
