// The write side of the POSIX view: namespace operations, file data, inode
// attributes and xattrs, each joining the running transaction.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <type_traits>

#include "fs/all_zero.h"
#include "fs/fs_impl.h"
#include "stats/stats.h"
#include "txn/clock.h"

namespace ubtrfs::fsimpl {
namespace {

// The largest extent btrfs writes uncompressed.
constexpr uint64_t kMaxExtent = 128ull << 20;
// A directory whose queue of delayed dir-index items grows past this many
// entries is flushed early. 4096 entries hold at most about 1 MiB (item,
// name, map node) and fill 30 or more 16 KiB leaves, and an early flush
// writes only whole-leaf batches (the short tail stays queued), so the
// bound costs no batch quality. A commit flushes everything.
constexpr size_t kDelayedFlushThreshold = 4096;
// Inodes of older transactions changed in this one whose updates may wait
// for the commit (MaybeAutoCommit).
constexpr uint64_t kMaxOldDirtyInodes = 1024;

template <typename T>
std::vector<uint8_t> AsBytes(const T& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  return std::vector<uint8_t>(p, p + sizeof(T));
}

// The key offset of an INODE_EXTREF: raw crc32c of the name seeded with the
// parent's objectid (truncated to 32 bits), as the kernel computes it.
uint64_t ExtrefHash(uint64_t parent, std::string_view name) {
  return Crc32c(static_cast<uint32_t>(parent),
                std::span(reinterpret_cast<const uint8_t*>(name.data()), name.size()));
}

constexpr size_t kMaxNameLen = 255;  // bytes of a directory entry's name, as Linux's NAME_MAX

using fs::AllZero;

// Removes `name` (under directory `parent`) from an INODE_REF or
// INODE_EXTREF item body and returns its dir index; nullopt if absent.
template <typename Ref>
Result<std::optional<uint64_t>> TakeBackRef(std::vector<uint8_t>& item, uint64_t parent, std::string_view name,
                                            const std::string& owner) {
  size_t pos = 0;
  while (pos + sizeof(Ref) <= item.size()) {
    const auto* r = reinterpret_cast<const Ref*>(item.data() + pos);
    const size_t len = sizeof(Ref) + r->name_len.get();
    if (pos + len > item.size()) return Status::Corrupt(owner + ": truncated inode back reference");
    bool same_parent = true;
    if constexpr (std::is_same_v<Ref, InodeExtref>) same_parent = r->parent_objectid.get() == parent;
    if (same_parent &&
        std::string_view(reinterpret_cast<const char*>(item.data()) + pos + sizeof(Ref), r->name_len.get()) == name) {
      const uint64_t index = r->index.get();
      item.erase(item.begin() + static_cast<long>(pos), item.begin() + static_cast<long>(pos + len));
      return std::optional<uint64_t>(index);
    }
    pos += len;
  }
  return std::optional<uint64_t>();
}

}  // namespace

Status CheckName(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameLen) {
    return Status::Error(ENAMETOOLONG, "bad name length " + std::to_string(name.size()));
  }
  if (name == "." || name == "..") return Status::Error(EEXIST, "'" + std::string(name) + "' is reserved");
  if (name.find('/') != std::string_view::npos || name.find('\0') != std::string_view::npos) {
    return Status::Invalid("name contains '/' or NUL");
  }
  return Status::Ok();
}


FilesystemImpl::~FilesystemImpl() {
  if (txn_ && !aborted_) {
    Status st = Commit();
    (void)st;  // nothing left to report to; the last committed state stays intact
  }
  if (txn_) txn_->chunk_alloc().SetQueuedWork(nullptr);  // it reads the queues below
  delayed_.reset();
  dir_items_.reset();
  txn_.reset();  // before vol_, which it points into
  vol_.reset();
  tree::DropThreadScratch();
  tree::TrimBlockBuffers();  // the pooled block buffers go back to the system with the blocks
}

Status FilesystemImpl::InitWrite() {
  UB_ASSIGN_OR_RETURN(txn_, txn::TxnManager::Open(vol_.get()));
  subvols_ = std::make_unique<SubvolumeFlags>(vol_.get());
  txn_->set_concurrent(true);  // until an operation takes the trees to itself
  dir_items_ = std::make_unique<inode::DelayedDirItems>(dir_item_options_);
  delayed_ = std::make_unique<inode::DelayedDirIndex>(
      vol_->nodesize(), legacy_batching_ ? inode::BatchPolicy::kLeafFreeSpace : inode::BatchPolicy::kFullLeaf);
  txn_->chunk_alloc().SetQueuedWork([this] { return QueuedWorkBytes(); });
  tree_log_ = std::make_unique<log::TreeLog>(vol_.get());
  // What the open itself changed (a free space tree built) is committed
  // before any operation, so a failure later cannot take it back.
  if (txn_->HasChanges()) UB_RETURN_IF_ERROR(Commit().WithContext("committing the free space tree"));
  return Status::Ok();
}

// ---- The operation lock -----------------------------------------------------------------------

namespace {
// What this thread holds of which view's operation lock.
struct HeldOpLock {
  const void* fs;
  FilesystemImpl::OpMode mode;
};
thread_local std::vector<HeldOpLock> t_held;

FilesystemImpl::OpMode HeldMode(const void* fs) {
  for (auto it = t_held.rbegin(); it != t_held.rend(); ++it) {
    if (it->fs == fs) return it->mode;
  }
  return FilesystemImpl::OpMode::kNone;
}
}  // namespace

thread_local bool FilesystemImpl::t_clean_failure = false;

bool FilesystemImpl::HoldsExclusive() const { return HeldMode(this) == OpMode::kExclusive; }
bool FilesystemImpl::HoldsOpLock() const { return HeldMode(this) != OpMode::kNone; }

FilesystemImpl::OpGuard::OpGuard(FilesystemImpl* fs, OpMode mode) {
  const OpMode held = HeldMode(fs);
  if (held == OpMode::kExclusive || (held == OpMode::kShared && mode == OpMode::kShared)) return;  // re-entry
  if (held == OpMode::kShared) {
    // Nothing run under the shared lock calls an exclusive operation; doing
    // so would wait for itself.
    std::fprintf(stderr, "ubtrfs: internal error: exclusive operation inside a shared one\n");
    std::abort();
  }
  static stats::Histogram& wait = stats::GetHistogram("lock.wait.op", "ns");
  if (mode == OpMode::kShared) {
    if (!fs->op_rw_.try_lock_shared()) {
      const uint64_t t0 = stats::NowNs();
      fs->op_rw_.lock_shared();
      wait.Record(stats::NowNs() - t0);
    }
  } else {
    if (!fs->op_rw_.try_lock()) {
      const uint64_t t0 = stats::NowNs();
      fs->op_rw_.lock();
      wait.Record(stats::NowNs() - t0);
    }
    // Alone with the trees: no node locks needed until the lock is let go of.
    fs->txn_->set_concurrent(false);
  }
  fs_ = fs;
  mode_ = mode;
  t_held.push_back(HeldOpLock{fs, mode});
}

void FilesystemImpl::OpGuard::Release() {
  if (fs_ == nullptr) return;
  for (auto it = t_held.rbegin(); it != t_held.rend(); ++it) {
    if (it->fs == fs_) {
      t_held.erase(std::next(it).base());
      break;
    }
  }
  if (mode_ == OpMode::kExclusive) {
    fs_->txn_->set_concurrent(true);
    fs_->op_rw_.unlock();
  } else {
    fs_->op_rw_.unlock_shared();
  }
  fs_ = nullptr;
}

Status FilesystemImpl::CheckWritable() {
  if (!txn_) return Status::Error(EROFS, "the image is open read-only");
  if (aborted_) {
    std::lock_guard lock(abort_mu_);
    return Status::Error(EROFS, "the transaction was aborted (" + abort_reason_ +
                                    "); the image keeps its last committed state");
  }
  return Status::Ok();
}

Result<tree::TreeWriter*> FilesystemImpl::FsWriter(uint64_t root) {
  if (tree::TreeWriter* w = CachedWriter(root)) return w;
  UB_RETURN_IF_ERROR(FsTree(root).status());
  return txn_->Writer(root);
}

Result<InodeItem> FilesystemImpl::LoadInode(InodeId id, inode::InodeRef* rec) {
  if (StubParent(id)) return Status::Error(EPERM, "an empty subvolume stub cannot be changed");
  if (inode::InodeRef r = icache_.Lookup(id.root, id.ino)) {
    std::lock_guard lock(RecordLock(id));
    InodeItem ii = r->item;
    if (rec != nullptr) *rec = std::move(r);
    return ii;
  }
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
  UB_ASSIGN_OR_RETURN(auto item, tree::LookupItem(vol_->source(), tree, Key{id.ino, kInodeItemKey, 0}));
  if (!item) return Status::NotFound(InodeName(id) + " does not exist");
  if (item->size() < sizeof(InodeItem)) return Status::Corrupt(InodeName(id) + ": short inode item");
  InodeItem ii;
  std::memcpy(&ii, item->data(), sizeof ii);
  CacheInode(id, ii);
  return ii;
}

inode::InodeRef FilesystemImpl::CacheInode(InodeId id, const InodeItem& ii) {
  // A fresh record is clean; the cache evicts clean idle records (CLOCK)
  // past its capacity.
  return icache_.Insert(id.root, id.ino, ii);
}

Status FilesystemImpl::StoreInode(InodeId id, const InodeItem& ii_in) {
  inode::InodeRef r = icache_.Lookup(id.root, id.ino);
  if (!r) r = icache_.Insert(id.root, id.ino, ii_in);
  std::lock_guard lock(RecordLock(id));
  r->item = ii_in;
  MarkChanged(*r);
  return Status::Ok();
}

void FilesystemImpl::MarkChanged(inode::InodeRecord& r) {
  const bool older = r.item.transid.get() != txn_->transid();
  r.item.transid = txn_->transid();
  r.item.sequence = r.item.sequence.get() + 1;
  if (!r.dirty.exchange(true, std::memory_order_relaxed) && older) {
    old_dirty_inodes_.fetch_add(1, std::memory_order_relaxed);
    txn_->chunk_alloc().NoteQueuedWork(vol_->nodesize());
  }
  NoteInodeChanged(r.root, r.ino);
}

// Queued items take up to twice their bytes in leaves (a DIR_ITEM lands in
// a random leaf, which may split).
constexpr uint64_t kLeafBytesPerQueuedByte = 2;
constexpr uint64_t QueuedItemBytes(uint64_t item_bytes) {
  return kLeafBytesPerQueuedByte * (item_bytes + sizeof(format::Item));
}

