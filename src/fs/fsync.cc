// fsync(2) and fdatasync(2): what goes into the tree log (log/tree_log.h),
// and when a full commit is taken instead, as the kernel falls back to one.
//
// What an fsync of inode X logs (the kernel's rules, tree-log.c, in the
// form its replay and ours apply them):
// - X whole: inode item, every INODE_REF/EXTREF (a replay unlinks names the
//   log lacks, so a rename is carried), every xattr (likewise), and file
//   extents: all of them the first time a new file is logged, else those in
//   the ranges changed since X was last logged (or since the commit), with
//   explicit hole items where such a range has no extent (no-holes images
//   have no hole items, and a replay would keep the committed extents
//   there), and the checksums of every logged extent's data.
// - A directory X (fsyncdir): also every DIR_INDEX entry and a DIR_LOG_INDEX
//   range over all of them (a replay removes entries the log lacks); each
//   entry's inode that is new or changed in this transaction is logged too.
// - Every ancestor directory changed or created in this transaction, up to
//   the subvolume's top, by inode item and references only: a new file in a
//   new directory is reachable after a replay, a renamed parent is where it
//   was at the fsync.
// - Inodes logged earlier in the transaction and changed since are logged
//   again (a later fsync must not replay a stale copy; a logged file since
//   deleted leaves the log, and if it was committed, its names are removed
//   by DIR_LOG_INDEX ranges of one index).
// A full commit instead: when the log would be large (it is written whole
// at each fsync, less the blocks that did not change), when the transaction
// made chunks (a log may only point into committed chunks), while edits may
// be undone (OpenOptions::undo_uncommitted), when space for the log runs
// out, or, with mixed groups, when the log would name a data extent twice
// (the kernel's replay then fails: TreeLog::NamesADataExtentTwice).
#include <sys/stat.h>

#include "fs/fs_impl.h"
#include "log/tree_log.h"

namespace ubtrfs::fsimpl {

namespace {

// Past this many bytes of logged items the fsync commits instead: each
// fsync rewrites what changed of the log, and a commit ends it.
constexpr uint64_t kMaxLogBytes = 2ull << 20;
// A range change that large (a big file rewritten) is cheaper to commit.
constexpr uint64_t kMaxLoggedRangeBytes = 64ull << 20;

Key MinKey(uint64_t ino, uint8_t type) { return Key{ino, type, 0}; }

// A DIR_LOG_INDEX item's body: the last index of the range its key starts.
std::vector<uint8_t> DirLogEnd(uint64_t last) {
  Le64 end;
  end = last;
  const auto* p = reinterpret_cast<const uint8_t*>(&end);
  return std::vector<uint8_t>(p, p + sizeof end);
}
Key MaxKey(uint64_t ino, uint8_t type) { return Key{ino, type, UINT64_MAX}; }

// (parent, index) of each name in an INODE_REF or INODE_EXTREF item.
Result<std::vector<std::pair<uint64_t, uint64_t>>> ParseRefs(const Key& k, std::span<const uint8_t> d) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  const bool ext = k.type == kInodeExtrefKey;
  const size_t head = ext ? sizeof(InodeExtref) : sizeof(InodeRef);
  for (size_t at = 0; at < d.size();) {
    if (d.size() - at < head) return Status::Corrupt("inode reference " + KeyToString(k) + ": short");
    uint64_t parent, index;
    size_t name_len;
    if (ext) {
      const auto* r = reinterpret_cast<const InodeExtref*>(d.data() + at);
      parent = r->parent_objectid.get();
      index = r->index.get();
      name_len = r->name_len.get();
    } else {
      const auto* r = reinterpret_cast<const InodeRef*>(d.data() + at);
      parent = k.offset;
      index = r->index.get();
      name_len = r->name_len.get();
    }
    if (name_len > d.size() - at - head) return Status::Corrupt("inode reference " + KeyToString(k) + ": overruns");
    out.push_back({parent, index});
    at += head + name_len;
  }
  return out;
}

}  // namespace

