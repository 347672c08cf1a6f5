// The tree-comparing send: an incremental stream of a read-only snapshot
// against a parent (btrfs send -p), or a full one built the same way against
// an empty tree (used when clone sources or compressed data are asked for).
//
// The changed inodes come from send/tree_diff (shared subtrees skipped). For
// each, its state in the parent (the old tree) and in the snapshot (the new
// tree) is loaded: inode item and names (INODE_REF / INODE_EXTREF). Then, in
// an order that cannot collide (simpler than the kernel's, equally valid):
//
//  1. every old name that goes away is freed: a directory that moves or goes
//     and a surviving file that keeps none of its old names are renamed to an
//     orphan name "o<ino>-<gen>-<n>" in the top directory; other old names of
//     files are unlinked;
//  2. every inode is put at its new names parents first (recursing up the
//     new tree): created where it is new, renamed from its orphan or linked
//     from a name it kept; since every moving directory waits at the top,
//     no rename can put a directory under itself and no name is taken;
//  3. data (changed extent ranges only; whole extents shared with the parent
//     or a clone source become CLONE, compressed ones ENCODED_WRITE when
//     asked), size, xattrs, owner, mode;
//  4. rmdir of the directories that went (all orphans by then, and empty);
//  5. utimes of every changed inode, last, so no later command moves them.
//
// A receiver resolves paths in its copy as it stands, so every path is
// computed from the model of where each inode is now (`loc_` over the
// parent's names).
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "format/checksum.h"
#include "fs/fs_impl.h"
#include "send/incremental.h"
#include "send/stream.h"
#include "send/tree_diff.h"
#include "txn/extent_refs.h"

namespace ubtrfs::send {

namespace {

using namespace format;

constexpr uint64_t kTop = kFirstFreeObjectid;  // a subvolume's top directory
constexpr size_t kWriteChunk = 48 * 1024;      // BTRFS_SEND_READ_SIZE
constexpr int kMaxDepth = 4096;                // deeper than any path of 4 KiB

struct Ref {
  uint64_t dir = 0;
  std::string name;
  // The directory's generation where its number went to another directory
  // between the two trees (0 otherwise): the same (dir, name) is then
  // another name, as the kernel's send tells them apart by generation.
  uint64_t dir_gen = 0;
  friend auto operator<=>(const Ref&, const Ref&) = default;
};

struct InodeState {
  bool exists = false;
  InodeItem item{};
  std::vector<Ref> refs;  // sorted
  uint64_t gen() const { return item.generation.get(); }
  uint32_t mode() const { return item.mode.get(); }
  bool is_dir() const { return S_ISDIR(mode()); }
};

struct Change {
  InodeState o, n;
  bool xattrs = false;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [start, end) of changed extent items
  bool is_new() const { return n.exists && (!o.exists || o.gen() != n.gen() || (o.mode() & S_IFMT) != (n.mode() & S_IFMT)); }
  bool is_gone() const { return o.exists && (!n.exists || is_new()); }
  bool same() const { return o.exists && n.exists && !is_new(); }
  bool refs_changed() const { return o.refs != n.refs; }
};

// Where a file extent item's bytes end in the file.
uint64_t ExtentLen(std::span<const uint8_t> d) {
  if (d.size() < kFileExtentInlineDataStart) return 0;
  const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
  if (fe->type == kFileExtentInline) return fe->ram_bytes.get();
  if (d.size() < sizeof(FileExtentItem)) return 0;
  return fe->num_bytes.get();
}

struct Tree {
  uint64_t id = 0;
  tree::RootPtr root;
  Uuid uuid{};  // what a receiver knows it by (received uuid, else uuid)
  uint64_t ctransid = 0;
};

class Engine {
 public:
  Engine(fsimpl::FilesystemImpl& fs, StreamWriter& w, const SendOptions& opt, SendResult* res)
      : fs_(fs), w_(w), opt_(opt), res_(res), src_(fs.SendBlockSource()), ss_(fs.SendSectorSize()) {}

  Status Run(const Tree& send, const std::optional<Tree>& parent, std::vector<Tree> clones, const std::string& name) {
    new_ = send;
    full_ = !parent;
    if (parent) old_ = *parent;
    clones_ = std::move(clones);
    if (parent) clones_.insert(clones_.begin(), *parent);
    // The stream's first command.
    w_.Begin(full_ ? kCmdSubvol : kCmdSnapshot);
    w_.String(kAttrPath, name);
    w_.PutUuid(kAttrUuid, new_.uuid);
    w_.U64(kAttrCtransid, new_.ctransid);
    if (!full_) {
      w_.PutUuid(kAttrCloneUuid, old_.uuid);
      w_.U64(kAttrCloneCtransid, old_.ctransid);
    }
    UB_RETURN_IF_ERROR(End());
    DiffStats ds;
    UB_RETURN_IF_ERROR(CompareTrees(src_, full_ ? tree::RootPtr{} : old_.root, new_.root,
                                    [this](DiffKind k, const Key& key, std::span<const uint8_t> a,
                                           std::span<const uint8_t> b) { return Note(k, key, a, b); },
                                    &ds));
    res_->blocks_read = ds.blocks_read;
    res_->shared_subtrees_skipped = ds.shared_skipped;
    if (full_) changes_[kTop];  // the top's attributes
    for (auto& [ino, c] : changes_) {
      if (!full_) UB_RETURN_IF_ERROR(Load(old_, ino, &c.o));
      UB_RETURN_IF_ERROR(Load(new_, ino, &c.n));
      if (ino == kTop && (!c.n.exists || !c.n.is_dir())) return Status::Corrupt("the snapshot has no top directory");
    }
    res_->changed_inodes = changes_.size();
    MarkReusedDirs();
    UB_RETURN_IF_ERROR(FreeOldNames());
    for (auto& [ino, c] : changes_) {
      if (c.n.exists) UB_RETURN_IF_ERROR(Place(ino, 0));
    }
    for (auto& [ino, c] : changes_) {
      if (c.n.exists) UB_RETURN_IF_ERROR(Contents(ino, c));
    }
    for (const std::string& p : rmdirs_) UB_RETURN_IF_ERROR(Simple(kCmdRmdir, kAttrPath, p));
    if (used_orphans_ && !changes_.contains(kTop)) {
      auto& c = changes_[kTop];
      UB_RETURN_IF_ERROR(Load(new_, kTop, &c.n));
      c.o = c.n;
    }
    for (auto& [ino, c] : changes_) {
      if (c.n.exists) UB_RETURN_IF_ERROR(Utimes(ino, c.n));
    }
    w_.Begin(kCmdEnd);
    return End();
  }

