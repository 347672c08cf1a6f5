// Tree-log replay (see replay.h). The order and the rules are the kernel's
// (fs/btrfs/tree-log.c, btrfs_recover_log_trees):
//
// 1. Pin: every block of the log root tree and of each log tree is read
//    (verified) and kept from allocation until the commit; every data extent
//    a logged file extent item points at is taken out of free space (it has
//    no EXTENT_ITEM yet when it was written in the crashed transaction).
//    Nothing has changed when a damaged block is found here.
// 2. For each stage -- inodes, directory index entries, everything else --
//    each log tree is walked in key order into its subvolume's tree:
//    - INODE_ITEM: xattrs of the inode absent from the log go; for a
//      directory, entries inside the log's DIR_LOG_INDEX ranges that the log
//      lacks go; the item is copied (keeping nbytes, and a directory's size,
//      which the names replayed later make right; generation 0 means "exists
//      only"); a regular file loses extents past its logged size.
//    - DIR_INDEX: the name is added unless the log holds the inode's
//      reference for it (then the reference adds it); conflicting entries of
//      the same name or index go.
//    - XATTR_ITEM: copied. INODE_REF/EXTREF: each name is linked (conflicting
//      names and references not in the log are unlinked first), then the
//      item is copied. EXTENT_DATA: overlapping extents are dropped, the item
//      inserted, its extent referenced (EXTENT_DATA_REF of the subvolume),
//      and the log's checksums for it replace the csum tree's.
// 3. After the last stage of each log tree, the link count of every inode
//    the replay touched is recounted from its references; an inode left with
//    none is removed (a directory's entries first), which the kernel does by
//    an orphan item and its orphan cleanup at mount. Directory sizes and
//    file nbytes are recounted the same way (the kernel adjusts them step by
//    step; the result is the same on a consistent tree).
// 4. log_root is cleared and one commit writes it all.
#include "log/replay.h"

#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "format/checksum.h"
#include "format/ondisk.h"
#include "txn/transaction.h"

