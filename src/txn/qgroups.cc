// Quota groups, kept exact at every commit as the kernel's qgroup accounting
// keeps them (fs/btrfs/qgroup.c): for each extent whose references changed
// in the transaction, the set of subvolumes that reach it before (the
// committed extent tree) and after (the extent tree the commit writes) is
// found by walking its back references up (a ref by tree names the tree; a
// ref by parent block leads to that block's own refs). A qgroup's
// referenced bytes change where it reaches the extent on one side only, its
// exclusive bytes where every reaching subvolume is its own on one side only.
//
// Two changes alter which subvolumes reach blocks whose own references stay
// as they are, and are handled as the kernel handles them:
// - a snapshot: the new qgroup inherits the source's numbers (everything but
//   the two root blocks is shared from then on: the kernel's
//   btrfs_qgroup_inherit), and the transaction's other changes are counted
//   from that state: every extent the source reached (but its root block)
//   counts as reached by the snapshot too before, and the snapshot's root
//   copy as its own;
// - a dropped subvolume's shared block: every block and data extent below it
//   loses the dropped tree, so they are all walked (TraceDroppedSubtree).
#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <tuple>

#include "format/ondisk.h"
#include "txn/extent_refs.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;
using tree::Cursor;

namespace {

constexpr int kMaxBackrefDepth = 2 * kMaxLevel;

template <typename T>
std::vector<uint8_t> Bytes(const T& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  return std::vector<uint8_t>(p, p + sizeof(T));
}

// The subvolumes whose trees reach extent `bytenr` in one state of the
// filesystem (the committed one, or the one being committed), as the
// kernel's backref walk finds them: a reference by parent leads to that
// block; a reference by tree (TREE_BLOCK_REF, EXTENT_DATA_REF) names the
// tree that holds the pointer, so the tree is searched for the block that
// holds it, and that block's own references are followed in turn (it may
// be shared with snapshots). A tree's root block is reached by that tree.
// Memoized per walk: parents are shared by many children.
class RootWalk {
 public:
  using TreeRootOf = std::function<std::optional<tree::RootPtr>(uint64_t)>;
  RootWalk(tree::BlockSource* src, tree::RootPtr ext, TreeRootOf root_of)
      : src_(src), ext_(ext), root_of_(std::move(root_of)) {}

  Result<std::set<uint64_t>> Roots(uint64_t bytenr, int depth = 0) {
    if (auto it = memo_.find(bytenr); it != memo_.end()) return it->second;
    if (depth > kMaxBackrefDepth) {
      return Status::Corrupt("extent tree: back references of " + std::to_string(bytenr) + " nest too deep");
    }
    std::set<uint64_t> roots;
    std::vector<uint64_t> parents, by_tree;                      // blocks: parents, trees holding it
    std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> data;  // data: (root, ino, offset)
    int level = 0;
    Cursor c(src_, ext_);
    UB_RETURN_IF_ERROR(c.Seek(Key{bytenr, 0, 0}));
    while (c.Valid() && c.key().objectid == bytenr) {
      const Key k = c.key();
      auto d = c.data();
      if (k.type == kExtentItemKey || k.type == kMetadataItemKey) {
        if (d.size() < sizeof(ExtentItem)) return Status::Corrupt("extent tree: short item " + KeyToString(k));
        const auto* ei = reinterpret_cast<const ExtentItem*>(d.data());
        size_t start = sizeof(ExtentItem);
        if (k.type == kMetadataItemKey) {
          level = static_cast<int>(k.offset);
        } else if (ei->flags.get() & kExtentFlagTreeBlock) {
          if (d.size() < start + sizeof(TreeBlockInfo)) return Status::Corrupt("extent tree: short " + KeyToString(k));
          level = reinterpret_cast<const TreeBlockInfo*>(d.data() + start)->level;
          start += sizeof(TreeBlockInfo);
        }
        const std::vector<uint8_t> item(d.begin(), d.end());
        UB_ASSIGN_OR_RETURN(auto refs, ParseInlineRefs(item, start, k));
        for (const InlineRef& r : refs) {
          if (r.type == kTreeBlockRefKey) by_tree.push_back(r.offset);
          if (r.type == kExtentDataRefKey) data.push_back({r.root, r.objectid, r.data_offset});
          if (r.type == kSharedBlockRefKey || r.type == kSharedDataRefKey) parents.push_back(r.offset);
        }
      } else if (k.type == kTreeBlockRefKey) {
        by_tree.push_back(k.offset);
      } else if (k.type == kSharedBlockRefKey || k.type == kSharedDataRefKey) {
        parents.push_back(k.offset);
      } else if (k.type == kExtentDataRefKey) {
        if (d.size() < sizeof(ExtentDataRef)) return Status::Corrupt("extent tree: short item " + KeyToString(k));
        const auto* r = reinterpret_cast<const ExtentDataRef*>(d.data());
        data.push_back({r->root.get(), r->objectid.get(), r->offset.get()});
      }
      UB_RETURN_IF_ERROR(c.Next());
    }
    for (uint64_t t : by_tree) {
      UB_ASSIGN_OR_RETURN(std::optional<uint64_t> parent, ParentInTree(t, bytenr, level));
      if (!parent) {
        roots.insert(t);  // the tree's root block (or a tree this state no longer has)
      } else {
        parents.push_back(*parent);
      }
    }
    for (const auto& [root, ino, off] : data) UB_RETURN_IF_ERROR(LeavesInTree(root, ino, off, bytenr, &parents));
    for (uint64_t p : parents) {
      UB_ASSIGN_OR_RETURN(auto up, Roots(p, depth + 1));
      roots.insert(up.begin(), up.end());
    }
    memo_[bytenr] = roots;
    return roots;
  }

