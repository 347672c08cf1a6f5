#include "txn/root_walk.h"

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "format/ondisk.h"
#include "txn/extent_refs.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;
using tree::Cursor;

namespace {

constexpr int kMaxBackrefDepth = 2 * kMaxLevel;
// The kernel's BTRFS_MAX_UNCOMPRESSED: the most a compressed extent holds.
constexpr uint64_t kMaxCompressedBytes = 128 * 1024;
// File offsets are signed in the kernel (loff_t).
constexpr uint64_t kMaxFileOffset = INT64_MAX;

}  // namespace

Result<std::set<uint64_t>> RootWalk::Roots(uint64_t bytenr, int depth) {
  if (auto it = memo_.find(bytenr); it != memo_.end()) return it->second;
  if (depth > kMaxBackrefDepth) {
    return Status::Corrupt("extent tree: back references of " + std::to_string(bytenr) + " nest too deep");
  }
  std::set<uint64_t> roots;
  std::vector<Backref> refs;
  int level = 0;
  UB_RETURN_IF_ERROR(Backrefs(bytenr, &refs, &level));
  // A reference that leads back to a block on the way up adds no tree: the
  // kernel leaves such loops in relocation trees (a reloc root block's
  // reference by parent may name itself; btrfs-progs' fsck-tests keep one).
  // A result found with a loop cut short is complete only for the block
  // the walk started from, so only that one is remembered.
  on_path_.insert(bytenr);
  const uint64_t cuts_before = loops_cut_;
  for (const Backref& r : refs) {
    if (r.root) roots.insert(r.a);  // the tree's root block (or a tree this state no longer has)
    for (uint64_t p : r.blocks) {
      if (on_path_.contains(p)) {
        ++loops_cut_;
        continue;
      }
      auto up = Roots(p, depth + 1);
      if (!up.ok()) {
        on_path_.erase(bytenr);
        return up.status();
      }
      roots.insert(up->begin(), up->end());
    }
  }
  on_path_.erase(bytenr);
  if (loops_cut_ == cuts_before || depth == 0) memo_[bytenr] = roots;
  return roots;
}

Status RootWalk::Backrefs(uint64_t bytenr, std::vector<Backref>* out, int* level) {
  UB_ASSIGN_OR_RETURN(StoredRefs stored, ReadStoredRefs(src_, ext_, bytenr));
  *level = stored.head.level;
  const uint64_t data_bytes = stored.key.type == kExtentItemKey ? stored.key.offset : 0;
  for (const InlineRef& r : stored.refs) {
    if (r.type == kExtentDataRefKey) {
      out->push_back({r.type, r.root, r.objectid, r.data_offset, r.count, {}, false});
    } else if (r.type == kTreeBlockRefKey || r.type == kSharedBlockRefKey || r.type == kSharedDataRefKey) {
      out->push_back({r.type, r.offset, 0, 0, r.count, {}, false});
    }
  }
  for (Backref& r : *out) {
    if (r.type == kTreeBlockRefKey) {
      UB_ASSIGN_OR_RETURN(std::optional<uint64_t> parent, ParentInTree(r.a, bytenr, *level));
      if (parent) {
        r.blocks.push_back(*parent);
      } else {
        r.root = true;
      }
    } else if (r.type == kSharedBlockRefKey || r.type == kSharedDataRefKey) {
      r.blocks.push_back(r.a);
    } else if (r.type == kExtentDataRefKey) {
      UB_RETURN_IF_ERROR(LeavesInTree(r.a, r.ino, r.off, bytenr, data_bytes, &r.blocks));
    }
  }
  return Status::Ok();
}

Result<std::optional<uint64_t>> RootWalk::ParentInTree(uint64_t t, uint64_t bytenr, int level) {
  std::optional<tree::RootPtr> root = root_of_(t);
  if (!root || root->bytenr == bytenr || root->level <= level) return std::optional<uint64_t>{};
  UB_ASSIGN_OR_RETURN(tree::BlockRef b, src_->Read(tree::BlockCheck{bytenr, level, 0, {}}));
  if (b->nritems() == 0) return std::optional<uint64_t>{};
  const Key first = b->key(0);
  UB_ASSIGN_OR_RETURN(tree::BlockRef n, src_->Read(tree::BlockCheck{root->bytenr, root->level, 0, {}}));
  while (n->level() > level + 1) {
    int slot = 0;
    while (slot + 1 < n->nritems() && n->key(slot + 1) <= first) ++slot;
    UB_ASSIGN_OR_RETURN(n, src_->Read(tree::BlockCheck{n->child_bytenr(slot), n->level() - 1, 0, {}}));
  }
  for (int i = 0; i < n->nritems(); ++i) {
    if (n->child_bytenr(i) == bytenr) return std::optional<uint64_t>{n->bytenr()};
  }
  return std::optional<uint64_t>{};  // not where its key says: no parent in this tree
}

Status RootWalk::LeavesInTree(uint64_t root, uint64_t ino, uint64_t off, uint64_t bytenr, uint64_t bytes,
                              std::vector<uint64_t>* leaves) {
  std::optional<tree::RootPtr> r = root_of_(root);
  if (!r) return Status::Ok();
  // An item maps the extent at file offset off + its extent offset, and a
  // readable item's extent offset is below the extent's size (uncompressed)
  // or 128 KiB (compressed): the items past that window cannot be among its
  // references, and scanning on to the inode's last item made a file of n
  // extents cost n^2 / 2 item visits. `off` is below zero (wrapped) for a
  // range cloned to a file offset lower than its offset in the extent: the
  // window then starts at the file's first item, as the kernel's backref
  // walk starts there.
  const uint64_t window = std::max<uint64_t>(bytes, kMaxCompressedBytes);
  Cursor c(src_, *r);
  UB_RETURN_IF_ERROR(c.Seek(Key{ino, kExtentDataKey, off > kMaxFileOffset ? 0 : off}));
  uint64_t last_leaf = 0;
  while (c.Valid() && c.key().objectid == ino && c.key().type == kExtentDataKey && c.key().offset - off < window) {
    auto d = c.data();
    if (d.size() >= sizeof(FileExtentItem)) {
      const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
      if (fe->type != kFileExtentInline && fe->disk_bytenr.get() == bytenr &&
          c.key().offset - fe->offset.get() == off && c.leaf().bytenr() != last_leaf) {
        last_leaf = c.leaf().bytenr();
        leaves->push_back(last_leaf);
      }
    }
    UB_RETURN_IF_ERROR(c.Next());
  }
  return Status::Ok();
}

}  // namespace ubtrfs::txn