uint64_t FilesystemImpl::QueuedWorkBytes() const {
  // The queues count their items' headers. An old inode's update COWs its leaf:
  // measured with sparse chmods (FullDevice.QueuedDirectoryAndInodeWork...,
  // 4 KiB nodes) 1-1.5 blocks each for up to 60 such inodes, fewer per inode
  // as they share leaves; the path above them is the reserve's base.
  return kLeafBytesPerQueuedByte * (delayed_->queued_bytes() + dir_items_->queued_bytes()) +
         old_dirty_inodes_.load(std::memory_order_relaxed) * vol_->nodesize();
}

Status FilesystemImpl::FlushQueued() {
  txn::ChunkAllocator::QueuedWorkScope scope;
  UB_RETURN_IF_ERROR(dir_items_->FlushAll(queued_dir_items_inserter_));
  UB_RETURN_IF_ERROR(delayed_->Flush([this](uint64_t r) { return FsWriter(r); }));
  return FlushInodes();
}

Status FilesystemImpl::FlushInodes() {
  // Delayed inode updates: every inode changed in this transaction is
  // written once, in (root, ino) order, at commit.
  // One subvolume's run at a time, leaf by leaf (TreeWriter::UpdateSorted):
  // 40,000 files written in a transaction are 40,000 searches otherwise,
  // while every other operation waits for the commit.
  const std::vector<inode::InodeRef> dirty = icache_.CollectDirty();
  if (!(vol_->super().incompat_flags.get() & kIncompatNoHoles)) {
    for (const inode::InodeRef& r : dirty) {
      if (S_ISREG(r->item.mode.get())) UB_RETURN_IF_ERROR(FillHoles(InodeId{r->root, r->ino}, r->item.size.get()));
    }
  }
  std::vector<Key> keys;
  std::vector<std::span<const uint8_t>> items;
  for (size_t i = 0; i < dirty.size();) {
    const uint64_t root = dirty[i]->root;
    keys.clear();
    items.clear();
    size_t j = i;
    for (; j < dirty.size() && dirty[j]->root == root; ++j) {
      keys.push_back(Key{dirty[j]->ino, kInodeItemKey, 0});
      // The record's own bytes: the records stay alive in `dirty`.
      items.emplace_back(reinterpret_cast<const uint8_t*>(&dirty[j]->item), sizeof(InodeItem));
    }
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(root));
    UB_RETURN_IF_ERROR(w->UpdateSorted(keys, items));
    for (; i < j; ++i) dirty[i]->dirty.store(false, std::memory_order_relaxed);
  }
  old_dirty_inodes_.store(0, std::memory_order_relaxed);
  return Status::Ok();
}

Result<uint64_t> FilesystemImpl::NextIno(uint64_t root) {
  std::lock_guard lock(ino_mu_);
  return NextInoLocked(root, 1);
}

// The next `n` inode numbers of a subvolume (ino_mu_ held).
Result<uint64_t> FilesystemImpl::NextInoLocked(uint64_t root, uint64_t n) {
  auto it = next_ino_.find(root);
  if (it == next_ino_.end()) {
    UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(root));
    Cursor c(vol_->source(), tree);
    UB_RETURN_IF_ERROR(c.SeekAtOrBefore(Key{kLastFreeObjectid, 0xff, UINT64_MAX}));
    uint64_t last = c.Valid() ? c.key().objectid : 0;
    it = next_ino_.emplace(root, std::max<uint64_t>(last, kFirstFreeObjectid) + 1).first;
  }
  if (it->second > kLastFreeObjectid - n) return Status::Error(EOVERFLOW, "inode numbers exhausted");
  const uint64_t first = it->second;
  it->second += n;
  return first;
}

// A new inode's number: from a run of numbers reserved for its directory.
// Creates in different directories then put their inode items and back
// references in different leaves, so threads creating in their own
// directories do not queue on the tree's last leaf. A directory's runs
// double from kInoRunFirst up to kInoRunMax as it takes more entries: a
// busy directory's leaves then sit under parent nodes of their own (a node
// points at ~490 leaves, ~30,000 inodes), where runs of 1024 put two
// creating threads under the same parent, waiting for each other's splits.
// Unused numbers of a run are simply never used (btrfs does not require
// dense numbers).
Result<uint64_t> FilesystemImpl::NewIno(InodeId dir) {
  DirState& ds = DirStateOf(dir);
  std::lock_guard lock(ds.mu);
  InoRun& run = ds.ino_runs[{dir.root, dir.ino}];
  if (run.next == run.end) {
    const uint64_t size = std::clamp<uint64_t>(run.size * 2, kInoRunFirst, kInoRunMax);
    std::lock_guard ino_lock(ino_mu_);
    auto first = NextInoLocked(dir.root, size);
    if (!first.ok() && first.status().code() == EOVERFLOW) {
      first = NextInoLocked(dir.root, 1);  // the last numbers, one at a time
      if (first.ok()) run = InoRun{*first, *first + 1, run.size};
    } else if (first.ok()) {
      run = InoRun{*first, *first + size, size};
    }
    UB_RETURN_IF_ERROR(first.status());
  }
  return run.next++;
}

Result<uint64_t> FilesystemImpl::NextDirIndex(InodeId dir) {
  DirState& ds = DirStateOf(dir);
  std::lock_guard lock(ds.mu);
  auto it = ds.next_index.find({dir.root, dir.ino});
  if (it == ds.next_index.end()) {
    UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(dir.root));
    Cursor c(vol_->source(), tree);
    UB_RETURN_IF_ERROR(c.SeekAtOrBefore(Key{dir.ino, kDirIndexKey, UINT64_MAX}));
    uint64_t next = 2;  // 0 and 1 stand for "." and ".."
    if (c.Valid() && c.key().objectid == dir.ino && c.key().type == kDirIndexKey) next = c.key().offset + 1;
    it = ds.next_index.emplace(std::make_pair(dir.root, dir.ino), next).first;
  }
  return it->second++;
}

Status FilesystemImpl::TouchDir(InodeId dir, int64_t size_delta, inode::InodeRecord* rec) {
  const Time now = Now();
  auto touch = [&](InodeItem& ii) {
    ii.size = static_cast<uint64_t>(static_cast<int64_t>(ii.size.get()) + size_delta);
    SetTime(ii.mtime, now);
    SetTime(ii.ctime, now);
  };
  // The caller has just loaded the directory, so it is normally cached (or
  // the caller holds its record): the record changes in place under its lock.
  inode::InodeRef looked_up;
  if (rec == nullptr && (looked_up = icache_.Lookup(dir.root, dir.ino))) rec = looked_up.get();
  if (rec != nullptr) {
    std::lock_guard lock(RecordLock(dir));
    touch(rec->item);
    MarkChanged(*rec);
    return Status::Ok();
  }
  UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(dir));
  touch(ii);
  return StoreInode(dir, ii);
}

// ---- Links ------------------------------------------------------------------------------------

// Another back reference of an existing inode: appended to its INODE_REF
// item for this directory, or, when that item is full, an INODE_EXTREF.
Status FilesystemImpl::AddBackRef(tree::TreeWriter* w, const tree::RootPtr& tree, InodeId dir, std::string_view name,
                                  InodeId target, uint64_t index, std::span<const uint8_t> ref) {
  const Key rkey{target.ino, kInodeRefKey, dir.ino};
  UB_ASSIGN_OR_RETURN(auto refs, tree::LookupItem(vol_->source(), tree, rkey));
  if (!refs) return w->Insert(rkey, ref);
  if (refs->size() + ref.size() <= w->MaxItemSize()) {
    refs->insert(refs->end(), ref.begin(), ref.end());
    return w->Update(rkey, *refs);
  }
  std::vector<uint8_t> ext(sizeof(InodeExtref) + name.size());
  auto* er = reinterpret_cast<InodeExtref*>(ext.data());
  er->parent_objectid = dir.ino;
  er->index = index;
  er->name_len = static_cast<uint16_t>(name.size());
  std::memcpy(ext.data() + sizeof(InodeExtref), name.data(), name.size());
  const Key ekey{target.ino, kInodeExtrefKey, ExtrefHash(dir.ino, name)};
  UB_ASSIGN_OR_RETURN(auto exts, tree::LookupItem(vol_->source(), tree, ekey));
  if (!exts) return w->Insert(ekey, ext);
  exts->insert(exts->end(), ext.begin(), ext.end());
  return w->Update(ekey, *exts);
}