void FilesystemImpl::NoteExtentRange(InodeId id, uint64_t start, uint64_t end, bool new_inode) {
  if (!txn_ || end <= start) return;
  std::lock_guard lock(log_mu_);
  const auto key = std::pair(id.root, id.ino);
  // A new inode is logged whole the first time; only its changes after that
  // are needed.
  if (new_inode && !logged_.count(key)) return;
  auto& ranges = log_ranges_[key];
  auto it = ranges.upper_bound(start);
  if (it != ranges.begin() && std::prev(it)->second >= start) {
    it = std::prev(it);
    start = it->first;
  }
  while (it != ranges.end() && it->first <= end) {
    end = std::max(end, it->second);
    it = ranges.erase(it);
  }
  ranges.emplace_hint(it, start, end);
}

void FilesystemImpl::NoteInodeChanged(uint64_t root, uint64_t ino) {
  if (!log_active_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(log_mu_);
  auto it = logged_.find(std::pair(root, ino));
  if (it != logged_.end()) it->second.changed = true;
}

void FilesystemImpl::NoteNameRemoved(InodeId id, uint64_t dir, uint64_t index) {
  if (!txn_) return;
  std::lock_guard lock(log_mu_);
  removed_names_[std::pair(id.root, id.ino)].push_back({dir, index});
}

void FilesystemImpl::ForgetRemovedNames(InodeId id) {
  std::lock_guard lock(log_mu_);
  removed_names_.erase(std::pair(id.root, id.ino));
}

void FilesystemImpl::ResetLog() {
  std::lock_guard lock(log_mu_);
  logged_.clear();
  log_ranges_.clear();
  removed_names_.clear();
  log_active_.store(false, std::memory_order_release);
  if (tree_log_) tree_log_->Reset();
}

Status FilesystemImpl::Fsync(InodeId id, bool datasync) {
  static stats::Histogram& latency = stats::GetHistogram("op.fsync", "ns");
  static stats::Counter& logged = stats::GetCounter("fsync.logged");
  static stats::Counter& committed = stats::GetCounter("fsync.committed");
  stats::ScopedTimer timer(latency);
  (void)datasync;  // the inode item is logged either way: it is small, and it carries the size
  auto guard = ExclusiveGuard();
  UB_RETURN_IF_ERROR(CheckWritable());
  Status st = FsyncImpl(id);
  if (st.ok()) {
    logged.Add();
    return st;
  }
  if (st.code() != EAGAIN) {
    NoteFailure(st);
    return st;
  }
  committed.Add();
  st = CommitImpl();
  NoteFailure(st);
  return st;
}

// EAGAIN: commit instead.
Status FilesystemImpl::FsyncImpl(InodeId id) {
  if (!undo_.empty() || !tree_log_) return Status::Error(EAGAIN, "no log");
  UB_RETURN_IF_ERROR(FlushQueued());
  if (!txn_->HasChanges()) return Status::Ok();  // everything is committed
  if (txn_->HasNewChunks()) return Status::Error(EAGAIN, "new chunks");
  {
    std::lock_guard lock(log_mu_);
    log_active_.store(true, std::memory_order_release);
  }
  UB_RETURN_IF_ERROR(LogInodeTree(id, LogMode::kAll));
  // Inodes logged before and changed since: their copies in the log are stale.
  for (;;) {
    std::optional<std::pair<uint64_t, uint64_t>> next;
    {
      std::lock_guard lock(log_mu_);
      for (const auto& [k, l] : logged_) {
        if (l.changed) {
          next = k;
          break;
        }
      }
    }
    if (!next) break;
    UB_RETURN_IF_ERROR(LogInodeTree(InodeId{next->first, next->second}, LogMode::kExists));
  }
  if (tree_log_->bytes() > kMaxLogBytes) return Status::Error(EAGAIN, "log too large");
  if (txn_->chunk_alloc().mixed() && tree_log_->NamesADataExtentTwice()) {
    return Status::Error(EAGAIN, "mixed groups: a data extent logged twice");
  }
  static stats::Counter& blocks = stats::GetCounter("fsync.log_blocks_written");
  const uint64_t before = tree_log_->stats().blocks_written;
  Status s = tree_log_->Sync(txn_.get());
  if (s.code() == ENOSPC) return Status::Error(EAGAIN, s.message());
  blocks.Add(tree_log_->stats().blocks_written - before);
  return s;
}

// X, then every inode its logging brings in (ancestors, a directory's new
// entries), each once.
Status FilesystemImpl::LogInodeTree(InodeId id, LogMode mode) {
  std::vector<std::pair<InodeId, LogMode>> todo{{id, mode}};
  std::set<std::pair<uint64_t, uint64_t>> done;
  while (!todo.empty()) {
    auto [x, m] = todo.back();
    todo.pop_back();
    if (!done.insert({x.root, x.ino}).second) continue;
    UB_RETURN_IF_ERROR(LogOneInode(x, m, &todo));
    if (tree_log_->bytes() > kMaxLogBytes) return Status::Error(EAGAIN, "log too large");
  }
  return Status::Ok();
}

Status FilesystemImpl::LogOneInode(InodeId id, LogMode mode, std::vector<std::pair<InodeId, LogMode>>* more) {
  const auto key = std::pair(id.root, id.ino);
  const uint64_t transid = txn_->transid();
  const uint64_t committed_gen = vol_->super().generation.get();
  bool first_time = false, changed = true;
  {
    std::lock_guard lock(log_mu_);
    auto it = logged_.find(key);
    first_time = it == logged_.end();
    if (!first_time) {
      changed = it->second.changed;
      if (it->second.mode == LogMode::kAll) {
        if (mode == LogMode::kAll) changed = true;  // asked for again: its ranges may have grown
        mode = LogMode::kAll;
      } else if (mode == LogMode::kAll) {
        changed = true;  // an ancestor fsynced itself now
      }
    }
  }
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
  const std::string where = "logging " + InodeName(id);
  auto ii_r = LoadInode(id);
  if (!ii_r.ok() && ii_r.status().code() != ENOENT) return ii_r.status().WithContext(where);
  if (!ii_r.ok() || ii_r->nlink.get() == 0) {
    // Gone since it was logged (or left only open, with no name: after a
    // crash it is gone too): out of the log. A committed inode would
    // come back with a replay: its logged names are removed by one-index
    // DIR_LOG_INDEX ranges of their directories.
    bool was_committed = false;
    {
      std::lock_guard lock(log_mu_);
      auto it = logged_.find(key);
      was_committed = it != logged_.end() && it->second.committed;
    }
    if (was_committed) {
      for (const auto& [k, d] : tree_log_->Items(id.root, MinKey(id.ino, kInodeRefKey), MaxKey(id.ino, kInodeExtrefKey))) {
        UB_ASSIGN_OR_RETURN(auto refs, ParseRefs(k, *d));
        for (const auto& [parent, index] : refs) {
          tree_log_->Put(id.root, Key{parent, kDirLogIndexKey, index}, DirLogEnd(index));
          more->push_back({InodeId{id.root, parent}, LogMode::kExists});
        }
      }
    }
    tree_log_->Erase(id.root, Key{id.ino, 0, 0}, Key{id.ino, UINT8_MAX, UINT64_MAX});
    std::lock_guard lock(log_mu_);
    logged_.erase(key);
    log_ranges_.erase(key);
    return Status::Ok();
  }
  const InodeItem ii = *ii_r;
  // No replay copies fs-verity's items (the kernel's replay_one_buffer
  // knows none): a log would bring back the flag without them. An inode
  // that changed in this transaction with the flag may have just got it.
  if ((ii.flags.get() & kInodeRoVerity) && ii.transid.get() == transid) {
    return Status::Error(EAGAIN, "fs-verity enabled in this transaction");
  }
  const bool is_dir = S_ISDIR(ii.mode.get());
  const bool is_new = ii.generation.get() > committed_gen;
  if (!is_dir) mode = LogMode::kAll;

  // Every item of the inode but its extents and DIR_ITEMs, as the tree has
  // them now; the names first, for the walk up.
  auto read_items = [&](uint8_t from, uint8_t to) -> Result<std::vector<std::pair<Key, std::vector<uint8_t>>>> {
    std::vector<std::pair<Key, std::vector<uint8_t>>> out;
    Cursor c(vol_->source(), tree);
    UB_RETURN_IF_ERROR(c.Seek(Key{id.ino, from, 0}));
    while (c.Valid() && c.key().objectid == id.ino && c.key().type <= to) {
      const uint8_t t = c.key().type;
      if (t == kInodeItemKey || t == kInodeRefKey || t == kInodeExtrefKey || t == kXattrItemKey ||
          (t == kDirIndexKey && mode == LogMode::kAll)) {
        out.push_back({c.key(), std::vector<uint8_t>(c.data().begin(), c.data().end())});
      }
      UB_RETURN_IF_ERROR(c.Next());
    }
    return out;
  };
  UB_ASSIGN_OR_RETURN(auto items, read_items(kInodeItemKey, kInodeExtrefKey));
  // Every ancestor is walked past, logged or not (a grandparent may have
  // been renamed).
  for (const auto& [k, d] : items) {
    if (k.type != kInodeRefKey && k.type != kInodeExtrefKey) continue;
    UB_ASSIGN_OR_RETURN(auto refs, ParseRefs(k, d));
    for (const auto& [parent, index] : refs) {
      if (parent != id.ino) more->push_back({InodeId{id.root, parent}, LogMode::kExists});  // not the top's ".."
    }
  }
  // An ancestor that neither changed nor is new needs no copy; one logged
  // and unchanged since keeps its copy.
  if (first_time && mode == LogMode::kExists && !is_new && ii.transid.get() != transid) return Status::Ok();
  if (!first_time && !changed) return Status::Ok();
  if (items.empty() || items.front().first.type != kInodeItemKey) return Status::Corrupt(where + ": no inode item");
  {
    UB_ASSIGN_OR_RETURN(auto rest, read_items(kInodeExtrefKey + 1, UINT8_MAX));
    for (auto& it : rest) items.push_back(std::move(it));
  }

  if (mode == LogMode::kAll) {
    // Names, xattrs, entries and their ranges: replaced as a set.
    tree_log_->Erase(id.root, Key{id.ino, 0, 0}, Key{id.ino, static_cast<uint8_t>(kExtentDataKey - 1), UINT64_MAX});
    tree_log_->Erase(id.root, Key{id.ino, static_cast<uint8_t>(kExtentDataKey + 1), 0},
                     Key{id.ino, UINT8_MAX, UINT64_MAX});
  } else {
    // The one-index deletion ranges of removed children stay.
    for (uint8_t t : {kInodeItemKey, kInodeRefKey, kInodeExtrefKey, kXattrItemKey}) {
      tree_log_->Erase(id.root, MinKey(id.ino, t), MaxKey(id.ino, t));
    }
  }
  for (auto& [k, d] : items) {
    if (k.type == kDirIndexKey) {
      UB_ASSIGN_OR_RETURN(auto es, ParseDirItems(d, k));
      for (const auto& e : es) {
        if (e.location.type != kInodeItemKey) continue;  // a subvolume's entry
        const InodeId child{id.root, e.location.objectid};
        auto ci = LoadInode(child);
        if (!ci.ok()) return ci.status().WithContext(where);
        // New, or changed (perhaps renamed in): without its own copy a
        // replay would drop the entry, or give the inode a second name.
        if (ci->generation.get() > committed_gen || ci->transid.get() == transid) {
          more->push_back({child, LogMode::kAll});
        }
      }
    }
    tree_log_->Put(id.root, k, std::move(d));
  }
  // Names this inode lost in this transaction, in directories the replay
  // finds in the committed tree: a one-index DIR_LOG_INDEX range there
  // removes each (else a renamed file would keep its old name too, and a
  // renamed directory would have two).
  std::vector<std::pair<uint64_t, uint64_t>> removed;
  {
    std::lock_guard lock(log_mu_);
    auto r = removed_names_.find(key);
    if (r != removed_names_.end()) removed = r->second;
  }
  for (const auto& [dir, index] : removed) {
    const InodeId d{id.root, dir};
    auto di = LoadInode(d);
    if (!di.ok() && di.status().code() != ENOENT) return di.status().WithContext(where);
    if (!di.ok()) return Status::Error(EAGAIN, "a directory this inode left is gone");
    if (di->generation.get() > committed_gen) continue;  // a new directory: its names come only from the log
    tree_log_->Put(id.root, Key{dir, kDirLogIndexKey, index}, DirLogEnd(index));
    more->push_back({d, LogMode::kExists});
  }
  if (is_dir && mode == LogMode::kAll) {
    tree_log_->Put(id.root, Key{id.ino, kDirLogIndexKey, 0}, DirLogEnd(UINT64_MAX));
  }

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  {
    std::lock_guard lock(log_mu_);
    auto& l = logged_[key];
    l.mode = mode;
    l.changed = false;
    l.committed = !is_new;
    auto r = log_ranges_.find(key);
    if (r != log_ranges_.end()) {
      ranges.assign(r->second.begin(), r->second.end());
      log_ranges_.erase(r);
    }
  }
  if (is_dir) return Status::Ok();
  if (first_time && is_new) ranges = {{0, UINT64_MAX}};
  return LogExtents(id, ii, std::move(ranges));
}

// The file's extents over `ranges` as the tree has them now, holes made
// explicit, with their checksums; what the log had there goes.
Status FilesystemImpl::LogExtents(InodeId id, const InodeItem& ii, std::vector<std::pair<uint64_t, uint64_t>> ranges) {
  if (ranges.empty()) return Status::Ok();
  const uint32_t ss = vol_->sectorsize();
  const uint64_t size_end = (ii.size.get() + ss - 1) / ss * ss;
  const std::string where = "logging the extents of " + InodeName(id);
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (auto [s, e] : ranges) {
    s = s / ss * ss;
    e = e >= UINT64_MAX - ss ? UINT64_MAX : (e + ss - 1) / ss * ss;
    if (!merged.empty() && s <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, e);
    } else {
      merged.push_back({s, e});
    }
  }
  // A logged item that reaches outside a range widens it: it goes, and
  // what the tree has over all of it is logged again. Only the items at
  // either end of a range can reach outside it (logged items never overlap).
  auto extent_end = [&](const Key& k, const std::vector<uint8_t>& d) { return FileExtentEnd(k, d, ss); };
  for (auto& [s, e] : merged) {
    if (auto before = tree_log_->ItemAtOrBefore(id.root, Key{id.ino, kExtentDataKey, s})) {
      if (extent_end(before->first, *before->second) > s) {
        s = before->first.offset;
        e = std::max(e, extent_end(before->first, *before->second));
      }
    }
    if (e > s) {
      if (auto last = tree_log_->ItemAtOrBefore(id.root, Key{id.ino, kExtentDataKey, e - 1})) {
        e = std::max(e, extent_end(last->first, *last->second));
      }
    }
  }
  {
    std::vector<std::pair<uint64_t, uint64_t>> again;
    for (const auto& r : merged) {
      if (!again.empty() && r.first <= again.back().second) {
        again.back().second = std::max(again.back().second, r.second);
      } else {
        again.push_back(r);
      }
    }
    merged = std::move(again);
  }
  uint64_t total = 0;
  for (const auto& [s, e] : merged) total += std::min(e, size_end) - std::min(s, size_end);
  if (total > kMaxLoggedRangeBytes) return Status::Error(EAGAIN, "large range");

  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * csum_w, txn_->Writer(kCsumTreeObjectid));
  const size_t csize = CsumSize(vol_->csum_type());
  const uint64_t transid = txn_->transid();
  for (const auto& [s, e] : merged) {
    tree_log_->Erase(id.root, Key{id.ino, kExtentDataKey, s}, Key{id.ino, kExtentDataKey, e - 1});
    std::vector<std::pair<Key, std::vector<uint8_t>>> found;
    {
      Cursor c(vol_->source(), tree);
      UB_RETURN_IF_ERROR(SeekFileExtent(c, id, s));
      while (c.Valid()) {
        const Key k = c.key();
        if (k.objectid != id.ino || k.type != kExtentDataKey || k.offset >= e) break;
        std::vector<uint8_t> d(c.data().begin(), c.data().end());
        if (extent_end(k, d) > s) found.push_back({k, std::move(d)});
        UB_RETURN_IF_ERROR(c.Next());
      }
    }
    uint64_t at = s;
    auto hole = [&](uint64_t from, uint64_t to) {
      to = std::min(to, size_end);
      if (from >= to) return;
      const FileExtentItem fe = HoleExtentItem(transid, to - from);
      const auto* p = reinterpret_cast<const uint8_t*>(&fe);
      tree_log_->Put(id.root, Key{id.ino, kExtentDataKey, from}, std::vector<uint8_t>(p, p + sizeof fe));
    };
    for (auto& [k, d] : found) {
      if (d.size() < kFileExtentInlineDataStart) return Status::Corrupt(where + ": short extent item");
      const uint64_t ke = extent_end(k, d);
      if (k.offset > at) hole(at, k.offset);
      at = std::max(at, ke);
      const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
      if (fe->type != kFileExtentInline && d.size() >= sizeof(FileExtentItem) && fe->disk_bytenr.get() != 0 &&
          !(ii.flags.get() & kInodeNodatasum)) {
        uint64_t cs = fe->disk_bytenr.get(), ce = cs + fe->disk_num_bytes.get();
        if (fe->compression == kCompressNone) {
          cs += fe->offset.get();
          ce = cs + fe->num_bytes.get();
        }
        // The checksums of [cs, ce) from the csum tree as it is now.
        Cursor c(txn_->source(), csum_w->CurrentRoot());
        UB_RETURN_IF_ERROR(c.SeekAtOrBefore(Key{kExtentCsumObjectid, kExtentCsumKey, cs}));
        if (!c.Valid() || c.key().objectid != kExtentCsumObjectid || c.key().type != kExtentCsumKey) {
          UB_RETURN_IF_ERROR(c.Seek(Key{kExtentCsumObjectid, kExtentCsumKey, cs}));
        }
        while (c.Valid()) {
          const Key ck = c.key();
          if (ck.objectid != kExtentCsumObjectid || ck.type != kExtentCsumKey || ck.offset >= ce) break;
          const uint64_t ie = ck.offset + c.data().size() / csize * ss;
          const uint64_t from = std::max(ck.offset, cs), to = std::min(ie, ce);
          if (from < to) {
            tree_log_->PutCsums(id.root, from,
                                c.data().subspan((from - ck.offset) / ss * csize, (to - from) / ss * csize));
          }
          UB_RETURN_IF_ERROR(c.Next());
        }
      }
      tree_log_->Put(id.root, k, std::move(d));
    }
    if (at < e) hole(at, e);
  }
  return Status::Ok();
}

}  // namespace ubtrfs::fsimpl
