// The POSIX view over an opened Volume, internal to libubtrfs. The read side
// (lookup, stat, readdir, data, symlinks, xattrs, statfs) is defined here;
// the write side in write_ops.cc.
#ifndef UBTRFS_FS_FS_IMPL_H_
#define UBTRFS_FS_FS_IMPL_H_

#include "ubtrfs/filesystem.h"

#include <dirent.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <type_traits>
#include <unordered_map>
#include <mutex>
#include <shared_mutex>
#include <array>
#include <atomic>
#include <utility>
#include <optional>

#include "format/checksum.h"
#include "fs/dir_names.h"
#include "fs/statfs.h"
#include "format/superblock.h"
#include "format/verity.h"
#include "fs/compress.h"
#include "fs/compress_write.h"
#include "fs/subvolume.h"
#include "fs/word_mutex.h"
#include "inode/delayed_dir_items.h"
#include "inode/delayed_index.h"
#include "inode/inode_cache.h"
#include "io/undo_device.h"
#include "log/tree_log.h"
#include "stats/stats.h"
#include "txn/clock.h"
#include "txn/space_reserve.h"
#include "txn/super_info.h"
#include "txn/transaction.h"
#include "txn/volume.h"

namespace ubtrfs::fsimpl {


using namespace ubtrfs::format;
using txn::Volume;
using tree::Cursor;

// Upper bounds that keep a damaged extent item from asking for huge buffers:
// btrfs never writes a compressed extent larger than 128 KiB of data.
constexpr uint64_t kMaxCompressedExtent = 128 * 1024;
// Files up to this size whose data starts at offset 0 are stored inline in
// the tree, as the kernel does by default (max_inline).
constexpr uint64_t kMaxInline = 2048;

// A file extent item that covers the whole of an uncompressed disk extent
// (regular or prealloc) of `len` bytes at `bytenr`.
inline FileExtentItem WholeExtentItem(uint64_t transid, uint8_t type, uint64_t bytenr, uint64_t len) {
  FileExtentItem fe{};
  fe.generation = transid;
  fe.ram_bytes = len;
  fe.compression = kCompressNone;
  fe.type = type;
  fe.disk_bytenr = bytenr;
  fe.disk_num_bytes = len;
  fe.offset = 0;
  fe.num_bytes = len;
  return fe;
}

// An explicit hole (disk_bytenr 0) of `len` bytes, as the kernel writes one
// on images without no-holes (explicit_holes.cc).
inline FileExtentItem HoleExtentItem(uint64_t transid, uint64_t len) {
  FileExtentItem fe{};
  fe.generation = transid;
  fe.ram_bytes = len;
  fe.type = kFileExtentReg;
  fe.num_bytes = len;
  return fe;
}

// Where a file extent item's range ends: an inline extent covers its bytes
// rounded up to a sector, as btrfs check and the kernel count it; an item
// too short to say covers one sector.
inline uint64_t FileExtentEnd(const Key& k, std::span<const uint8_t> d, uint32_t ss) {
  if (d.size() < kFileExtentInlineDataStart) return k.offset + ss;
  const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
  if (fe->type == kFileExtentInline || d.size() < sizeof(FileExtentItem)) {
    return k.offset + (fe->ram_bytes.get() + ss - 1) / ss * ss;
  }
  return k.offset + fe->num_bytes.get();
}

// Inode timestamps come from the coarse clock, as the kernel's current_time()
// does (tick resolution): reading it costs no time-stamp-counter read, and
// every create reads it twice (the inode, its directory).
inline Time Now() {
  const timespec ts = txn::WallClock(/*coarse=*/true);
  return Time{ts.tv_sec, static_cast<uint32_t>(ts.tv_nsec)};
}

inline void SetTime(Timespec& ts, const Time& t) {
  ts.sec = static_cast<uint64_t>(t.sec);
  ts.nsec = t.nsec;
}

// A DIR_ITEM / XATTR_ITEM entry: the header, the name, then the data.
inline std::vector<uint8_t> DirItemBytes(const Key& location, uint64_t transid, uint8_t type, std::string_view name,
                                  std::string_view data) {
  std::vector<uint8_t> b(sizeof(DirItem) + name.size() + data.size());
  auto* di = reinterpret_cast<DirItem*>(b.data());
  location.To(&di->location);
  di->transid = transid;
  di->data_len = static_cast<uint16_t>(data.size());
  di->name_len = static_cast<uint16_t>(name.size());
  di->type = type;
  std::memcpy(b.data() + sizeof(DirItem), name.data(), name.size());
  if (!data.empty()) std::memcpy(b.data() + sizeof(DirItem) + name.size(), data.data(), data.size());
  return b;
}

inline std::string InodeName(InodeId id) {
  return "inode " + std::to_string(id.ino) + " in tree " + std::to_string(id.root);
}

inline uint8_t DtFromFt(uint8_t ft) {
  switch (ft) {
    case kFtRegFile: return DT_REG;
    case kFtDir: return DT_DIR;
    case kFtChrdev: return DT_CHR;
    case kFtBlkdev: return DT_BLK;
    case kFtFifo: return DT_FIFO;
    case kFtSock: return DT_SOCK;
    case kFtSymlink: return DT_LNK;
    default: return DT_UNKNOWN;
  }
}

// One entry of a DIR_ITEM/DIR_INDEX/XATTR_ITEM item (an item may pack several).
struct DirItemView {
  Key location;
  uint8_t type;
  std::string_view name;
  std::string_view data;
};

// Splits an item into its dir items, checking every length against the item.
inline Result<std::vector<DirItemView>> ParseDirItems(std::span<const uint8_t> d, const Key& key) {
  std::vector<DirItemView> out;
  size_t pos = 0;
  while (pos < d.size()) {
    if (d.size() - pos < sizeof(DirItem)) {
      return Status::Corrupt("item " + KeyToString(key) + ": truncated dir item at byte " + std::to_string(pos));
    }
    const auto* di = reinterpret_cast<const DirItem*>(d.data() + pos);
    const size_t nl = di->name_len.get(), dl = di->data_len.get();
    if (nl == 0 || nl + dl > d.size() - pos - sizeof(DirItem)) {
      return Status::Corrupt("item " + KeyToString(key) + ": dir item name/data lengths " + std::to_string(nl) + "/" +
                             std::to_string(dl) + " overrun the item");
    }
    const char* name = reinterpret_cast<const char*>(di) + sizeof(DirItem);
    out.push_back(DirItemView{Key::From(di->location), di->type, std::string_view(name, nl),
                              std::string_view(name + nl, dl)});
    pos += sizeof(DirItem) + nl + dl;
  }
  return out;
}

// Puts a cursor on a file's extent item that covers `offset` or comes
// before it, else on the file's first extent item (or past its items).
inline Status SeekFileExtent(tree::Cursor& c, InodeId file, uint64_t offset) {
  UB_RETURN_IF_ERROR(c.SeekAtOrBefore(Key{file.ino, kExtentDataKey, offset}));
  if (!c.Valid() || c.key().objectid != file.ino || c.key().type != kExtentDataKey) {
    UB_RETURN_IF_ERROR(c.Seek(Key{file.ino, kExtentDataKey, 0}));
  }
  return Status::Ok();
}

// A new entry's name: 1-255 bytes, no '/' or NUL, not "." or "..".
Status CheckName(std::string_view name);

class FilesystemImpl final : public Filesystem {
 public:
  enum class OpMode : uint8_t { kNone, kShared, kExclusive };  // of the operation lock (OpGuard)
  explicit FilesystemImpl(std::unique_ptr<Volume> vol) : vol_(std::move(vol)) {}
  ~FilesystemImpl() override;

  // Makes the view writable: starts the transaction machinery.
  Status InitWrite();
  void set_legacy_dir_index_batching(bool on) { legacy_batching_ = on; }
  void set_dir_item_options(uint32_t index_after, uint32_t batch) {
    if (index_after) dir_item_options_.index_after = index_after;
    if (batch) dir_item_options_.dir_batch = batch;
  }
  void set_max_dirty_bytes(uint64_t n) { max_dirty_bytes_ = n; }
  void set_drop_step_blocks(uint64_t n) { drop_step_blocks_ = n; }
  // Drops the subvolumes a deletion left dead (a crash, or the kernel's
  // cleaner not done at unmount), a commit per step (subvolume_admin.cc).
  Status FinishDeadTrees();
  // Inodes left with no name and an orphan item (a crash while a file was
  // unlinked but open): deleted, in every writable subvolume (orphans.cc).
  Status CleanOrphans();
  void set_compression(const CompressOptions& c) { compress_ = c; }
  const CompressOptions& compression() const { return compress_; }
  // Data of `type` was written: its incompat flag goes in at the next commit.
  void NoteCompressed(uint8_t type);
  // Write with ranges compressed ahead (the import's workers); the same
  // result as Write, sooner.
  Result<size_t> WritePrecompressed(InodeId file, uint64_t offset, std::span<const uint8_t> data,
                                    std::span<const fs::Precompressed> pre);
  void set_undo_devices(std::vector<io::UndoDevice*> u) { undo_ = std::move(u); }