Status FilesystemImpl::AddLink(InodeId dir, std::string_view name, InodeId target, uint8_t ftype,
                               const InodeItem* new_inode, inode::InodeRecord* dir_rec) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(dir.root));
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(dir.root));
  const uint64_t transid = txn_->transid();
  auto entry = DirItemBytes(Key{target.ino, kInodeItemKey, 0}, transid, ftype, name, {});
  if (entry.size() > w->MaxItemSize()) return Status::Error(ENAMETOOLONG, "entry too large");
  if (new_inode == nullptr && !(vol_->super().incompat_flags.get() & kIncompatExtendedIref)) {
    // Without extended-iref (mkfs.btrfs before 3.12) a full INODE_REF item
    // has nowhere to grow: EMLINK, as the kernel says, before any change.
    UB_ASSIGN_OR_RETURN(auto refs, tree::LookupItem(vol_->source(), tree, Key{target.ino, kInodeRefKey, dir.ino}));
    if (refs && refs->size() + sizeof(InodeRef) + name.size() > w->MaxItemSize()) {
      return Status::Error(EMLINK, "too many links to one file in one directory (the image has no extended-iref)");
    }
  }

  // DIR_ITEM by name hash. A directory with an index of its name hashes
  // (inode/delayed_dir_items.h) queues it when the hash is new; otherwise
  // it goes into the tree now, after the directory's queue.
  const uint32_t hash = static_cast<uint32_t>(NameHash(name));
  bool queued = false, flush_items = false;
  uint64_t creates = 0;
  auto verdict = dir_items_->Add(dir.root, dir.ino, hash, entry, &flush_items, &creates);
  if (verdict == inode::DelayedDirItems::Verdict::kConsiderIndex) {
    UB_RETURN_IF_ERROR(MaybeIndexDir(dir, creates));
    verdict = dir_items_->Add(dir.root, dir.ino, hash, entry, &flush_items);
  }
  switch (verdict) {
    case inode::DelayedDirItems::Verdict::kQueued:
      queued = true;
      txn_->chunk_alloc().NoteQueuedWork(QueuedItemBytes(entry.size()));
      break;
    case inode::DelayedDirItems::Verdict::kMayExist:
      UB_RETURN_IF_ERROR(FlushDirItems(dir));
      break;
    case inode::DelayedDirItems::Verdict::kNoIndex:
    case inode::DelayedDirItems::Verdict::kConsiderIndex:
      break;
  }
  if (!queued) {
    dir_items_->NoteInserted(dir.root, dir.ino, hash);
    UB_RETURN_IF_ERROR(InsertDirItem(w, dir, hash, entry));
  }
  UB_ASSIGN_OR_RETURN(uint64_t index, NextDirIndex(dir));

  // INODE_REF (or, when that item is full, an INODE_EXTREF).
  std::array<uint8_t, sizeof(InodeRef) + kMaxNameLen> ref_buf;  // names are checked to be at most 255 bytes
  if (name.size() > kMaxNameLen) return Status::Error(ENAMETOOLONG, "name of " + std::to_string(name.size()) + " bytes");
  auto* ir = reinterpret_cast<InodeRef*>(ref_buf.data());
  ir->index = index;
  ir->name_len = static_cast<uint16_t>(name.size());
  std::memcpy(ref_buf.data() + sizeof(InodeRef), name.data(), name.size());
  const std::span<const uint8_t> ref(ref_buf.data(), sizeof(InodeRef) + name.size());
  const Key rkey{target.ino, kInodeRefKey, dir.ino};
  UB_ASSIGN_OR_RETURN(tree, FsTree(dir.root));  // the DIR_ITEM change may have moved the root
  if (new_inode != nullptr) {
    // A new inode has no items yet: its inode item and this first back
    // reference are neighbours, inserted as one batch with one search.
    const Key keys[2] = {Key{target.ino, kInodeItemKey, 0}, rkey};
    const std::span<const uint8_t> data[2] = {
        std::span(reinterpret_cast<const uint8_t*>(new_inode), sizeof(InodeItem)), ref};
    UB_RETURN_IF_ERROR(w->InsertBatch(keys, data, /*nothing_between=*/true));
  } else {
    UB_RETURN_IF_ERROR(AddBackRef(w, tree, dir, name, target, index, ref));
  }

  // DIR_INDEX goes through the delayed queue.
  txn_->chunk_alloc().NoteQueuedWork(QueuedItemBytes(entry.size()));
  if (delayed_->Add(dir.root, dir.ino, index, std::move(entry)) >= kDelayedFlushThreshold) {
    txn::ChunkAllocator::QueuedWorkScope scope;
    UB_RETURN_IF_ERROR(
        delayed_->FlushDir(dir.root, dir.ino, [this](uint64_t r) { return FsWriter(r); }, /*full_batches_only=*/true));
  }
  if (flush_items) UB_RETURN_IF_ERROR(FlushDirItems(dir));
  return TouchDir(dir, 2 * static_cast<int64_t>(name.size()), dir_rec);
}

// One DIR_ITEM into the tree; names whose hashes collide share one item. The
// insert itself tells whether the hash is taken (it changes nothing then);
// only then is the item read to see whether the name exists.
Status FilesystemImpl::InsertDirItem(tree::TreeWriter* w, InodeId dir, uint32_t hash, std::span<const uint8_t> entry) {
  const Key dkey{dir.ino, kDirItemKey, hash};
  Status inserted = w->Insert(dkey, entry);
  if (inserted.code() != EEXIST) return inserted;
  const auto* di = reinterpret_cast<const DirItem*>(entry.data());
  const std::string_view name(reinterpret_cast<const char*>(entry.data()) + sizeof(DirItem), di->name_len.get());
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(dir.root));
  UB_ASSIGN_OR_RETURN(auto existing, tree::LookupItem(vol_->source(), tree, dkey));
  if (!existing) return Status::Error(EIO, "internal: dir item " + KeyToString(dkey) + " vanished");
  UB_ASSIGN_OR_RETURN(auto entries, ParseDirItems(*existing, dkey));
  for (const auto& e : entries) {
    if (e.name == name) return Status::Error(EEXIST, std::string(name) + ": exists");
  }
  if (existing->size() + entry.size() > w->MaxItemSize()) return Status::Error(ENOSPC, "dir item full of colliding names");
  existing->insert(existing->end(), entry.begin(), entry.end());
  return w->Update(dkey, *existing);
}

Status FilesystemImpl::InsertQueuedDirItems(uint64_t root, uint64_t dir, std::span<const uint32_t> hashes,
                                            std::span<const std::span<const uint8_t>> items) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(root));
  thread_local std::vector<Key> keys;
  keys.clear();
  for (uint32_t h : hashes) keys.push_back(Key{dir, kDirItemKey, h});
  // The index said no item had these hashes: an existing one is a bug.
  Status st = w->InsertSorted(keys, items);
  if (st.code() == EEXIST) return Status::Error(EIO, "internal: queued dir item already exists: " + st.message());
  return st;
}

Status FilesystemImpl::FlushDirItems(InodeId dir) {
  txn::ChunkAllocator::QueuedWorkScope scope;
  return dir_items_->FlushDir(dir.root, dir.ino, queued_dir_items_inserter_);
}

// Indexes a directory's DIR_ITEM hashes once it has taken enough creates for
// the scan to pay (inode/delayed_dir_items.h).
Status FilesystemImpl::MaybeIndexDir(InodeId dir, uint64_t creates) {
  UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(dir));
  if (creates * 128 < ii.size.get()) return Status::Ok();
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(dir.root));
  std::vector<uint64_t> hashes;
  Cursor c(vol_->source(), tree);
  UB_RETURN_IF_ERROR(c.Seek(Key{dir.ino, kDirItemKey, 0}));
  for (; c.Valid() && c.key().objectid == dir.ino && c.key().type == kDirItemKey;) {
    hashes.push_back(c.key().offset);
    UB_RETURN_IF_ERROR(c.Next());
  }
  dir_items_->SetIndex(dir.root, dir.ino, hashes);
  return Status::Ok();
}

// The name's entry out of its DIR_ITEM (names whose hashes collide share
// the item).
Status FilesystemImpl::DropNameFromDirItem(InodeId dir, std::string_view name) {
  UB_RETURN_IF_ERROR(FlushDirItems(dir));  // the name's DIR_ITEM may still be queued
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(dir.root));
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(dir.root));
  const Key dkey{dir.ino, kDirItemKey, NameHash(name)};
  UB_ASSIGN_OR_RETURN(auto ditem, tree::LookupItem(vol_->source(), tree, dkey));
  if (!ditem) return Status::NotFound(std::string(name) + ": no such entry");
  UB_ASSIGN_OR_RETURN(auto entries, ParseDirItems(*ditem, dkey));
  std::vector<uint8_t> rest;
  bool found = false;
  for (const auto& e : entries) {
    if (e.name == name && !found) {
      found = true;
      continue;
    }
    auto b = DirItemBytes(e.location, txn_->transid(), e.type, e.name, e.data);
    rest.insert(rest.end(), b.begin(), b.end());
  }
  if (!found) return Status::NotFound(std::string(name) + ": no such entry");
  return rest.empty() ? w->Delete(dkey) : w->Update(dkey, rest);
}

Status FilesystemImpl::RemoveLink(InodeId dir, std::string_view name, InodeId target, bool*) {
  UB_RETURN_IF_ERROR(DropNameFromDirItem(dir, name));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(dir.root));
  tree::RootPtr tree;
  // INODE_REF or INODE_EXTREF: find the name, learn its index, drop it.
  uint64_t index = 0;
  bool have_index = false;
  const Key rkey{target.ino, kInodeRefKey, dir.ino};
  UB_ASSIGN_OR_RETURN(tree, FsTree(dir.root));  // the DIR_ITEM change may have moved the root
  UB_ASSIGN_OR_RETURN(auto refs, tree::LookupItem(vol_->source(), tree, rkey));
  if (refs) {
    UB_ASSIGN_OR_RETURN(auto found, TakeBackRef<InodeRef>(*refs, dir.ino, name, InodeName(target)));
    if (found) {
      index = *found;
      have_index = true;
      UB_RETURN_IF_ERROR(refs->empty() ? w->Delete(rkey) : w->Update(rkey, *refs));
    }
  }
  if (!have_index) {
    const Key ekey{target.ino, kInodeExtrefKey, ExtrefHash(dir.ino, name)};
    UB_ASSIGN_OR_RETURN(tree, FsTree(dir.root));
    UB_ASSIGN_OR_RETURN(auto exts, tree::LookupItem(vol_->source(), tree, ekey));
    if (exts) {
      UB_ASSIGN_OR_RETURN(auto found, TakeBackRef<InodeExtref>(*exts, dir.ino, name, InodeName(target)));
      if (found) {
        index = *found;
        have_index = true;
        UB_RETURN_IF_ERROR(exts->empty() ? w->Delete(ekey) : w->Update(ekey, *exts));
      }
    }
  }
  if (!have_index) return Status::Corrupt(InodeName(target) + ": no back reference for '" + std::string(name) + "'");
  // DIR_INDEX: still queued, or in the tree.
  if (!delayed_->Cancel(dir.root, dir.ino, index)) {
    UB_RETURN_IF_ERROR(w->Delete(Key{dir.ino, kDirIndexKey, index}).WithContext("dir index of '" + std::string(name) + "'"));
  }
  NoteInodeChanged(target.root, target.ino);  // its names in a tree log are stale
  NoteNameRemoved(target, dir.ino, index);
  return TouchDir(dir, -2 * static_cast<int64_t>(name.size()));
}

Status FilesystemImpl::DropInode(InodeId id) {
  NoteInodeChanged(id.root, id.ino);  // a copy in a tree log must go
  ForgetRemovedNames(id);
  int64_t nbytes = 0;
  UB_RETURN_IF_ERROR(DropExtents(id, 0, UINT64_MAX, &nbytes));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(id.root));
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
  std::vector<Key> keys;
  Cursor c(vol_->source(), tree);
  UB_RETURN_IF_ERROR(c.Seek(Key{id.ino, 0, 0}));
  for (; c.Valid() && c.key().objectid == id.ino;) {
    keys.push_back(c.key());
    UB_RETURN_IF_ERROR(c.Next());
  }
  for (const Key& k : keys) UB_RETURN_IF_ERROR(w->Delete(k));
  {
    DirState& ds = DirStateOf(id);
    std::lock_guard lock(ds.mu);
    ds.next_index.erase({id.root, id.ino});
    ds.ino_runs.erase({id.root, id.ino});
  }
  dir_items_->Forget(id.root, id.ino);
  icache_.Remove(id.root, id.ino);
  return Status::Ok();
}

Status FilesystemImpl::DropName(InodeId id, bool is_dir, const Time& now) {
  UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(id));
  if (is_dir || ii.nlink.get() <= 1) return DropOrOrphan(id, ii);
  ii.nlink = ii.nlink.get() - 1;
  SetTime(ii.ctime, now);
  return StoreInode(id, ii);
}