 private:
  Status End() {
    ++res_->commands;
    return w_.End();
  }

  // ---- The comparison's results ----

  Status Note(DiffKind kind, const Key& k, std::span<const uint8_t> a, std::span<const uint8_t> b) {
    if (k.objectid < kFirstFreeObjectid || k.objectid > kLastFreeObjectid) return Status::Ok();
    switch (k.type) {
      case kInodeItemKey:
      case kInodeRefKey:
      case kInodeExtrefKey:
      case kDirItemKey:
      case kDirIndexKey:
        changes_[k.objectid];
        break;
      case kXattrItemKey:
        changes_[k.objectid].xattrs = true;
        break;
      case kExtentDataKey: {
        auto& r = changes_[k.objectid].ranges;
        if (kind != DiffKind::kNew) r.emplace_back(k.offset, k.offset + std::max<uint64_t>(ExtentLen(a), 1));
        if (kind != DiffKind::kDeleted) r.emplace_back(k.offset, k.offset + std::max<uint64_t>(ExtentLen(b), 1));
        break;
      }
      default:
        break;
    }
    return Status::Ok();
  }

  Status Load(const Tree& t, uint64_t ino, InodeState* s) {
    UB_ASSIGN_OR_RETURN(auto item, tree::LookupItem(src_, t.root, Key{ino, kInodeItemKey, 0}));
    if (!item) return Status::Ok();
    if (item->size() < sizeof(InodeItem)) {
      return Status::Corrupt("tree " + std::to_string(t.id) + ": inode " + std::to_string(ino) + " item is short");
    }
    s->exists = true;
    std::memcpy(&s->item, item->data(), sizeof(InodeItem));
    UB_ASSIGN_OR_RETURN(s->refs, Refs(t, ino));
    return Status::Ok();
  }

  // A directory number the parent and the snapshot give to two different
  // inodes (the first deleted, the number reused): a name in it is not the
  // same name in both trees although its INODE_REF is byte for byte the
  // same, so each such ref carries its directory's generation.
  void MarkReusedDirs() {
    std::map<uint64_t, std::pair<uint64_t, uint64_t>> reused;  // dir -> (old gen, new gen)
    for (const auto& [ino, c] : changes_) {
      if (c.o.exists && c.n.exists && c.is_new()) reused[ino] = {c.o.gen(), c.n.gen()};
    }
    if (reused.empty()) return;
    for (auto& [ino, c] : changes_) {
      for (auto* refs : {&c.o.refs, &c.n.refs}) {
        bool marked = false;
        for (Ref& r : *refs) {
          auto it = reused.find(r.dir);
          if (it == reused.end()) continue;
          r.dir_gen = refs == &c.o.refs ? it->second.first : it->second.second;
          marked = true;
        }
        if (marked) std::sort(refs->begin(), refs->end());
      }
    }
  }