  // ---- Write side (write_ops.cc) ----
  Result<InodeId> Create(InodeId dir, std::string_view name, const NewInode& attrs) override;
  Result<InodeId> Mkdir(InodeId dir, std::string_view name, const NewInode& attrs) override;
  Result<InodeId> Mknod(InodeId dir, std::string_view name, const NewInode& attrs) override;
  Result<InodeId> Symlink(InodeId dir, std::string_view name, std::string_view target, const NewInode& attrs) override;
  Status Link(InodeId inode, InodeId dir, std::string_view name) override;
  Status Unlink(InodeId dir, std::string_view name) override;
  Status Rmdir(InodeId dir, std::string_view name) override;
  Status Rename(InodeId old_dir, std::string_view old_name, InodeId new_dir, std::string_view new_name,
                unsigned flags) override;
  Result<size_t> Write(InodeId file, uint64_t offset, std::span<const uint8_t> data) override;
  Status SetAttr(InodeId id, const AttrChange& change) override;
  Status SetXattr(InodeId id, std::string_view name, std::string_view value, int flags) override;
  Status RemoveXattr(InodeId id, std::string_view name) override;
  Status Commit() override;
  Status Fsync(InodeId id, bool datasync) override;  // fsync.cc
  void PinInode(InodeId id) override;                 // orphans.cc
  Status UnpinInode(InodeId id) override;
  Status Discard() override;
  Status Fallocate(InodeId file, int mode, uint64_t offset, uint64_t len) override;  // fallocate.cc
  // subvolume.cc
  Result<bool> SubvolumeReadOnly(InodeId subvol) override;
  Status SetSubvolumeReadOnly(InodeId subvol, bool read_only) override;
  Result<InodeId> CreateSnapshot(InodeId subvol, InodeId dir, std::string_view name, bool read_only) override;
  // subvolume_admin.cc
  Result<InodeId> CreateSubvolume(InodeId dir, std::string_view name, const NewInode& attrs) override;
  Status DeleteSubvolume(InodeId dir, std::string_view name) override;
  // Drops dead tree `id` to its end, committing each step.
  Status DropDeadTree(uint64_t id);
  Result<std::vector<SubvolumeInfo>> ListSubvolumes() override;
  Result<uint64_t> DefaultSubvolume() override {
    auto guard = Guard();
    return DefaultSubvolumeId();
  }
  Status SetDefaultSubvolume(uint64_t id) override;
  Status RescanQuotas() override;  // quotas.cc
  // `name` is free in directory `dir` for a new subvolume's entry (EEXIST,
  // ENOTDIR and name errors otherwise).
  Status CheckNewSubvolumeEntry(InodeId dir, std::string_view name);
  // The entry `name` in `dir` for subvolume `id` (DIR_ITEM, DIR_INDEX,
  // ROOT_REF/ROOT_BACKREF) and its UUID tree item.
  Status LinkSubvolume(InodeId dir, std::string_view name, uint64_t id, const uint8_t (&uuid)[16]);
  // Deletes subvolume `target`, named `name` in `dir`: its entry now, its
  // tree to the end (committing between steps).
  Status RemoveSubvolume(InodeId dir, std::string_view name, InodeId target);
  // subvolume_entries.cc: entries that name subvolumes, under rmdir and
  // rename. What a directory entry names: an inode of the directory's own
  // tree, the top of another subvolume, or a snapshot's empty stub of a
  // nested subvolume (an entry without a matching ROOT_REF).
  enum class EntryKind { kInode, kSubvolume, kStub };
  static EntryKind KindOf(InodeId dir, InodeId target);
  // DIR_ITEM, DIR_INDEX and the ROOT_REF/ROOT_BACKREF pair; the UUID tree
  // is the caller's.
  Status LinkSubvolumeEntry(InodeId dir, std::string_view name, uint64_t id);
  Status UnlinkSubvolumeEntry(InodeId dir, std::string_view name, uint64_t id);
  Status RemoveStubEntry(InodeId dir, std::string_view name, InodeId stub);
  Status RmdirSubvolumeEntry(InodeId dir, std::string_view name, InodeId target);
  // The next free subvolume id (never one this view deleted).
  Result<uint64_t> NewSubvolumeId();
  uint64_t min_subvol_id_ = 0;
  Status Clone(InodeId src, uint64_t src_offset, InodeId dst, uint64_t dst_offset, uint64_t len) override;  // reflink.cc
  Status EnableVerity(InodeId file, const VerityParams& params) override;  // verity.cc
  Result<std::optional<VerityInfo>> GetVerity(InodeId file) override;
  Status VerifyVerity(InodeId file) override;
  void SetCallerKeepsFileTimes(bool on) override { caller_keeps_file_times_.store(on, std::memory_order_relaxed); }
  bool CallerKeepsFileTimes() const { return caller_keeps_file_times_.load(std::memory_order_relaxed); }

  // ---- Receive (send/receive.cc) ----
  // While set, no change commits on its own: not the auto-commit at
  // max_dirty_bytes, not the commit before an ENOSPC retry, not the commits
  // around CreateSnapshot and CreateSubvolume. A received stream is then one
  // transaction that either commits whole or is discarded.
  void set_hold_commits(bool hold) { hold_commits_ = hold; }
  bool hold_commits() const { return hold_commits_; }
  // Marks the subvolume whose top is `subvol` as received, as the kernel's
  // BTRFS_IOC_SET_RECEIVED_SUBVOL then SUBVOL_SETFLAGS do: received_uuid,
  // stransid, rtransid (this transaction), rtime (now), stime cleared, the
  // UUID tree's RECEIVED_SUBVOL item, and the RDONLY flag. Returns rtransid.
  Result<uint64_t> SetReceivedSubvol(InodeId subvol, const uint8_t (&received_uuid)[16], uint64_t stransid);
  // The top directory of subvolume `id`.
  Result<InodeId> SubvolumeTopOf(uint64_t id) { return SubvolRoot(id); }

  // ---- Send (send/send.cc, send/incremental.cc) ----
  // A tree's root and ROOT_ITEM (a subvolume's, or the extent tree's), the
  // source its blocks are read from, and data read by logical address: what
  // the incremental send's tree comparison and extent lookups need.
  Result<Volume::TreeRoot> SendTreeRoot(uint64_t id) { return vol_->FindRoot(id); }
  tree::BlockSource* SendBlockSource() { return vol_->source(); }
  Status SendReadData(uint64_t logical, std::span<uint8_t> out) {
    return vol_->ReadData(logical, out, vol_->verify_data_csums());
  }
  uint32_t SendSectorSize() const { return vol_->sectorsize(); }

  // ---- Bulk import of new inodes under an empty directory (import.cc) ----
  struct BulkTarget {
    uint64_t transid = 0;
    uint64_t first_ino = 0;    // the new inodes take first_ino, first_ino + 1, ...
    uint64_t first_index = 0;  // the directory's new entries take first_index, ...
    uint64_t inode_flags = 0;  // what new inodes inherit from the directory
    uint32_t max_item = 0;    // largest item
    uint32_t leaf_space = 0;  // item bytes (headers included) a leaf holds
    uint32_t sectorsize = 0;
  };
  Result<BulkTarget> BulkBegin(InodeId dir);
  // Inserts ascending new items (one leaf's worth per call is the efficient
  // size; appending after the tree's last key is the fast case).
  Status BulkInsert(InodeId dir, std::span<const format::Key> keys, std::span<const std::vector<uint8_t>> data);
  // The inode numbers and entry indexes used, and the directory's size growth.
  Status BulkEnd(InodeId dir, const BulkTarget& t, uint64_t inodes, uint64_t entries, uint64_t dir_size_delta);
  // ORs `flags` into an inode's flags (mkfs --inode-flags on the import's top).
  Status AddInodeFlags(InodeId id, uint64_t flags);

  // Paths start at the chosen subvolume (OpenOptions::subvol / subvolid),
  // else at the default one (subvolume.cc).
  // `fall_back`: a default entry that cannot be read leaves paths at the top
  // level, with a warning (rescue=ignorebadroots).
  Status Init(const std::string& subvol_path, uint64_t subvolid, bool fall_back = false);
  // The subvolume the "default" entry of the root tree names (5 without one).
  Result<uint64_t> DefaultSubvolumeId() {
    uint64_t subvol = kFsTreeObjectid;
    tree::Cursor c(vol_->source(), txn_ ? txn_->Writer(kRootTreeObjectid).value()->LiveRef() : vol_->root_tree());
    const Key k{kRootTreeDirObjectid, kDirItemKey, NameHash("default")};
    UB_RETURN_IF_ERROR(c.Seek(k).WithContext("root tree"));
    if (c.Valid() && c.key() == k) {
      UB_ASSIGN_OR_RETURN(auto items, ParseDirItems(c.data(), k));
      for (const auto& di : items) {
        if (di.name == "default" && di.location.type == kRootItemKey) subvol = di.location.objectid;
      }
    }
    return subvol;
  }
  Status InitDefault(bool fall_back) {
    // The kernel mounts the default subvolume; so do we.
    auto id = DefaultSubvolumeId();
    if (!id.ok() && fall_back) {
      vol_->AddWarning("the default subvolume entry: " + id.status().message() +
                       ": paths start at the top level (rescue=ignorebadroots)");
      id = uint64_t{kFsTreeObjectid};
    } else if (!id.ok() && !vol_->writable()) {
      return Status::Error(id.status().code(), "the default subvolume entry: " + id.status().message() +
                                                   "; the rescue option ignorebadroots starts at the top level");
    }
    UB_ASSIGN_OR_RETURN(const uint64_t subvol, std::move(id));
    UB_ASSIGN_OR_RETURN(root_, SubvolRoot(subvol));
    return GetStat(root_).status().WithContext("root directory");
  }