Status FilesystemImpl::DropOrOrphan(InodeId id, InodeItem ii) {
  bool pinned;
  {
    std::lock_guard lock(pins_mu_);
    auto it = pins_.find({id.root, id.ino});
    pinned = it != pins_.end() && !S_ISDIR(ii.mode.get());
    if (pinned) it->second.orphaned = true;  // for UnpinInode
  }
  bool in_steps = false;
  if (!pinned && S_ISREG(ii.mode.get()) && undo_.empty() && !hold_commits_) {
    UB_ASSIGN_OR_RETURN(in_steps, HasMoreExtentsThan(id, kDropStepExtents));
  }
  if (!pinned && !in_steps) return DropInode(id);
  NoteInodeChanged(id.root, id.ino);  // a copy in a tree log must go
  ii.nlink = 0;
  SetTime(ii.ctime, Now());
  UB_RETURN_IF_ERROR(StoreInode(id, ii));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(id.root));
  Status s = w->Insert(OrphanKey(id.ino), {});
  if (!s.ok() && s.code() != EEXIST) return s;
  if (in_steps) StageDrop(id);
  return Status::Ok();
}

Result<InodeId> FilesystemImpl::NewEntry(InodeId dir, std::string_view name, uint32_t mode, const NewInode& attrs,
                                         std::string_view symlink_target) {
  UB_RETURN_IF_ERROR(CheckWritable());
  UB_RETURN_IF_ERROR(CheckName(name));
  // The directory's record, held to the end (its time and size change).
  inode::InodeRef dir_rec;
  UB_ASSIGN_OR_RETURN(InodeItem parent, LoadInode(dir, &dir_rec));
  if (!S_ISDIR(parent.mode.get())) return Status::Error(ENOTDIR, InodeName(dir) + " is not a directory");
  if (parent.nlink.get() == 0) return Status::NotFound(InodeName(dir) + " was removed");
  UB_ASSIGN_OR_RETURN(uint64_t ino, NewIno(dir));
  const InodeId id{dir.root, ino};
  const Time now = Now();
  InodeItem ii{};
  ii.generation = txn_->transid();
  ii.transid = txn_->transid();
  ii.nlink = 1;
  ii.uid = attrs.uid;
  ii.gid = attrs.gid;
  ii.mode = mode;
  const dev_t rdev = static_cast<dev_t>(attrs.rdev);
  if (S_ISCHR(mode) || S_ISBLK(mode)) ii.rdev = (uint64_t{major(rdev)} << 20) | minor(rdev);
  // New inodes follow their directory's no-COW / compression choices.
  ii.flags = parent.flags.get() & (kInodeNodatacow | kInodeNodatasum | kInodeCompress | kInodeNocompress);
  SetTime(ii.atime, attrs.atime.value_or(now));
  SetTime(ii.mtime, attrs.mtime.value_or(now));
  SetTime(ii.ctime, attrs.ctime.value_or(now));
  SetTime(ii.otime, now);
  // The link (with the inode item) first: it fails cleanly (EEXIST) before
  // anything else changed.
  UB_RETURN_IF_ERROR(AddLink(dir, name, id, FileTypeOfMode(mode), &ii, dir_rec.get()));
  inode::InodeRef rec = CacheInode(id, ii);
  if (parent.flags.get() & kInodeCompress) {
    UB_RETURN_IF_ERROR(InheritCompressionProperty(dir, id));
  } else if (rec) {
    rec->without_xattrs.store(true, std::memory_order_release);
  }
  if (S_ISLNK(mode)) {
    UB_RETURN_IF_ERROR(WriteInline(id, std::span(reinterpret_cast<const uint8_t*>(symlink_target.data()), symlink_target.size())));
    UB_ASSIGN_OR_RETURN(InodeItem li, LoadInode(id));
    li.size = symlink_target.size();
    li.nbytes = symlink_target.size();
    UB_RETURN_IF_ERROR(StoreInode(id, li));
  }
  return id;
}

Result<InodeId> FilesystemImpl::CreateImpl(InodeId dir, std::string_view name, const NewInode& attrs) {
  auto guard = Guard();
  return NewEntry(dir, name, S_IFREG | (attrs.mode & 07777), attrs, {});
}

Result<InodeId> FilesystemImpl::MkdirImpl(InodeId dir, std::string_view name, const NewInode& attrs) {
  auto guard = Guard();
  return NewEntry(dir, name, S_IFDIR | (attrs.mode & 07777), attrs, {});
}

Result<InodeId> FilesystemImpl::MknodImpl(InodeId dir, std::string_view name, const NewInode& attrs) {
  auto guard = Guard();
  const uint32_t type = attrs.mode & S_IFMT;
  if (type != S_IFIFO && type != S_IFSOCK && type != S_IFCHR && type != S_IFBLK && type != S_IFREG) {
    return Status::Invalid("mknod of an unsupported file type");
  }
  return NewEntry(dir, name, attrs.mode & (S_IFMT | 07777), attrs, {});
}

Result<InodeId> FilesystemImpl::SymlinkImpl(InodeId dir, std::string_view name, std::string_view target,
                                        const NewInode& attrs) {
  auto guard = Guard();
  if (target.empty()) return Status::Error(ENOENT, "empty symlink target");
  if (target.size() >= 4096 || target.size() > vol_->nodesize() - sizeof(Header) - sizeof(Item) - kFileExtentInlineDataStart) {
    return Status::Error(ENAMETOOLONG, "symlink target of " + std::to_string(target.size()) + " bytes");
  }
  return NewEntry(dir, name, S_IFLNK | 0777, attrs, target);
}

Status FilesystemImpl::LinkImpl(InodeId inode, InodeId dir, std::string_view name) {
  auto guard = Guard();
  UB_RETURN_IF_ERROR(CheckWritable());
  UB_RETURN_IF_ERROR(CheckName(name));
  UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(inode));
  if (S_ISDIR(ii.mode.get())) return Status::Error(EPERM, "hard link to a directory");
  if (inode.root != dir.root) return Status::Error(EXDEV, "hard link across subvolumes");
  UB_ASSIGN_OR_RETURN(InodeItem parent, LoadInode(dir));
  if (!S_ISDIR(parent.mode.get())) return Status::Error(ENOTDIR, InodeName(dir) + " is not a directory");
  auto existing = LookupChild(dir, name);
  if (existing.ok()) return Status::Error(EEXIST, std::string(name) + ": exists");
  if (existing.status().code() != ENOENT) return existing.status();
  if (ii.nlink.get() >= 65535) return Status::Error(EMLINK, "too many links");
  UB_RETURN_IF_ERROR(AddLink(dir, name, inode, FileTypeOfMode(ii.mode.get()), nullptr));
  UB_ASSIGN_OR_RETURN(ii, LoadInode(inode));
  ii.nlink = ii.nlink.get() + 1;
  SetTime(ii.ctime, Now());
  return StoreInode(inode, ii);
}

Status FilesystemImpl::UnlinkImpl(InodeId dir, std::string_view name) {
  auto guard = Guard();
  UB_RETURN_IF_ERROR(CheckWritable());
  UB_ASSIGN_OR_RETURN(InodeId id, LookupChild(dir, name));
  if (id.root != dir.root) return Status::Error(EISDIR, std::string(name) + " is a subvolume");
  UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(id));
  if (S_ISDIR(ii.mode.get())) return Status::Error(EISDIR, std::string(name) + " is a directory");
  UB_RETURN_IF_ERROR(RemoveLink(dir, name, id, nullptr));
  return DropName(id, false, Now());
}

Status FilesystemImpl::RmdirImpl(InodeId dir, std::string_view name) {
  auto guard = Guard();
  UB_RETURN_IF_ERROR(CheckWritable());
  if (name == ".") return Status::Invalid("rmdir of '.'");
  if (name == "..") return Status::Error(ENOTEMPTY, "rmdir of '..'");
  UB_ASSIGN_OR_RETURN(InodeId id, LookupChild(dir, name));
  if (id.root != dir.root) return RmdirSubvolumeEntry(dir, name, id);
  UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(id));
  if (!S_ISDIR(ii.mode.get())) return Status::Error(ENOTDIR, std::string(name) + " is not a directory");
  UB_ASSIGN_OR_RETURN(auto entries, ReadDir(id));
  if (!entries.empty()) return Status::Error(ENOTEMPTY, std::string(name) + ": directory not empty");
  UB_RETURN_IF_ERROR(RemoveLink(dir, name, id, nullptr));
  return DropInode(id);
}

Result<bool> FilesystemImpl::IsAncestor(InodeId maybe_ancestor, InodeId dir) {
  InodeId cur = dir;
  for (int depth = 0; depth < 100000; ++depth) {
    if (cur == maybe_ancestor) return true;
    if (cur == root_) return false;
    UB_ASSIGN_OR_RETURN(InodeId up, Parent(cur));
    if (up == cur) return false;
    cur = up;
  }
  return Status::Corrupt("directory chain too deep (a loop?)");
}