  // The names of inode `ino` in tree `t` (none for the top).
  Result<std::vector<Ref>> Refs(const Tree& t, uint64_t ino) {
    std::vector<Ref> out;
    if (ino == kTop) return out;
    tree::Cursor c(src_, t.root);
    UB_RETURN_IF_ERROR(c.Seek(Key{ino, kInodeRefKey, 0}));
    const auto bad = [&](const Key& k) { return Status::Corrupt("tree " + std::to_string(t.id) + ": item " + KeyToString(k) + " is damaged"); };
    for (bool first = true;; first = false) {
      if (!first) UB_RETURN_IF_ERROR(c.Next());
      if (!c.Valid()) break;
      const Key k = c.key();
      if (k.objectid != ino || k.type > kInodeExtrefKey) break;
      const auto d = c.data();
      size_t pos = 0;
      while (pos < d.size()) {
        uint64_t dir = k.offset;
        size_t head = sizeof(InodeRef);
        uint16_t nl;
        if (k.type == kInodeRefKey) {
          if (d.size() - pos < sizeof(InodeRef)) return bad(k);
          nl = reinterpret_cast<const InodeRef*>(d.data() + pos)->name_len.get();
        } else {
          head = sizeof(InodeExtref);
          if (d.size() - pos < sizeof(InodeExtref)) return bad(k);
          const auto* e = reinterpret_cast<const InodeExtref*>(d.data() + pos);
          dir = e->parent_objectid.get();
          nl = e->name_len.get();
        }
        if (nl == 0 || nl > d.size() - pos - head) return bad(k);
        std::string name(reinterpret_cast<const char*>(d.data() + pos + head), nl);
        if (name.find('/') != std::string::npos || name == "." || name == "..") return bad(k);
        out.push_back(Ref{dir, std::move(name)});
        pos += head + nl;
      }
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  // ---- Where inodes are in the receiver's copy ----

  // The name of `ino` in the parent snapshot (any one of a file's).
  Result<Ref> OldLoc(uint64_t ino) {
    if (auto it = changes_.find(ino); it != changes_.end() && !full_) {
      if (it->second.o.refs.empty()) return Status::Corrupt("inode " + std::to_string(ino) + " has no name in the parent");
      return it->second.o.refs.front();
    }
    if (auto it = old_locs_.find(ino); it != old_locs_.end()) return it->second;
    if (full_) return Status::Corrupt("inode " + std::to_string(ino) + " is named before it exists");
    UB_ASSIGN_OR_RETURN(auto refs, Refs(old_, ino));
    if (refs.empty()) return Status::Corrupt("inode " + std::to_string(ino) + " has no name in the parent snapshot");
    old_locs_[ino] = refs.front();
    return refs.front();
  }

  Result<Ref> CurLoc(uint64_t ino) {
    if (auto it = loc_.find(ino); it != loc_.end()) return it->second;
    return OldLoc(ino);
  }

  Result<std::string> CurPath(uint64_t ino) {
    std::vector<std::string> parts;
    for (int depth = 0; ino != kTop; ++depth) {
      if (depth > kMaxDepth) return Status::Corrupt("directory loop at inode " + std::to_string(ino));
      UB_ASSIGN_OR_RETURN(Ref r, CurLoc(ino));
      parts.push_back(r.name);
      ino = r.dir;
    }
    return Join(parts);
  }

  // A path in tree `t` as it is (a clone source's), from its first names.
  Result<std::string> PathIn(const Tree& t, uint64_t ino) {
    std::vector<std::string> parts;
    for (int depth = 0; ino != kTop; ++depth) {
      if (depth > kMaxDepth) return Status::Corrupt("directory loop at inode " + std::to_string(ino));
      UB_ASSIGN_OR_RETURN(auto refs, Refs(t, ino));
      if (refs.empty()) return Status::NotFound("inode " + std::to_string(ino) + " has no name");
      parts.push_back(refs.front().name);
      ino = refs.front().dir;
    }
    return Join(parts);
  }

  static std::string Join(const std::vector<std::string>& reversed) {
    std::string p;
    for (auto it = reversed.rbegin(); it != reversed.rend(); ++it) {
      if (!p.empty()) p += '/';
      p += *it;
    }
    return p;
  }

  Result<std::string> RefPath(const Ref& r) {
    UB_ASSIGN_OR_RETURN(std::string dir, CurPath(r.dir));
    return dir.empty() ? r.name : dir + "/" + r.name;
  }

  // Whether directory `dir` of tree `t` has an entry `name`.
  Result<bool> HasEntry(const Tree& t, uint64_t dir, const std::string& name) {
    const Key k{dir, kDirItemKey, NameHash(name)};
    UB_ASSIGN_OR_RETURN(auto item, tree::LookupItem(src_, t.root, k));
    if (!item) return false;
    UB_ASSIGN_OR_RETURN(auto entries, fsimpl::ParseDirItems(*item, k));
    for (const auto& e : entries) {
      if (e.name == name) return true;
    }
    return false;
  }

  Status Orphan(uint64_t ino, uint64_t gen) {
    std::string name;
    for (int n = 0;; ++n) {
      name = "o" + std::to_string(ino) + "-" + std::to_string(gen) + "-" + std::to_string(n);
      if (orphan_names_.contains(name)) continue;
      UB_ASSIGN_OR_RETURN(bool in_old, HasEntry(old_, kTop, name));
      UB_ASSIGN_OR_RETURN(bool in_new, HasEntry(new_, kTop, name));
      if (!in_old && !in_new) break;
    }
    UB_ASSIGN_OR_RETURN(std::string from, CurPath(ino));
    orphan_names_.insert(name);
    used_orphans_ = true;
    UB_RETURN_IF_ERROR(Rename(from, name));
    loc_[ino] = Ref{kTop, name};
    return Status::Ok();
  }

  Status Rename(const std::string& from, const std::string& to) {
    w_.Begin(kCmdRename);
    w_.String(kAttrPath, from);
    w_.String(kAttrPathTo, to);
    return End();
  }

  Status Simple(uint16_t cmd, uint16_t attr, const std::string& a, uint16_t attr2 = 0, const std::string& b = {}) {
    w_.Begin(cmd);
    w_.String(attr, a);
    if (attr2) w_.String(attr2, b);
    return End();
  }

  // ---- 1: old names out of the way ----

  Status FreeOldNames() {
    if (full_) return Status::Ok();
    for (auto& [ino, c] : changes_) {
      if (ino == kTop || !c.o.exists) continue;
      if (c.is_gone()) {
        if (c.o.is_dir()) {
          UB_RETURN_IF_ERROR(Orphan(ino, c.o.gen()));
          rmdirs_.push_back(loc_[ino].name);  // at the top, which never moves
        } else {
          for (const Ref& r : c.o.refs) {
            UB_ASSIGN_OR_RETURN(std::string p, RefPath(r));
            UB_RETURN_IF_ERROR(Simple(kCmdUnlink, kAttrPath, p));
          }
          loc_.erase(ino);
        }
        continue;
      }
      if (!c.refs_changed()) continue;
      if (c.o.is_dir()) {
        UB_RETURN_IF_ERROR(Orphan(ino, c.o.gen()));
        continue;
      }
      std::optional<Ref> kept;
      for (const Ref& r : c.o.refs) {
        if (std::binary_search(c.n.refs.begin(), c.n.refs.end(), r)) {
          kept = r;
          break;
        }
      }
      bool orphaned = false;
      if (!kept) {
        // Keeps no name: waits under an orphan name for its new ones.
        loc_[ino] = c.o.refs.front();
        UB_RETURN_IF_ERROR(Orphan(ino, c.o.gen()));
        orphaned = true;
      } else {
        loc_[ino] = *kept;
      }
      for (size_t i = orphaned ? 1 : 0; i < c.o.refs.size(); ++i) {
        const Ref& r = c.o.refs[i];
        if (std::binary_search(c.n.refs.begin(), c.n.refs.end(), r)) continue;
        UB_ASSIGN_OR_RETURN(std::string p, RefPath(r));
        UB_RETURN_IF_ERROR(Simple(kCmdUnlink, kAttrPath, p));
      }
    }
    return Status::Ok();
  }

  // ---- 2: everything at its new names, parents first ----

  Status Place(uint64_t ino, int depth) {
    if (ino == kTop || placed_.contains(ino)) return Status::Ok();
    if (depth > kMaxDepth || visiting_.contains(ino)) {
      return Status::Corrupt("directory loop at inode " + std::to_string(ino) + " in the snapshot");
    }
    visiting_.insert(ino);
    auto it = changes_.find(ino);
    if (it == changes_.end()) {
      // Unchanged: where the parent had it, below a parent that may move.
      UB_ASSIGN_OR_RETURN(Ref r, OldLoc(ino));
      UB_RETURN_IF_ERROR(Place(r.dir, depth + 1));
    } else {
      Change& c = it->second;
      if (!c.n.exists) return Status::Corrupt("inode " + std::to_string(ino) + " holds entries of the snapshot but is not in it");
      if (c.n.refs.empty()) return Status::Corrupt("inode " + std::to_string(ino) + " has no name in the snapshot");
      if (c.n.is_dir() && c.n.refs.size() != 1) {
        return Status::Corrupt("directory " + std::to_string(ino) + " has " + std::to_string(c.n.refs.size()) + " names");
      }
      for (const Ref& r : c.n.refs) UB_RETURN_IF_ERROR(Place(r.dir, depth + 1));
      if (c.is_new()) {
        UB_RETURN_IF_ERROR(Make(ino, c));
      } else if (c.refs_changed()) {
        if (c.n.is_dir()) {
          UB_ASSIGN_OR_RETURN(std::string from, CurPath(ino));
          UB_ASSIGN_OR_RETURN(std::string to, RefPath(c.n.refs.front()));
          UB_RETURN_IF_ERROR(Rename(from, to));
          loc_[ino] = c.n.refs.front();
        } else {
          UB_RETURN_IF_ERROR(Relink(ino, c));
        }
      }
    }
    visiting_.erase(ino);
    placed_.insert(ino);
    return Status::Ok();
  }

  // A surviving file whose names changed: from its orphan (or a kept name)
  // to every new name.
  Status Relink(uint64_t ino, Change& c) {
    UB_ASSIGN_OR_RETURN(Ref cur, CurLoc(ino));
    const bool orphan = cur.dir == kTop && orphan_names_.contains(cur.name);
    for (const Ref& r : c.n.refs) {
      if (std::binary_search(c.o.refs.begin(), c.o.refs.end(), r)) continue;
      UB_ASSIGN_OR_RETURN(std::string to, RefPath(r));
      UB_ASSIGN_OR_RETURN(std::string from, CurPath(ino));
      if (orphan && loc_[ino] == cur) {
        UB_RETURN_IF_ERROR(Rename(from, to));
        loc_[ino] = r;
      } else {
        UB_RETURN_IF_ERROR(Simple(kCmdLink, kAttrPath, to, kAttrPathLink, from));
      }
    }
    return Status::Ok();
  }

  Status Make(uint64_t ino, Change& c) {
    const uint32_t mode = c.n.mode();
    const uint32_t fmt = mode & S_IFMT;
    const uint16_t cmd = fmt == S_IFREG ? kCmdMkfile : fmt == S_IFDIR ? kCmdMkdir : fmt == S_IFLNK ? kCmdSymlink
                         : fmt == S_IFIFO ? kCmdMkfifo : fmt == S_IFSOCK ? kCmdMksock
                         : (fmt == S_IFCHR || fmt == S_IFBLK) ? kCmdMknod : kCmdUnspec;
    if (cmd == kCmdUnspec) return Status::Corrupt("inode " + std::to_string(ino) + " of unknown type " + std::to_string(mode));
    UB_ASSIGN_OR_RETURN(std::string p, RefPath(c.n.refs.front()));
    std::string target;
    if (cmd == kCmdSymlink) {
      UB_ASSIGN_OR_RETURN(target, fs_.ReadLink(InodeId{new_.id, ino}));
    }
    w_.Begin(cmd);
    w_.String(kAttrPath, p);
    w_.U64(kAttrIno, ino);
    if (cmd == kCmdSymlink) w_.String(kAttrPathLink, target);
    if (cmd == kCmdMknod) {
      const uint64_t rdev = c.n.item.rdev.get();
      w_.U64(kAttrMode, mode);
      w_.U64(kAttrRdev, makedev(static_cast<unsigned>(rdev >> 20), static_cast<unsigned>(rdev & 0xfffff)));
    }
    UB_RETURN_IF_ERROR(End());
    loc_[ino] = c.n.refs.front();
    for (size_t i = 1; i < c.n.refs.size(); ++i) {
      UB_ASSIGN_OR_RETURN(std::string to, RefPath(c.n.refs[i]));
      UB_RETURN_IF_ERROR(Simple(kCmdLink, kAttrPath, to, kAttrPathLink, p));
    }
    return Status::Ok();
  }

  // ---- 3: data, size, xattrs, owner, mode ----

  Status Contents(uint64_t ino, Change& c) {
    UB_ASSIGN_OR_RETURN(std::string p, CurPath(ino));
    const bool fresh = c.is_new() || (full_ && ino == kTop);
    const InodeItem& ni = c.n.item;
    const uint64_t size = ni.size.get();
    bool wrote = false;
    if (S_ISREG(c.n.mode())) {
      std::vector<std::pair<uint64_t, uint64_t>> ranges;
      if (fresh) {
        ranges.emplace_back(0, size);
      } else {
        ranges = std::move(c.ranges);
        std::sort(ranges.begin(), ranges.end());
      }
      // Merged where they overlap or touch, and clipped to the new size
      // (TRUNCATE does the rest).
      std::vector<std::pair<uint64_t, uint64_t>> merged;
      for (auto [a, b] : ranges) {
        b = std::min(b, size);
        if (a >= b) continue;
        if (!merged.empty() && a <= merged.back().second) {
          merged.back().second = std::max(merged.back().second, b);
        } else {
          merged.emplace_back(a, b);
        }
      }
      for (auto [a, b] : merged) {
        UB_RETURN_IF_ERROR(SendRange(ino, p, a, b, size, fresh, ni));
        wrote = true;
      }
      if (fresh || c.o.item.size.get() != size) {
        w_.Begin(kCmdTruncate);
        w_.String(kAttrPath, p);
        w_.U64(kAttrSize, size);
        UB_RETURN_IF_ERROR(End());
      }
    }
    if (fresh || c.xattrs) UB_RETURN_IF_ERROR(Xattrs(ino, p, fresh));
    const bool chown = fresh || c.o.item.uid.get() != ni.uid.get() || c.o.item.gid.get() != ni.gid.get();
    if (chown) {
      w_.Begin(kCmdChown);
      w_.String(kAttrPath, p);
      w_.U64(kAttrUid, ni.uid.get());
      w_.U64(kAttrGid, ni.gid.get());
      UB_RETURN_IF_ERROR(End());
    }
    // After chown (which clears set-id bits) and after writes.
    const uint32_t mode = c.n.mode();
    if (!S_ISLNK(mode) && (chown || c.o.mode() != mode || (wrote && (mode & 06000)))) {
      w_.Begin(kCmdChmod);
      w_.String(kAttrPath, p);
      w_.U64(kAttrMode, mode & 07777);
      UB_RETURN_IF_ERROR(End());
    }
    // fs-verity enabled since the parent (or on a new file), after its
    // data, as the kernel's send (protocol 3 only).
    const bool verity = S_ISREG(mode) && (ni.flags.get() & kInodeRoVerity);
    if (verity && w_.version() >= 3 && (fresh || !(c.o.item.flags.get() & kInodeRoVerity))) {
      UB_ASSIGN_OR_RETURN(auto v, fs_.GetVerity(InodeId{new_.id, ino}));
      if (!v) return Status::Corrupt(p + ": the VERITY flag without a descriptor");
      UB_RETURN_IF_ERROR(PutEnableVerity(w_, p, v->params.hash_algorithm, v->params.block_size, v->params.salt,
                                         v->params.signature));
      ++res_->commands;
    }
    return Status::Ok();
  }

  Status Xattrs(uint64_t ino, const std::string& p, bool fresh) {
    const auto load = [&](const Tree& t) -> Result<std::map<std::string, std::string>> {
      std::map<std::string, std::string> m;
      tree::Cursor cur(src_, t.root);
      UB_RETURN_IF_ERROR(cur.Seek(Key{ino, kXattrItemKey, 0}));
      for (bool first = true;; first = false) {
        if (!first) UB_RETURN_IF_ERROR(cur.Next());
        if (!cur.Valid()) break;
        const Key k = cur.key();
        if (k.objectid != ino || k.type != kXattrItemKey) break;
        UB_ASSIGN_OR_RETURN(auto entries, fsimpl::ParseDirItems(cur.data(), k));
        for (const auto& e : entries) m[std::string(e.name)] = std::string(e.data);
      }
      return m;
    };
    std::map<std::string, std::string> before;
    if (!fresh) {
      UB_ASSIGN_OR_RETURN(before, load(old_));
    }
    UB_ASSIGN_OR_RETURN(auto after, load(new_));
    for (const auto& [name, value] : before) {
      if (after.contains(name)) continue;
      UB_RETURN_IF_ERROR(Simple(kCmdRemoveXattr, kAttrPath, p, kAttrXattrName, name));
    }
    for (const auto& [name, value] : after) {
      if (auto it = before.find(name); it != before.end() && it->second == value) continue;
      w_.Begin(kCmdSetXattr);
      w_.String(kAttrPath, p);
      w_.String(kAttrXattrName, name);
      w_.String(kAttrXattrData, value);
      UB_RETURN_IF_ERROR(End());
    }
    return Status::Ok();
  }

  Status Utimes(uint64_t ino, const InodeState& s) {
    UB_ASSIGN_OR_RETURN(std::string p, CurPath(ino));
    const auto t = [](const format::Timespec& ts) { return send::Timespec{ts.sec.get(), ts.nsec.get()}; };
    w_.Begin(kCmdUtimes);
    w_.String(kAttrPath, p);
    w_.Time(kAttrAtime, t(s.item.atime));
    w_.Time(kAttrMtime, t(s.item.mtime));
    w_.Time(kAttrCtime, t(s.item.ctime));
    return End();
  }

  // [a, b) of file `ino` as the snapshot has it: data (written, cloned or
  // sent encoded) and holes (punched, unless the file is new).
  Status SendRange(uint64_t ino, const std::string& p, uint64_t a, uint64_t b, uint64_t size, bool fresh,
                   const InodeItem& ni) {
    tree::Cursor c(src_, new_.root);
    UB_RETURN_IF_ERROR(fsimpl::SeekFileExtent(c, InodeId{new_.id, ino}, a));
    uint64_t pos = a;
    for (bool first = true; pos < b; first = false) {
      if (!first) UB_RETURN_IF_ERROR(c.Next());
      if (!c.Valid()) break;
      const Key k = c.key();
      if (k.objectid != ino || k.type != kExtentDataKey) {
        if (k.objectid > ino || (k.objectid == ino && k.type > kExtentDataKey)) break;
        continue;
      }
      if (k.offset >= b) break;
      const auto d = c.data();
      if (d.size() < kFileExtentInlineDataStart) return Status::Corrupt("inode " + std::to_string(ino) + ": short extent item");
      const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
      const uint64_t len = ExtentLen(d);
      if (k.offset + len <= pos) continue;
      if (k.offset > pos) {
        UB_RETURN_IF_ERROR(Hole(p, pos, std::min(k.offset, b), fresh));
        pos = std::min(k.offset, b);
        if (pos >= b) break;
      }
      const uint64_t end = std::min(k.offset + len, b);
      const bool data = fe->type == kFileExtentInline ||
                        (fe->type == kFileExtentReg && d.size() >= sizeof(FileExtentItem) && fe->disk_bytenr.get() != 0);
      if (!data) {
        UB_RETURN_IF_ERROR(Hole(p, pos, end, fresh));
      } else {
        bool sent = false;
        if (fe->type == kFileExtentReg && pos == k.offset && end == std::min(k.offset + len, size)) {
          UB_ASSIGN_OR_RETURN(sent, Whole(ino, p, k, *fe, end - pos, ni));
        }
        if (!sent) UB_RETURN_IF_ERROR(Write(ino, p, pos, end));
      }
      pos = end;
    }
    if (pos < b) UB_RETURN_IF_ERROR(Hole(p, pos, b, fresh));
    return Status::Ok();
  }

  Status Hole(const std::string& p, uint64_t a, uint64_t b, bool fresh) {
    if (fresh || a >= b) return Status::Ok();
    if (w_.version() >= 2) {
      w_.Begin(kCmdFallocate);
      w_.String(kAttrPath, p);
      w_.U32(kAttrFallocateMode, 0x01 | 0x02);  // FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
      w_.U64(kAttrFileOffset, a);
      w_.U64(kAttrSize, b - a);
      return End();
    }
    const std::vector<uint8_t> zeros(kWriteChunk, 0);
    for (uint64_t off = a; off < b;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kWriteChunk, b - off));
      w_.Begin(kCmdWrite);
      w_.String(kAttrPath, p);
      w_.U64(kAttrFileOffset, off);
      w_.Data(std::span(zeros.data(), n));
      UB_RETURN_IF_ERROR(End());
      off += n;
    }
    return Status::Ok();
  }