namespace ubtrfs::log {

using namespace ubtrfs::format;
using Bytes = std::vector<uint8_t>;

namespace {

constexpr uint64_t kNoIndex = UINT64_MAX;
constexpr int kMaxRetries = 100000;  // a bound on unlink-and-retry loops (a hostile image)

struct Item {
  Key key;
  Bytes data;
};

struct DirEntry {
  Key location;
  uint8_t type = 0;
  std::string name;
  size_t off = 0, len = 0;  // where the entry lies in its item
};

struct RefEntry {
  uint64_t parent = 0, index = 0;
  std::string name;
  size_t off = 0, len = 0;
};

std::span<const uint8_t> AsSpan(const std::string& s) {
  return std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

uint64_t NameHashOf(const std::string& name) { return NameHash(name); }

uint64_t ExtrefHash(uint64_t parent, const std::string& name) {
  return Crc32c(static_cast<uint32_t>(parent), AsSpan(name));
}

Result<std::vector<DirEntry>> ParseDirItems(const std::string& where, const Key& k, std::span<const uint8_t> d) {
  std::vector<DirEntry> out;
  size_t at = 0;
  while (at < d.size()) {
    if (d.size() - at < sizeof(DirItem)) return Status::Corrupt(where + KeyToString(k) + ": short dir item");
    const auto* di = reinterpret_cast<const DirItem*>(d.data() + at);
    const size_t n = sizeof(DirItem) + di->name_len.get() + di->data_len.get();
    if (n > d.size() - at) return Status::Corrupt(where + KeyToString(k) + ": dir item overruns its item");
    DirEntry e;
    e.location = Key::From(di->location);
    e.type = di->type;
    e.name.assign(reinterpret_cast<const char*>(d.data() + at + sizeof(DirItem)), di->name_len.get());
    e.off = at;
    e.len = n;
    out.push_back(std::move(e));
    at += n;
  }
  return out;
}

Result<std::vector<RefEntry>> ParseRefs(const std::string& where, const Key& k, std::span<const uint8_t> d) {
  std::vector<RefEntry> out;
  size_t at = 0;
  const bool ext = k.type == kInodeExtrefKey;
  const size_t head = ext ? sizeof(InodeExtref) : sizeof(InodeRef);
  while (at < d.size()) {
    if (d.size() - at < head) return Status::Corrupt(where + KeyToString(k) + ": short inode reference");
    RefEntry e;
    size_t name_len;
    if (ext) {
      const auto* r = reinterpret_cast<const InodeExtref*>(d.data() + at);
      e.parent = r->parent_objectid.get();
      e.index = r->index.get();
      name_len = r->name_len.get();
    } else {
      const auto* r = reinterpret_cast<const InodeRef*>(d.data() + at);
      e.parent = k.offset;
      e.index = r->index.get();
      name_len = r->name_len.get();
    }
    if (head + name_len > d.size() - at) {
      return Status::Corrupt(where + KeyToString(k) + ": inode reference overruns its item");
    }
    e.name.assign(reinterpret_cast<const char*>(d.data() + at + head), name_len);
    e.off = at;
    e.len = head + name_len;
    out.push_back(std::move(e));
    at += head + name_len;
  }
  return out;
}

const char kLog[] = "tree log: item ";
const char kFs[] = "subvolume tree item ";

class Replayer {
 public:
  Replayer(txn::Volume* vol, txn::TxnManager* txn, ReplayStats* st)
      : vol_(vol), txn_(txn), st_(st), ss_(vol->sectorsize()) {}

  Status Run();

 private:
  enum Stage { kInodes, kDirIndex, kAll };
  struct LogTree {
    uint64_t root_id = 0;
    tree::RootPtr ptr;
    std::vector<Item> items;                  // every item, in key order
    std::map<uint64_t, Bytes> csums;          // logged EXTENT_CSUM items: start -> sums
    std::set<uint64_t> fixup, dirs, files;    // inodes to recount
    bool has_dest = true;                     // its subvolume still exists
  };

  Status Walk(const tree::BlockCheck& chk, LogTree* lt, std::vector<Item>* items);
  Status ReplayTree(Stage stage);
  Status FixupLinks();
  Status Recount();

  // The subvolume tree being replayed into.
  Result<std::optional<Bytes>> Get(const Key& k);
  Result<std::vector<Item>> Range(const Key& from, const Key& to);
  Status Put(const Key& k, std::span<const uint8_t> d);
  Status Del(const Key& k) {
    return w_->Delete(k).WithContext("replaying the tree log into tree " + std::to_string(root_));
  }
  Result<std::optional<InodeItem>> Inode(uint64_t ino);
  Status PutInode(uint64_t ino, const InodeItem& ii);
  // The log tree being replayed.
  const Item* LogFind(const Key& k) const;
  bool LogHasRefName(uint64_t ino, uint64_t parent, const std::string& name);
  bool LogHasExtrefName(uint64_t ino, uint64_t parent, const std::string& name);

  Status ReplayInodeItem(const Key& k, std::span<const uint8_t> d);
  Status ReplayXattrDeletes(uint64_t ino);
  Status ReplayDirDeletes(uint64_t dir, bool del_all);
  Status ReplayDirIndex(const Key& k, std::span<const uint8_t> d);
  Status ReplayInodeRef(const Key& k, std::span<const uint8_t> d);
  Status ReplayExtent(const Key& k, std::span<const uint8_t> d);
  Status OverwriteItem(const Key& k, std::span<const uint8_t> d);

  // Removes one name: the inode's back reference, the DIR_ITEM entry and the
  // DIR_INDEX item (index from the reference when not given).
  Status UnlinkName(uint64_t dir, uint64_t ino, const std::string& name, uint64_t index);
  Status UnlinkEntry(uint64_t dir, const DirEntry& e, uint64_t index);
  Status AddLink(uint64_t dir, uint64_t ino, const std::string& name, uint64_t index, uint8_t ftype, bool backref);
  Status AddRefName(uint64_t ino, uint64_t parent, uint64_t index, const std::string& name);
  Result<bool> InodeInDir(uint64_t dir, uint64_t ino, uint64_t index, const std::string& name);
  // __add_inode_ref: true when the reference is the subvolume root's own.
  Result<bool> ResolveRefConflicts(uint64_t ino, uint64_t parent, uint64_t index, const std::string& name);
  Status UnlinkOldInodeRefs(const Key& k, const std::vector<RefEntry>& logged);
  Status DropExtents(uint64_t ino, uint64_t start, uint64_t end);
  Status DeleteInode(uint64_t ino);
  Result<std::optional<DirEntry>> FindDirItemName(uint64_t dir, const std::string& name);
  Result<std::optional<DirEntry>> FindDirIndex(uint64_t dir, uint64_t index);

  txn::Volume* vol_;
  txn::TxnManager* txn_;
  ReplayStats* st_;
  uint32_t ss_;
  std::vector<LogTree> trees_;
  LogTree* lt_ = nullptr;
  uint64_t root_ = 0;
  tree::TreeWriter* w_ = nullptr;
};

// ---- Access ----------------------------------------------------------------------------------

Result<std::optional<Bytes>> Replayer::Get(const Key& k) {
  return tree::LookupItem(txn_->source(), w_->CurrentRoot(), k);
}

Result<std::vector<Item>> Replayer::Range(const Key& from, const Key& to) {
  std::vector<Item> out;
  tree::Cursor c(txn_->source(), w_->CurrentRoot());
  UB_RETURN_IF_ERROR(c.Seek(from));
  for (; c.Valid() && c.key() <= to;) {
    out.push_back(Item{c.key(), Bytes(c.data().begin(), c.data().end())});
    UB_RETURN_IF_ERROR(c.Next());
  }
  return out;
}

Status Replayer::Put(const Key& k, std::span<const uint8_t> d) {
  UB_ASSIGN_OR_RETURN(auto have, Get(k));
  const std::string where = "replaying the tree log into tree " + std::to_string(root_);
  if (have) return w_->Update(k, d).WithContext(where);
  return w_->Insert(k, d).WithContext(where);
}

Result<std::optional<InodeItem>> Replayer::Inode(uint64_t ino) {
  UB_ASSIGN_OR_RETURN(auto d, Get(Key{ino, kInodeItemKey, 0}));
  if (!d) return std::optional<InodeItem>();
  if (d->size() < sizeof(InodeItem)) return Status::Corrupt(kFs + KeyToString(Key{ino, kInodeItemKey, 0}) + ": short");
  InodeItem ii;
  std::memcpy(&ii, d->data(), sizeof ii);
  return std::optional<InodeItem>(ii);
}

Status Replayer::PutInode(uint64_t ino, const InodeItem& ii) {
  UB_ASSIGN_OR_RETURN(auto d, Get(Key{ino, kInodeItemKey, 0}));
  if (!d || d->size() < sizeof ii) return Status::Corrupt(kFs + KeyToString(Key{ino, kInodeItemKey, 0}) + ": missing");
  std::memcpy(d->data(), &ii, sizeof ii);
  return Put(Key{ino, kInodeItemKey, 0}, *d);
}

const Item* Replayer::LogFind(const Key& k) const {
  auto it = std::lower_bound(lt_->items.begin(), lt_->items.end(), k,
                             [](const Item& a, const Key& b) { return a.key < b; });
  if (it == lt_->items.end() || it->key != k) return nullptr;
  return &*it;
}

bool Replayer::LogHasRefName(uint64_t ino, uint64_t parent, const std::string& name) {
  const Item* it = LogFind(Key{ino, kInodeRefKey, parent});
  if (!it) return false;
  auto refs = ParseRefs(kLog, it->key, it->data);
  if (!refs.ok()) return false;
  for (const auto& r : *refs) {
    if (r.name == name) return true;
  }
  return false;
}

bool Replayer::LogHasExtrefName(uint64_t ino, uint64_t parent, const std::string& name) {
  const Item* it = LogFind(Key{ino, kInodeExtrefKey, ExtrefHash(parent, name)});
  if (!it) return false;
  auto refs = ParseRefs(kLog, it->key, it->data);
  if (!refs.ok()) return false;
  for (const auto& r : *refs) {
    if (r.parent == parent && r.name == name) return true;
  }
  return false;
}

Result<std::optional<DirEntry>> Replayer::FindDirItemName(uint64_t dir, const std::string& name) {
  const Key k{dir, kDirItemKey, NameHashOf(name)};
  UB_ASSIGN_OR_RETURN(auto d, Get(k));
  if (!d) return std::optional<DirEntry>();
  UB_ASSIGN_OR_RETURN(auto es, ParseDirItems(kFs, k, *d));
  for (auto& e : es) {
    if (e.name == name) return std::optional<DirEntry>(e);
  }
  return std::optional<DirEntry>();
}

Result<std::optional<DirEntry>> Replayer::FindDirIndex(uint64_t dir, uint64_t index) {
  const Key k{dir, kDirIndexKey, index};
  UB_ASSIGN_OR_RETURN(auto d, Get(k));
  if (!d) return std::optional<DirEntry>();
  UB_ASSIGN_OR_RETURN(auto es, ParseDirItems(kFs, k, *d));
  if (es.empty()) return Status::Corrupt(kFs + KeyToString(k) + ": empty");
  return std::optional<DirEntry>(es.front());
}

// ---- Names -----------------------------------------------------------------------------------

Status Replayer::UnlinkName(uint64_t dir, uint64_t ino, const std::string& name, uint64_t index) {
  // The back reference.
  bool ref_found = false;
  for (const Key k : {Key{ino, kInodeRefKey, dir}, Key{ino, kInodeExtrefKey, ExtrefHash(dir, name)}}) {
    UB_ASSIGN_OR_RETURN(auto d, Get(k));
    if (!d) continue;
    UB_ASSIGN_OR_RETURN(auto refs, ParseRefs(kFs, k, *d));
    for (const auto& r : refs) {
      if (r.parent != dir || r.name != name) continue;
      if (index == kNoIndex) index = r.index;
      d->erase(d->begin() + static_cast<long>(r.off), d->begin() + static_cast<long>(r.off + r.len));
      if (d->empty()) {
        UB_RETURN_IF_ERROR(Del(k));
      } else {
        UB_RETURN_IF_ERROR(Put(k, *d));
      }
      ref_found = true;
      break;
    }
    if (ref_found) break;
  }
  // The DIR_ITEM entry.
  {
    const Key k{dir, kDirItemKey, NameHashOf(name)};
    UB_ASSIGN_OR_RETURN(auto d, Get(k));
    if (d) {
      UB_ASSIGN_OR_RETURN(auto es, ParseDirItems(kFs, k, *d));
      for (const auto& e : es) {
        if (e.name != name) continue;
        d->erase(d->begin() + static_cast<long>(e.off), d->begin() + static_cast<long>(e.off + e.len));
        if (d->empty()) {
          UB_RETURN_IF_ERROR(Del(k));
        } else {
          UB_RETURN_IF_ERROR(Put(k, *d));
        }
        break;
      }
    }
  }
  // The DIR_INDEX item.
  if (index != kNoIndex) {
    UB_ASSIGN_OR_RETURN(auto e, FindDirIndex(dir, index));
    if (e && e->name == name) UB_RETURN_IF_ERROR(Del(Key{dir, kDirIndexKey, index}));
  } else {
    UB_ASSIGN_OR_RETURN(auto all, Range(Key{dir, kDirIndexKey, 0}, Key{dir, kDirIndexKey, UINT64_MAX}));
    for (const auto& it : all) {
      UB_ASSIGN_OR_RETURN(auto es, ParseDirItems(kFs, it.key, it.data));
      if (!es.empty() && es.front().name == name && es.front().location.objectid == ino) {
        UB_RETURN_IF_ERROR(Del(it.key));
        break;
      }
    }
  }
  // As btrfs_unlink_inode: the inode's ctime and the directory's mtime and
  // ctime become the time of the replay (a directory logged later gets its
  // logged times back when its inode item is copied).
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  auto stamp = [&](Timespec& t) {
    t.sec = static_cast<uint64_t>(now.tv_sec);
    t.nsec = static_cast<uint32_t>(now.tv_nsec);
  };
  UB_ASSIGN_OR_RETURN(auto inode, Inode(ino));
  if (inode) {
    stamp(inode->ctime);
    UB_RETURN_IF_ERROR(PutInode(ino, *inode));
  }
  UB_ASSIGN_OR_RETURN(auto dinode, Inode(dir));
  if (dinode) {
    stamp(dinode->ctime);
    stamp(dinode->mtime);
    UB_RETURN_IF_ERROR(PutInode(dir, *dinode));
  }
  lt_->fixup.insert(ino);
  lt_->dirs.insert(dir);
  return Status::Ok();
}

Status Replayer::UnlinkEntry(uint64_t dir, const DirEntry& e, uint64_t index) {
  if (e.location.type != kInodeItemKey) {
    return Status::Unsupported("tree log replay would remove the entry \"" + e.name + "\" of subvolume " +
                               std::to_string(e.location.objectid) + " from directory " + std::to_string(dir) +
                               " of tree " + std::to_string(root_));
  }
  return UnlinkName(dir, e.location.objectid, e.name, index);
}

Status Replayer::AddRefName(uint64_t ino, uint64_t parent, uint64_t index, const std::string& name) {
  const Key k{ino, kInodeRefKey, parent};
  UB_ASSIGN_OR_RETURN(auto d, Get(k));
  Bytes item = d ? *d : Bytes();
  if (d) {
    UB_ASSIGN_OR_RETURN(auto refs, ParseRefs(kFs, k, *d));
    for (const auto& r : refs) {
      if (r.name == name) return Status::Ok();
    }
  }
  if (item.size() + sizeof(InodeRef) + name.size() <= w_->MaxItemSize()) {
    InodeRef r{};
    r.index = index;
    r.name_len = static_cast<uint16_t>(name.size());
    const auto* p = reinterpret_cast<const uint8_t*>(&r);
    item.insert(item.end(), p, p + sizeof r);
    item.insert(item.end(), name.begin(), name.end());
    return Put(k, item);
  }
  if (!(vol_->super().incompat_flags.get() & kIncompatExtendedIref)) {
    return Status::Unsupported("tree log replay: inode " + std::to_string(ino) + " needs an extended reference");
  }
  const Key ek{ino, kInodeExtrefKey, ExtrefHash(parent, name)};
  UB_ASSIGN_OR_RETURN(auto ed, Get(ek));
  Bytes ext = ed ? *ed : Bytes();
  InodeExtref r{};
  r.parent_objectid = parent;
  r.index = index;
  r.name_len = static_cast<uint16_t>(name.size());
  const auto* p = reinterpret_cast<const uint8_t*>(&r);
  ext.insert(ext.end(), p, p + sizeof r);
  ext.insert(ext.end(), name.begin(), name.end());
  return Put(ek, ext);
}

// btrfs_add_link as the replay uses it: the DIR_ITEM and DIR_INDEX (and the
// back reference if asked); parts already there stay.
Status Replayer::AddLink(uint64_t dir, uint64_t ino, const std::string& name, uint64_t index, uint8_t ftype,
                         bool backref) {
  if (name.empty() || name.size() > 255) {
    return Status::Corrupt("tree log: a name of inode " + std::to_string(ino) + " has length " +
                           std::to_string(name.size()));
  }
  if (backref) UB_RETURN_IF_ERROR(AddRefName(ino, dir, index, name));
  Bytes entry(sizeof(DirItem) + name.size());
  auto* di = reinterpret_cast<DirItem*>(entry.data());
  Key{ino, kInodeItemKey, 0}.To(&di->location);
  di->transid = txn_->transid();
  di->data_len = 0;
  di->name_len = static_cast<uint16_t>(name.size());
  di->type = ftype;
  std::memcpy(entry.data() + sizeof(DirItem), name.data(), name.size());
  const Key k{dir, kDirItemKey, NameHashOf(name)};
  UB_ASSIGN_OR_RETURN(auto d, Get(k));
  bool have_name = false;
  if (d) {
    UB_ASSIGN_OR_RETURN(auto es, ParseDirItems(kFs, k, *d));
    for (const auto& e : es) have_name |= e.name == name;
  }
  if (!have_name) {
    Bytes item = d ? *d : Bytes();
    item.insert(item.end(), entry.begin(), entry.end());
    UB_RETURN_IF_ERROR(Put(k, item));
  }
  UB_ASSIGN_OR_RETURN(auto idx, Get(Key{dir, kDirIndexKey, index}));
  if (!idx) UB_RETURN_IF_ERROR(Put(Key{dir, kDirIndexKey, index}, entry));
  lt_->dirs.insert(dir);
  return Status::Ok();
}

Result<bool> Replayer::InodeInDir(uint64_t dir, uint64_t ino, uint64_t index, const std::string& name) {
  UB_ASSIGN_OR_RETURN(auto idx, FindDirIndex(dir, index));
  if (!idx || idx->name != name || idx->location.objectid != ino) return false;
  UB_ASSIGN_OR_RETURN(auto di, FindDirItemName(dir, name));
  return di && di->location.objectid == ino;
}

Result<bool> Replayer::ResolveRefConflicts(uint64_t ino, uint64_t parent, uint64_t index, const std::string& name) {
  for (int tries = 0;; ++tries) {
    if (tries > kMaxRetries) {
      return Status::Corrupt("tree log: references of inode " + std::to_string(ino) + " do not settle");
    }
    bool again = false;
    const Key rk{ino, kInodeRefKey, parent};
    UB_ASSIGN_OR_RETURN(auto ref, Get(rk));
    if (ref) {
      if (ino == parent) return true;  // the subvolume root's own ".."
      UB_ASSIGN_OR_RETURN(auto refs, ParseRefs(kFs, rk, *ref));
      for (const auto& r : refs) {
        if (LogHasRefName(ino, parent, r.name)) continue;
        UB_RETURN_IF_ERROR(UnlinkName(parent, ino, r.name, r.index));
        again = true;
        break;
      }
      if (again) continue;
    }
    const Key ek{ino, kInodeExtrefKey, ExtrefHash(parent, name)};
    UB_ASSIGN_OR_RETURN(auto ext, Get(ek));
    if (ext) {
      UB_ASSIGN_OR_RETURN(auto refs, ParseRefs(kFs, ek, *ext));
      bool ours = false;
      for (const auto& r : refs) ours |= r.parent == parent && r.name == name;
      if (ours) {
        for (const auto& r : refs) {
          if (LogHasExtrefName(ino, r.parent, r.name)) continue;
          UB_RETURN_IF_ERROR(UnlinkName(r.parent, ino, r.name, r.index));
          again = true;
          break;
        }
      }
      if (again) continue;
    }
    break;
  }
  // An entry of the same name at our index, or of the same name anywhere.
  UB_ASSIGN_OR_RETURN(auto idx, FindDirIndex(parent, index));
  if (idx && idx->name == name) UB_RETURN_IF_ERROR(UnlinkEntry(parent, *idx, index));
  UB_ASSIGN_OR_RETURN(auto di, FindDirItemName(parent, name));
  if (di) UB_RETURN_IF_ERROR(UnlinkEntry(parent, *di, kNoIndex));
  return false;
}

Status Replayer::UnlinkOldInodeRefs(const Key& k, const std::vector<RefEntry>& logged) {
  for (int tries = 0;; ++tries) {
    if (tries > kMaxRetries) return Status::Corrupt("tree log: references " + KeyToString(k) + " do not settle");
    UB_ASSIGN_OR_RETURN(auto d, Get(k));
    if (!d) return Status::Ok();
    UB_ASSIGN_OR_RETURN(auto refs, ParseRefs(kFs, k, *d));
    const RefEntry* gone = nullptr;
    for (const auto& r : refs) {
      bool in_log = false;
      for (const auto& l : logged) in_log |= l.name == r.name && l.parent == r.parent;
      if (!in_log) {
        gone = &r;
        break;
      }
    }
    if (!gone) return Status::Ok();
    UB_RETURN_IF_ERROR(UnlinkName(gone->parent, k.objectid, gone->name, gone->index));
  }
}

// ---- Replay rules ----------------------------------------------------------------------------

Status Replayer::OverwriteItem(const Key& k, std::span<const uint8_t> d) {
  UB_ASSIGN_OR_RETURN(auto have, Get(k));
  if (have && have->size() == d.size() && std::equal(d.begin(), d.end(), have->begin())) return Status::Ok();
  return Put(k, d);
}

Status Replayer::ReplayInodeItem(const Key& k, std::span<const uint8_t> d) {
  if (d.size() < sizeof(InodeItem)) return Status::Corrupt(kLog + KeyToString(k) + ": short inode item");
  Bytes src(d.begin(), d.end());
  auto* s = reinterpret_cast<InodeItem*>(src.data());
  const uint32_t mode = s->mode.get();
  UB_ASSIGN_OR_RETURN(auto have, Get(k));
  if (have && have->size() == src.size() && std::equal(src.begin(), src.end(), have->begin())) return Status::Ok();
  if (have && have->size() >= sizeof(InodeItem)) {
    auto* dst = reinterpret_cast<InodeItem*>(have->data());
    if (s->generation.get() == 0) {
      // Logged only so that the inode exists (a directory's fsync): a
      // regular file's logged size is kept, nothing else changes.
      if (S_ISREG(mode) && S_ISREG(dst->mode.get()) && s->size.get() != 0) {
        dst->size = s->size.get();
        return Put(k, *have);
      }
      return Status::Ok();
    }
    s->nbytes = dst->nbytes.get();
    if (S_ISDIR(mode)) s->size = S_ISDIR(dst->mode.get()) ? dst->size.get() : 0;
  } else {
    s->nbytes = 0;
    if (S_ISDIR(mode)) s->size = 0;
  }
  if (s->generation.get() == 0) s->generation = txn_->transid();
  return Put(k, src);
}

Status Replayer::ReplayXattrDeletes(uint64_t ino) {
  UB_ASSIGN_OR_RETURN(auto items, Range(Key{ino, kXattrItemKey, 0}, Key{ino, kXattrItemKey, UINT64_MAX}));
  for (auto& it : items) {
    UB_ASSIGN_OR_RETURN(auto es, ParseDirItems(kFs, it.key, it.data));
    const Item* logged = LogFind(it.key);
    std::vector<DirEntry> in_log;
    if (logged) {
      UB_ASSIGN_OR_RETURN(in_log, ParseDirItems(kLog, logged->key, logged->data));
    }
    bool changed = false;
    for (auto e = es.rbegin(); e != es.rend(); ++e) {  // back to front: offsets stay valid
      bool found = false;
      for (const auto& l : in_log) found |= l.name == e->name;
      if (found) continue;
      it.data.erase(it.data.begin() + static_cast<long>(e->off), it.data.begin() + static_cast<long>(e->off + e->len));
      changed = true;
    }
    if (!changed) continue;
    if (it.data.empty()) {
      UB_RETURN_IF_ERROR(Del(it.key));
    } else {
      UB_RETURN_IF_ERROR(Put(it.key, it.data));
    }
  }
  return Status::Ok();
}

// Entries of directory `dir` inside the log's DIR_LOG_INDEX ranges (every
// entry with del_all) that the log does not hold are removed.
Status Replayer::ReplayDirDeletes(uint64_t dir, bool del_all) {
  UB_ASSIGN_OR_RETURN(auto inode, Inode(dir));
  if (!inode) return Status::Ok();
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  if (del_all) {
    ranges.push_back({0, UINT64_MAX});
  } else {
    const Key from{dir, kDirLogIndexKey, 0};
    auto it = std::lower_bound(lt_->items.begin(), lt_->items.end(), from,
                               [](const Item& a, const Key& b) { return a.key < b; });
    for (; it != lt_->items.end() && it->key.objectid == dir && it->key.type == kDirLogIndexKey; ++it) {
      if (it->data.size() < sizeof(uint64_t)) return Status::Corrupt(kLog + KeyToString(it->key) + ": short");
      const uint64_t end = reinterpret_cast<const Le64*>(it->data.data())->get();
      if (end < it->key.offset) return Status::Corrupt(kLog + KeyToString(it->key) + ": range ends before it starts");
      ranges.push_back({it->key.offset, end});
    }
  }
  for (auto [start, end] : ranges) {
    UB_ASSIGN_OR_RETURN(auto items, Range(Key{dir, kDirIndexKey, start}, Key{dir, kDirIndexKey, end}));
    for (const auto& it : items) {
      UB_ASSIGN_OR_RETURN(auto es, ParseDirItems(kFs, it.key, it.data));
      if (es.empty()) return Status::Corrupt(kFs + KeyToString(it.key) + ": empty");
      if (!del_all) {
        if (const Item* l = LogFind(it.key)) {
          UB_ASSIGN_OR_RETURN(auto les, ParseDirItems(kLog, l->key, l->data));
          if (!les.empty() && les.front().name == es.front().name) continue;  // the log has it
        }
      }
      UB_RETURN_IF_ERROR(UnlinkEntry(dir, es.front(), it.key.offset));
      if (st_) ++st_->names_removed;
    }
  }
  return Status::Ok();
}

Status Replayer::ReplayDirIndex(const Key& k, std::span<const uint8_t> d) {
  const uint64_t dir = k.objectid, index = k.offset;
  UB_ASSIGN_OR_RETURN(auto es, ParseDirItems(kLog, k, d));
  if (es.size() != 1) return Status::Corrupt(kLog + KeyToString(k) + ": a dir index item holds one entry");
  const DirEntry& e = es.front();
  UB_ASSIGN_OR_RETURN(auto dinode, Inode(dir));
  if (!dinode) return Status::Corrupt(kLog + KeyToString(k) + ": its directory does not exist");
  if (e.location.type != kInodeItemKey) return Status::Ok();  // a subvolume's entry: left as it is
  const uint64_t ino = e.location.objectid;
  UB_ASSIGN_OR_RETURN(auto target, Inode(ino));
  const bool exists = target.has_value();
  bool dir_match = false, index_match = false;
  UB_ASSIGN_OR_RETURN(auto dst, FindDirItemName(dir, e.name));
  if (dst) {
    if (dst->location == e.location && dst->type == e.type) {
      dir_match = true;
    } else if (exists) {
      UB_RETURN_IF_ERROR(UnlinkEntry(dir, *dst, kNoIndex));
    }
  }
  UB_ASSIGN_OR_RETURN(auto idx, FindDirIndex(dir, index));
  if (idx && idx->name == e.name) {
    if (idx->location == e.location && idx->type == e.type) {
      index_match = true;
    } else if (exists) {
      UB_RETURN_IF_ERROR(UnlinkEntry(dir, *idx, index));
    }
  }
  if (dir_match && index_match) return Status::Ok();
  // The inode's reference in the log adds the name in the last stage.
  if (LogHasRefName(ino, dir, e.name) || LogHasExtrefName(ino, dir, e.name)) return Status::Ok();
  if (!exists) return Status::Ok();
  UB_RETURN_IF_ERROR(AddLink(dir, ino, e.name, index, e.type, true));
  if (e.type != kFtDir) lt_->fixup.insert(ino);
  return Status::Ok();
}

Status Replayer::ReplayInodeRef(const Key& k, std::span<const uint8_t> d) {
  const uint64_t ino = k.objectid;
  UB_ASSIGN_OR_RETURN(auto logged, ParseRefs(kLog, k, d));
  if (k.type == kInodeRefKey) {
    UB_ASSIGN_OR_RETURN(auto parent, Inode(k.offset));
    if (!parent) return Status::Ok();  // its directory was not logged: the link counts sort it out
  }
  UB_ASSIGN_OR_RETURN(auto inode, Inode(ino));
  if (!inode) return Status::Corrupt(kLog + KeyToString(k) + ": the inode does not exist");
  const uint8_t ftype = FileTypeOfMode(inode->mode.get());
  lt_->fixup.insert(ino);
  for (const auto& r : logged) {
    if (r.name.empty() || r.name.size() > 255) return Status::Corrupt(kLog + KeyToString(k) + ": bad name length");
    if (k.type == kInodeExtrefKey) {
      UB_ASSIGN_OR_RETURN(auto parent, Inode(r.parent));
      if (!parent) return Status::Ok();
    }
    UB_ASSIGN_OR_RETURN(bool present, InodeInDir(r.parent, ino, r.index, r.name));
    if (present) continue;
    UB_ASSIGN_OR_RETURN(bool root_self, ResolveRefConflicts(ino, r.parent, r.index, r.name));
    if (root_self) return Status::Ok();
    UB_RETURN_IF_ERROR(AddLink(r.parent, ino, r.name, r.index, ftype, false));
  }
  UB_RETURN_IF_ERROR(UnlinkOldInodeRefs(k, logged));
  return OverwriteItem(k, d);
}

// btrfs_drop_extents over [start, end) of inode `ino`: items inside go
// (with their extent references), items across an end are cut.
Status Replayer::DropExtents(uint64_t ino, uint64_t start, uint64_t end) {
  UB_ASSIGN_OR_RETURN(auto items, Range(Key{ino, kExtentDataKey, 0}, Key{ino, kExtentDataKey, UINT64_MAX}));
  for (auto& it : items) {
    const uint64_t ks = it.key.offset;
    if (it.data.size() < kFileExtentInlineDataStart) return Status::Corrupt(kFs + KeyToString(it.key) + ": short");
    auto* fe = reinterpret_cast<FileExtentItem*>(it.data.data());
    if (fe->type == 0) {  // inline
      const uint64_t ke = ks + (fe->ram_bytes.get() + ss_ - 1) / ss_ * ss_;
      if (ke <= start || ks >= end || ks < start) continue;
      UB_RETURN_IF_ERROR(Del(it.key));
      continue;
    }
    if (it.data.size() < sizeof(FileExtentItem)) return Status::Corrupt(kFs + KeyToString(it.key) + ": short");
    const uint64_t ke = ks + fe->num_bytes.get();
    if (ke <= start || ks >= end) continue;
    const uint64_t disk = fe->disk_bytenr.get(), dnb = fe->disk_num_bytes.get(), off = fe->offset.get();
    if (ks < start && ke > end) {
      Bytes tail = it.data;
      fe->num_bytes = start - ks;
      UB_RETURN_IF_ERROR(Put(it.key, it.data));
      auto* t = reinterpret_cast<FileExtentItem*>(tail.data());
      t->offset = off + (end - ks);
      t->num_bytes = ke - end;
      UB_RETURN_IF_ERROR(Put(Key{ino, kExtentDataKey, end}, tail));
      if (disk) UB_RETURN_IF_ERROR(txn_->AddDataRef(disk, dnb, root_, ino, ks - off));
    } else if (ks < start) {
      fe->num_bytes = start - ks;
      UB_RETURN_IF_ERROR(Put(it.key, it.data));
    } else if (ke > end) {
      UB_RETURN_IF_ERROR(Del(it.key));
      fe->offset = off + (end - ks);
      fe->num_bytes = ke - end;
      UB_RETURN_IF_ERROR(Put(Key{ino, kExtentDataKey, end}, it.data));
    } else {
      UB_RETURN_IF_ERROR(Del(it.key));
      if (disk) UB_RETURN_IF_ERROR(txn_->DropDataRef(disk, dnb, root_, ino, ks - off));
    }
  }
  lt_->files.insert(ino);
  return Status::Ok();
}

Status Replayer::ReplayExtent(const Key& k, std::span<const uint8_t> d) {
  const uint64_t ino = k.objectid, ks = k.offset;
  if (d.size() < kFileExtentInlineDataStart) return Status::Corrupt(kLog + KeyToString(k) + ": short file extent");
  const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
  UB_ASSIGN_OR_RETURN(auto inode, Inode(ino));
  if (!inode) return Status::Corrupt(kLog + KeyToString(k) + ": the inode does not exist");
  lt_->files.insert(ino);
  if (fe->type == 0) {
    const uint64_t ram = fe->ram_bytes.get();
    if (ram > (1u << 20)) {
      return Status::Corrupt(kLog + KeyToString(k) + ": inline extent of " + std::to_string(ram) + " bytes");
    }
    UB_RETURN_IF_ERROR(DropExtents(ino, ks, ks + (ram + ss_ - 1) / ss_ * ss_));
    return OverwriteItem(k, d);
  }
  if (fe->type != 1 && fe->type != 2) return Status::Corrupt(kLog + KeyToString(k) + ": unknown file extent type");
  if (d.size() < sizeof(FileExtentItem)) return Status::Corrupt(kLog + KeyToString(k) + ": short file extent");
  const uint64_t num = fe->num_bytes.get(), disk = fe->disk_bytenr.get(), dnb = fe->disk_num_bytes.get();
  const uint64_t off = fe->offset.get();
  if (num == 0 || num % ss_ || ks % ss_ || ks + num < ks) {
    return Status::Corrupt(kLog + KeyToString(k) + ": bad extent length " + std::to_string(num));
  }
  if (disk && !fe->compression && (off > dnb || num > dnb - off)) {
    return Status::Corrupt(kLog + KeyToString(k) + ": extent range outside its disk extent");
  }
  UB_ASSIGN_OR_RETURN(auto have, Get(k));
  if (have && have->size() >= sizeof(FileExtentItem) &&
      std::memcmp(have->data(), d.data(), sizeof(FileExtentItem)) == 0) {
    return Status::Ok();  // the tree already points at this very extent
  }
  UB_RETURN_IF_ERROR(DropExtents(ino, ks, ks + num));
  if (disk == 0 && (vol_->super().incompat_flags.get() & kIncompatNoHoles)) return Status::Ok();
  UB_RETURN_IF_ERROR(Put(k, d.first(sizeof(FileExtentItem))));
  if (disk == 0) return Status::Ok();
  UB_RETURN_IF_ERROR(txn_->AddDataRef(disk, dnb, root_, ino, ks - off));
  // The log's checksums of the range this item uses replace the csum tree's.
  uint64_t cs = disk, ce = disk + dnb;
  if (!fe->compression) {
    cs = disk + off;
    ce = cs + num;
  }
  const size_t csize = CsumSize(vol_->csum_type());
  auto it = lt_->csums.upper_bound(cs);
  if (it != lt_->csums.begin()) --it;
  for (; it != lt_->csums.end() && it->first < ce; ++it) {
    const uint64_t is = it->first, ie = is + it->second.size() / csize * ss_;
    const uint64_t from = std::max(is, cs), to = std::min(ie, ce);
    if (from >= to) continue;
    UB_RETURN_IF_ERROR(txn_->ReplaceCsums(
        from, std::span<const uint8_t>(it->second).subspan((from - is) / ss_ * csize, (to - from) / ss_ * csize)));
  }
  return Status::Ok();
}

Status Replayer::DeleteInode(uint64_t ino) {
  UB_ASSIGN_OR_RETURN(auto items, Range(Key{ino, 0, 0}, Key{ino, UINT8_MAX, UINT64_MAX}));
  for (const auto& it : items) {
    if (it.key.type == kExtentDataKey && it.data.size() >= sizeof(FileExtentItem)) {
      const auto* fe = reinterpret_cast<const FileExtentItem*>(it.data.data());
      if (fe->type != 0 && fe->disk_bytenr.get() != 0) {
        UB_RETURN_IF_ERROR(txn_->DropDataRef(fe->disk_bytenr.get(), fe->disk_num_bytes.get(), root_, ino,
                                             it.key.offset - fe->offset.get()));
      }
    }
    UB_RETURN_IF_ERROR(Del(it.key));
  }
  UB_ASSIGN_OR_RETURN(auto orphan, Get(OrphanKey(ino)));
  if (orphan) UB_RETURN_IF_ERROR(Del(OrphanKey(ino)));
  lt_->files.erase(ino);
  lt_->dirs.erase(ino);
  if (st_) ++st_->inodes_removed;
  return Status::Ok();
}

// fixup_inode_link_counts: link counts from the references; no reference
// left: the inode goes (a directory's entries first).
Status Replayer::FixupLinks() {
  while (!lt_->fixup.empty()) {
    const uint64_t ino = *lt_->fixup.begin();
    lt_->fixup.erase(lt_->fixup.begin());
    UB_ASSIGN_OR_RETURN(auto inode, Inode(ino));
    if (!inode) continue;
    uint32_t nlink = 0;
    UB_ASSIGN_OR_RETURN(auto refs, Range(Key{ino, kInodeRefKey, 0}, Key{ino, kInodeExtrefKey, UINT64_MAX}));
    for (const auto& it : refs) {
      UB_ASSIGN_OR_RETURN(auto es, ParseRefs(kFs, it.key, it.data));
      nlink += static_cast<uint32_t>(es.size());
    }
    if (nlink != inode->nlink.get()) {
      inode->nlink = nlink;
      UB_RETURN_IF_ERROR(PutInode(ino, *inode));
    }
    if (nlink == 0) {
      if (S_ISDIR(inode->mode.get())) UB_RETURN_IF_ERROR(ReplayDirDeletes(ino, true));
      UB_RETURN_IF_ERROR(DeleteInode(ino));
    }
  }
  return Status::Ok();
}

// Directory sizes (twice the length of every name) and nbytes of files, as
// btrfs check computes them, for every inode the replay touched.
Status Replayer::Recount() {
  for (uint64_t dir : lt_->dirs) {
    UB_ASSIGN_OR_RETURN(auto inode, Inode(dir));
    if (!inode || !S_ISDIR(inode->mode.get())) continue;
    UB_ASSIGN_OR_RETURN(auto items, Range(Key{dir, kDirIndexKey, 0}, Key{dir, kDirIndexKey, UINT64_MAX}));
    uint64_t size = 0;
    for (const auto& it : items) {
      UB_ASSIGN_OR_RETURN(auto es, ParseDirItems(kFs, it.key, it.data));
      for (const auto& e : es) size += 2 * e.name.size();
    }
    if (inode->size.get() != size) {
      inode->size = size;
      UB_RETURN_IF_ERROR(PutInode(dir, *inode));
    }
  }
  for (uint64_t ino : lt_->files) {
    UB_ASSIGN_OR_RETURN(auto inode, Inode(ino));
    if (!inode || S_ISDIR(inode->mode.get())) continue;
    UB_ASSIGN_OR_RETURN(auto items, Range(Key{ino, kExtentDataKey, 0}, Key{ino, kExtentDataKey, UINT64_MAX}));
    uint64_t nbytes = 0;
    for (const auto& it : items) {
      if (it.data.size() < kFileExtentInlineDataStart) continue;
      const auto* fe = reinterpret_cast<const FileExtentItem*>(it.data.data());
      if (fe->type == 0) {
        nbytes += fe->ram_bytes.get();
      } else if (it.data.size() >= sizeof(FileExtentItem) && fe->disk_bytenr.get() != 0) {
        nbytes += fe->num_bytes.get();
      }
    }
    if (inode->nbytes.get() != nbytes) {
      inode->nbytes = nbytes;
      UB_RETURN_IF_ERROR(PutInode(ino, *inode));
    }
  }
  return Status::Ok();
}

// ---- The walk --------------------------------------------------------------------------------

Status Replayer::Walk(const tree::BlockCheck& chk, LogTree* lt, std::vector<Item>* items) {
  UB_ASSIGN_OR_RETURN(tree::BlockRef b, vol_->reader()->Read(chk));
  UB_RETURN_IF_ERROR(txn_->PinLogBlock(chk.bytenr));
  if (st_) ++st_->log_blocks;
  if (!b->is_leaf()) {
    for (int i = 0; i < b->nritems(); ++i) {
      UB_RETURN_IF_ERROR(Walk(tree::BlockCheck{b->child_bytenr(i), b->level() - 1, b->child_generation(i), b->key(i)},
                              lt, items));
    }
    return Status::Ok();
  }
  for (int i = 0; i < b->nritems(); ++i) {
    const Key k = b->key(i);
    auto d = b->item_data(i);
    if (!items->empty() && !(items->back().key < k)) {
      return Status::Corrupt("tree log: block " + std::to_string(chk.bytenr) + ": keys out of order");
    }
    items->push_back(Item{k, Bytes(d.begin(), d.end())});
    if (!lt) continue;
    if (k.type == kExtentDataKey && d.size() >= sizeof(FileExtentItem)) {
      const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
      if (fe->type != 0 && fe->disk_bytenr.get() != 0) {
        UB_ASSIGN_OR_RETURN(bool fresh, txn_->AdoptLoggedExtent(fe->disk_bytenr.get(), fe->disk_num_bytes.get()));
        if (fresh && st_) ++st_->new_extents;
      }
    } else if (k.objectid == kExtentCsumObjectid && k.type == kExtentCsumKey) {
      const size_t csize = CsumSize(vol_->csum_type());
      if (d.empty() || d.size() % csize != 0 || k.offset % ss_ != 0) {
        return Status::Corrupt(kLog + KeyToString(k) + ": malformed checksums");
      }
      lt->csums[k.offset] = Bytes(d.begin(), d.end());
    }
  }
  return Status::Ok();
}

Status Replayer::ReplayTree(Stage stage) {
  bool ignore = false;
  uint64_t ignore_ino = 0;
  for (const Item& it : lt_->items) {
    const Key& k = it.key;
    if (st_ && stage == kInodes) ++st_->items;
    if (k.objectid == kExtentCsumObjectid || k.objectid == kTreeLogFixupObjectid) continue;
    if (k.type == kInodeItemKey) {
      if (it.data.size() < sizeof(InodeItem)) return Status::Corrupt(kLog + KeyToString(k) + ": short inode item");
      const auto* ii = reinterpret_cast<const InodeItem*>(it.data.data());
      // No links: an O_TMPFILE never linked, or an unlinked file fsynced
      // through an open descriptor; its parent's entry goes with the
      // directory's replay.
      ignore = ii->nlink.get() == 0;
      ignore_ino = k.objectid;
      if (ignore) continue;
      if (stage == kInodes) {
        const uint32_t mode = ii->mode.get();
        UB_RETURN_IF_ERROR(ReplayXattrDeletes(k.objectid));
        if (S_ISDIR(mode)) UB_RETURN_IF_ERROR(ReplayDirDeletes(k.objectid, false));
        UB_RETURN_IF_ERROR(ReplayInodeItem(k, it.data));
        if (S_ISREG(mode)) {
          UB_ASSIGN_OR_RETURN(auto now, Inode(k.objectid));
          if (now) {
            const uint64_t from = (now->size.get() + ss_ - 1) / ss_ * ss_;
            UB_RETURN_IF_ERROR(DropExtents(k.objectid, from, UINT64_MAX));
          }
        }
        if (S_ISDIR(mode)) lt_->dirs.insert(k.objectid);
        lt_->fixup.insert(k.objectid);
      }
    }
    if (ignore && k.objectid == ignore_ino) continue;
    if (k.type == kDirIndexKey && stage == kDirIndex) UB_RETURN_IF_ERROR(ReplayDirIndex(k, it.data));
    if (stage != kAll) continue;
    if (k.type == kXattrItemKey) {
      UB_RETURN_IF_ERROR(OverwriteItem(k, it.data));
    } else if (k.type == kInodeRefKey || k.type == kInodeExtrefKey) {
      UB_RETURN_IF_ERROR(ReplayInodeRef(k, it.data));
    } else if (k.type == kExtentDataKey) {
      UB_RETURN_IF_ERROR(ReplayExtent(k, it.data));
    }
    // DIR_ITEMs (older kernels logged them) follow from the DIR_INDEX items.
  }
  return Status::Ok();
}

Status Replayer::Run() {
  const SuperBlock& sb = vol_->super();
  const uint64_t log_root = sb.log_root.get();
  if (log_root == 0) return Status::Ok();
  if (sb.log_root_level >= kMaxLevel) {
    return Status::Corrupt("superblock: log_root_level " + std::to_string(sb.log_root_level));
  }
  // The log root tree was written in the transaction after the committed one.
  std::vector<Item> roots;
  UB_RETURN_IF_ERROR(Walk(tree::BlockCheck{log_root, sb.log_root_level, sb.generation.get() + 1, {}}, nullptr, &roots)
                         .WithContext("tree log root " + std::to_string(log_root)));
  for (const Item& r : roots) {
    if (r.key.objectid != kTreeLogObjectid || r.key.type != kRootItemKey) continue;
    if (r.data.size() < kRootItemV1Size) {
      return Status::Corrupt("tree log: root item " + KeyToString(r.key) + " is short");
    }
    RootItem ri{};
    std::memcpy(&ri, r.data.data(), std::min(r.data.size(), sizeof ri));
    const uint64_t id = r.key.offset;
    if (!IsSubvolumeTree(id)) {
      return Status::Corrupt("tree log: a log for tree " + std::to_string(id) + ", which is no subvolume");
    }
    if (ri.level >= kMaxLevel) return Status::Corrupt("tree log: root item " + KeyToString(r.key) + ": bad level");
    LogTree lt;
    lt.root_id = id;
    lt.ptr = tree::RootPtr{ri.bytenr.get(), ri.level, ri.generation.get(), kTreeLogObjectid};
    trees_.push_back(std::move(lt));
  }
  for (LogTree& lt : trees_) {
    UB_RETURN_IF_ERROR(Walk(tree::BlockCheck{lt.ptr.bytenr, lt.ptr.level, lt.ptr.generation, {}}, &lt, &lt.items)
                           .WithContext("log tree of subvolume " + std::to_string(lt.root_id)));
    auto dest = vol_->FindRoot(lt.root_id);
    if (!dest.ok() && dest.status().code() != ENOENT) return dest.status();
    lt.has_dest = dest.ok();  // a deleted subvolume's log is only freed, as the kernel does
  }
  for (Stage stage : {kInodes, kDirIndex, kAll}) {
    for (LogTree& lt : trees_) {
      if (!lt.has_dest) continue;
      lt_ = &lt;
      root_ = lt.root_id;
      UB_ASSIGN_OR_RETURN(w_, txn_->Writer(root_));
      const std::string where = "replaying the log of subvolume " + std::to_string(root_);
      UB_RETURN_IF_ERROR(ReplayTree(stage).WithContext(where));
      if (stage == kAll) {
        UB_RETURN_IF_ERROR(FixupLinks().WithContext(where));
        UB_RETURN_IF_ERROR(Recount().WithContext(where));
        if (st_) ++st_->log_trees;
      }
    }
  }
  SuperBlock& msb = vol_->mutable_super();
  msb.log_root = 0;
  msb.log_root_level = 0;
  txn_->ForceSuperblockWrite();
  return txn_->Commit().WithContext("committing the replayed tree log");
}

}  // namespace

Status ReplayLog(txn::Volume* vol, ReplayStats* stats) {
  UB_ASSIGN_OR_RETURN(auto txn, txn::TxnManager::Open(vol, /*allow_log=*/true));
  Replayer r(vol, txn.get(), stats);
  return r.Run();
}

}  // namespace ubtrfs::log