Status FilesystemImpl::RenameImpl(InodeId old_dir, std::string_view old_name, InodeId new_dir, std::string_view new_name,
                              unsigned flags) {
  auto guard = Guard();
  UB_RETURN_IF_ERROR(CheckWritable());
  UB_RETURN_IF_ERROR(CheckName(new_name));
  if ((flags & kRenameNoReplace) && (flags & kRenameExchange)) return Status::Invalid("NOREPLACE with EXCHANGE");
  UB_ASSIGN_OR_RETURN(InodeId src, LookupChild(old_dir, old_name));
  UB_ASSIGN_OR_RETURN(InodeItem nd, LoadInode(new_dir));
  if (!S_ISDIR(nd.mode.get())) return Status::Error(ENOTDIR, InodeName(new_dir) + " is not a directory");
  auto dst_r = LookupChild(new_dir, new_name);
  if (!dst_r.ok() && dst_r.status().code() != ENOENT) return dst_r.status();
  const std::optional<InodeId> dst = dst_r.ok() ? std::optional<InodeId>(*dst_r) : std::nullopt;
  // Errors in the order Linux reports them: an existing target under
  // NOREPLACE, a missing one under EXCHANGE, then a directory moved into itself.
  if (dst && (flags & kRenameNoReplace)) return Status::Error(EEXIST, std::string(new_name) + ": exists");
  if (!dst && (flags & kRenameExchange)) return Status::NotFound(std::string(new_name) + ": no such entry to exchange with");
  if (dst && *dst == src) return Status::Ok();  // the same inode under both names: nothing happens
  const EntryKind ks = KindOf(old_dir, src);
  const EntryKind kd = dst ? KindOf(new_dir, *dst) : EntryKind::kInode;  // used only with dst
  if (ks == EntryKind::kStub) return Status::Error(ENOTEMPTY, std::string(old_name) + ": a stub of a subvolume cannot move");
  const bool exchange = flags & kRenameExchange;
  if (exchange && kd == EntryKind::kStub) {
    return Status::Error(ENOENT, std::string(new_name) + ": a stub of a subvolume cannot be exchanged with");
  }
  UB_ASSIGN_OR_RETURN(InodeItem src_ii, LoadInode(src));
  const bool src_dir = S_ISDIR(src_ii.mode.get());
  // A directory (a subvolume's top is one) moved into itself.
  if (src_dir) {
    UB_ASSIGN_OR_RETURN(bool loop, IsAncestor(src, new_dir));
    if (loop) return Status::Invalid("cannot move a directory into itself");
  }
  std::optional<InodeItem> dst_ii;
  if (dst && kd != EntryKind::kStub) {
    UB_ASSIGN_OR_RETURN(dst_ii, LoadInode(*dst));
  }
  const bool dst_dir = dst && (kd == EntryKind::kStub || S_ISDIR(dst_ii->mode.get()));
  if (exchange) {
    if (dst_dir) {
      UB_ASSIGN_OR_RETURN(bool loop, IsAncestor(*dst, old_dir));
      if (loop) return Status::Invalid("cannot move a directory into itself");
    }
    if (old_dir.root != new_dir.root && (ks != EntryKind::kSubvolume || kd != EntryKind::kSubvolume)) {
      return Status::Error(EXDEV, "only subvolumes are exchanged across subvolumes");
    }
  } else if (dst) {
    UB_ASSIGN_OR_RETURN(bool holds_src, IsAncestor(*dst, old_dir));
    if (holds_src) return Status::Error(ENOTEMPTY, std::string(new_name) + ": directory not empty");
    if (src_dir && !dst_dir) return Status::Error(ENOTDIR, std::string(new_name) + " is not a directory");
    if (!src_dir && dst_dir) return Status::Error(EISDIR, std::string(new_name) + " is a directory");
    if (kd == EntryKind::kSubvolume) return Status::Error(ENOTEMPTY, std::string(new_name) + " is a subvolume");
  }
  if (ks == EntryKind::kInode && old_dir.root != new_dir.root) return Status::Error(EXDEV, "rename across subvolumes");
  // Moving a directory rewrites its ".."; the kernel asks for write access
  // to it, which a read-only subvolume's top refuses.
  if (!(old_dir == new_dir)) {
    std::vector<uint64_t> moved;
    if (ks == EntryKind::kSubvolume) moved.push_back(src.root);
    if (exchange && kd == EntryKind::kSubvolume) moved.push_back(dst->root);
    for (uint64_t root : moved) {
      UB_ASSIGN_OR_RETURN(bool ro, subvols_->ReadOnly(root));
      if (ro) return Status::Error(EROFS, "subvolume " + std::to_string(root) + " is read-only");
    }
  }
  if (dst && !exchange && kd == EntryKind::kInode && dst_dir) {
    UB_ASSIGN_OR_RETURN(auto entries, ReadDir(*dst));
    if (!entries.empty()) return Status::Error(ENOTEMPTY, std::string(new_name) + ": directory not empty");
  }

  const Time now = Now();
  auto unlink = [&](InodeId dir, std::string_view name, InodeId id, EntryKind kind) -> Status {
    if (kind == EntryKind::kSubvolume) return UnlinkSubvolumeEntry(dir, name, id.root);
    if (kind == EntryKind::kStub) return RemoveStubEntry(dir, name, id);
    return RemoveLink(dir, name, id, nullptr);
  };
  auto link = [&](InodeId dir, std::string_view name, InodeId id, EntryKind kind, const InodeItem& ii) -> Status {
    if (kind == EntryKind::kSubvolume) return LinkSubvolumeEntry(dir, name, id.root);
    UB_RETURN_IF_ERROR(AddLink(dir, name, id, FileTypeOfMode(ii.mode.get()), nullptr));
    // A subvolume's top keeps its ctime: the kernel changes it in memory only.
    UB_ASSIGN_OR_RETURN(InodeItem now_ii, LoadInode(id));
    SetTime(now_ii.ctime, now);
    return StoreInode(id, now_ii);
  };
  UB_RETURN_IF_ERROR(unlink(old_dir, old_name, src, ks));
  if (dst) {
    UB_RETURN_IF_ERROR(unlink(new_dir, new_name, *dst, kd));
    if (!exchange && kd == EntryKind::kInode) UB_RETURN_IF_ERROR(DropName(*dst, dst_dir, now));
  }
  UB_RETURN_IF_ERROR(link(new_dir, new_name, src, ks, src_ii));
  if (exchange) UB_RETURN_IF_ERROR(link(old_dir, old_name, *dst, kd, *dst_ii));
  // A subvolume's entry lives in two trees, and the tree log carries only
  // the fs tree's half (subvolume_entries.cc): such a change commits.
  if (ks == EntryKind::kInode && kd == EntryKind::kInode) return Status::Ok();
  return hold_commits_ ? Status::Ok() : CommitImpl();
}

// ---- File data ------------------------------------------------------------------------------------

// Removes file extents from [start, end), trimming or splitting those that
// reach past either end. Extents keep their data references: a split adds
// one reference to the same disk extent, a removal drops one.
Status FilesystemImpl::DropExtents(InodeId id, uint64_t start, uint64_t end, int64_t* nbytes_delta) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(id.root));
  {
    UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(id));
    NoteExtentRange(id, start, end, ii.generation.get() > vol_->super().generation.get());
  }
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
  std::vector<std::pair<Key, std::vector<uint8_t>>> hits;
  {
    // The cursor (and its node locks) is let go of before the tree changes.
    Cursor c(vol_->source(), tree);
    UB_RETURN_IF_ERROR(SeekFileExtent(c, id, start));
    for (; c.Valid();) {
      const Key k = c.key();
      if (k.objectid != id.ino || k.type != kExtentDataKey || k.offset >= end) break;
      hits.push_back({k, std::vector<uint8_t>(c.data().begin(), c.data().end())});
      UB_RETURN_IF_ERROR(c.Next());
    }
  }
  for (auto& [k, d] : hits) {
    if (d.size() < kFileExtentInlineDataStart) return Status::Corrupt(InodeName(id) + ": short extent item");
    auto* fe = reinterpret_cast<FileExtentItem*>(d.data());
    if (fe->type == kFileExtentInline) {
      const uint64_t len = fe->compression ? fe->ram_bytes.get() : d.size() - kFileExtentInlineDataStart;
      if (k.offset + len <= start) continue;
      UB_RETURN_IF_ERROR(w->Delete(k));
      *nbytes_delta -= static_cast<int64_t>(len);
      continue;
    }
    if (d.size() < sizeof(FileExtentItem)) return Status::Corrupt(InodeName(id) + ": short extent item");
    const uint64_t ks = k.offset, num = fe->num_bytes.get(), ke = ks + num;
    if (ke <= start) continue;
    const uint64_t disk = fe->disk_bytenr.get(), disk_len = fe->disk_num_bytes.get();
    const uint64_t ref_offset = ks - fe->offset.get();
    const bool counted = disk != 0;  // holes have no data and no reference
    const uint64_t cut_from = std::max(ks, start), cut_to = std::min(ke, end);
    if (counted) *nbytes_delta -= static_cast<int64_t>(cut_to - cut_from);
    if (ks < start) {
      // Keep the head [ks, start).
      fe->num_bytes = start - ks;
      UB_RETURN_IF_ERROR(w->Update(k, d));
      if (ke > end) {
        // The range is inside the extent: the tail [end, ke) becomes a new item.
        fe->offset = fe->offset.get() + (end - ks);
        fe->num_bytes = ke - end;
        UB_RETURN_IF_ERROR(w->Insert(Key{id.ino, kExtentDataKey, end}, d));
        if (counted) UB_RETURN_IF_ERROR(txn_->AddDataRef(disk, disk_len, id.root, id.ino, ref_offset));
      }
      continue;
    }
    UB_RETURN_IF_ERROR(w->Delete(k));
    if (ke > end) {
      fe->offset = fe->offset.get() + (end - ks);
      fe->num_bytes = ke - end;
      UB_RETURN_IF_ERROR(w->Insert(Key{id.ino, kExtentDataKey, end}, d));
    } else if (counted) {
      UB_RETURN_IF_ERROR(txn_->DropDataRef(disk, disk_len, id.root, id.ino, ref_offset));
    }
  }
  return Status::Ok();
}

Status FilesystemImpl::WriteInline(InodeId id, std::span<const uint8_t> content, uint64_t ram_bytes,
                                   uint8_t compression) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(id.root));
  std::vector<uint8_t> item(kFileExtentInlineDataStart + content.size());
  auto* fe = reinterpret_cast<FileExtentItem*>(item.data());
  fe->generation = txn_->transid();
  fe->ram_bytes = compression != kCompressNone ? ram_bytes : content.size();
  fe->compression = compression;
  fe->type = kFileExtentInline;
  std::memcpy(item.data() + kFileExtentInlineDataStart, content.data(), content.size());
  return w->Insert(Key{id.ino, kExtentDataKey, 0}, item);
}

// Writes sector-aligned data at sector-aligned `start` as new extents; runs
// of all-zero sectors become holes (no-holes images need no hole items).
// Finds data space for the non-zero sectors of `data` (to sit at file
// offset `start`), before anything else changes: a full device is an ENOSPC
// with the file untouched. Runs of all-zero sectors become holes.
std::optional<FilesystemImpl::GrowableExtent> FilesystemImpl::ExtentEndingAt(InodeId id, uint64_t offset) {
  if (offset == 0) return std::nullopt;
  {
    // A file fsynced in this transaction keeps an extent per write, as the
    // kernel's (each fsync ends its delalloc range): a grown extent would be
    // logged again whole, with all its checksums, at every fsync.
    std::lock_guard lock(log_mu_);
    if (logged_.count({id.root, id.ino})) return std::nullopt;
  }
  auto tree = FsTree(id.root);
  if (!tree.ok()) return std::nullopt;
  Cursor c(vol_->source(), *tree);
  if (!c.SeekAtOrBefore(Key{id.ino, kExtentDataKey, offset - 1}).ok() || !c.Valid()) return std::nullopt;
  const Key k = c.key();
  if (k.objectid != id.ino || k.type != kExtentDataKey || c.data().size() != sizeof(FileExtentItem)) {
    return std::nullopt;
  }
  FileExtentItem fe;
  std::memcpy(&fe, c.data().data(), sizeof fe);
  const uint64_t len = fe.num_bytes.get();
  if (fe.type != kFileExtentReg || fe.compression != kCompressNone || fe.encryption != 0 ||
      fe.other_encoding.get() != 0 || fe.disk_bytenr.get() == 0 || fe.offset.get() != 0 ||
      fe.disk_num_bytes.get() != len || fe.ram_bytes.get() != len || fe.generation.get() != txn_->transid() ||
      k.offset + len != offset || len >= kMaxExtent) {
    return std::nullopt;
  }
  return GrowableExtent{k.offset, fe.disk_bytenr.get(), len};
}