  Status Write(uint64_t ino, const std::string& p, uint64_t a, uint64_t b) {
    buf_.resize(kWriteChunk);
    for (uint64_t off = a; off < b;) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(kWriteChunk, b - off));
      UB_ASSIGN_OR_RETURN(size_t n, fs_.Read(InodeId{new_.id, ino}, off, std::span(buf_.data(), want)));
      if (n == 0) return Status::Corrupt(p + ": read ends at " + std::to_string(off) + " before its size");
      w_.Begin(kCmdWrite);
      w_.String(kAttrPath, p);
      w_.U64(kAttrFileOffset, off);
      w_.Data(std::span(buf_.data(), n));
      UB_RETURN_IF_ERROR(End());
      res_->data_bytes += n;
      off += n;
    }
    return Status::Ok();
  }

  // A whole regular extent item (clipped at the end of the file): a CLONE
  // where a clone source holds the same extent bytes, else an
  // ENCODED_WRITE of its compressed bytes when asked. False: write it.
  Result<bool> Whole(uint64_t ino, const std::string& p, const Key& k, const FileExtentItem& fe, uint64_t len,
                     const InodeItem& ni) {
    // Unaligned only to the end of both files, as FICLONERANGE allows.
    const bool at_eof = k.offset + len == ni.size.get();
    if (k.offset % ss_ == 0 && (len % ss_ == 0 || at_eof)) {
      UB_ASSIGN_OR_RETURN(auto src, FindClone(ino, fe, len, ni));
      if (src) {
        w_.Begin(kCmdClone);
        w_.String(kAttrPath, p);
        w_.U64(kAttrFileOffset, k.offset);
        w_.U64(kAttrCloneLen, len);
        w_.PutUuid(kAttrCloneUuid, src->tree->uuid);
        w_.U64(kAttrCloneCtransid, src->tree->ctransid);
        w_.String(kAttrClonePath, src->path);
        w_.U64(kAttrCloneOffset, src->offset);
        UB_RETURN_IF_ERROR(End());
        ++res_->clones;
        return true;
      }
    }
    const uint8_t comp = fe.compression;
    if (!opt_.compressed_data || w_.version() < 2 || comp == kCompressNone || fe.encryption != 0 ||
        fe.other_encoding.get() != 0) {
      return false;
    }
    uint32_t enc;
    if (comp == kCompressZlib) {
      enc = kEncodedZlib;
    } else if (comp == kCompressZstd) {
      enc = kEncodedZstd;
    } else if (comp == kCompressLzo && ss_ >= 4096 && ss_ <= 65536 && (ss_ & (ss_ - 1)) == 0) {
      enc = kEncodedLzo4k + static_cast<uint32_t>(__builtin_ctz(ss_ / 4096));
    } else {
      return false;
    }
    const uint64_t disk_len = fe.disk_num_bytes.get(), ram = fe.ram_bytes.get();
    if (disk_len == 0 || disk_len > 128 * 1024 || ram > 128 * 1024 || fe.offset.get() > ram ||
        len > ram - fe.offset.get()) {
      return false;
    }
    std::vector<uint8_t> raw(disk_len);
    UB_RETURN_IF_ERROR(fs_.SendReadData(fe.disk_bytenr.get(), raw).WithContext(p));
    w_.Begin(kCmdEncodedWrite);
    w_.String(kAttrPath, p);
    w_.U64(kAttrFileOffset, k.offset);
    w_.U64(kAttrUnencodedFileLen, len);
    w_.U64(kAttrUnencodedLen, ram);
    w_.U64(kAttrUnencodedOffset, fe.offset.get());
    w_.U32(kAttrCompression, enc);
    w_.Data(raw);
    UB_RETURN_IF_ERROR(End());
    ++res_->encoded_writes;
    res_->data_bytes += disk_len;
    return true;
  }