  const std::vector<std::string>& Warnings() const override { return vol_->warnings(); }

  FsInfo Info() const override {
    FsInfo i = txn::InfoFromSuperblock(vol_->super(), vol_->super_mirror());
    i.devices_missing = vol_->missing_devices();
    return i;
  }

  InodeId Root() const override { return root_; }

  Result<InodeId> Lookup(std::string_view path) override {
    auto guard = Guard();
    InodeId cur = root_;
    size_t pos = 0;
    while (pos < path.size()) {
      size_t slash = path.find('/', pos);
      std::string_view comp = path.substr(pos, slash == std::string_view::npos ? std::string_view::npos : slash - pos);
      pos = slash == std::string_view::npos ? path.size() : slash + 1;
      if (comp.empty() || comp == ".") continue;
      auto next = LookupChild(cur, comp);
      if (!next.ok()) return next.status().WithContext(std::string(path));
      cur = *next;
    }
    return cur;
  }

  Result<InodeId> LookupChild(InodeId dir, std::string_view name) override {
    auto guard = Guard();
    if (name.empty() || name.size() > kNameMax) {
      return Status::Error(ENAMETOOLONG, "bad name length " + std::to_string(name.size()));
    }
    if (name.find('/') != std::string_view::npos || name.find('\0') != std::string_view::npos) {
      return Status::Invalid("name " + PrintableName(name) + " contains '/' or NUL");
    }
    UB_ASSIGN_OR_RETURN(Stat st, GetStat(dir));
    if (!S_ISDIR(st.mode)) return Status::Error(ENOTDIR, InodeName(dir) + " is not a directory");
    if (name == ".") return dir;
    if (name == "..") return Parent(dir);
    if (StubParent(dir)) return Status::NotFound(std::string(name) + ": no such entry in an empty subvolume stub");
    const Key k{dir.ino, kDirItemKey, NameHash(name)};
    std::optional<std::vector<uint8_t>> item;
    if (dir_items_) {  // an indexed directory knows absent names, and has queued items
      std::vector<uint8_t> queued;
      switch (dir_items_->Find(dir.root, dir.ino, static_cast<uint32_t>(k.offset), &queued)) {
        case inode::DelayedDirItems::Probe::kAbsent:
          return Status::NotFound(std::string(name) + ": no such entry in directory " + InodeName(dir));
        case inode::DelayedDirItems::Probe::kPending:
          item = std::move(queued);
          break;
        case inode::DelayedDirItems::Probe::kUnknown:
          break;
      }
    }
    if (!item) {
      UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(dir.root));
      UB_ASSIGN_OR_RETURN(item, tree::LookupItem(vol_->source(), tree, k));
    }
    if (item) {
      UB_ASSIGN_OR_RETURN(auto entries, ParseDirItems(*item, k));
      for (const auto& e : entries) {
        if (e.name == name) return Resolve(dir, e.location, e.name);
      }
    }
    return Status::NotFound(std::string(name) + ": no such entry in directory " + InodeName(dir));
  }

  Result<Stat> GetStat(InodeId id) override {
    auto guard = Guard();
    if (auto parent = StubParent(id)) {
      // As the kernel shows it: an empty 0755 directory owned like its parent.
      UB_ASSIGN_OR_RETURN(Stat p, GetStat(*parent));
      Stat s;
      s.id = id;
      s.mode = S_IFDIR | 0755;
      s.nlink = 1;
      s.uid = p.uid;
      s.gid = p.gid;
      s.atime = p.atime;
      s.mtime = s.ctime = p.mtime;
      return s;
    }
    InodeItem ii_buf;
    if (txn_) {
      // A writable view keeps inodes it touched in memory (delayed updates).
      UB_ASSIGN_OR_RETURN(ii_buf, LoadInode(id));
    } else {
      UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
      const Key k{id.ino, kInodeItemKey, 0};
      UB_ASSIGN_OR_RETURN(auto item, tree::LookupItem(vol_->source(), tree, k));
      if (!item) return Status::NotFound(InodeName(id) + " does not exist");
      if (item->size() < sizeof(InodeItem)) {
        return Status::Corrupt(InodeName(id) + ": inode item is " + std::to_string(item->size()) + " bytes");
      }
      std::memcpy(&ii_buf, item->data(), sizeof ii_buf);
    }
    const InodeItem& ii = ii_buf;
    Stat s;
    s.id = id;
    s.mode = ii.mode.get();
    s.nlink = ii.nlink.get();
    s.uid = ii.uid.get();
    s.gid = ii.gid.get();
    // The kernel stores device numbers as major << 20 | minor.
    const uint64_t rdev = ii.rdev.get();
    s.rdev = makedev(static_cast<unsigned>(rdev >> 20), static_cast<unsigned>(rdev & 0xfffff));
    s.size = ii.size.get();
    s.nbytes = ii.nbytes.get();
    s.generation = ii.generation.get();
    s.flags = ii.flags.get();
    auto t = [](const format::Timespec& ts) {
      return Time{static_cast<int64_t>(ts.sec.get()), ts.nsec.get()};
    };
    s.atime = t(ii.atime);
    s.mtime = t(ii.mtime);
    s.ctime = t(ii.ctime);
    s.otime = t(ii.otime);
    return s;
  }