Result<std::vector<FilesystemImpl::DataPiece>> FilesystemImpl::AllocPieces(uint64_t start, std::span<const uint8_t> data,
                                                                           const std::optional<GrowableExtent>& grow) {
  const uint32_t ss = vol_->sectorsize();
  std::vector<DataPiece> pieces;
  size_t pos = 0;
  while (pos < data.size()) {
    if (AllZero(data.subspan(pos, ss))) {
      pos += ss;
      continue;
    }
    size_t run = ss;
    while (pos + run < data.size() && run < kMaxExtent && !AllZero(data.subspan(pos + run, ss))) run += ss;
    size_t done = 0;
    if (pos == 0 && grow) {
      // Right after the extent the write continues, if that space is free.
      const uint64_t want = std::min<uint64_t>(run, kMaxExtent - grow->len);
      UB_ASSIGN_OR_RETURN(bool at, txn_->AllocDataAt(grow->bytenr + grow->len, want));
      if (at) {
        pieces.push_back(DataPiece{start, 0, grow->bytenr + grow->len, want, kCompressNone, {}, grow});
        done = want;
      }
    }
    // The run, in smaller pieces if space is fragmented.
    while (done < run) {
      uint64_t want = run - done;
      for (;;) {
        auto a = txn_->AllocData(want);
        if (a.ok()) {
          pieces.push_back(DataPiece{start + pos + done, pos + done, *a, want});
          break;
        }
        // Space taken so far is returned at commit: a new extent that nothing
        // references vanishes there.
        if (a.status().code() != ENOSPC || want <= ss) return a.status();
        want = std::max<uint64_t>(ss, want / 2 / ss * ss);
      }
      done += want;
    }
    pos += run;
  }
  return pieces;
}

Status FilesystemImpl::WritePieces(InodeId id, const std::vector<DataPiece>& pieces, std::span<const uint8_t> data,
                                   bool csum, int64_t* nbytes_delta) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(id.root));
  for (const DataPiece& p : pieces) {
    FileExtentItem fe = WholeExtentItem(txn_->transid(), kFileExtentReg, p.bytenr, p.len);
    if (p.compression != kCompressNone) {
      // Checksums cover the compressed bytes as they lie on disk.
      UB_RETURN_IF_ERROR(txn_->WriteData(p.bytenr, p.zdata, csum));
      fe.compression = p.compression;
      fe.disk_num_bytes = p.zdata.size();
      NoteCompressed(p.compression);
    } else {
      UB_RETURN_IF_ERROR(txn_->WriteData(p.bytenr, data.subspan(p.data_pos, p.len), csum));
    }
    if (p.grows) {
      UB_ASSIGN_OR_RETURN(bool merged, txn_->MergeData(p.grows->bytenr, p.grows->len, p.bytenr, id.root, id.ino,
                                                       p.grows->file_off));
      if (merged) {
        const FileExtentItem grown =
            WholeExtentItem(txn_->transid(), kFileExtentReg, p.grows->bytenr, p.grows->len + p.len);
        UB_RETURN_IF_ERROR(w->Update(Key{id.ino, kExtentDataKey, p.grows->file_off}, AsBytes(grown)));
        *nbytes_delta += static_cast<int64_t>(p.len);
        continue;
      }
    }
    UB_RETURN_IF_ERROR(w->Insert(Key{id.ino, kExtentDataKey, p.file_off}, AsBytes(fe)));
    UB_RETURN_IF_ERROR(txn_->AddDataRef(p.bytenr, fe.disk_num_bytes.get(), id.root, id.ino, p.file_off));
    *nbytes_delta += static_cast<int64_t>(p.len);
  }
  return Status::Ok();
}

Status FilesystemImpl::WriteRegular(InodeId id, uint64_t start, std::span<const uint8_t> data, bool csum,
                                    int64_t* nbytes_delta) {
  UB_ASSIGN_OR_RETURN(auto pieces, AllocPieces(start, data));
  return WritePieces(id, pieces, data, csum, nbytes_delta);
}

Result<size_t> FilesystemImpl::WriteImpl(InodeId file, uint64_t offset, std::span<const uint8_t> data,
                                         std::span<const fs::Precompressed> pre) {
  auto guard = Guard();
  UB_RETURN_IF_ERROR(CheckWritable());
  UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(file));
  if (S_ISDIR(ii.mode.get())) return Status::Error(EISDIR, InodeName(file) + " is a directory");
  if (!S_ISREG(ii.mode.get())) return Status::Invalid(InodeName(file) + " is not a regular file");
  UB_RETURN_IF_ERROR(DataMayChange(file, ii));
  if (data.empty()) return size_t{0};
  if (offset + data.size() < offset || offset + data.size() > (1ull << 62)) return Status::Error(EFBIG, "file too large");
  const uint32_t ss = vol_->sectorsize();
  // As the kernel reserves a write's whole range against the limits.
  if (Status q = txn_->CheckQuota(file.root, (data.size() + ss - 1) / ss * ss); !q.ok()) {
    t_clean_failure = true;
    return q;
  }
  const uint64_t old_size = ii.size.get(), end = offset + data.size(), new_size = std::max(old_size, end);
  const bool csum = !(ii.flags.get() & kInodeNodatasum);
  int64_t nbytes_delta = 0;
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(file.root));
  // One search tells whether the file has extent items at all (a new
  // file's first write: nothing to drop) and whether its first is inline.
  bool has_extents = false, has_inline = false;
  {
    Cursor c(vol_->source(), tree);
    UB_RETURN_IF_ERROR(c.Seek(Key{file.ino, kExtentDataKey, 0}));
    has_extents = c.Valid() && c.key().objectid == file.ino && c.key().type == kExtentDataKey;
    has_inline = has_extents && c.key().offset == 0 && c.data().size() >= kFileExtentInlineDataStart &&
                 reinterpret_cast<const FileExtentItem*>(c.data().data())->type == kFileExtentInline;
  }
  // Into preallocated extents, and the extents of a NODATACOW file, in
  // place where the file has them to itself (write_in_place.cc).
  bool in_place = false;
  if (has_extents && !has_inline) {
    UB_ASSIGN_OR_RETURN(in_place, WriteInPlace(file, ii, offset, data, &nbytes_delta));
  }
  fs::WriteCompression zc;
  if (!in_place) {
    UB_ASSIGN_OR_RETURN(zc, CompressionFor(file, ii));
  }
  bool mark_nocompress = false;
  std::optional<std::vector<uint8_t>> zinline;
  std::vector<uint8_t> content;
  if (zc.on() && new_size <= ss) {  // (never in place: zc is off then)
    // The whole file is rewritten; at one sector at most it may become a
    // compressed inline extent (compressing costs nothing on disk yet).
    content.assign(new_size, 0);
    UB_RETURN_IF_ERROR(Read(file, 0, std::span(content).subspan(0, old_size)).status());
    std::memcpy(content.data() + offset, data.data(), data.size());
    bool failed = false;
    zinline = fs::CompressInline(zc, content, ss, kMaxInline, &failed);
    if (failed && !zc.force && !zc.by_property) mark_nocompress = true;
  }
  if (in_place) {
    // Written by WriteInPlace; only the inode is left.
  } else if (zinline) {
    UB_RETURN_IF_ERROR(DropExtents(file, 0, UINT64_MAX, &nbytes_delta));
    UB_RETURN_IF_ERROR(WriteInline(file, *zinline, new_size, zc.type));
    NoteCompressed(zc.type);
    nbytes_delta += static_cast<int64_t>(new_size);
  } else if (new_size <= kMaxInline && new_size < ss) {
    std::vector<uint8_t> content(new_size, 0);
    UB_RETURN_IF_ERROR(Read(file, 0, std::span(content).subspan(0, old_size)).status());
    std::memcpy(content.data() + offset, data.data(), data.size());
    UB_RETURN_IF_ERROR(DropExtents(file, 0, UINT64_MAX, &nbytes_delta));
    UB_RETURN_IF_ERROR(WriteInline(file, content));
    nbytes_delta += static_cast<int64_t>(content.size());
  } else if (!has_inline && !zc.on() && offset % ss == 0 && data.size() % ss == 0) {
    // Whole sectors replace whatever was there: straight from the caller's
    // buffer (no copy, no read of the old bytes), as an import's writes
    // of large files are. A write that continues the file's newest extent
    // grows it where the space after it is free.
    auto pieces = AllocPieces(offset, data, ExtentEndingAt(file, offset));
    if (!pieces.ok()) {
      t_clean_failure = true;  // nothing changed yet
      return pieces.status();
    }
    if (has_extents) {
      UB_RETURN_IF_ERROR(DropExtents(file, offset, end, &nbytes_delta));
    } else {
      NoteExtentRange(file, offset, end, ii.generation.get() > vol_->super().generation.get());
    }
    UB_RETURN_IF_ERROR(WritePieces(file, *pieces, data, csum, &nbytes_delta));
  } else {
    const uint64_t a = has_inline ? 0 : offset / ss * ss;
    const uint64_t b = (end + ss - 1) / ss * ss;
    std::vector<uint8_t> buf(b - a, 0);
    if (a < old_size) {
      UB_RETURN_IF_ERROR(Read(file, a, std::span(buf).subspan(0, std::min(b, old_size) - a)).status());
    }
    std::memcpy(buf.data() + (offset - a), data.data(), data.size());
    // The caller's bytes that lie in a host file (import --reflink) are in
    // buf now: the clone source follows them there.
    std::optional<txn::ScopedCloneSource> from_host;
    if (const txn::CloneSource* cs = txn::CurrentCloneSource();
        cs && data.data() >= cs->base && data.data() + data.size() <= cs->base + cs->len) {
      from_host.emplace(txn::CloneSource{cs->fd, cs->offset + static_cast<uint64_t>(data.data() - cs->base),
                                         buf.data() + (offset - a), data.size()});
    }
    // Files of one sector were tried above (inline or nothing).
    auto pieces = zc.on() && new_size > ss ? AllocCompressedPieces(zc, a, buf, new_size - a, pre, &mark_nocompress) : AllocPieces(a, buf);
    if (!pieces.ok()) {
      t_clean_failure = true;  // nothing changed yet
      return pieces.status();
    }
    UB_RETURN_IF_ERROR(DropExtents(file, a, has_inline ? UINT64_MAX : b, &nbytes_delta));
    UB_RETURN_IF_ERROR(WritePieces(file, *pieces, buf, csum, &nbytes_delta));
  }
  UB_ASSIGN_OR_RETURN(ii, LoadInode(file));
  ii.size = new_size;
  ii.nbytes = static_cast<uint64_t>(static_cast<int64_t>(ii.nbytes.get()) + nbytes_delta);
  // Data that did not compress: the kernel stops trying for this file.
  if (mark_nocompress) ii.flags = ii.flags.get() | kInodeNocompress;
  if (!CallerKeepsFileTimes()) {
    const Time now = Now();
    SetTime(ii.mtime, now);
    SetTime(ii.ctime, now);
  }
  UB_RETURN_IF_ERROR(StoreInode(file, ii));
  return data.size();
}