  struct CloneSrc {
    const Tree* tree;
    std::string path;
    uint64_t offset;
  };

  // A file of a clone source (the parent first) whose extent item holds the
  // bytes [fe.offset, +len) of the same disk extent: found through the
  // extent's back references (EXTENT_DATA_REF name inodes, SHARED_DATA_REF
  // leaves), each candidate checked in the clone source itself.
  Result<std::optional<CloneSrc>> FindClone(uint64_t ino, const FileExtentItem& fe, uint64_t len,
                                            const InodeItem& ni) {
    if (clones_.empty()) return std::optional<CloneSrc>();
    const uint64_t bytenr = fe.disk_bytenr.get(), disk_len = fe.disk_num_bytes.get();
    if (!extent_tree_) {
      UB_ASSIGN_OR_RETURN(auto r, fs_.SendTreeRoot(kExtentTreeObjectid));
      extent_tree_ = r.ref;
    }
    // Candidates (inode, file offset of the extent's start), this inode first.
    std::vector<std::pair<uint64_t, uint64_t>> cands;
    constexpr size_t kMaxCandidates = 32;
    tree::Cursor c(src_, *extent_tree_);
    UB_RETURN_IF_ERROR(c.Seek(Key{bytenr, kExtentItemKey, 0}));
    for (bool first = true; cands.size() < kMaxCandidates; first = false) {
      if (!first) UB_RETURN_IF_ERROR(c.Next());
      if (!c.Valid()) break;
      const Key k = c.key();
      if (k.objectid != bytenr || k.type > kSharedDataRefKey) break;
      if (k.type == kExtentItemKey) {
        if (k.offset != disk_len) continue;
        std::vector<uint8_t> item(c.data().begin(), c.data().end());
        if (item.size() < sizeof(ExtentItem)) return Status::Corrupt("extent item " + KeyToString(k) + " is short");
        UB_ASSIGN_OR_RETURN(auto refs, txn::ParseInlineRefs(item, sizeof(ExtentItem), k));
        for (const auto& r : refs) {
          if (r.type == kExtentDataRefKey) cands.emplace_back(r.objectid, r.data_offset);
          if (r.type == kSharedDataRefKey) UB_RETURN_IF_ERROR(SharedLeaf(r.offset, bytenr, &cands));
        }
      } else if (k.type == kExtentDataRefKey && c.data().size() >= sizeof(ExtentDataRef)) {
        const auto* r = reinterpret_cast<const ExtentDataRef*>(c.data().data());
        cands.emplace_back(r->objectid.get(), r->offset.get());
      } else if (k.type == kSharedDataRefKey) {
        UB_RETURN_IF_ERROR(SharedLeaf(k.offset, bytenr, &cands));
      }
    }
    std::stable_partition(cands.begin(), cands.end(), [&](const auto& x) { return x.first == ino; });
    cands.resize(std::min(cands.size(), kMaxCandidates));
    const uint64_t want_lo = fe.offset.get(), want_hi = want_lo + len;
    for (const Tree& t : clones_) {
      for (const auto& [cino, start] : cands) {
        // The source's extent items of this extent, from the one at `start`
        // (below zero, wrapped, for a range cloned to a file offset lower
        // than its offset in the extent: from the file's first item then).
        tree::Cursor s(src_, t.root);
        UB_RETURN_IF_ERROR(s.Seek(Key{cino, kExtentDataKey, start > INT64_MAX ? 0 : start}));
        for (int n = 0; n < 8; ++n) {
          if (n > 0) UB_RETURN_IF_ERROR(s.Next());
          if (!s.Valid()) break;
          const Key k = s.key();
          if (k.objectid != cino || k.type != kExtentDataKey) break;
          const auto d = s.data();
          if (d.size() < sizeof(FileExtentItem)) continue;
          const auto* sf = reinterpret_cast<const FileExtentItem*>(d.data());
          if (sf->type != kFileExtentReg || sf->disk_bytenr.get() != bytenr || sf->disk_num_bytes.get() != disk_len) continue;
          const uint64_t lo = sf->offset.get(), hi = lo + sf->num_bytes.get();
          if (want_lo < lo || want_hi > hi) continue;
          const uint64_t src_off = k.offset + (want_lo - lo);
          // Within the source's size, and both sides checksummed alike (the
          // kernel's clone refuses otherwise).
          UB_ASSIGN_OR_RETURN(auto ii, tree::LookupItem(src_, t.root, Key{cino, kInodeItemKey, 0}));
          if (!ii || ii->size() < sizeof(InodeItem)) break;
          InodeItem si;
          std::memcpy(&si, ii->data(), sizeof si);
          if (!S_ISREG(si.mode.get()) || src_off + len > si.size.get() ||
              (len % ss_ != 0 && src_off + len != si.size.get()) ||
              ((si.flags.get() ^ ni.flags.get()) & kInodeNodatasum) != 0) {
            break;
          }
          auto path = PathIn(t, cino);
          if (!path.ok()) break;
          return std::optional<CloneSrc>(CloneSrc{&t, *path, src_off});
        }
      }
    }
    return std::optional<CloneSrc>();
  }