 private:
  // The block of tree `t` that points at block `bytenr` (level `level`), or
  // nothing when it is t's root block.
  Result<std::optional<uint64_t>> ParentInTree(uint64_t t, uint64_t bytenr, int level) {
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

  // The leaves of tree `root` whose file extent items of inode `ino` map
  // data extent `bytenr` at file offset - extent offset == `off`.
  Status LeavesInTree(uint64_t root, uint64_t ino, uint64_t off, uint64_t bytenr, std::vector<uint64_t>* leaves) {
    std::optional<tree::RootPtr> r = root_of_(root);
    if (!r) return Status::Ok();
    Cursor c(src_, *r);
    UB_RETURN_IF_ERROR(c.Seek(Key{ino, kExtentDataKey, off}));
    uint64_t last_leaf = 0;
    while (c.Valid() && c.key().objectid == ino && c.key().type == kExtentDataKey) {
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

  tree::BlockSource* src_;
  tree::RootPtr ext_;
  TreeRootOf root_of_;
  std::map<uint64_t, std::set<uint64_t>> memo_;
};

}  // namespace

Status TxnManager::LoadQuotas() {
  auto q = vol_->FindRoot(kQuotaTreeObjectid);
  if (!q.ok()) return Status::Ok();  // quotas were never enabled
  auto state = std::make_unique<QuotaState>();
  bool have_status = false;
  Cursor c(vol_->reader(), q->ref);
  UB_RETURN_IF_ERROR(c.SeekFirst());
  while (c.Valid()) {
    const Key k = c.key();
    auto d = c.data();
    if (k.type == kQgroupStatusKey) {
      if (d.size() < sizeof(QgroupStatusItem)) return Status::Corrupt("quota tree: short status item");
      const auto* st = reinterpret_cast<const QgroupStatusItem*>(d.data());
      have_status = true;
      if (!(st->flags.get() & kQgroupStatusOn)) {
        return Status::Unsupported("writing to an image whose quotas are being turned off (mount it once)");
      }
      if (st->flags.get() & kQgroupStatusRescan) {
        return Status::Unsupported("writing to an image during a quota rescan (the kernel finishes it at mount)");
      }
      state->simple = st->flags.get() & kQgroupStatusSimpleMode;
      if (state->simple != bool(vol_->super().incompat_flags.get() & kIncompatSimpleQuota)) {
        return Status::Unsupported("writing to an image whose quota status and SIMPLE_QUOTA flag disagree");
      }
      if (state->simple) {
        if (d.size() < sizeof(QgroupStatusItemSimple)) return Status::Corrupt("quota tree: short simple status item");
        state->enable_gen = reinterpret_cast<const QgroupStatusItemSimple*>(d.data())->enable_gen.get();
      }
    } else if (k.type == kQgroupInfoKey) {
      if (d.size() < sizeof(QgroupInfoItem)) return Status::Corrupt("quota tree: short item " + KeyToString(k));
      const auto* in = reinterpret_cast<const QgroupInfoItem*>(d.data());
      Qgroup& g = state->groups[k.offset];
      g.rfer = in->rfer.get();
      g.excl = in->excl.get();
      g.rfer_cmpr = in->rfer_cmpr.get();
      g.excl_cmpr = in->excl_cmpr.get();
    } else if (k.type == kQgroupLimitKey) {
      if (d.size() < sizeof(QgroupLimitItem)) return Status::Corrupt("quota tree: short item " + KeyToString(k));
      Qgroup& g = state->groups[k.offset];
      std::memcpy(&g.limit, d.data(), sizeof(QgroupLimitItem));
    } else if (k.type == kQgroupRelationKey) {
      // Stored both ways; (child, parent) has the child's id first and
      // lower level ids are smaller.
      if (k.objectid < k.offset) state->groups[k.objectid].parents.push_back(k.offset);
    }
    UB_RETURN_IF_ERROR(c.Next());
  }
  if (!have_status) return Status::Corrupt("quota tree has no status item");
  if (!state->simple && (vol_->super().incompat_flags.get() & kIncompatSimpleQuota)) {
    return Status::Unsupported("writing to an image whose quota status and SIMPLE_QUOTA flag disagree");
  }
  UB_ASSIGN_OR_RETURN(auto ext, vol_->FindRoot(kExtentTreeObjectid));
  state->committed_extent = ext.ref;
  state->committed_extent.live = nullptr;
  quotas_ = std::move(state);
  return Status::Ok();
}

// Every qgroup a subvolume's data counts in: its own (0/root) and the
// groups above it.
std::set<uint64_t> TxnManager::QgroupsOf(const std::set<uint64_t>& roots) const {
  std::set<uint64_t> out;
  std::vector<uint64_t> todo;
  for (uint64_t r : roots) {
    if (IsSubvolumeTree(r) && quotas_->groups.count(r)) todo.push_back(r);
  }
  while (!todo.empty()) {
    const uint64_t g = todo.back();
    todo.pop_back();
    if (!out.insert(g).second) continue;
    auto it = quotas_->groups.find(g);
    if (it != quotas_->groups.end()) todo.insert(todo.end(), it->second.parents.begin(), it->second.parents.end());
  }
  return out;
}

Status TxnManager::CheckQuota(uint64_t root, uint64_t bytes) {
  if (!quotas_) return Status::Ok();
  auto lock = AllocLock();
  const std::set<uint64_t> groups = QgroupsOf({root});
  for (uint64_t g : groups) {
    Qgroup& q = quotas_->groups[g];
    const uint64_t flags = q.limit.flags.get();
    const uint64_t rfer = q.rfer + q.reserved + bytes, excl = q.excl + q.reserved + bytes;
    if (((flags & kQgroupLimitMaxRfer) && rfer > q.limit.max_rfer.get()) ||
        ((flags & kQgroupLimitMaxExcl) && excl > q.limit.max_excl.get())) {
      return Status::Error(EDQUOT, "the quota of qgroup " + std::to_string(g >> 48) + "/" +
                                       std::to_string(g & ((1ull << 48) - 1)) + " is exceeded");
    }
  }
  for (uint64_t g : groups) quotas_->groups[g].reserved += bytes;
  return Status::Ok();
}

Status TxnManager::NewQgroup(uint64_t root, uint64_t inherit_from, uint64_t dir_root) {
  if (!quotas_) return Status::Ok();
  if (quotas_->simple) return NewSimpleQgroup(root, dir_root);
  auto lock = AllocLock();
  Qgroup& g = quotas_->groups[root];
  g = Qgroup{};
  g.dirty = true;
  if (inherit_from) {
    auto src = quotas_->groups.find(inherit_from);
    if (src == quotas_->groups.end()) return Status::Ok();  // the source has no qgroup: start from zero
    if (!src->second.parents.empty()) {
      // The kernel marks quotas inconsistent here unless told which groups
      // the snapshot joins; refuse rather than leave numbers that are wrong.
      return Status::Unsupported("a snapshot of a subvolume in a higher-level qgroup with quotas enabled");
    }
    g.limit = src->second.limit;
    UB_ASSIGN_OR_RETURN(auto from, vol_->FindRoot(inherit_from));
    UB_ASSIGN_OR_RETURN(auto to, vol_->FindRoot(root));
    quotas_->inherits.push_back({inherit_from, root, from.ref.bytenr, to.ref.bytenr});
  }
  return Status::Ok();
}

// All of a dropped tree's shared block b lies below: each block and data
// extent loses the dropped tree from its subvolumes, with no reference of
// its own changing.
Status TxnManager::TraceDroppedSubtree(uint64_t bytenr, int level, uint64_t generation) {
  if (!quotas_ || quotas_->simple) return Status::Ok();  // simple quotas follow extent items alone
  std::vector<tree::BlockCheck> todo = {tree::BlockCheck{bytenr, level, generation, {}}};
  while (!todo.empty()) {
    const tree::BlockCheck at = todo.back();
    todo.pop_back();
    if (!quotas_->extra.emplace(at.bytenr, vol_->nodesize()).second) continue;
    UB_ASSIGN_OR_RETURN(tree::BlockRef b, dirty_->Read(at));
    if (b->is_leaf()) {
      ForEachDataExtent(*b, [&](const Key&, const FileExtentItem& fe) {
        quotas_->extra.emplace(fe.disk_bytenr.get(), fe.disk_num_bytes.get());
      });
    } else {
      for (int i = 0; i < b->nritems(); ++i) {
        todo.push_back(tree::BlockCheck{b->child_bytenr(i), b->level() - 1, b->child_generation(i), {}});
      }
    }
  }
  return Status::Ok();
}

// Before the commit applies anything: which extents to account, and who
// reached them in the committed state.
Status TxnManager::PrepareQuotaAccounting() {
  QuotaState& q = *quotas_;
  if (q.simple) return Status::Ok();  // counted as extent items come and go (simple_quota.cc)
  q.touched.clear();
  for (const auto& [bytenr, p] : pending_) q.touched.push_back({bytenr, p.tree ? vol_->nodesize() : p.num_bytes, {}});
  for (auto [bytenr, len] : q.extra) q.touched.push_back({bytenr, len, {}});
  q.extra.clear();
  std::sort(q.touched.begin(), q.touched.end(), [](const auto& a, const auto& b) { return a.bytenr < b.bytenr; });
  q.touched.erase(std::unique(q.touched.begin(), q.touched.end(),
                              [](const auto& a, const auto& b) { return a.bytenr == b.bytenr; }),
                  q.touched.end());
  // The trees as last committed: their ROOT_ITEMs are rewritten only later
  // in the commit.
  RootWalk old_walk(vol_->reader(), q.committed_extent, [&](uint64_t id) -> std::optional<tree::RootPtr> {
    auto r = vol_->MutableRoot(id, true);
    if (!r.ok() || (*r)->item.generation.get() >= transid() || (*r)->item.bytenr.get() == 0) return std::nullopt;
    return tree::RootPtr{(*r)->item.bytenr.get(), (*r)->item.level, (*r)->item.generation.get(), id, nullptr};
  });
  for (auto& t : q.touched) {
    UB_ASSIGN_OR_RETURN(t.old_roots, old_walk.Roots(t.bytenr));
    // Counted from the state right after the snapshots (see the top).
    for (const auto& in : q.inherits) {
      if (t.bytenr == in.dst_root) {
        t.old_roots = {in.dst};
      } else if (t.bytenr != in.src_root && t.old_roots.count(in.src)) {
        t.old_roots.insert(in.dst);
      }
    }
  }
  return Status::Ok();
}

// After the delayed refs are applied: who reaches each extent now; the
// numbers; the snapshots' inherited numbers; the items.
Status TxnManager::AccountQuotas() {
  QuotaState& q = *quotas_;
  if (q.simple) return WriteQgroupItems();
  for (const auto& in : q.inherits) {
    Qgroup& s = q.groups[in.src];
    Qgroup& d = q.groups[in.dst];
    d.rfer = s.rfer;
    d.excl = vol_->nodesize();
    s.excl = vol_->nodesize();
    s.dirty = d.dirty = true;
  }
  q.inherits.clear();
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * ext, vol_->MutableRoot(kExtentTreeObjectid));
  tree::RootPtr now = ext->ref;
  now.live = nullptr;
  // Each subvolume's qgroups (its own and those above), found once.
  std::map<uint64_t, std::set<uint64_t>> up;
  auto groups_of = [&](uint64_t r) -> const std::set<uint64_t>& {
    auto it = up.find(r);
    if (it == up.end()) it = up.emplace(r, QgroupsOf({r})).first;
    return it->second;
  };
  auto union_of = [&](const std::set<uint64_t>& roots) {
    std::set<uint64_t> out;
    for (uint64_t r : roots) out.insert(groups_of(r).begin(), groups_of(r).end());
    return out;
  };
  RootWalk new_walk(dirty_.get(), now, [&](uint64_t id) -> std::optional<tree::RootPtr> {
    auto r = vol_->MutableRoot(id, true);
    if (!r.ok()) return std::nullopt;
    tree::RootPtr p = (*r)->ref;  // a dead tree's too: what is not yet dropped is still its own
    p.live = nullptr;
    return p;
  });
  for (const auto& t : q.touched) {
    UB_ASSIGN_OR_RETURN(auto new_roots, new_walk.Roots(t.bytenr));
    const std::set<uint64_t> before = union_of(t.old_roots), after = union_of(new_roots);
    if (before == after && before.empty()) continue;
    std::set<uint64_t> all = before;
    all.insert(after.begin(), after.end());
    auto only_under = [&](const std::set<uint64_t>& roots, uint64_t g) {
      bool any = false;
      for (uint64_t r : roots) {
        if (!IsSubvolumeTree(r)) continue;
        if (!groups_of(r).count(g)) return false;
        any = true;
      }
      return any;
    };
    for (uint64_t g : all) {
      Qgroup& qg = q.groups[g];
      const bool in_old = before.count(g), in_new = after.count(g);
      const bool ex_old = in_old && only_under(t.old_roots, g), ex_new = in_new && only_under(new_roots, g);
      if (in_new != in_old) qg.rfer += in_new ? t.len : -t.len;
      if (ex_new != ex_old) qg.excl += ex_new ? t.len : -t.len;
      if (in_new != in_old || ex_new != ex_old) qg.dirty = true;
    }
  }
  q.touched.clear();
  return WriteQgroupItems();
}

Status TxnManager::WriteQgroupItems() {
  QuotaState& q = *quotas_;
  if (q.simple) UB_RETURN_IF_ERROR(RemoveDroppedQgroups());
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, Writer(kQuotaTreeObjectid));
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * root, vol_->MutableRoot(kQuotaTreeObjectid));
  bool any = false;
  for (auto& [id, g] : q.groups) {
    if (!g.dirty) continue;
    g.dirty = false;
    any = true;
    QgroupInfoItem info{};
    info.generation = transid();
    info.rfer = g.rfer;
    info.rfer_cmpr = q.simple ? g.rfer_cmpr : g.rfer;
    info.excl = g.excl;
    info.excl_cmpr = q.simple ? g.excl_cmpr : g.excl;
    const Key ik{0, kQgroupInfoKey, id}, lk{0, kQgroupLimitKey, id};
    UB_ASSIGN_OR_RETURN(auto have, tree::LookupItem(dirty_.get(), root->ref, ik));
    if (have) {
      UB_RETURN_IF_ERROR(w->Update(ik, Bytes(info)));
    } else {
      UB_RETURN_IF_ERROR(w->Insert(ik, Bytes(info)));
    }
    UB_ASSIGN_OR_RETURN(auto have_limit, tree::LookupItem(dirty_.get(), root->ref, lk));
    if (!have_limit) UB_RETURN_IF_ERROR(w->Insert(lk, Bytes(g.limit)));
  }
  if (!any) return Status::Ok();
  // The status item's generation says the numbers are of this transaction.
  const Key sk{0, kQgroupStatusKey, 0};
  UB_ASSIGN_OR_RETURN(auto st, tree::LookupItem(dirty_.get(), root->ref, sk));
  if (!st || st->size() < sizeof(QgroupStatusItem)) return Status::Corrupt("quota tree has no status item");
  reinterpret_cast<QgroupStatusItem*>(st->data())->generation = transid();
  return w->Update(sk, *st);
}

bool TxnManager::QgroupsDirty() const {
  for (const auto& [id, g] : quotas_->groups) {
    if (g.dirty) return true;
  }
  return false;
}

void TxnManager::QuotasCommitted() {
  if (!quotas_) return;
  quotas_->new_blocks.clear();
  for (auto& [id, g] : quotas_->groups) g.reserved = 0;
  if (auto ext = vol_->FindRoot(kExtentTreeObjectid); ext.ok()) {
    quotas_->committed_extent = ext->ref;
    quotas_->committed_extent.live = nullptr;
  }
}

}  // namespace ubtrfs::txn