Status FilesystemImpl::TruncateLocked(InodeId id, uint64_t new_size) {
  UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(id));
  if (S_ISDIR(ii.mode.get())) return Status::Error(EISDIR, InodeName(id) + " is a directory");
  if (!S_ISREG(ii.mode.get())) return Status::Invalid(InodeName(id) + " is not a regular file");
  // Even to the size it has, as the kernel's setattr_prepare.
  UB_RETURN_IF_ERROR(DataMayChange(id, ii));
  const uint64_t old_size = ii.size.get();
  if (new_size == old_size) return Status::Ok();
  const uint32_t ss = vol_->sectorsize();
  const bool csum = !(ii.flags.get() & kInodeNodatasum);
  int64_t nbytes_delta = 0;
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
  UB_ASSIGN_OR_RETURN(auto first, tree::LookupItem(vol_->source(), tree, Key{id.ino, kExtentDataKey, 0}));
  const bool has_inline = first && first->size() >= kFileExtentInlineDataStart &&
                          reinterpret_cast<const FileExtentItem*>(first->data())->type == kFileExtentInline;
  // Data space for what is rewritten is found before anything changes: on a
  // full device the truncate is an ENOSPC with the file untouched.
  auto alloc_first = [&](uint64_t start, std::span<const uint8_t> data) -> Result<std::vector<DataPiece>> {
    auto pieces = AllocPieces(start, data);
    if (!pieces.ok()) t_clean_failure = true;  // nothing changed yet
    return pieces;
  };
  if (has_inline) {
    // Rewrite the whole (small) file: inline again if it still fits.
    std::vector<uint8_t> content(new_size, 0);
    const uint64_t keep = std::min(old_size, new_size);
    UB_RETURN_IF_ERROR(Read(id, 0, std::span(content).subspan(0, keep)).status());
    if (new_size <= kMaxInline && new_size < ss) {
      UB_RETURN_IF_ERROR(DropExtents(id, 0, UINT64_MAX, &nbytes_delta));
      if (new_size > 0) {
        UB_RETURN_IF_ERROR(WriteInline(id, content));
        nbytes_delta += static_cast<int64_t>(new_size);
      }
    } else {
      content.resize((keep + ss - 1) / ss * ss, 0);
      UB_ASSIGN_OR_RETURN(auto pieces, alloc_first(0, content));
      UB_RETURN_IF_ERROR(DropExtents(id, 0, UINT64_MAX, &nbytes_delta));
      UB_RETURN_IF_ERROR(WritePieces(id, pieces, content, csum, &nbytes_delta));
    }
  } else if (new_size < old_size) {
    const uint64_t tail = new_size % ss, base = new_size - tail;
    std::vector<uint8_t> sector;
    std::vector<DataPiece> pieces;
    if (tail) {
      // The part of the last sector past the new end must read as zeros if
      // the file grows again: rewrite that sector with its tail cleared.
      sector.assign(ss, 0);
      UB_RETURN_IF_ERROR(Read(id, base, std::span(sector).subspan(0, tail)).status());
      UB_ASSIGN_OR_RETURN(pieces, alloc_first(base, sector));  // none when the sector is all zeros
    }
    UB_RETURN_IF_ERROR(DropExtents(id, tail ? base : new_size, UINT64_MAX, &nbytes_delta));
    if (!pieces.empty()) UB_RETURN_IF_ERROR(WritePieces(id, pieces, sector, csum, &nbytes_delta));
  }
  UB_ASSIGN_OR_RETURN(ii, LoadInode(id));
  ii.size = new_size;
  ii.nbytes = static_cast<uint64_t>(static_cast<int64_t>(ii.nbytes.get()) + nbytes_delta);
  if (!CallerKeepsFileTimes()) {
    const Time now = Now();
    SetTime(ii.mtime, now);
    SetTime(ii.ctime, now);
  }
  return StoreInode(id, ii);
}

Status FilesystemImpl::SetAttrImpl(InodeId id, const AttrChange& change) {
  auto guard = Guard();
  UB_RETURN_IF_ERROR(CheckWritable());
  if (change.size) {
    UB_ASSIGN_OR_RETURN(InodeItem cur, LoadInode(id));
    const bool same_size = cur.size.get() == *change.size;
    UB_RETURN_IF_ERROR(TruncateLocked(id, *change.size));
    // truncate(2) to the size the file has changes nothing, times included
    // (so the kernel's btrfs: it stamps mtime and ctime only when the size
    // changes; ext4 stamps both either way).
    if (same_size && !change.mode && !change.uid && !change.gid && !change.atime && !change.mtime && !change.ctime) {
      return Status::Ok();
    }
  }
  UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(id));
  if (change.mode) ii.mode = (ii.mode.get() & S_IFMT) | (*change.mode & 07777);
  if (change.uid) ii.uid = *change.uid;
  if (change.gid) ii.gid = *change.gid;
  if (change.atime) SetTime(ii.atime, *change.atime);
  if (change.mtime) SetTime(ii.mtime, *change.mtime);
  if (change.ctime) {
    SetTime(ii.ctime, *change.ctime);
  } else if (!(change.size && CallerKeepsFileTimes())) {
    SetTime(ii.ctime, Now());
  }
  return StoreInode(id, ii);
}

// ---- Xattrs ----------------------------------------------------------------------------------------

Status FilesystemImpl::PutXattrItem(InodeId id, const Key& key, std::vector<uint8_t> item) {
  if (!item.empty()) {
    if (inode::InodeRef r = icache_.Lookup(id.root, id.ino)) r->without_xattrs.store(false, std::memory_order_release);
  }
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(id.root));
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
  UB_ASSIGN_OR_RETURN(auto existing, tree::LookupItem(vol_->source(), tree, key));
  if (item.empty()) return existing ? w->Delete(key) : Status::Ok();
  return existing ? w->Update(key, item) : w->Insert(key, item);
}

Status FilesystemImpl::SetXattrImpl(InodeId id, std::string_view name, std::string_view value, int flags) {
  auto guard = Guard();
  UB_RETURN_IF_ERROR(CheckWritable());
  if (name.empty() || name.size() > 255) return Status::Error(ERANGE, "bad xattr name length");
  UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(id));
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(id.root));
  const Key key{id.ino, kXattrItemKey, NameHash(name)};
  UB_ASSIGN_OR_RETURN(auto existing, tree::LookupItem(vol_->source(), tree, key));
  std::vector<uint8_t> out;
  bool found = false;
  if (existing) {
    UB_ASSIGN_OR_RETURN(auto entries, ParseDirItems(*existing, key));
    for (const auto& e : entries) {
      if (e.name == name) {
        found = true;
        continue;
      }
      auto b = DirItemBytes(e.location, txn_->transid(), e.type, e.name, e.data);
      out.insert(out.end(), b.begin(), b.end());
    }
  }
  if ((flags & XATTR_CREATE) && found) return Status::Error(EEXIST, std::string(name) + ": xattr exists");
  if ((flags & XATTR_REPLACE) && !found) return Status::Error(ENODATA, std::string(name) + ": no such xattr");
  auto mine = DirItemBytes(Key{}, txn_->transid(), kFtXattr, name, value);
  if (out.size() + mine.size() > w->MaxItemSize()) {
    return Status::Error(E2BIG, "xattr " + std::string(name) + " of " + std::to_string(value.size()) + " bytes does not fit");
  }
  out.insert(out.end(), mine.begin(), mine.end());
  UB_RETURN_IF_ERROR(CheckCompressionProperty(name, value, &ii));
  const uint64_t prop_flags = ii.flags.get();
  UB_RETURN_IF_ERROR(PutXattrItem(id, key, std::move(out)));
  UB_ASSIGN_OR_RETURN(ii, LoadInode(id));
  ii.flags = prop_flags;
  SetTime(ii.ctime, Now());
  return StoreInode(id, ii);
}

Status FilesystemImpl::RemoveXattrImpl(InodeId id, std::string_view name) {
  auto guard = Guard();
  UB_RETURN_IF_ERROR(CheckWritable());
  UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(id));
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
  const Key key{id.ino, kXattrItemKey, NameHash(name)};
  UB_ASSIGN_OR_RETURN(auto existing, tree::LookupItem(vol_->source(), tree, key));
  if (!existing) return Status::Error(ENODATA, std::string(name) + ": no such xattr");
  UB_ASSIGN_OR_RETURN(auto entries, ParseDirItems(*existing, key));
  std::vector<uint8_t> out;
  bool found = false;
  for (const auto& e : entries) {
    if (e.name == name) {
      found = true;
      continue;
    }
    auto b = DirItemBytes(e.location, txn_->transid(), e.type, e.name, e.data);
    out.insert(out.end(), b.begin(), b.end());
  }
  if (!found) return Status::Error(ENODATA, std::string(name) + ": no such xattr");
  UB_RETURN_IF_ERROR(CheckCompressionProperty(name, std::nullopt, &ii));
  UB_RETURN_IF_ERROR(PutXattrItem(id, key, std::move(out)));
  SetTime(ii.ctime, Now());
  return StoreInode(id, ii);
}