  using Filesystem::ReadDir;
  Result<std::vector<DirEntry>> ReadDir(InodeId dir, std::vector<SkippedEntry>* skipped) override {
    auto guard = Guard();
    std::unique_lock<fs::WordMutex> dir_lock;
    if (txn_ && !HoldsExclusive()) dir_lock = std::unique_lock(InodeLock(dir));
    if (StubParent(dir)) return std::vector<DirEntry>();
    UB_ASSIGN_OR_RETURN(Stat st, GetStat(dir));
    if (!S_ISDIR(st.mode)) return Status::Error(ENOTDIR, InodeName(dir) + " is not a directory");
    UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(dir.root));
    std::vector<DirEntry> out;
    Cursor c(vol_->source(), tree);
    std::vector<Cursor::Skipped> lost;
    if (salvage_) c.SkipUnreadable(&lost);
    UB_RETURN_IF_ERROR(c.Seek(Key{dir.ino, kDirIndexKey, 0}));
    for (; c.Valid(); ) {
      const Key k = c.key();
      if (k.objectid != dir.ino || k.type != kDirIndexKey) break;
      UB_ASSIGN_OR_RETURN(auto entries, ParseDirItems(c.data(), k));
      if (entries.size() != 1) return Status::Corrupt("item " + KeyToString(k) + " holds " +
                                                      std::to_string(entries.size()) + " entries");
      const auto& e = entries[0];
      UB_ASSIGN_OR_RETURN(InodeId id, Resolve(dir, e.location, e.name));
      out.push_back(DirEntry{std::string(e.name), id, DtFromFt(e.type), k.offset});
      UB_RETURN_IF_ERROR(c.Next());
    }
    // Entries still queued as delayed dir-index items.
    if (const auto* pending = delayed_ ? delayed_->Pending(dir.root, dir.ino) : nullptr) {
      for (const auto& [index, item] : *pending) {
        const Key k{dir.ino, kDirIndexKey, index};
        UB_ASSIGN_OR_RETURN(auto entries, ParseDirItems(item, k));
        if (entries.size() != 1) {
          return Status::Error(EIO, "queued dir index " + KeyToString(k) + " holds " + std::to_string(entries.size()) +
                                        " entries (a flush that failed left it behind)");
        }
        UB_ASSIGN_OR_RETURN(InodeId id, Resolve(dir, entries[0].location, entries[0].name));
        out.push_back(DirEntry{std::string(entries[0].name), id, DtFromFt(entries[0].type), index});
      }
      std::sort(out.begin(), out.end(), [](const DirEntry& a, const DirEntry& b) { return a.index < b.index; });
    }
    if (!lost.empty()) UB_RETURN_IF_ERROR(SalvageDirEntries(dir, st.size, tree, lost, &out, skipped));
    FilterDirEntries(&out, skipped);
    return out;
  }
  // RescueOptions::salvage: what ReadDir lost to unreadable tree blocks is
  // reported, and the names the directory's name-hash items still hold are
  // listed after the others (fs/dir_salvage.cc).
  Status SalvageDirEntries(InodeId dir, uint64_t dir_size, const tree::RootPtr& tree, const std::vector<tree::Cursor::Skipped>& lost,
                           std::vector<DirEntry>* out, std::vector<SkippedEntry>* skipped);
  void set_salvage(bool on) { salvage_ = on; }

  Result<size_t> Read(InodeId file, uint64_t offset, std::span<uint8_t> buf) override {
    auto guard = Guard();
    UB_ASSIGN_OR_RETURN(ReadStart r, StartRead(file, offset, buf.size()));
    if (r.len == 0) return size_t{0};
    const uint64_t len = r.len, end = offset + len;
    const bool verify = r.verify;
    Cursor c(vol_->source(), r.tree);
    UB_RETURN_IF_ERROR(SeekFileExtent(c, file, offset));
    // Holes read as zeros: the gaps between extents and past the last one
    // are zeroed here, the ranges extents cover by CopyExtent.
    uint64_t filled = offset;
    for (; c.Valid(); ) {
      const Key k = c.key();
      if (k.objectid != file.ino || k.type != kExtentDataKey || k.offset >= end) break;
      if (k.offset > filled) std::memset(buf.data() + (filled - offset), 0, k.offset - filled);
      UB_RETURN_IF_ERROR(CopyExtent(file, k, c.data(), offset, end, buf.data(), verify, &filled));
      UB_RETURN_IF_ERROR(c.Next());
    }
    if (filled < end) std::memset(buf.data() + (filled - offset), 0, end - filled);
    return static_cast<size_t>(len);
  }

  Result<size_t> ReadPieces(InodeId file, uint64_t offset, std::span<uint8_t> scratch,
                            const ReadSink& send) override;  // read_pieces.cc

  // lseek SEEK_DATA / SEEK_HOLE from the file's extent items: inline and
  // regular extents on disk are data; gaps, disk_bytenr 0 and prealloc
  // extents are holes (as the kernel's btrfs reports them without delalloc).
  Result<uint64_t> SeekHole(InodeId file, uint64_t offset, bool hole) override {
    auto guard = Guard();
    UB_ASSIGN_OR_RETURN(Stat st, GetStat(file));
    if (!S_ISREG(st.mode)) return Status::Error(EINVAL, InodeName(file) + " is not a regular file");
    if (offset >= st.size) return Status::Error(ENXIO, "offset at or past the end of the file");
    UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(file.root));
    Cursor c(vol_->source(), tree);
    UB_RETURN_IF_ERROR(SeekFileExtent(c, file, offset));
    uint64_t pos = offset;
    for (bool first = true; pos < st.size; first = false) {
      if (!first) {
        UB_RETURN_IF_ERROR(c.Next());
      }
      if (!c.Valid()) break;
      const Key k = c.key();
      if (k.objectid != file.ino || k.type != kExtentDataKey) break;
      const auto d = c.data();
      if (d.size() < kFileExtentInlineDataStart) return Status::Corrupt(InodeName(file) + ": extent item too small");
      const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
      uint64_t len;
      bool data;
      if (fe->type == kFileExtentInline) {
        len = fe->ram_bytes.get();
        data = true;
      } else {
        if (d.size() < sizeof(FileExtentItem)) return Status::Corrupt(InodeName(file) + ": extent item too small");
        len = fe->num_bytes.get();
        data = fe->type == kFileExtentReg && fe->disk_bytenr.get() != 0;
      }
      if (k.offset + len <= pos) continue;
      if (k.offset > pos) {  // a gap: a hole
        if (hole) return pos;
        pos = k.offset;
        if (pos >= st.size) break;
      }
      if (data != hole) return pos;
      pos = k.offset + len;
    }
    if (hole) return std::min(pos, st.size);  // the end of the file counts as a hole
    return Status::Error(ENXIO, "no data at or after the offset");
  }

  Result<std::string> ReadLink(InodeId link) override {
    auto guard = Guard();
    UB_ASSIGN_OR_RETURN(Stat st, GetStat(link));
    if (!S_ISLNK(st.mode)) return Status::Invalid(InodeName(link) + " is not a symlink");
    if (st.size > 4096) return Status::Corrupt(InodeName(link) + ": symlink of " + std::to_string(st.size) + " bytes");
    std::string target(st.size, '\0');
    UB_ASSIGN_OR_RETURN(size_t n, Read(link, 0, std::span(reinterpret_cast<uint8_t*>(target.data()), target.size())));
    target.resize(n);
    return target;
  }

  Result<std::vector<std::string>> ListXattr(InodeId id) override {
    auto guard = Guard();
    if (StubParent(id)) return std::vector<std::string>();
    UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
    std::vector<std::string> out;
    Cursor c(vol_->source(), tree);
    UB_RETURN_IF_ERROR(c.Seek(Key{id.ino, kXattrItemKey, 0}));
    for (; c.Valid(); ) {
      const Key k = c.key();
      if (k.objectid != id.ino || k.type != kXattrItemKey) break;
      UB_ASSIGN_OR_RETURN(auto entries, ParseDirItems(c.data(), k));
      for (const auto& e : entries) out.emplace_back(e.name);
      UB_RETURN_IF_ERROR(c.Next());
    }
    return out;
  }

  Result<std::string> GetXattr(InodeId id, std::string_view name) override {
    auto guard = Guard();
    if (inode::InodeRef r = icache_.Lookup(id.root, id.ino); r && r->without_xattrs.load(std::memory_order_acquire)) {
      return Status::Error(ENODATA, std::string(name) + ": no such xattr on " + InodeName(id));
    }
    UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
    const Key k{id.ino, kXattrItemKey, NameHash(name)};
    UB_ASSIGN_OR_RETURN(auto item, tree::LookupItem(vol_->source(), tree, k));
    if (item) {
      UB_ASSIGN_OR_RETURN(auto entries, ParseDirItems(*item, k));
      for (const auto& e : entries) {
        if (e.name == name) return std::string(e.data);
      }
    }
    return Status::Error(ENODATA, std::string(name) + ": no such xattr on " + InodeName(id));
  }

  Result<FsStat> StatFs() override {
    auto guard = Guard();
    // The figures a kernel mount reports (fs/statfs.h): a running
    // transaction's block groups as they are now, else the committed ones.
    StatFsInput in;
    if (txn_) {
      UB_ASSIGN_OR_RETURN(in, StatFsInputFromTxn(*txn_));
    } else {
      UB_ASSIGN_OR_RETURN(in, StatFsInputFromVolume(*vol_));
    }
    return ToFsStat(in, KernelStatFs(in));
  }

 private:
  // Where Read and ReadPieces begin: how many bytes there are to read at
  // `offset` (0 at or past the end), whether data checksums apply, and the
  // tree that holds the file.
  struct ReadStart {
    uint64_t len = 0;
    bool verify = false;
    tree::RootPtr tree;
  };
  Result<ReadStart> StartRead(InodeId file, uint64_t offset, size_t want) {
    UB_ASSIGN_OR_RETURN(Stat st, GetStat(file));
    if (S_ISDIR(st.mode)) return Status::Error(EISDIR, InodeName(file) + " is a directory");
    ReadStart r;
    if (offset >= st.size || want == 0) return r;
    r.len = std::min<uint64_t>(want, st.size - offset);
    r.verify = vol_->verify_data_csums() && !(st.flags & kInodeNodatasum);
    UB_ASSIGN_OR_RETURN(r.tree, FsTree(file.root));
    return r;
  }

  // Copies the part of one file extent that overlaps [offset, end) into buf
  // (which starts at file offset `offset`), zeros where the extent is a hole
  // or preallocated, and moves *filled (the file offset up to which buf is
  // written) past it.
  Status CopyExtent(InodeId file, const Key& k, std::span<const uint8_t> d, uint64_t offset, uint64_t end,
                    uint8_t* buf, bool verify, uint64_t* filled) {
    const std::string where = InodeName(file) + " extent " + KeyToString(k);
    if (d.size() < kFileExtentInlineDataStart) return Status::Corrupt(where + ": item too small");
    const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
    if (fe->encryption != 0 || fe->other_encoding.get() != 0) {
      return Status::Unsupported(where + ": encrypted or encoded extent");
    }
    const uint8_t comp = fe->compression;
    if (comp > kCompressZstd) return Status::Unsupported(where + ": compression type " + std::to_string(comp));
    const uint32_t ss = vol_->sectorsize();

    if (fe->type == kFileExtentInline) {
      auto inline_data = d.subspan(kFileExtentInlineDataStart);
      std::vector<uint8_t> plain;
      if (comp != kCompressNone) {
        const uint64_t ram = fe->ram_bytes.get();
        if (ram > vol_->sectorsize()) return Status::Corrupt(where + ": inline ram_bytes " + std::to_string(ram));
        plain.resize(ram);
        UB_RETURN_IF_ERROR(fs::Decompress(comp, inline_data, plain, ss).WithContext(where));
        inline_data = plain;
      }
      const uint64_t ext_end = k.offset + inline_data.size();
      const uint64_t from = std::max(offset, k.offset), to = std::min(end, ext_end);
      if (from < to) {
        std::memcpy(buf + (from - offset), inline_data.data() + (from - k.offset), to - from);
        *filled = std::max(*filled, to);
      }
      return Status::Ok();
    }
    if (fe->type != kFileExtentReg && fe->type != kFileExtentPrealloc) {
      return Status::Corrupt(where + ": unknown extent type " + std::to_string(fe->type));
    }
    if (d.size() < sizeof(FileExtentItem)) return Status::Corrupt(where + ": item too small for a regular extent");
    const uint64_t num = fe->num_bytes.get(), ext_off = fe->offset.get();
    const uint64_t disk = fe->disk_bytenr.get(), disk_len = fe->disk_num_bytes.get();
    if (k.offset + num < k.offset) return Status::Corrupt(where + ": extent length overflows");
    const uint64_t from = std::max(offset, k.offset), to = std::min(end, k.offset + num);
    if (from >= to) return Status::Ok();
    if (fe->type == kFileExtentPrealloc || disk == 0) {
      std::memset(buf + (from - offset), 0, to - from);
      *filled = std::max(*filled, to);
      return Status::Ok();
    }
    if (disk % ss != 0 || disk_len % ss != 0 || disk_len == 0) {
      return Status::Corrupt(where + ": unaligned disk extent [" + std::to_string(disk) + ", +" +
                             std::to_string(disk_len) + ")");
    }
    if (comp == kCompressNone) {
      if (ext_off + num < ext_off || ext_off + num > disk_len) {
        return Status::Corrupt(where + ": range offset " + std::to_string(ext_off) + " + " + std::to_string(num) +
                               " exceeds the disk extent of " + std::to_string(disk_len) + " bytes");
      }
      const uint64_t in_ext = ext_off + (from - k.offset);
      if (in_ext % ss == 0 && (to - from) % ss == 0) {
        // Whole sectors: straight into the caller's buffer.
        UB_RETURN_IF_ERROR(vol_->ReadData(disk + in_ext, std::span(buf + (from - offset), to - from), verify)
                               .WithContext(where));
      } else {
        const uint64_t a = in_ext / ss * ss, b = (in_ext + (to - from) + ss - 1) / ss * ss;
        std::vector<uint8_t> tmp(b - a);
        UB_RETURN_IF_ERROR(vol_->ReadData(disk + a, tmp, verify).WithContext(where));
        std::memcpy(buf + (from - offset), tmp.data() + (in_ext - a), to - from);
      }
      *filled = std::max(*filled, to);
      return Status::Ok();
    }
    const uint64_t ram = fe->ram_bytes.get();
    if (disk_len > kMaxCompressedExtent || ram > kMaxCompressedExtent || ram == 0) {
      return Status::Corrupt(where + ": compressed extent sizes " + std::to_string(disk_len) + "/" +
                             std::to_string(ram) + " exceed 128 KiB");
    }
    if (ext_off > ram || num > ram - ext_off) return Status::Corrupt(where + ": range exceeds the decompressed extent");
    std::vector<uint8_t> raw(disk_len), plain(ram);
    UB_RETURN_IF_ERROR(vol_->ReadData(disk, raw, verify).WithContext(where));
    UB_RETURN_IF_ERROR(fs::Decompress(comp, raw, plain, ss).WithContext(where));
    std::memcpy(buf + (from - offset), plain.data() + ext_off + (from - k.offset), to - from);
    *filled = std::max(*filled, to);
    return Status::Ok();
  }

  // The tree of a subvolume, refusing ids that are not subvolumes.
  Result<tree::RootPtr> FsTree(uint64_t root) {
    if (tree::TreeWriter* w = CachedWriter(root)) return w->LiveRef();
    if (root != kFsTreeObjectid && (root < kFirstFreeObjectid || root > kLastFreeObjectid)) {
      return Status::Invalid("tree " + std::to_string(root) + " is not a subvolume");
    }
    UB_ASSIGN_OR_RETURN(Volume::TreeRoot * r, vol_->MutableRoot(root));
    if (txn_) {
      // The root a running transaction moves: cursors follow it under its lock.
      UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, txn_->Writer(root));
      RememberWriter(root, w);
      return w->LiveRef();
    }
    std::lock_guard<std::mutex> lock(vol_->roots_mutex());
    return r->ref;
  }

  Result<InodeId> SubvolRoot(uint64_t subvol) {
    if (subvol != kFsTreeObjectid && (subvol < kFirstFreeObjectid || subvol > kLastFreeObjectid)) {
      return Status::Corrupt("directory entry points at tree " + std::to_string(subvol) + ", not a subvolume");
    }
    UB_ASSIGN_OR_RETURN(auto r, vol_->FindRoot(subvol));
    return InodeId{subvol, r.item.root_dirid.get()};
  }

  // A directory entry's target. An entry naming a subvolume leads into it
  // only if the root tree has the matching ROOT_REF (this tree, this
  // directory, this name); otherwise, as in the kernel, it is an empty stub
  // directory (a snapshot's copy of a nested subvolume's entry, say).
  Result<InodeId> Resolve(InodeId dir, const Key& location, std::string_view name) {
    if (location.type == kInodeItemKey) return InodeId{dir.root, location.objectid};
    if (location.type != kRootItemKey) {
      return Status::Corrupt("directory entry location " + KeyToString(location) +
                             " is neither an inode nor a subvolume");
    }
    if (location.objectid != kFsTreeObjectid &&
        (location.objectid < kFirstFreeObjectid || location.objectid > kLastFreeObjectid)) {
      return Status::Corrupt("directory entry points at tree " + std::to_string(location.objectid) +
                             ", not a subvolume");
    }
    const Key ref_key{dir.root, kRootRefKey, location.objectid};
    UB_ASSIGN_OR_RETURN(auto ref, tree::LookupItem(vol_->source(), vol_->root_tree(), ref_key));
    if (ref && ref->size() >= sizeof(RootRef)) {
      const auto* rr = reinterpret_cast<const RootRef*>(ref->data());
      const size_t nl = rr->name_len.get();
      if (rr->dirid.get() == dir.ino && sizeof(RootRef) + nl <= ref->size() &&
          std::string_view(reinterpret_cast<const char*>(ref->data()) + sizeof(RootRef), nl) == name) {
        return SubvolRoot(location.objectid);
      }
    }
    const InodeId stub{location.objectid, kEmptySubvolDirObjectid};
    std::lock_guard<std::mutex> lock(stubs_mu_);
    stubs_[{stub.root, stub.ino}] = dir;
    return stub;
  }

  // The parent directory of a subvolume stub, if id is one.
  std::optional<InodeId> StubParent(InodeId id) {
    if (id.ino != kEmptySubvolDirObjectid) return std::nullopt;
    std::lock_guard<std::mutex> lock(stubs_mu_);
    auto it = stubs_.find({id.root, id.ino});
    if (it == stubs_.end()) return std::nullopt;
    return it->second;
  }

  Result<InodeId> Parent(InodeId dir) {
    if (dir == root_) return dir;
    if (auto parent = StubParent(dir)) return *parent;
    UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(dir.root));
    UB_ASSIGN_OR_RETURN(auto sub, vol_->FindRoot(dir.root));
    if (dir.ino == sub.item.root_dirid.get()) {
      // The top of a subvolume: its parent directory is named by a ROOT_BACKREF.
      Cursor c(vol_->source(), vol_->root_tree());
      UB_RETURN_IF_ERROR(c.Seek(Key{dir.root, kRootBackrefKey, 0}));
      if (!c.Valid() || c.key().objectid != dir.root || c.key().type != kRootBackrefKey) return root_;
      if (c.data().size() < sizeof(RootRef)) return Status::Corrupt("short ROOT_BACKREF of tree " + std::to_string(dir.root));
      const auto* rr = reinterpret_cast<const RootRef*>(c.data().data());
      return InodeId{c.key().offset, rr->dirid.get()};
    }
    Cursor c(vol_->source(), tree);
    UB_RETURN_IF_ERROR(c.Seek(Key{dir.ino, kInodeRefKey, 0}));
    if (c.Valid() && c.key().objectid == dir.ino && c.key().type == kInodeRefKey) {
      return InodeId{dir.root, c.key().offset};
    }
    return Status::Corrupt(InodeName(dir) + ": directory has no INODE_REF");
  }

  // ---- Write-side helpers (write_ops.cc) ----
  Result<InodeId> CreateImpl(InodeId dir, std::string_view name, const NewInode& attrs);
  Result<InodeId> MkdirImpl(InodeId dir, std::string_view name, const NewInode& attrs);
  Result<InodeId> MknodImpl(InodeId dir, std::string_view name, const NewInode& attrs);
  Result<InodeId> SymlinkImpl(InodeId dir, std::string_view name, std::string_view target, const NewInode& attrs);
  Status LinkImpl(InodeId inode, InodeId dir, std::string_view name);
  Status UnlinkImpl(InodeId dir, std::string_view name);
  Status RmdirImpl(InodeId dir, std::string_view name);
  Status RenameImpl(InodeId old_dir, std::string_view old_name, InodeId new_dir, std::string_view new_name, unsigned flags);
  Result<size_t> WriteImpl(InodeId file, uint64_t offset, std::span<const uint8_t> data,
                           std::span<const fs::Precompressed> pre = {});
  Status SetAttrImpl(InodeId id, const AttrChange& change);
  Status SetXattrImpl(InodeId id, std::string_view name, std::string_view value, int flags);
  Status RemoveXattrImpl(InodeId id, std::string_view name);
  // With `tail`, the commit's second half is left to the caller, who runs
  // FinishCommit(*tail) once it has let go of the operation lock
  // (txn/commit_tail.h).
  Status CommitImpl(txn::CommitTail* tail = nullptr);
  Status FinishCommit(txn::CommitTail& tail);
  // ---- fsync's tree log (fsync.cc) ----
  // kExists: inode item, names and xattrs (an ancestor directory);
  // kAll: also a file's extents, a directory's entries.
  enum class LogMode : uint8_t { kExists, kAll };
  struct LoggedInode {
    LogMode mode = LogMode::kExists;
    bool changed = false;    // changed since its copy went into the log
    bool committed = false;  // exists in the last committed tree
  };
  Status FsyncImpl(InodeId id);
  Status LogInodeTree(InodeId id, LogMode mode);
  Status LogOneInode(InodeId id, LogMode mode, std::vector<std::pair<InodeId, LogMode>>* more);
  Status LogExtents(InodeId id, const format::InodeItem& ii, std::vector<std::pair<uint64_t, uint64_t>> ranges);
  // File ranges whose extents changed (dropped, replaced, allocated): a
  // committed file's are logged from them. A new file's only once it has
  // been logged (it is logged whole the first time).
  void NoteExtentRange(InodeId id, uint64_t start, uint64_t end, bool new_inode);
  void NoteInodeChanged(uint64_t root, uint64_t ino);
  // A name of `id` left directory `dir` (its DIR_INDEX `index`) in this
  // transaction: if `id` is logged, a replay must remove that name too.
  void NoteNameRemoved(InodeId id, uint64_t dir, uint64_t index);
  void ForgetRemovedNames(InodeId id);  // the inode is gone
  void ResetLog();  // the transaction committed
  std::unique_ptr<log::TreeLog> tree_log_;
  std::mutex log_mu_;  // guards logged_ and log_ranges_ (changes note into them from many threads)
  std::atomic<bool> log_active_{false};  // something was logged in this transaction
  std::map<std::pair<uint64_t, uint64_t>, LoggedInode> logged_;
  // start -> end, disjoint: a file written in many places (random writes)
  // notes a range per write, so each note must cost O(log n), not a sort.
  std::map<std::pair<uint64_t, uint64_t>, std::map<uint64_t, uint64_t>> log_ranges_;
  std::map<std::pair<uint64_t, uint64_t>, std::vector<std::pair<uint64_t, uint64_t>>> removed_names_;  // (dir, index)
  void NoteFailure(const Status& st);
  // The operation lock of a writable view: shared for the operations that
  // run in parallel (reads, and creates under their directory's lock),
  // exclusive for every other change and for commit. A thread that already
  // holds it (an operation calling another) takes nothing more. Waits are
  // recorded (lock.wait.op, ns).
  class OpGuard {
   public:
    OpGuard() = default;
    OpGuard(FilesystemImpl* fs, OpMode mode);
    ~OpGuard() { Release(); }
    OpGuard(OpGuard&& o) noexcept : fs_(std::exchange(o.fs_, nullptr)), mode_(o.mode_) {}
    OpGuard(const OpGuard&) = delete;
    OpGuard& operator=(const OpGuard&) = delete;
    void Release();

   private:
    FilesystemImpl* fs_ = nullptr;
    OpMode mode_ = OpMode::kNone;
  };
  OpGuard Guard() { return txn_ ? OpGuard(this, OpMode::kShared) : OpGuard(); }
  OpGuard ExclusiveGuard() { return txn_ ? OpGuard(this, OpMode::kExclusive) : OpGuard(); }
  // Which stripe an inode's per-inode state lives in: a multiplicative
  // hash, whose top `bits` bits spread neighbouring numbers over the stripes.
  static size_t StripeOf(InodeId id, unsigned bits) {
    return (id.ino * 0x9E3779B97F4A7C15ull + id.root) >> (64 - bits);
  }
  // One of 64, for short-held state (RecordLock, DirStateOf).
  static size_t Stripe64(InodeId id) { return StripeOf(id, 6); }
  // The lock of one inode (4,096 stripes: see dir_mu_): held by a create in
  // it and by ReadDir for a directory, so a directory's delayed items and its
  // entries in the tree change together; by a write for a file.
  fs::WordMutex& InodeLock(InodeId dir) { return dir_mu_[StripeOf(dir, kInodeLockBits)]; }
  std::mutex& RecordLock(InodeId id) { return rec_mu_[Stripe64(id)].mu; }
  bool HoldsExclusive() const;

  // Runs one public change: the operation lock, the writable and
  // metadata-reservation checks (ENOSPC before anything changes), abort on a
  // half-done failure, and the auto-commit that bounds a transaction.
  // Changes run exclusive, except ChangeIn's (creates, holding their
  // directory, and writes, holding their file), which run in parallel with
  // each other and with reads. `in`: the inodes whose subvolumes the change
  // touches (EROFS when one is read-only, before anything changes). `who`
  // says whether the change may use the global metadata reserve (deletions:
  // txn/space_reserve.h).
  //
  // An ENOSPC that changed nothing (the reservation, or a failure the
  // operation marked clean) commits the running transaction, which releases
  // the space it pinned and its commit reserve, and runs the change once
  // more, as the kernel does before it gives up (full_device.cc). Only the
  // outermost operation of a thread does so, and only with the operation
  // lock let go of: the commit takes it exclusive.
  template <typename F>
  auto Change(std::initializer_list<InodeId> in, uint64_t reserve_items, F&& op) -> decltype(op()) {
    return Change(in, txn::ReserveFor::kChange, reserve_items, std::forward<F>(op));
  }
  template <typename F>
  auto Change(std::initializer_list<InodeId> in, txn::ReserveFor who, uint64_t reserve_items, F&& op)
      -> decltype(op()) {
    using R = decltype(op());
    return RetryForSpace<R>([&](std::optional<R>& r) -> Status {
      auto guard = ExclusiveGuard();
      UB_RETURN_IF_ERROR(CheckWritable());
      UB_RETURN_IF_ERROR(subvols_->CheckWritable(in));
      {
        // (the allocation lock: the commit reserve counts the transaction's
        // pending references, which background work may be adding to)
        auto lock = txn_->AllocLock();
        UB_RETURN_IF_ERROR(txn_->chunk_alloc().ReserveMetadata(reserve_items, who));
      }
      txn::ChunkAllocator::OpHold hold(txn_->chunk_alloc(), reserve_items);
      r.emplace(op());
      NoteResult(*r);
      return Status::Ok();
    });
  }
  template <typename F>
  auto ChangeIn(InodeId dir, uint64_t reserve_items, F&& op) -> decltype(op()) {
    if (!txn_) return Status::Error(EROFS, "the image is open read-only");
    using R = decltype(op());
    return RetryForSpace<R>([&](std::optional<R>& r) -> Status {
      auto guard = Guard();
      UB_RETURN_IF_ERROR(CheckWritable());
      UB_RETURN_IF_ERROR(subvols_->CheckWritable(dir.root));
      if (!txn_->chunk_alloc().MetadataSurelyFree(reserve_items)) {
        auto lock = txn_->AllocLock();
        UB_RETURN_IF_ERROR(txn_->chunk_alloc().ReserveMetadata(reserve_items));
      }
      txn::ChunkAllocator::OpHold hold(txn_->chunk_alloc(), reserve_items);
      std::lock_guard dir_lock(InodeLock(dir));
      r.emplace(op());
      NoteResult(*r);
      return Status::Ok();
    });
  }
  // What Change and ChangeIn share: `attempt` makes one try under its locks,
  // leaving the change's result in `r` when its checks and reservation
  // passed, and returns the first of those that failed (Ok otherwise).
  template <typename R, typename Attempt>
  R RetryForSpace(Attempt&& attempt) {
    const bool outermost = !HoldsOpLock();
    for (int n = 0;; ++n) {
      if (outermost) LetWaitingCommitsIn();
      std::optional<R> r;
      const Status failed = attempt(r);
      // The commit needs the operation lock exclusive: after letting go of it.
      if (RetryAfterCommit(r ? StatusOf(*r) : failed, n, outermost)) {
        UB_RETURN_IF_ERROR(CommitForSpace());
        continue;
      }
      if (!r) return failed;
      if (r->ok()) UB_RETURN_IF_ERROR(MaybeAutoCommit());
      if (r->ok() && outermost && has_staged_.load(std::memory_order_relaxed)) UB_RETURN_IF_ERROR(DropStaged());
      return std::move(*r);
    }
  }
  static Status StatusOf(const Status& s) { return s; }
  template <typename T>
  static Status StatusOf(const Result<T>& r) { return r.status(); }
  template <typename R>
  void NoteResult(const R& r) {
    NoteFailure(StatusOf(r));
  }
  // full_device.cc: whether a failed change's ENOSPC calls for a commit and
  // a second try (first attempt, outermost operation, nothing half done, and
  // a transaction with something to commit); the commit itself.
  bool RetryAfterCommit(const Status& st, int attempt, bool outermost);
  Status CommitForSpace();
  // Whether this thread holds the operation lock (in either mode).
  bool HoldsOpLock() const;
  Status MaybeAutoCommit();
  // The record it inserts (or the one a racing insert left).
  inode::InodeRef CacheInode(InodeId id, const format::InodeItem& ii);
  Status CheckWritable();
  Result<tree::TreeWriter*> FsWriter(uint64_t root);
  // The writer of the last subvolume used, without the map lookups and
  // their locks (a writer lives as long as the transaction manager).
  tree::TreeWriter* CachedWriter(uint64_t root) const {
    const CachedWriterEntry* e = cached_writer_.entry.load(std::memory_order_acquire);
    return e != nullptr && e->root == root ? e->writer : nullptr;
  }
  void RememberWriter(uint64_t root, tree::TreeWriter* w) {
    std::lock_guard lock(writer_entries_mu_);
    for (const auto& e : writer_entries_) {
      if (e->root == root) return cached_writer_.entry.store(e.get(), std::memory_order_release);
    }
    writer_entries_.push_back(std::make_unique<CachedWriterEntry>(CachedWriterEntry{root, w}));
    cached_writer_.entry.store(writer_entries_.back().get(), std::memory_order_release);
  }
  // With rec, a cached inode's record is handed out too (left empty when
  // the inode came from the tree).
  Result<format::InodeItem> LoadInode(InodeId id, inode::InodeRef* rec = nullptr);
  Status StoreInode(InodeId id, const format::InodeItem& ii);
  // A cached record's item changed (its lock held): stamps it with this
  // transaction and marks it dirty for FlushInodes.
  void MarkChanged(inode::InodeRecord& r);
  // Writes every changed cached inode item into its tree (on an image
  // without no-holes, after filling the gaps of the regular files).
  Status FlushInodes();
  // The commit's queued work, done now (before a commit or a log): every
  // directory's queued DIR_ITEMs and dir-index batches, then the inode
  // updates; its tree blocks come out of the room the reserve kept for it.
  Status FlushQueued();
  // What the commit reserve keeps for that work (the queues' bytes, a tree
  // block for each inode of an older transaction changed in this one):
  // lock-free, called at every reserve check.
  uint64_t QueuedWorkBytes() const;
  // Explicit hole items over every gap in [0, size rounded up) of a regular
  // file, for images without the no-holes feature (explicit_holes.cc).
  Status FillHoles(InodeId file, uint64_t size);
  Result<uint64_t> NextIno(uint64_t root);
  Result<uint64_t> NextInoLocked(uint64_t root, uint64_t n);
  Result<uint64_t> NewIno(InodeId dir);
  static constexpr uint64_t kInoRunFirst = 1024;
  static constexpr uint64_t kInoRunMax = 65536;
  Result<uint64_t> NextDirIndex(InodeId dir);
  Result<InodeId> NewEntry(InodeId dir, std::string_view name, uint32_t mode, const NewInode& attrs,
                           std::string_view symlink_target);
  // Adds a directory entry for `target`; with new_inode, target is a new
  // inode whose item is inserted with its first back reference.
  // dir_rec: the directory's cached record when the caller holds it (one
  // cache lookup less).
  Status AddLink(InodeId dir, std::string_view name, InodeId target, uint8_t ftype, const format::InodeItem* new_inode,
                 inode::InodeRecord* dir_rec = nullptr);
  Status AddBackRef(tree::TreeWriter* w, const tree::RootPtr& tree, InodeId dir, std::string_view name, InodeId target,
                    uint64_t index, std::span<const uint8_t> ref);
  Status RemoveLink(InodeId dir, std::string_view name, InodeId target, bool* was_dir_entry);
  Status DropNameFromDirItem(InodeId dir, std::string_view name);
  // What a subvolume deletion reserves up front (its entry and refs; the
  // drop itself frees more than it takes).
  static constexpr uint64_t kItemsPerDeleteSubvol = 16;
  Status DropInode(InodeId id);
  // The last name of `id` (ii as loaded) is gone: drops the inode, or, while
  // it is pinned (an open file), keeps it with nlink 0 and an orphan item.
  Status DropOrOrphan(InodeId id, InodeItem ii);
  // A regular file of more than kDropStepExtents extent items is not
  // dropped in the change that removed its last name: it becomes an orphan
  // there (nlink 0, ORPHAN_ITEM), and DropStaged drops it after that change,
  // kDropStepExtents items per change, as the kernel's eviction truncates
  // in steps across transactions. One change freeing thousands of extents
  // grew the commit's work past what a full device had left: the commit
  // failed after the unlink had been answered (orphans.cc).
  static constexpr size_t kDropStepExtents = 64;
  Result<bool> HasMoreExtentsThan(InodeId id, size_t n);
  void StageDrop(InodeId id);
  // Drops the staged orphans (outermost changes call it after they are done).
  Status DropStaged();
  // Drops orphan `id` (nlink 0) in steps, then its items and orphan item.
  Status DropOrphanInSteps(InodeId id);
  std::mutex staged_mu_;
  std::vector<InodeId> staged_drops_;  // guarded by staged_mu_
  std::atomic<bool> has_staged_{false};
  // A name of `id` was just removed: with its last one (a directory has
  // only one) it goes (DropOrOrphan), else it has a link less.
  Status DropName(InodeId id, bool is_dir, const Time& now);
  std::mutex pins_mu_;
  struct Pin {
    uint32_t opens = 0;
    bool orphaned = false;  // DropOrOrphan kept it: the last unpin must drop it
  };
  std::map<std::pair<uint64_t, uint64_t>, Pin> pins_;  // (root, ino)
  Status TouchDir(InodeId dir, int64_t size_delta, inode::InodeRecord* rec = nullptr);
  Status InsertDirItem(tree::TreeWriter* w, InodeId dir, uint32_t hash, std::span<const uint8_t> entry);
  // One directory's queued DIR_ITEMs (ascending hashes) into its tree.
  Status InsertQueuedDirItems(uint64_t root, uint64_t dir, std::span<const uint32_t> hashes,
                              std::span<const std::span<const uint8_t>> items);
  Status FlushDirItems(InodeId dir);
  Status MaybeIndexDir(InodeId dir, uint64_t creates);
  Status DropExtents(InodeId id, uint64_t start, uint64_t end, int64_t* nbytes_delta);
  // `content` is the file's data, or its compressed form (`compression`)
  // of `ram_bytes` bytes.
  Status WriteInline(InodeId id, std::span<const uint8_t> content, uint64_t ram_bytes = 0,
                     uint8_t compression = kCompressNone);
  Status WriteRegular(InodeId id, uint64_t start, std::span<const uint8_t> aligned, bool csum, int64_t* nbytes_delta);
  // A write into extents the file may overwrite in place, as the kernel's
  // nocow path (write_in_place.cc): false, with nothing changed, where any
  // sector of [offset, offset + data.size()) needs a new extent.
  Result<bool> WriteInPlace(InodeId id, const InodeItem& ii, uint64_t offset, std::span<const uint8_t> data,
                            int64_t* nbytes_delta);
  // A plain extent written in this transaction, whole and the file's only
  // use of it, that ends where a write begins: the write may grow it.
  struct GrowableExtent {
    uint64_t file_off, bytenr, len;
  };
  std::optional<GrowableExtent> ExtentEndingAt(InodeId id, uint64_t offset);
  struct DataPiece {
    uint64_t file_off, data_pos, bytenr, len;
    uint8_t compression = kCompressNone;  // else `zdata` goes to disk in place of data[data_pos, +len)
    std::vector<uint8_t> zdata;
    std::optional<GrowableExtent> grows;  // the piece lies right after this extent, to be merged into it
  };
  Result<std::vector<DataPiece>> AllocPieces(uint64_t start, std::span<const uint8_t> aligned,
                                             const std::optional<GrowableExtent>& grow = std::nullopt);
  Status WritePieces(InodeId id, const std::vector<DataPiece>& pieces, std::span<const uint8_t> aligned, bool csum,
                     int64_t* nbytes_delta);
  // Compression on write (compress_write.cc).
  Result<fs::WriteCompression> CompressionFor(InodeId id, const InodeItem& ii);
  // As AllocPieces, with ranges compressed where worth it; `file_len` is
  // the file's size less `start`; `pre` ranges already compressed.
  Result<std::vector<DataPiece>> AllocCompressedPieces(const fs::WriteCompression& c, uint64_t start,
                                                       std::span<const uint8_t> aligned, uint64_t file_len,
                                                       std::span<const fs::Precompressed> pre, bool* mark_nocompress);
  void ApplyPendingIncompat();
  // Setting (value) or removing (nullopt) the btrfs.compression property:
  // EINVAL for a bad value, else the inode's flags as the kernel sets them.
  Status CheckCompressionProperty(std::string_view name, std::optional<std::string_view> value, InodeItem* ii);
  // A new inode takes its directory's property, as the kernel's inherited props.
  Status InheritCompressionProperty(InodeId dir, InodeId child);
  Status TruncateLocked(InodeId id, uint64_t new_size);
  Status CloneImpl(InodeId src, uint64_t src_offset, InodeId dst, uint64_t dst_offset, uint64_t len);
  // fs-verity (verity.cc). EPERM when the file's data may not change (it has verity).
  static Status DataMayChange(InodeId id, const InodeItem& ii);
  Result<std::optional<format::VerityDescriptor>> LoadVerityDescriptor(InodeId id);
  // Its descriptor when the file has the VERITY flag (EUCLEAN when the flag
  // has none), with the file's Stat.
  Result<std::optional<format::VerityDescriptor>> FlaggedVerity(InodeId file, Stat* st);
  // The bytes of the items of `type` from key offset `first` on, joined
  // (each must start where the last ended), up to `limit` bytes.
  Result<std::vector<uint8_t>> JoinVerityItems(InodeId id, uint8_t type, uint64_t first, uint64_t limit,
                                               const std::string& what);
  Status EnableVerityImpl(InodeId id, const VerityParams& params);
  // Deletes the file's verity items (what an interrupted enable left).
  Status DropVerityItems(InodeId id);
  Result<bool> IsAncestor(InodeId maybe_ancestor, InodeId dir);
  Status PutXattrItem(InodeId id, const format::Key& key, std::vector<uint8_t> item);

  // A reader/writer lock that prefers the writer: once a commit (or another
  // exclusive change) waits, new operations wait behind it, so a stream of
  // parallel operations cannot starve it. Never taken shared twice by one
  // thread (OpGuard's thread-local record), which writer preference requires.
  class OpLock {
   public:
    OpLock() {
      pthread_rwlockattr_t attr;
      pthread_rwlockattr_init(&attr);
      pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
      pthread_rwlock_init(&rw_, &attr);
      pthread_rwlockattr_destroy(&attr);
    }
    ~OpLock() { pthread_rwlock_destroy(&rw_); }
    OpLock(const OpLock&) = delete;
    OpLock& operator=(const OpLock&) = delete;
    bool try_lock_shared() { return pthread_rwlock_tryrdlock(&rw_) == 0; }
    void lock_shared() { pthread_rwlock_rdlock(&rw_); }
    void unlock_shared() { pthread_rwlock_unlock(&rw_); }
    bool try_lock() { return pthread_rwlock_trywrlock(&rw_) == 0; }
    void lock() { pthread_rwlock_wrlock(&rw_); }
    void unlock() { pthread_rwlock_unlock(&rw_); }

   private:
    pthread_rwlock_t rw_;
  };
  OpLock op_rw_;  // the operation lock (OpGuard)
  // Commits waiting for the operation lock. The lock prefers writers to
  // readers, but among writers the one that lets go of it takes it again
  // before a woken waiter runs: a thread running change after change (the
  // steps of a large file's drop, a single-threaded copy) held a waiting
  // commit off until it was done. A change that is about to take the lock
  // lets such commits in first, as the kernel's transaction joins wait
  // for a commit that has started.
  std::atomic<int> commits_waiting_{0};
  struct CommitWaiting {
    explicit CommitWaiting(FilesystemImpl* fs) : fs(fs) { fs->commits_waiting_.fetch_add(1, std::memory_order_relaxed); }
    ~CommitWaiting() {
      fs->commits_waiting_.fetch_sub(1, std::memory_order_release);
      fs->commits_waiting_.notify_all();
    }
    FilesystemImpl* fs;
  };
  void LetWaitingCommitsIn() {
    for (int n; (n = commits_waiting_.load(std::memory_order_acquire)) > 0;) commits_waiting_.wait(n);
  }
  // Locks that threads take at once sit on cache lines of their own.
  struct alignas(64) PaddedMutex {
    std::mutex mu;
  };
  // Held for a whole create or write: two threads meeting on one stripe
  // sleep on it. With 64 stripes, two threads creating 4 KiB files met
  // there 1,800 times per 120,000 files (a futex sleep and wake each).
  // A word each (word_mutex.h says why).
  static constexpr unsigned kInodeLockBits = 12;
  std::unique_ptr<fs::WordMutex[]> dir_mu_{new fs::WordMutex[size_t{1} << kInodeLockBits]};  // InodeLock
  std::array<PaddedMutex, 64> rec_mu_;  // RecordLock: a cached inode item's bytes
  alignas(64) std::mutex ino_mu_;        // guards next_ino_ (taken inside a DirState's mu)
  // Per-directory counters, in stripes (Stripe64) so that threads
  // creating in different directories neither wait for nor share a lock.
  struct InoRun {
    uint64_t next = 0, end = 0, size = 0;
  };
  struct alignas(64) DirState {
    std::mutex mu;  // guards the two maps
    std::map<std::pair<uint64_t, uint64_t>, uint64_t> next_index;  // the next DIR_INDEX of a directory
    // The inode numbers [next, end) reserved for a directory's new entries,
    // and the size of its last run (NewIno).
    std::map<std::pair<uint64_t, uint64_t>, InoRun> ino_runs;
  };
  std::array<DirState, 64> dir_state_;
  DirState& DirStateOf(InodeId dir) { return dir_state_[Stripe64(dir)]; }
  struct CachedWriterEntry {
    uint64_t root;
    tree::TreeWriter* writer;
  };
  std::mutex writer_entries_mu_;  // guards writer_entries_ (taken inside ino_mu_ too)
  std::vector<std::unique_ptr<CachedWriterEntry>> writer_entries_;  // never shrinks while the view lives
  struct alignas(64) PaddedWriterCache {  // a cache line of its own
    std::atomic<const CachedWriterEntry*> entry{nullptr};
  };
  PaddedWriterCache cached_writer_;
  std::atomic<bool> caller_keeps_file_times_{false};  // SetCallerKeepsFileTimes
  std::atomic<bool> aborted_{false};        // a failed change: no more writes, no commit
  std::vector<io::UndoDevice*> undo_;        // inside vol_'s devices (one each), when undo_uncommitted
  // The failing operation of this thread had changed nothing yet (set by the
  // operation, read and cleared by NoteFailure).
  static thread_local bool t_clean_failure;
  std::mutex abort_mu_;                     // guards abort_reason_
  std::string abort_reason_;
  std::unique_ptr<txn::TxnManager> txn_;
  std::unique_ptr<SubvolumeFlags> subvols_;  // read-only subvolumes (writable views)
  std::unique_ptr<inode::DelayedDirIndex> delayed_;
  std::unique_ptr<inode::DelayedDirItems> dir_items_;  // queued DIR_ITEMs of indexed directories
  const inode::DelayedDirItems::InsertFn queued_dir_items_inserter_ =
      [this](uint64_t root, uint64_t dir, std::span<const uint32_t> hashes,
             std::span<const std::span<const uint8_t>> items) { return InsertQueuedDirItems(root, dir, hashes, items); };
  bool legacy_batching_ = false;  // OpenOptions::legacy_dir_index_batching
  inode::DelayedDirItems::Options dir_item_options_;  // OpenOptions::dir_item_*
  uint64_t max_dirty_bytes_ = 256ull << 20;  // OpenOptions::max_dirty_bytes
  uint64_t drop_step_blocks_ = 4096;         // OpenOptions::drop_blocks_per_commit
  std::atomic<bool> hold_commits_{false};    // set_hold_commits
  CompressOptions compress_;                  // OpenOptions::compress
  bool salvage_ = false;                      // RescueOptions::salvage: ReadDir steps over bad blocks
  std::atomic<uint64_t> pending_incompat_{0};  // compression incompat flags for the next commit
  std::map<uint64_t, uint64_t> next_ino_;                          // per subvolume
  // The open-inode cache (a radix tree per subvolume, inode/inode_cache.h):
  // inode items read or changed recently. Changed ones are dirty until
  // FlushInodes writes them at commit (delayed inode updates); clean ones
  // stay cached across commits until evicted.
  // Its insert and lookup times are sampled (one call in 16) to keep clock
  // reads off the create path.
  // Inodes of an older transaction changed in this one: their leaves are
  // not in the transaction yet (a new inode's leaf is, since its insert).
  std::atomic<uint64_t> old_dirty_inodes_{0};
  inode::InodeCache icache_{inode::InodeCacheOptions{.capacity = size_t{1} << 16, .time_every = 16, .shards = 16}};

  // The kernel's inode number for a subvolume stub directory.
  static constexpr uint64_t kEmptySubvolDirObjectid = 2;

  std::unique_ptr<Volume> vol_;
  InodeId root_;
  std::mutex stubs_mu_;  // guards stubs_
  std::map<std::pair<uint64_t, uint64_t>, InodeId> stubs_;  // stub -> the directory holding its entry
};

}  // namespace ubtrfs::fsimpl

#endif  // UBTRFS_FS_FS_IMPL_H_