  // The file extent items of a leaf that a SHARED_DATA_REF names.
  Status SharedLeaf(uint64_t leaf, uint64_t bytenr, std::vector<std::pair<uint64_t, uint64_t>>* cands) {
    tree::BlockCheck check;
    check.bytenr = leaf;
    check.level = 0;
    auto b = src_->Read(check);
    if (!b.ok()) return Status::Ok();  // a stale reference: no candidate, not an error of the send
    const tree::TreeBlock& blk = **b;
    for (int i = 0; i < blk.nritems() && cands->size() < 32; ++i) {
      const Key k = blk.key(i);
      if (k.type != kExtentDataKey) continue;
      const auto d = blk.item_data(i);
      if (d.size() < sizeof(FileExtentItem)) continue;
      const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
      if (fe->type == kFileExtentReg && fe->disk_bytenr.get() == bytenr && k.offset >= fe->offset.get()) {
        cands->emplace_back(k.objectid, k.offset - fe->offset.get());
      }
    }
    return Status::Ok();
  }

  fsimpl::FilesystemImpl& fs_;
  StreamWriter& w_;
  const SendOptions& opt_;
  SendResult* res_;
  tree::BlockSource* src_;
  uint32_t ss_;
  Tree new_, old_;
  bool full_ = false;
  std::vector<Tree> clones_;
  std::optional<tree::RootPtr> extent_tree_;
  std::map<uint64_t, Change> changes_;
  std::map<uint64_t, Ref> loc_;       // where the receiver has an inode now, where not the parent's place
  std::map<uint64_t, Ref> old_locs_;  // names in the parent of unchanged inodes, looked up
  std::set<std::string> orphan_names_;
  bool used_orphans_ = false;
  std::set<uint64_t> placed_, visiting_;
  std::vector<std::string> rmdirs_;  // orphaned directories that go, by their orphan names
  std::vector<uint8_t> buf_;
};

}  // namespace