Status FilesystemImpl::CommitImpl(txn::CommitTail* tail) {
  auto guard = ExclusiveGuard();
  UB_RETURN_IF_ERROR(CheckWritable());
  static stats::Histogram& commit_time = stats::GetHistogram("commit.time", "ns");
  static stats::Histogram& commit_blocks = stats::GetHistogram("commit.blocks_written", "blocks");
  static stats::Counter& commits = stats::GetCounter("commit.count");
  static stats::Counter& data_bytes = stats::GetCounter("commit.data_bytes_written");
  const uint64_t t0 = stats::NowNs();
  const txn::TxnStats before = txn_->stats();
  UB_RETURN_IF_ERROR(FlushQueued());
  ApplyPendingIncompat();
  // Under OpenOptions::undo_uncommitted the commit is whole before its
  // caller goes on: Discard() must never meet a half-durable one.
  UB_RETURN_IF_ERROR(txn_->Commit(undo_.empty() ? tail : nullptr));
  ResetLog();  // the commit's superblock has no log_root
  for (auto* u : undo_) u->Forget();  // what the commit made durable stays
  const txn::TxnStats after = txn_->stats();
  if (after.commits != before.commits) {
    commit_time.Record(stats::NowNs() - t0);
    commit_blocks.Record(after.blocks_written - before.blocks_written);
    commits.Add();
    data_bytes.Add(after.data_bytes_written - before.data_bytes_written);
  }
  return Status::Ok();
}


// ---- Public entry points: a failure that may have left a change half done
// aborts the transaction, as btrfs does: the image stays at its last commit
// and the view turns read-only.

// Items an operation may insert, delete or change (inode, refs, dir items,
// extents, csums), for the up-front metadata reservation.
constexpr uint64_t kItemsPerOp = 8;
// What a deletion (unlink, rmdir, truncate) reserves, over the commit
// reserve only: less than the global reserve that changes leave for it
// (txn/space_reserve.h), so a deletion can run where changes cannot.
constexpr uint64_t kItemsPerDelete = 4;
static_assert(kItemsPerDelete * txn::ChunkAllocator::kBlocksPerItem < txn::kGlobalReserveMinBlocks);

// Bounds the memory of a running transaction (dirty tree blocks and cached
// inodes): past OpenOptions::max_dirty_bytes, commit, as the kernel does
// every 30 seconds whatever its callers do. Never under
// OpenOptions::undo_uncommitted: there only the caller commits.
Status FilesystemImpl::MaybeAutoCommit() {
  if (old_dirty_inodes_.load(std::memory_order_relaxed) >= kMaxOldDirtyInodes) {
    // Their updates wait for the commit in leaves the transaction does not
    // have yet, each kept a tree block of room: past a bound, they go into
    // the tree now (as the kernel's delayed-inode writeback does), so that
    // a long transaction of chmods or small writes to old files does not
    // hold back megabytes of metadata for them.
    auto guard = ExclusiveGuard();
    if (old_dirty_inodes_.load(std::memory_order_relaxed) >= kMaxOldDirtyInodes) {
      txn::ChunkAllocator::QueuedWorkScope scope;
      Status st = FlushInodes();
      NoteFailure(st);
      UB_RETURN_IF_ERROR(st);
    }
  }
  if (hold_commits_ || !undo_.empty() || txn_->dirty_bytes() < max_dirty_bytes_) return Status::Ok();
  txn::CommitTail tail;
  Status st;
  {
    auto guard = ExclusiveGuard();
    if (txn_->dirty_bytes() < max_dirty_bytes_) return Status::Ok();  // another thread committed meanwhile
    st = CommitImpl(&tail);
  }
  // The other threads go on with the next transaction while this one waits
  // for the device.
  if (st.ok()) st = FinishCommit(tail);
  NoteFailure(st);
  return st;
}

Status FilesystemImpl::FinishCommit(txn::CommitTail& tail) {
  Status st = tail.Finish();
  if (!st.ok()) {
    // Other threads may have changed the next transaction already, on top
    // of one whose superblock is not on disk: nothing more may be written,
    // whatever the error was.
    std::lock_guard lock(abort_mu_);
    if (!aborted_) {
      abort_reason_ = "a commit's superblock did not reach the device: " + st.ToString();
      aborted_ = true;
    }
  }
  return st;
}

void FilesystemImpl::NoteFailure(const Status& st) {
  const bool clean = std::exchange(t_clean_failure, false);
  if (st.ok() || aborted_ || clean) return;
  switch (st.code()) {
    case ENOSPC: case EIO: case EUCLEAN: case ENOMEM: case EOVERFLOW: {
      std::lock_guard lock(abort_mu_);
      if (aborted_) break;
      abort_reason_ = st.ToString();
      aborted_ = true;
    }
      break;
    default:
      break;  // argument and namespace errors are found before anything changes
  }
}

Result<InodeId> FilesystemImpl::Create(InodeId dir, std::string_view name, const NewInode& attrs) {
  static stats::Histogram& latency = stats::GetHistogram("op.create", "ns");
  stats::ScopedTimer timer(latency);
  return ChangeIn(dir, kItemsPerOp, [&] { return CreateImpl(dir, name, attrs); });
}

Result<InodeId> FilesystemImpl::Mkdir(InodeId dir, std::string_view name, const NewInode& attrs) {
  static stats::Histogram& latency = stats::GetHistogram("op.mkdir", "ns");
  stats::ScopedTimer timer(latency);
  return ChangeIn(dir, kItemsPerOp, [&] { return MkdirImpl(dir, name, attrs); });
}

Result<InodeId> FilesystemImpl::Mknod(InodeId dir, std::string_view name, const NewInode& attrs) {
  static stats::Histogram& latency = stats::GetHistogram("op.mknod", "ns");
  stats::ScopedTimer timer(latency);
  return ChangeIn(dir, kItemsPerOp, [&] { return MknodImpl(dir, name, attrs); });
}

Result<InodeId> FilesystemImpl::Symlink(InodeId dir, std::string_view name, std::string_view target, const NewInode& attrs) {
  static stats::Histogram& latency = stats::GetHistogram("op.symlink", "ns");
  stats::ScopedTimer timer(latency);
  return Change({dir}, kItemsPerOp, [&] { return SymlinkImpl(dir, name, target, attrs); });
}

Status FilesystemImpl::Link(InodeId inode, InodeId dir, std::string_view name) {
  static stats::Histogram& latency = stats::GetHistogram("op.link", "ns");
  stats::ScopedTimer timer(latency);
  return Change({inode, dir}, kItemsPerOp, [&] { return LinkImpl(inode, dir, name); });
}

Status FilesystemImpl::Unlink(InodeId dir, std::string_view name) {
  static stats::Histogram& latency = stats::GetHistogram("op.unlink", "ns");
  stats::ScopedTimer timer(latency);
  return Change({dir}, txn::ReserveFor::kDelete, kItemsPerDelete, [&] { return UnlinkImpl(dir, name); });
}

Status FilesystemImpl::Rmdir(InodeId dir, std::string_view name) {
  static stats::Histogram& latency = stats::GetHistogram("op.rmdir", "ns");
  stats::ScopedTimer timer(latency);
  return Change({dir}, txn::ReserveFor::kDelete, kItemsPerDelete, [&] { return RmdirImpl(dir, name); });
}

Status FilesystemImpl::Rename(InodeId old_dir, std::string_view old_name, InodeId new_dir, std::string_view new_name, unsigned flags) {
  static stats::Histogram& latency = stats::GetHistogram("op.rename", "ns");
  stats::ScopedTimer timer(latency);
  if (flags & kRenameForDeletion) {
    const unsigned f = flags & ~kRenameForDeletion;
    return Change({old_dir, new_dir}, txn::ReserveFor::kDelete, kItemsPerDelete,
                  [&] { return RenameImpl(old_dir, old_name, new_dir, new_name, f); });
  }
  return Change({old_dir, new_dir}, 2 * kItemsPerOp,
                [&] { return RenameImpl(old_dir, old_name, new_dir, new_name, flags); });
}

Result<size_t> FilesystemImpl::Write(InodeId file, uint64_t offset, std::span<const uint8_t> data) {
  static stats::Histogram& latency = stats::GetHistogram("op.write", "ns");
  stats::ScopedTimer timer(latency);
  return ChangeIn(file, kItemsPerOp + data.size() / (1 << 20), [&] { return WriteImpl(file, offset, data); });
}

Result<size_t> FilesystemImpl::WritePrecompressed(InodeId file, uint64_t offset, std::span<const uint8_t> data,
                                                  std::span<const fs::Precompressed> pre) {
  return ChangeIn(file, kItemsPerOp + data.size() / (1 << 20), [&] { return WriteImpl(file, offset, data, pre); });
}

Status FilesystemImpl::SetAttr(InodeId id, const AttrChange& change) {
  static stats::Histogram& latency = stats::GetHistogram("op.setattr", "ns");
  stats::ScopedTimer timer(latency);
  // A size change (truncate) is a deletion: it may use the global reserve.
  if (change.size) {
    return Change({id}, txn::ReserveFor::kDelete, kItemsPerDelete, [&] { return SetAttrImpl(id, change); });
  }
  return Change({id}, kItemsPerOp, [&] { return SetAttrImpl(id, change); });
}

Status FilesystemImpl::SetXattr(InodeId id, std::string_view name, std::string_view value, int flags) {
  static stats::Histogram& latency = stats::GetHistogram("op.setxattr", "ns");
  stats::ScopedTimer timer(latency);
  return Change({id}, kItemsPerOp, [&] { return SetXattrImpl(id, name, value, flags); });
}

Status FilesystemImpl::RemoveXattr(InodeId id, std::string_view name) {
  static stats::Histogram& latency = stats::GetHistogram("op.removexattr", "ns");
  stats::ScopedTimer timer(latency);
  // Removing an item frees space, so it may use the global reserve: on a
  // metadata-full device (fsstress on 512 MiB: 1,541 ENOSPC) it must work
  // as unlink does.
  return Change({id}, txn::ReserveFor::kDelete, kItemsPerDelete, [&] { return RemoveXattrImpl(id, name); });
}

Status FilesystemImpl::Discard() {
  auto guard = ExclusiveGuard();
  if (!txn_) return Status::Error(EROFS, "the image is open read-only");
  {
    std::lock_guard lock(abort_mu_);
    if (!aborted_) {
      abort_reason_ = "the changes were discarded";
      aborted_ = true;
    }
  }
  if (!undo_.empty()) {
    for (auto* u : undo_) {
      UB_RETURN_IF_ERROR(u->Rollback().WithContext("putting back the bytes written since the last commit"));
    }
    return Status::Ok();
  }
  return Status::Ok();
}

Status FilesystemImpl::Commit() {
  txn::CommitTail tail;
  Status r;
  {
    auto guard = [&] {
      CommitWaiting waiting(this);
      return ExclusiveGuard();
    }();
    UB_RETURN_IF_ERROR(CheckWritable());
    r = CommitImpl(&tail);
  }
  // Durable when this returns, but other threads' changes go on meanwhile
  // (unless this thread holds the operation lock from further out).
  if (r.ok()) r = FinishCommit(tail);
  NoteFailure(r);
  return r;
}

}  // namespace ubtrfs::fsimpl