Status SendByComparison(fsimpl::FilesystemImpl& fs, StreamWriter& w, const SendOptions& opt, SendResult* res,
                        uint64_t send_id, const std::string& name) {
  const auto load = [&](uint64_t id) -> Result<Tree> {
    UB_ASSIGN_OR_RETURN(auto r, fs.SendTreeRoot(id));
    if (r.item.root_dirid.get() != kTop) {
      return Status::Unsupported("send: subvolume " + std::to_string(id) + " has its top at inode " +
                                 std::to_string(r.item.root_dirid.get()) + ", not 256");
    }
    Tree t;
    t.id = id;
    t.root = r.ref;
    const bool has_received = std::any_of(std::begin(r.item.received_uuid), std::end(r.item.received_uuid),
                                          [](uint8_t b) { return b != 0; });
    std::memcpy(t.uuid.data(), has_received ? r.item.received_uuid : r.item.uuid, 16);
    t.ctransid = r.item.ctransid.get();
    return t;
  };
  UB_ASSIGN_OR_RETURN(Tree send, load(send_id));
  std::optional<Tree> parent;
  if (opt.parent) {
    UB_ASSIGN_OR_RETURN(parent, load(opt.parent->root));
  }
  std::vector<Tree> clones;
  for (const InodeId& c : opt.clone_sources) {
    if (opt.parent && c.root == opt.parent->root) continue;
    UB_ASSIGN_OR_RETURN(Tree t, load(c.root));
    clones.push_back(t);
  }
  Engine e(fs, w, opt, res);
  return e.Run(send, parent, std::move(clones), name);
}

}  // namespace ubtrfs::send
